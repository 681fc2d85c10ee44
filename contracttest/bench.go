package contracttest

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/latchkey-go/latchkey/locks"
)

// RunBenchmarks measures the backend made by newHarness:
//   - Uncontended: one client, Lock then Release of one name, per op;
//   - Contended: 8 clients on one name, each holding it for 100µs; one op
//     is one hand-off, reported also as handoffs/s.
func RunBenchmarks(b *testing.B, newHarness NewHarness) {
	b.Run("Uncontended", func(b *testing.B) { benchUncontended(b, newHarness) })
	b.Run("Contended", func(b *testing.B) { benchContended(b, newHarness, 8, 100*time.Microsecond) })
}

func benchUncontended(b *testing.B, nh NewHarness) {
	e := newEnv(b, nh)
	defer e.close()
	l := e.newClientLocker()
	name := e.name()
	ctx := e.ctx
	for b.Loop() {
		lease, err := l.Lock(ctx, name)
		if err != nil {
			b.Fatal(err)
		}
		if err := lease.Release(ctx); err != nil {
			b.Fatal(err)
		}
	}
}

func benchContended(b *testing.B, nh NewHarness, workers int, hold time.Duration) {
	e := newEnv(b, nh)
	defer e.close()
	name := e.name()
	ls := make([]locks.Locker, workers)
	for i := range ls {
		ls[i] = e.newClientLocker()
	}
	var left atomic.Int64
	left.Store(int64(b.N))
	var wg sync.WaitGroup
	var failed atomic.Value
	b.ResetTimer()
	start := time.Now()
	for _, l := range ls {
		wg.Go(func() {
			for left.Add(-1) >= 0 {
				ctx, cancel := context.WithTimeout(e.ctx, time.Minute)
				lease, err := l.Lock(ctx, name)
				if err != nil {
					cancel()
					failed.Store(err)
					return
				}
				time.Sleep(hold)
				err = lease.Release(ctx)
				cancel()
				if err != nil {
					failed.Store(err)
					return
				}
			}
		})
	}
	wg.Wait()
	b.StopTimer()
	if err, _ := failed.Load().(error); err != nil {
		b.Fatal(err)
	}
	b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "handoffs/s")
}
