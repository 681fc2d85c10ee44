package natsputex_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/latchkey-go/latchkey/contracttest/testenv"
	"github.com/latchkey-go/latchkey/locks"
	"github.com/latchkey-go/latchkey/natsputex"
)

// TestAttackWatchAfterBlackHole: a waiting Lock (T = 10s, backoff 20s)
// whose own link to the server is black-holed for 1.5s, then restored
// (the proxy closes the connection that lost data; nats.go reconnects),
// or cut and restored. "Waiting calls look at their keys again as soon as
// the connection is back, and make their KV watches again": the holder's
// release, 1s after the link is back, wakes the waiter within a second.
func TestAttackWatchAfterBlackHole(t *testing.T) {
	for _, fault := range []string{"blackhole", "cut"} {
		t.Run(fault, func(t *testing.T) {
			url, bucket := promiseEnv(t, "atkwatch")
			proxy := testenv.NewProxy(t, strings.TrimPrefix(url, "nats://"))
			slow := []natsputex.Option{natsputex.WithRenewInterval(time.Second), natsputex.WithFailureThreshold(10)}
			holder := newTestClient(t, url, bucket, slow...).Locker()
			waiter := newTestClient(t, "nats://"+proxy.Addr(), bucket,
				append(slow, natsputex.WithBackoff(locks.Backoff{Min: 20 * time.Second, Max: 20 * time.Second}))...).Locker()
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			lease, err := holder.TryLock(ctx, "job")
			if err != nil {
				t.Fatal(err)
			}
			got := lockBehind(ctx, waiter, "job", lease)
			time.Sleep(500 * time.Millisecond)
			if fault == "cut" {
				proxy.Cut()
			} else {
				proxy.BlackHole()
			}
			time.Sleep(1500 * time.Millisecond)
			proxy.Restore()
			time.Sleep(time.Second)
			released := time.Now()
			if err := lease.Release(ctx); err != nil {
				t.Fatal(err)
			}
			select {
			case g := <-got:
				if g.err != nil {
					t.Fatalf("the waiter's Lock: %v", g.err)
				}
				defer g.lease.Release(context.Background())
				took := time.Since(released)
				t.Logf("%s: the waiter got the key %v after the release", fault, took.Round(time.Millisecond))
				if took > time.Second {
					t.Errorf("the waiter got the key %v after the release: its watch did not come back with its link", took.Round(time.Millisecond))
				}
				if g.otherLive {
					t.Error("double grant")
				}
			case <-time.After(3 * time.Second):
				t.Errorf("%s: the waiter did not get the key within 3s of the release (T = 10s, backoff 20s): its watch did not come back with its link", fault)
			}
		})
	}
}
