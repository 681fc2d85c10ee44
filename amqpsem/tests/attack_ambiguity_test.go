package amqpsem_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/latchkey-go/latchkey/contracttest/testenv"
	"github.com/latchkey-go/latchkey/locks"

	"github.com/latchkey-go/latchkey/amqpsem"
)

// TestAttackAmbiguousAcquire: the broker's replies come late (the declare
// of the holder or mutex queue runs at once, its declare-ok arrives after
// the caller's ctx ended). "On failure nothing is held": after the call
// fails, the queue must be gone (within the heartbeat the doc allows for the
// undo), while the client's connection stays up, and another client must be
// able to take the name.
func TestAttackAmbiguousAcquire(t *testing.T) {
	url, host := amqpURL(t)
	type tcase struct {
		kind            string
		hb, delay, wait time.Duration
	}
	var cases []tcase
	cases = append(cases, tcase{"semaphore", time.Second, 600 * time.Millisecond, 1300 * time.Millisecond},
		tcase{"mutex", time.Second, 600 * time.Millisecond, 300 * time.Millisecond})
	for _, tc := range cases {
		t.Run(fmt.Sprintf("%s-hb%v-delay%v-ctx%v", tc.kind, tc.hb, tc.delay, tc.wait), func(t *testing.T) {
			name := atkName("amb" + tc.kind)
			atkCleanup(t, url, name)
			p := testenv.NewProxy(t, host)
			c := atkDial(t, url, p.Addr(), amqpsem.WithHeartbeat(tc.hb), amqpsem.WithVerifyInterval(tc.hb/3))
			other := atkDial(t, url, "")
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			var try, otry func(context.Context) (locks.Lease, error)
			queue := name
			if tc.kind == "semaphore" {
				if err := atkAdmin(t, other).Create(ctx, name, 1); err != nil {
					t.Fatal(err)
				}
				s, _ := c.Semaphore(amqpsem.MaxSemaphoreSize)
				os, _ := other.Semaphore(amqpsem.MaxSemaphoreSize)
				try = func(ctx context.Context) (locks.Lease, error) { return s.TryAcquire(ctx, name) }
				otry = func(ctx context.Context) (locks.Lease, error) { return os.TryAcquire(ctx, name) }
				queue = name + "-1-B"
				// Warm up the client's channels.
				if l, err := try(ctx); err != nil {
					t.Fatal(err)
				} else {
					l.Release(ctx)
				}
			} else {
				m := c.Locker()
				om := other.Locker()
				try = func(ctx context.Context) (locks.Lease, error) { return m.TryLock(ctx, name) }
				otry = func(ctx context.Context) (locks.Lease, error) { return om.TryLock(ctx, name) }
				if l, err := try(ctx); err != nil {
					t.Fatal(err)
				} else {
					l.Release(ctx)
				}
			}
			p.DelayReplies(tc.delay)
			cctx, ccancel := context.WithTimeout(ctx, tc.wait)
			t0 := time.Now()
			during := make(chan time.Duration, 1)
			stop := make(chan struct{})
			go func() {
				raw := atkRaw(t, url)
				first := time.Duration(-1)
				for {
					select {
					case <-stop:
						during <- first
						return
					default:
					}
					if st := raw.state(queue); st != "absent" && first < 0 {
						first = time.Since(t0)
					}
					time.Sleep(20 * time.Millisecond)
				}
			}()
			l, err := try(cctx)
			close(stop)
			t.Logf("queue first seen held during the call at %v", <-during)
			ccancel()
			ret := time.Since(t0)
			t.Logf("try with late replies: %v after %v", err, ret)
			if err == nil {
				l.Release(context.Background())
				t.Skip("acquired before the ctx ended")
			}
			raw := atkRaw(t, url)
			var lastLocked time.Duration = -1
			var st string
			for time.Since(t0) < ret+tc.hb+tc.delay+500*time.Millisecond {
				st = raw.state(queue)
				if st != "absent" {
					lastLocked = time.Since(t0)
				}
				time.Sleep(25 * time.Millisecond)
			}
			p.Restore()
			t.Logf("queue %s last seen held %v after the call started, returned at %v (client connected: %v), now %s", queue, lastLocked, ret, c.Connected(), st)
			if st != "absent" {
				t.Errorf("failed call left %s %s; client connected %v", queue, st, c.Connected())
			}
			if lastLocked > ret+tc.hb {
				t.Errorf("the failed call's queue was held %v after the call returned (heartbeat %v)", lastLocked-ret, tc.hb)
			}
			ol, err := otry(ctx)
			if err != nil {
				t.Errorf("another client cannot take %s: %v", name, err)
			} else {
				ol.Release(ctx)
			}
		})
	}
}
