package tests

import (
	"context"
	"testing"

	"go.opentelemetry.io/otel/trace"

	"github.com/latchkey-go/latchkey/lockotel"
	"github.com/latchkey-go/latchkey/locks"
	"github.com/latchkey-go/latchkey/locks/memlock"
)

// By default, calls outside any trace start no span, and their metrics
// are recorded all the same; the lease's Context is the backend's own.
func TestNoSpanOutsideTrace(t *testing.T) {
	tl := newTelemetry(t)
	l := lockotel.WrapLocker(memClient(t, memlock.New()).Locker(), tl.opts()...)
	ctx := context.Background()
	lease, err := l.Lock(ctx, "untraced")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := l.TryLock(ctx, "untraced"); err == nil {
		t.Fatal("TryLock of a held name succeeded")
	}
	inner := lease.(interface{ Unwrap() locks.Lease }).Unwrap()
	if lease.Context() != inner.Context() {
		t.Error("an untraced lease's Context is not the backend's")
	}
	if err := lease.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if spans := tl.spans.Ended(); len(spans) != 0 {
		t.Errorf("spans outside a trace: %s", spanNames(spans))
	}
	if got := tl.sum(t, "latchkey.lock.acquisitions", op("lock"), outcome("acquired")); got != 1 {
		t.Errorf("lock acquisitions = %d, want 1", got)
	}
	if got := tl.sum(t, "latchkey.lock.acquisitions", op("trylock"), outcome("not_acquired")); got != 1 {
		t.Errorf("trylock not_acquired = %d, want 1", got)
	}
	if n, _ := tl.hist(t, "latchkey.lock.wait.duration"); n != 2 {
		t.Errorf("wait durations = %d, want 2", n)
	}
	if n, _ := tl.hist(t, "latchkey.lock.hold.duration", cause("released")); n != 1 {
		t.Errorf("hold durations = %d, want 1", n)
	}
	if got := tl.sum(t, "latchkey.lease.ends", cause("released")); got != 1 {
		t.Errorf("ends released = %d, want 1", got)
	}
}

// WithRootSpans traces calls outside any trace too, each span the root
// of its own trace.
func TestRootSpans(t *testing.T) {
	tl := newTelemetry(t)
	l := lockotel.WrapLocker(memClient(t, memlock.New()).Locker(), tl.opts(lockotel.WithRootSpans())...)
	ctx := context.Background()
	lease, err := l.Lock(ctx, "rooted")
	if err != nil {
		t.Fatal(err)
	}
	if err := lease.Release(ctx); err != nil {
		t.Fatal(err)
	}
	lock, rel := tl.lastSpan(t, "latchkey.lock"), tl.lastSpan(t, "latchkey.release")
	checkAttrs(t, lock, backend("memlock"), name("rooted"), outcome("acquired"), lockotel.TokenKey.Int64(int64(lease.Token())))
	checkAttrs(t, rel, backend("memlock"), name("rooted"), outcome("released"))
	for _, s := range []interface {
		Name() string
		Parent() trace.SpanContext
	}{lock, rel} {
		if s.Parent().IsValid() {
			t.Errorf("span %s has a parent %v, want a root span", s.Name(), s.Parent().SpanID())
		}
	}
	if lock.SpanContext().TraceID() == rel.SpanContext().TraceID() {
		t.Error("two root spans share a trace")
	}
}

// Close unregisters the counters, which leave the metrics, and stops
// the events; the histograms are still recorded.
func TestClose(t *testing.T) {
	tl := newTelemetry(t)
	l := lockotel.WrapLocker(memClient(t, memlock.New()).Locker(), tl.opts()...)
	lease, err := l.Lock(tl.ctx, "closing")
	if err != nil {
		t.Fatal(err)
	}
	if got := tl.sum(t, "latchkey.lock.acquisitions"); got != 1 {
		t.Fatalf("acquisitions before Close = %d, want 1", got)
	}
	l.Close()
	l.Close()
	if err := lease.Release(tl.ctx); err != nil {
		t.Fatal(err)
	}
	if sets := tl.attrSets(t, "latchkey.lock.acquisitions"); len(sets) != 0 {
		t.Errorf("acquisitions still reported after Close: %d points", len(sets))
	}
	if n, _ := tl.hist(t, "latchkey.lock.hold.duration"); n != 1 {
		t.Errorf("hold durations after Close = %d, want 1", n)
	}
}

// plainLease hides every method of a lease but locks.Lease's, AfterEnd
// included.
type plainLease struct{ locks.Lease }

// plainLocker hands out plainLeases.
type plainLocker struct{ inner locks.Locker }

func (p plainLocker) Lock(ctx context.Context, name string) (locks.Lease, error) {
	l, err := p.inner.Lock(ctx, name)
	if err != nil {
		return nil, err
	}
	return plainLease{l}, nil
}

func (p plainLocker) TryLock(ctx context.Context, name string) (locks.Lease, error) {
	return p.Lock(ctx, name)
}

// A lease without AfterEnd has its end recorded through its context
// (context.AfterFunc), by Release or by a loss alike.
func TestEndOfLeaseWithoutAfterEnd(t *testing.T) {
	tl := newTelemetry(t)
	store := memlock.New()
	l := lockotel.WrapLocker(plainLocker{memClient(t, store).Locker()}, tl.opts(lockotel.WithBackend("plain"))...)
	released, err := l.Lock(tl.ctx, "released")
	if err != nil {
		t.Fatal(err)
	}
	lost, err := l.Lock(tl.ctx, "lost")
	if err != nil {
		t.Fatal(err)
	}
	if err := released.Release(tl.ctx); err != nil {
		t.Fatal(err)
	}
	store.Revoke("lost")
	<-lost.Context().Done()
	eventually(t, within, "lease end with cause lost not recorded", func() bool {
		return tl.sum(t, "latchkey.lease.ends", cause("lost")) == 1
	})
	if got := tl.sum(t, "latchkey.lease.ends", cause("released")); got != 1 {
		t.Errorf("ends released = %d, want 1", got)
	}
	if got := tl.sum(t, "latchkey.leases.held", backend("plain")); got != 0 {
		t.Errorf("leases held = %d, want 0", got)
	}
}
