package natsputex_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/latchkey-go/latchkey/contracttest"
	"github.com/latchkey-go/latchkey/contracttest/testenv/natsenv"
	"github.com/latchkey-go/latchkey/locks"
	"github.com/latchkey-go/latchkey/natsputex"
)

// TestAttackRestartMidTakeover: a live holder renewing, a waiting Lock
// and a TryLock loop on one name of a file-stored bucket; the server is
// shut down for 0, T/2, T and 2T and started again, each time around the
// moment a takeover may happen. Every grant is checked: no lease is live
// when another is granted, and tokens rise in grant order.
func TestAttackRestartMidTakeover(t *testing.T) {
	srv := natsenv.StartServer(t)
	url := srv.URL()
	bucket := uniqueBucket("atkrestart")
	prepareBucket(t, url, bucket, natsputex.WithStorage(jetstream.FileStorage))
	g := newGrants()
	ctx, cancel := context.WithTimeout(context.Background(), 40*time.Second)
	defer cancel()
	stop := make(chan struct{})
	var wg sync.WaitGroup
	// Three clients, each alternating Lock (hold 250ms, so that others
	// wait and take over) and TryLock.
	for i := range 3 {
		c := newTestClient(t, url, bucket, natsputex.WithHolderID(fmt.Sprintf("c%d", i)))
		wg.Add(1)
		go func() {
			defer wg.Done()
			for n := 0; ; n++ {
				select {
				case <-stop:
					return
				default:
				}
				lctx, lcancel := context.WithTimeout(ctx, 2*time.Second)
				var l locks.Lease
				var err error
				if n%2 == 0 {
					l, err = c.Locker().Lock(lctx, "job")
				} else {
					l, err = c.Locker().TryLock(lctx, "job")
				}
				lcancel()
				if err != nil {
					time.Sleep(20 * time.Millisecond)
					continue
				}
				g.grant(fmt.Sprintf("c%d", i), l)
				select {
				case <-l.Context().Done():
				case <-time.After(250 * time.Millisecond):
				}
				_ = l.Release(context.Background())
			}
		}()
	}
	T := testF * testR
	for _, down := range []time.Duration{0, T / 2, T, 2 * T} {
		time.Sleep(700 * time.Millisecond)
		srv.Shutdown()
		time.Sleep(down)
		if err := srv.Restart(); err != nil {
			t.Fatal(err)
		}
	}
	time.Sleep(time.Second)
	close(stop)
	wg.Wait()
	g.mu.Lock()
	n := len(g.leases)
	g.mu.Unlock()
	t.Logf("%d grants", n)
	g.check(t)
}

// TestAttackRecreatedBucketSupervisor: the bucket is deleted and made
// again (New makes a missing one; the docs mention this case only for
// fencing tokens, which count from 1 again) while two agents with the same
// timing (R = 100ms, F = 3) run. node-b finds the key free in the new
// bucket and starts at once, while node-a's hold, from its last write in
// the old bucket, is still valid and its service runs until its next
// renewal fails: "at most one runs the service at a time". Also checked:
// every takeover in the new bucket comes T or more after the last write.
func TestAttackRecreatedBucketSupervisor(t *testing.T) {
	for _, C := range []int{1, 0} {
		t.Run(fmt.Sprintf("C=%d", C), func(t *testing.T) {
			url, bucket, key := supervisorEnv(t)
			kv := mustBucket(t, url, bucket)
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			for i := range 50 { // revisions well above what the new bucket reaches
				if _, err := kv.Put(ctx, "filler", []byte(fmt.Sprint(i))); err != nil {
					t.Fatal(err)
				}
			}
			h := contracttest.NewHistory(1)
			a := startAgentWith(t, url, bucket, key, "node-a", "node-a", h, nil, natsputex.WithConfirmations(C))
			waitFor(t, 5*time.Second, "node-a starts its service", a.running)
			b := startAgentWith(t, url, bucket, key, "node-b", "node-b", h, nil, natsputex.WithConfirmations(C))
			time.Sleep(500 * time.Millisecond)
			deleteBucket(url, bucket)
			prepareBucket(t, url, bucket)
			writes := watchWrites(t, url, bucket, key)
			time.Sleep(2 * time.Second)
			a.stop()
			b.stop()
			writes.mu.Lock()
			ws := append([]keyWrite(nil), writes.writes...)
			writes.mu.Unlock()
			bad := 0
			for i := 1; i < len(ws); i++ {
				prev, w := ws[i-1], ws[i]
				if w.value == "" || prev.value == "" || w.value == prev.value {
					continue
				}
				gap := w.created.Sub(prev.created)
				t.Logf("rev %d %q took over rev %d %q %v after it", w.rev, w.value, prev.rev, prev.value, gap.Round(time.Millisecond))
				if gap < testF*testR {
					bad++
					t.Errorf("rev %d %q took over rev %d %q %v after it, before T = %v", w.rev, w.value, prev.rev, prev.value, gap.Round(time.Millisecond), testF*testR)
				}
			}
			if err := h.Check(); err != nil {
				t.Errorf("services overlapped: %v", err)
			}
		})
	}
}
