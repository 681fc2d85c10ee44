package natsputex_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/latchkey-go/latchkey/contracttest/testenv/natsenv"
	"github.com/latchkey-go/latchkey/locks"
	"github.com/latchkey-go/latchkey/natsputex"
)

// TestAttackClusterLeaderStopMidTakeover: on an embedded 3-node cluster
// with an R3 bucket, a holder connected to a follower crashes; a waiting
// Lock and two TryLock loops (on the other nodes) race for its key, and
// the bucket's stream leader is stopped just before T of silence has
// passed (mid-takeover), then restarted. Every grant is checked: no lease
// live when another is granted, tokens rising.
func TestAttackClusterLeaderStopMidTakeover(t *testing.T) {
	if testing.Short() {
		t.Skip("a 3-node cluster")
	}
	cluster := natsenv.StartCluster(t, 3)
	nodes := cluster.Servers()
	bucket := uniqueBucket("atkcluster")
	prepareBucket(t, cluster.URLs(), bucket, natsputex.WithReplicas(3))
	leader := bucketLeader(t, cluster.URLs(), bucket, nodes, -1)
	follower := (leader + 1) % 3
	writes := watchWrites(t, nodes[follower].URL(), bucket, "job")
	nc, js, err := connect(nodes[follower].URL(), nats.IgnoreDiscoveredServers())
	if err != nil {
		t.Fatal(err)
	}
	crashed, err := natsputex.New(context.Background(), js, bucket, natsputex.WithHolderID("crashed"),
		natsputex.WithRenewInterval(testR), natsputex.WithFailureThreshold(testF), natsputex.WithConfirmations(testC))
	if err != nil {
		t.Fatal(err)
	}
	g := newGrants()
	// The first write may find the new cluster's stream between leaders
	// ("no response from stream", seen under load): try again briefly.
	var held locks.Lease
	for deadline := time.Now().Add(10 * time.Second); ; {
		held, err = crashed.Locker().TryLock(context.Background(), "job")
		if err == nil || errors.Is(err, locks.ErrNotAcquired) || time.Now().After(deadline) {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if err != nil {
		t.Fatal(err)
	}
	g.grant("crashed", held)
	ctx, cancel := context.WithTimeout(context.Background(), 40*time.Second)
	defer cancel()
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for i := range 3 {
		who := fmt.Sprintf("c%d", i)
		c := newTestClient(t, cluster.URLs(), bucket, natsputex.WithHolderID(who))
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				var l locks.Lease
				var err error
				if i == 0 {
					lctx, lcancel := context.WithTimeout(ctx, 3*time.Second)
					l, err = c.Locker().Lock(lctx, "job")
					lcancel()
				} else {
					l, err = c.Locker().TryLock(ctx, "job")
				}
				if err != nil {
					if !errors.Is(err, locks.ErrNotAcquired) && !errors.Is(err, context.DeadlineExceeded) {
						t.Logf("%s: %v", who, err)
					}
					time.Sleep(10 * time.Millisecond)
					continue
				}
				g.grant(who, l)
				select {
				case <-l.Context().Done():
				case <-time.After(150 * time.Millisecond):
				}
				_ = l.Release(context.Background())
			}
		}()
	}
	time.Sleep(3 * testR)
	nc.Close() // the holder crashes
	t.Cleanup(func() { _ = crashed.Close(context.Background()) })
	time.Sleep(time.Until(writes.lastWrite().Add(testF*testR - 30*time.Millisecond)))
	stopped := time.Now()
	cluster.Stop(leader)
	t.Logf("stopped the stream leader (node %d) %v after the crashed holder's last write seen", leader, stopped.Sub(writes.lastWrite()).Round(time.Millisecond))
	time.Sleep(3 * time.Second)
	if err := cluster.Restart(leader); err != nil {
		t.Fatal(err)
	}
	time.Sleep(time.Second)
	close(stop)
	wg.Wait()
	g.mu.Lock()
	t.Logf("%d grants", len(g.leases))
	g.mu.Unlock()
	g.check(t)
	silence(t, writes, "crashed", testF*testR)
}
