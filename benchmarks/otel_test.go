package benchmarks

import (
	"context"
	"testing"

	"github.com/latchkey-go/latchkey/lockotel"
	"github.com/latchkey-go/latchkey/locks"
	"github.com/latchkey-go/latchkey/locks/memlock"
)

// BenchmarkLockotelCost measures what lockotel on the SDK of an +otel
// variant adds to one Lock + Release, without a broker: memlock plain,
// then wrapped. The difference of the two ns/op is the wrapper's CPU cost
// per cycle, to compare with a broker system's uncontended p50. "otel" is
// the +otel variants' case: calls made outside any trace, so metrics
// only (the wrapper's default starts no root span); "otel-in-trace" calls
// inside a sampled caller's span, so with the two spans as well (the
// caller's span is started once, outside the loop); "otel-rootspans" is
// WithRootSpans outside any trace.
func BenchmarkLockotelCost(b *testing.B) {
	store := memlock.New()
	c, err := store.NewClient()
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = c.Close(context.Background()) })
	sys := newOtelSystem(nil)
	b.Cleanup(func() {
		_ = sys.tracers.Shutdown(context.Background())
		_ = sys.meters.Shutdown(context.Background())
	})
	opts := []lockotel.Option{lockotel.WithTracerProvider(sys.tracers), lockotel.WithMeterProvider(sys.meters)}
	traced, caller := sys.tracers.Tracer("caller").Start(context.Background(), "caller")
	b.Cleanup(func() { caller.End() })
	for _, tc := range []struct {
		name string
		ctx  context.Context
		l    locks.Locker
	}{
		{"plain", context.Background(), c.Locker()},
		{"otel", context.Background(), lockotel.WrapLocker(c.Locker(), opts...)},
		{"otel-in-trace", traced, lockotel.WrapLocker(c.Locker(), opts...)},
		{"otel-rootspans", context.Background(), lockotel.WrapLocker(c.Locker(), append(opts, lockotel.WithRootSpans())...)},
	} {
		b.Run(tc.name, func(b *testing.B) {
			ctx := tc.ctx
			b.ReportAllocs()
			for b.Loop() {
				l, err := tc.l.Lock(ctx, "bench")
				if err != nil {
					b.Fatal(err)
				}
				if err := l.Release(ctx); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
