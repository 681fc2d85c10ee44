package benchmarks

import (
	"context"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"time"
)

func (r *runner) many(ctx context.Context) (Result, error) {
	rs, ok := r.sys.(Renewing)
	if !ok {
		return Result{}, notApplicable("no leases renewed over a network (no TTL, or no broker)")
	}
	interval := rs.RenewInterval()
	// The window is a whole number of renew intervals, at least three, so
	// that it holds the same number of renewal ticks whatever their phase.
	ticks := max(3, int(r.p.Duration/interval))
	window := time.Duration(ticks) * interval
	cs, closeAll, err := r.clients(ctx, 1)
	if err != nil {
		return Result{}, err
	}
	defer closeAll()
	c := cs[0]
	if err := r.cycle(ctx, c, r.prefix+"-warm"); err != nil {
		return Result{}, err
	}

	heap0 := heapInUse()
	held := make([]Held, r.p.Leases)
	samples := make([]time.Duration, r.p.Leases)
	defer func() {
		r.parallel(len(held), func(i int) error {
			if held[i] != nil {
				_ = r.release(ctx, held[i])
			}
			return nil
		})
	}()
	err = r.parallel(r.p.Leases, func(i int) error {
		t0 := time.Now()
		h, err := r.lock(ctx, c, fmt.Sprintf("%s-%d", r.prefix, i))
		if err != nil {
			return err
		}
		samples[i] = time.Since(t0)
		held[i] = h
		return nil
	})
	if err != nil {
		return Result{}, err
	}
	perLease := float64(int64(heapInUse())-int64(heap0)) / float64(r.p.Leases)

	// Peers do not renew by themselves: renew every lease once per
	// interval, as their users must. Backends renew on their own.
	var renewErrs, renewed atomic.Int64
	winCtx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	_, manual := held[0].(Renewer)
	if manual {
		wg.Go(func() { r.renewEvery(winCtx, interval, held, &renewed, &renewErrs) })
	}
	if manual {
		// Our ticks fire at whole intervals from now: start counting half
		// an interval in, so that exactly `ticks` of them fall inside.
		select {
		case <-ctx.Done():
		case <-time.After(interval / 2):
		}
	}
	rt0, n0, t0 := rs.RoundTrips(), renewed.Load(), time.Now()
	select {
	case <-ctx.Done():
	case <-time.After(window):
	}
	rt1, n1, elapsed := rs.RoundTrips(), renewed.Load(), time.Since(t0)
	cancel()
	wg.Wait()
	if err := ctx.Err(); err != nil {
		return Result{}, err
	}
	res := newResult(samples, int(rt1-rt0), elapsed)
	res.Metrics = map[string]float64{
		"bytes_per_lease":                 perLease,
		"round_trips_per_master_per_tick": res.Ops * interval.Seconds() / float64(rs.Masters()),
		"renew_errors":                    float64(renewErrs.Load()),
	}
	if manual {
		// Whether the user's renewal loop keeps up: 1 means every lease
		// was renewed once per tick.
		res.Metrics["renewed_per_lease_per_tick"] = float64(n1-n0) / float64(ticks) / float64(len(held))
	}
	return res, nil
}

// renewEvery renews every lease of held (each a [Renewer]) once per
// interval until ctx ends, as the user of a peer library must, counting
// the renewals and, while ctx lives, the failed ones.
func (r *runner) renewEvery(ctx context.Context, interval time.Duration, held []Held, renewed, failed *atomic.Int64) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		r.parallel(len(held), func(i int) error {
			rctx, cancel := context.WithTimeout(ctx, interval)
			defer cancel()
			if err := held[i].(Renewer).Renew(rctx); err != nil {
				if ctx.Err() == nil {
					failed.Add(1)
				}
			} else {
				renewed.Add(1)
			}
			return nil
		})
	}
}

// parallel runs f(0..n-1) on Workers goroutines and returns the first
// error; after an error the remaining indexes are skipped.
func (r *runner) parallel(n int, f func(i int) error) error {
	var (
		next atomic.Int64
		once sync.Once
		ferr error
		bad  atomic.Bool
		wg   sync.WaitGroup
	)
	for range min(r.p.Workers, n) {
		wg.Go(func() {
			for !bad.Load() {
				i := int(next.Add(1) - 1)
				if i >= n {
					return
				}
				if err := f(i); err != nil {
					once.Do(func() { ferr = err })
					bad.Store(true)
				}
			}
		})
	}
	wg.Wait()
	return ferr
}

// heapInUse returns the live heap after a full collection.
func heapInUse() uint64 {
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapAlloc
}
