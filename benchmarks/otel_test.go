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
// per cycle, to compare with a broker system's uncontended p50.
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
	for _, tc := range []struct {
		name string
		l    locks.Locker
	}{
		{"plain", c.Locker()},
		{"otel", lockotel.WrapLocker(c.Locker(), lockotel.WithTracerProvider(sys.tracers), lockotel.WithMeterProvider(sys.meters))},
	} {
		b.Run(tc.name, func(b *testing.B) {
			ctx := context.Background()
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
