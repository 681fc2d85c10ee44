package tests

import (
	"context"
	"testing"

	"github.com/latchkey-go/latchkey/lockotel"
	"github.com/latchkey-go/latchkey/locks"
	"github.com/latchkey-go/latchkey/locks/memlock"
)

// BenchmarkOverhead measures one uncontended Lock and Release on memlock,
// plain and wrapped, with the SDK installed (a tracer provider that
// records every span, with no processor, and a meter provider with a
// ManualReader, never collected). memlock does no I/O, so the difference
// is the wrapper's cost in absolute terms; against a broker's round
// trips it is a small fraction (lockbench measures that).
func BenchmarkOverhead(b *testing.B) {
	run := func(b *testing.B, l locks.Locker) {
		ctx := context.Background()
		b.ReportAllocs()
		for b.Loop() {
			lease, err := l.Lock(ctx, "bench")
			if err != nil {
				b.Fatal(err)
			}
			if err := lease.Release(ctx); err != nil {
				b.Fatal(err)
			}
		}
	}
	newLocker := func(b *testing.B) *memlock.Locker {
		c, err := memlock.New().NewClient()
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { _ = c.Close() })
		return c.Locker()
	}
	b.Run("plain", func(b *testing.B) { run(b, newLocker(b)) })
	b.Run("wrapped", func(b *testing.B) {
		tl := newTelemetry(b)
		run(b, lockotel.WrapLocker(newLocker(b), tl.opts()...))
	})
	b.Run("wrapped-noop", func(b *testing.B) {
		run(b, lockotel.WrapLocker(newLocker(b))) // the global no-op providers
	})
}
