package redlockprio_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/latchkey-go/latchkey/contracttest/testenv"
	"github.com/latchkey-go/latchkey/locks"
)

// TestAttackSemaphoreChainMixedTTLs: a semaphore of 2 slots. V1 (priority
// 1, TTL 3s) and V2 (priority 1, TTL 300ms or 3s) hold both slots; V1 is
// cut off and writes while its context is live; V2 is cut off too or
// healthy. T (priority 2, TTL 400ms) steals a slot and waits; then H1 and
// H2 (priority 3, TTL 300ms) acquire at once. At no time may more than 2
// holders write ("at most size leases per name at once [...] with the
// same guarantees as a lock").
func TestAttackSemaphoreChainMixedTTLs(t *testing.T) {
	for _, how := range []string{"both victims cut off", "V2 short and healthy"} {
		t.Run(how, func(t *testing.T) {
			addrs := addrsOf(testenv.StartRedis(t, 3))
			clk := newAtkClock()
			v1 := mustProxied(t, addrs, atkOpts(3*time.Second, 0.01, 1)...)
			v2ttl := 3 * time.Second
			if how != "both victims cut off" {
				v2ttl = 300 * time.Millisecond
			}
			v2 := mustProxied(t, addrs, atkOpts(v2ttl, 0.01, 1)...)
			tc := mustClient(t, addrs, atkOpts(400*time.Millisecond, 0.05, 2)...)
			h1 := mustClient(t, addrs, atkOpts(300*time.Millisecond, 0.1, 3)...)
			h2 := mustClient(t, addrs, atkOpts(300*time.Millisecond, 0, 3)...)
			for _, c := range []*client{v1.client, v2.client, tc, h1, h2} {
				warm(t, c.l)
			}
			name := uniqueName(t)
			ctx := ctxFor(t, 20*time.Second)
			var wg sync.WaitGroup
			hold := func(who string, c *client, cut func(), ignore bool) {
				sem, err := c.c.Semaphore(2)
				if err != nil {
					t.Fatal(err)
				}
				l, err := sem.Acquire(ctx, name)
				if err != nil {
					t.Errorf("%s: %v", who, err)
					return
				}
				s := clk.begin(who, l)
				stop := make(chan struct{})
				wg.Go(func() {
					if ignore {
						time.AfterFunc(500*time.Millisecond, func() { close(stop) })
						clk.workIgnoringContext(s, l, stop)
					} else {
						clk.workWhileLive(s, l, stop)
					}
					clk.end(s, l)
					_ = l.Release(context.Background())
				})
				if cut != nil {
					cut()
				}
				t.Logf("%s holds slot %d token %d", who, l.(interface{ Slot() int }).Slot(), l.Token())
			}
			hold("V1", v1.client, v1.cut, false)
			if how == "both victims cut off" {
				hold("V2", v2.client, v2.cut, false)
			} else {
				hold("V2", v2.client, nil, true)
			}
			wg.Go(func() {
				tctx, cancel := context.WithTimeout(ctx, 8*time.Second)
				defer cancel()
				sem, _ := tc.c.Semaphore(2)
				l, err := sem.Acquire(tctx, name)
				if err != nil {
					t.Logf("T: %v", err)
					return
				}
				s := clk.begin("T", l)
				t.Logf("T granted slot %d", l.(interface{ Slot() int }).Slot())
				clk.write(s, clk.now())
				clk.end(s, l)
				_ = l.Release(context.Background())
			})
			time.Sleep(300 * time.Millisecond)
			for _, h := range []struct {
				who string
				c   *client
			}{{"H1", h1}, {"H2", h2}} {
				wg.Go(func() {
					sem, _ := h.c.c.Semaphore(2)
					l, err := sem.Acquire(ctx, name)
					if err != nil {
						t.Errorf("%s: %v", h.who, err)
						return
					}
					s := clk.begin(h.who, l)
					t.Logf("%s granted slot %d", h.who, l.(interface{ Slot() int }).Slot())
					stop := make(chan struct{})
					time.AfterFunc(100*time.Millisecond, func() { close(stop) })
					clk.workWhileLive(s, l, stop)
					clk.end(s, l)
					_ = l.Release(context.Background())
				})
			}
			wg.Wait()
			clk.dump(t)
			n, at := clk.maxConcurrent()
			t.Logf("at most %d holders at once (at %v)", n, ms(at))
			if n > 2 {
				t.Errorf("%d holders of a 2-slot semaphore wrote at once (at %v)", n, ms(at))
			}
			var _ locks.Lease
		})
	}
}
