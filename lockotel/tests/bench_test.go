package tests

import (
	"context"
	"testing"

	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/latchkey-go/latchkey/lockotel"
	"github.com/latchkey-go/latchkey/locks"
	"github.com/latchkey-go/latchkey/locks/memlock"
)

// BenchmarkOverhead measures one uncontended Lock and Release on memlock:
// plain; wrapped with the SDK installed (a tracer provider that would
// record spans but exports none, and a meter provider with a
// ManualReader, never collected), called outside any trace so that the
// wrapper starts no span (its default); and wrapped with the global no-op
// providers. memlock does no I/O, so the difference is the wrapper's cost
// in absolute terms; lockbench sets it against a broker's round trips.
// Besides ns/op it reports cpu-ns/op, the process's CPU time (all its
// goroutines, the garbage collector's included) per Lock and Release.
func BenchmarkOverhead(b *testing.B) {
	run := func(b *testing.B, l locks.Locker) {
		ctx := context.Background()
		b.ReportAllocs()
		cpu0, ok := cpuTime()
		for b.Loop() {
			lease, err := l.Lock(ctx, "bench")
			if err != nil {
				b.Fatal(err)
			}
			if err := lease.Release(ctx); err != nil {
				b.Fatal(err)
			}
		}
		// CPU time per op is steadier than ns/op on a loaded machine.
		if cpu1, ok1 := cpuTime(); ok && ok1 {
			b.ReportMetric(float64(cpu1-cpu0)/float64(b.N), "cpu-ns/op")
		}
	}
	newLocker := func(b *testing.B) *memlock.Locker {
		c, err := memlock.New().NewClient()
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { _ = c.Close(context.Background()) })
		return c.Locker()
	}
	b.Run("plain", func(b *testing.B) { run(b, newLocker(b)) })
	b.Run("wrapped", func(b *testing.B) {
		tp := sdktrace.NewTracerProvider() // records spans, exports none
		mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(sdkmetric.NewManualReader()))
		b.Cleanup(func() {
			_ = tp.Shutdown(context.Background())
			_ = mp.Shutdown(context.Background())
		})
		run(b, lockotel.WrapLocker(newLocker(b), lockotel.WithTracerProvider(tp), lockotel.WithMeterProvider(mp)))
	})
	b.Run("wrapped-noop", func(b *testing.B) {
		run(b, lockotel.WrapLocker(newLocker(b))) // the global no-op providers
	})
}
