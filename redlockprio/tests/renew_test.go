package redlockprio_test

import (
	"context"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/latchkey-go/latchkey/contracttest/testenv"
	"github.com/latchkey-go/latchkey/locks"
	"github.com/latchkey-go/latchkey/redlockprio"
)

// countHook counts the round trips a go-redis client makes once armed:
// single commands and pipelines, and the size of the largest pipeline.
type countHook struct {
	armed     atomic.Bool
	singles   atomic.Int64
	pipelines atomic.Int64
	largest   atomic.Int64
}

func (h *countHook) DialHook(next redis.DialHook) redis.DialHook {
	return func(ctx context.Context, network, addr string) (net.Conn, error) { return next(ctx, network, addr) }
}

func (h *countHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if h.armed.Load() {
			h.singles.Add(1)
		}
		return next(ctx, cmd)
	}
}

func (h *countHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		if h.armed.Load() {
			h.pipelines.Add(1)
			for n := int64(len(cmds)); ; {
				old := h.largest.Load()
				if n <= old || h.largest.CompareAndSwap(old, n) {
					break
				}
			}
		}
		return next(ctx, cmds)
	}
}

// TestBatchRenewal holds many leases in one Locker and checks that each
// renewal tick costs one round trip per master, not one per lease.
func TestBatchRenewal(t *testing.T) {
	const leases = 1000
	addrs := addrsOf(testenv.StartRedis(t, 3))
	// A long TTL: this test counts round trips, and must not lose leases
	// when the machine is slow.
	const renew = 300 * time.Millisecond
	c := mustClient(t, addrs, redlockprio.WithTTL(5*time.Second), redlockprio.WithRenewInterval(renew))
	hooks := make([]*countHook, len(c.rcs))
	for i, rc := range c.rcs {
		hooks[i] = &countHook{}
		rc.AddHook(hooks[i])
	}
	ctx := ctxFor(t, 30*time.Second)
	prefix := uniqueName(t)
	held := make([]locks.Lease, leases)
	var wg sync.WaitGroup
	errs := make(chan error, leases)
	for w := range 8 {
		wg.Go(func() {
			for i := w; i < leases; i += 8 {
				l, err := c.l.TryLock(ctx, fmt.Sprintf("%s-%d", prefix, i))
				if err != nil {
					errs <- err
					return
				}
				held[i] = l
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	time.Sleep(renew / 2) // let the acquisitions' background calls finish
	for _, h := range hooks {
		h.armed.Store(true)
	}
	const ticks = 4
	time.Sleep(ticks*renew + renew/2)
	for _, h := range hooks {
		h.armed.Store(false)
	}
	for i, h := range hooks {
		p, s, big := h.pipelines.Load(), h.singles.Load(), h.largest.Load()
		t.Logf("master %d: %d pipelines (largest %d commands), %d single commands in %d ticks", i, p, big, s, ticks)
		if p < ticks-1 || p > ticks+1 {
			t.Errorf("master %d: %d pipelines in %d renewal ticks, want one per tick", i, p, ticks)
		}
		if big != leases {
			t.Errorf("master %d: largest pipeline has %d commands, want all %d leases", i, big, leases)
		}
		if s != 0 {
			t.Errorf("master %d: %d single commands while only renewing", i, s)
		}
	}
	for _, l := range held {
		if err := context.Cause(l.Context()); err != nil {
			t.Fatalf("a lease ended during batch renewal: %v", err)
		}
	}
	for _, l := range held {
		_ = l.Release(ctx)
	}
}
