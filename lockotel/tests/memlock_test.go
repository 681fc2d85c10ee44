package tests

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"
	"go.uber.org/goleak"

	"github.com/latchkey-go/latchkey/lockotel"
	"github.com/latchkey-go/latchkey/locks"
	"github.com/latchkey-go/latchkey/locks/memlock"
)

func memClient(t testing.TB, store *memlock.Store, opts ...memlock.Option) *memlock.Client {
	t.Helper()
	c, err := store.NewClient(opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close(context.Background()) })
	return c
}

// The calls of a Locker become spans with their attributes and outcome,
// and the wait, acquisition, hold, end and held metrics count them.
func TestLockerSpansAndMetrics(t *testing.T) {
	tl := newTelemetry(t)
	store := memlock.New()
	a := lockotel.WrapLocker(memClient(t, store).Locker(), tl.opts()...)
	b := lockotel.WrapLocker(memClient(t, store).Locker(), tl.opts()...)
	ctx, parent := tl.tp.Tracer("test").Start(tl.ctx, "caller")

	lease, err := a.Lock(ctx, "jobs")
	if err != nil {
		t.Fatal(err)
	}
	if got := tl.sum(t, "latchkey.leases.held", backend("memlock"), kind("lock")); got != 1 {
		t.Errorf("leases held while locked = %d, want 1", got)
	}
	if _, err := b.TryLock(ctx, "jobs"); !errors.Is(err, locks.ErrNotAcquired) {
		t.Fatalf("TryLock on a held name: %v, want ErrNotAcquired", err)
	}
	// Work under the lease belongs to the caller's span.
	if got := trace.SpanContextFromContext(lease.Context()); !got.Equal(parent.SpanContext()) {
		t.Errorf("lease context's span = %v, want the caller's %v", got.SpanID(), parent.SpanContext().SpanID())
	}
	inner := lease.(interface{ Unwrap() locks.Lease }).Unwrap()
	time.Sleep(20 * time.Millisecond)
	if err := lease.Release(ctx); err != nil {
		t.Fatal(err)
	}
	parent.End()

	lock := tl.lastSpan(t, "latchkey.lock")
	checkAttrs(t, lock, backend("memlock"), kind("lock"), name("jobs"), outcome("acquired"),
		lockotel.TokenKey.Int64(int64(inner.Token())), lockotel.SlotKey.Int(inner.(locks.SlotLease).Slot()))
	if lock.Parent().SpanID() != parent.SpanContext().SpanID() {
		t.Errorf("lock span's parent is %v, want the caller's span", lock.Parent().SpanID())
	}
	if lock.SpanKind() != trace.SpanKindClient {
		t.Errorf("lock span kind %v, want client", lock.SpanKind())
	}
	try := tl.lastSpan(t, "latchkey.trylock")
	checkAttrs(t, try, outcome("not_acquired"), name("jobs"))
	if try.Status().Code != codes.Unset {
		t.Errorf("not_acquired trylock span status %v, want unset", try.Status())
	}
	if v := attr(try, lockotel.TokenKey); v.Type() != attribute.EMPTY {
		t.Errorf("trylock that failed has a token attribute %s", show(v))
	}
	rel := tl.lastSpan(t, "latchkey.release")
	checkAttrs(t, rel, outcome("released"), name("jobs"), lockotel.TokenKey.Int64(int64(inner.Token())))

	if got := tl.sum(t, "latchkey.lock.acquisitions", op("lock"), outcome("acquired")); got != 1 {
		t.Errorf("lock acquisitions = %d, want 1", got)
	}
	if got := tl.sum(t, "latchkey.lock.acquisitions", op("trylock"), outcome("not_acquired")); got != 1 {
		t.Errorf("trylock not_acquired = %d, want 1", got)
	}
	if n, _ := tl.hist(t, "latchkey.lock.wait.duration", backend("memlock")); n != 2 {
		t.Errorf("wait durations recorded = %d, want 2", n)
	}
	if n, s := tl.hist(t, "latchkey.lock.hold.duration", cause("released")); n != 1 || s < 0.02 || s > 10 {
		t.Errorf("hold durations with cause released: %d totalling %vs, want 1 of at least 0.02s", n, s)
	}
	if got := tl.sum(t, "latchkey.lease.ends", cause("released"), kind("lock")); got != 1 {
		t.Errorf("lease ends released = %d, want 1", got)
	}
	if got := tl.sum(t, "latchkey.leases.held"); got != 0 {
		t.Errorf("leases held after release = %d, want 0", got)
	}
	for metric, want := range map[string]string{
		"latchkey.lock.wait.duration": "s", "latchkey.lock.hold.duration": "s",
		"latchkey.lock.acquisitions": "{call}", "latchkey.lease.ends": "{lease}", "latchkey.leases.held": "{lease}",
	} {
		if got := tl.unit(t, metric); got != want {
			t.Errorf("%s unit %q, want %q", metric, got, want)
		}
	}
	// Names are on spans only unless WithMetricNames.
	for _, set := range tl.attrSets(t, "latchkey.lock.acquisitions") {
		if _, ok := set.Value(lockotel.NameKey); ok {
			t.Errorf("acquisitions carry a name without WithMetricNames: %v", set.Encoded(attribute.DefaultEncoder()))
		}
	}
}

// A Lock whose context ends is "canceled"; a call that fails otherwise is
// "error", with the span's status set.
func TestCanceledAndError(t *testing.T) {
	tl := newTelemetry(t)
	store := memlock.New()
	holder, _ := memClient(t, store).Locker().Lock(tl.ctx, "busy")
	defer holder.Release(tl.ctx)
	l := lockotel.WrapLocker(memClient(t, store).Locker(), tl.opts()...)

	ctx, cancel := context.WithTimeout(tl.ctx, 50*time.Millisecond)
	defer cancel()
	if _, err := l.Lock(ctx, "busy"); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Lock past its deadline: %v", err)
	}
	checkAttrs(t, tl.lastSpan(t, "latchkey.lock"), outcome("canceled"))
	if got := tl.sum(t, "latchkey.lock.acquisitions", op("lock"), outcome("canceled")); got != 1 {
		t.Errorf("canceled acquisitions = %d, want 1", got)
	}

	if _, err := l.TryLock(tl.ctx, ""); !errors.Is(err, locks.ErrInvalidName) {
		t.Fatalf("TryLock(\"\"): %v, want ErrInvalidName", err)
	}
	span := tl.lastSpan(t, "latchkey.trylock")
	checkAttrs(t, span, outcome("error"))
	if span.Status().Code != codes.Error {
		t.Errorf("error span status %v, want Error", span.Status())
	}
	if len(span.Events()) == 0 || span.Events()[0].Name != "exception" {
		t.Errorf("error span has no exception event: %v", span.Events())
	}
	if got := tl.sum(t, "latchkey.lock.acquisitions", outcome("error")); got != 1 {
		t.Errorf("error acquisitions = %d, want 1", got)
	}
}

// A lease taken away at the broker ends with cause lost; Release then
// reports the loss on its span, and the end is counted once.
func TestLostLease(t *testing.T) {
	tl := newTelemetry(t)
	store := memlock.New()
	l := lockotel.WrapLocker(memClient(t, store).Locker(), tl.opts()...)
	lease, err := l.Lock(tl.ctx, "revoked")
	if err != nil {
		t.Fatal(err)
	}
	if n := store.Revoke("revoked"); n != 1 {
		t.Fatalf("Revoke ended %d leases", n)
	}
	<-lease.Context().Done()
	eventually(t, 5*time.Second, "lease end with cause lost not recorded", func() bool {
		return tl.sum(t, "latchkey.lease.ends", cause("lost")) == 1
	})
	if got := tl.sum(t, "latchkey.leases.held"); got != 0 {
		t.Errorf("leases held after the loss = %d, want 0", got)
	}
	if n, _ := tl.hist(t, "latchkey.lock.hold.duration", cause("lost")); n != 1 {
		t.Errorf("hold durations with cause lost = %d, want 1", n)
	}
	if err := lease.Release(tl.ctx); !errors.Is(err, locks.ErrLost) {
		t.Fatalf("Release of a lost lease: %v, want ErrLost", err)
	}
	rel := tl.lastSpan(t, "latchkey.release")
	checkAttrs(t, rel, outcome("lost"))
	if rel.Status().Code != codes.Error {
		t.Errorf("release of a lost lease: status %v, want Error", rel.Status())
	}
	if got := tl.sum(t, "latchkey.lease.ends"); got != 1 {
		t.Errorf("lease ends = %d after Release of a lost lease, want 1", got)
	}
}

// A lease that a higher priority takes ends with cause preempted.
func TestPreemptedLease(t *testing.T) {
	tl := newTelemetry(t)
	store := memlock.New()
	low := lockotel.WrapLocker(memClient(t, store).Locker(), tl.opts()...)
	high := lockotel.WrapLocker(memClient(t, store, memlock.WithPriority(1)).Locker(), tl.opts()...)
	victim, err := low.Lock(tl.ctx, "contested")
	if err != nil {
		t.Fatal(err)
	}
	thief, err := high.Lock(tl.ctx, "contested")
	if err != nil {
		t.Fatal(err)
	}
	defer thief.Release(tl.ctx)
	<-victim.Context().Done()
	if !errors.Is(context.Cause(victim.Context()), locks.ErrPreempted) {
		t.Fatalf("victim's cause: %v", context.Cause(victim.Context()))
	}
	eventually(t, 5*time.Second, "lease end with cause preempted not recorded", func() bool {
		return tl.sum(t, "latchkey.lease.ends", cause("preempted")) == 1
	})
	if got := tl.sum(t, "latchkey.lease.ends", cause("lost")); got != 0 {
		t.Errorf("a preemption was also counted as lost (%d)", got)
	}
	if got := tl.sum(t, "latchkey.leases.held"); got != 1 {
		t.Errorf("leases held = %d, want 1 (the thief's)", got)
	}
}

// Leases of a closed client end with cause closed.
func TestClosedCause(t *testing.T) {
	tl := newTelemetry(t)
	c := memClient(t, memlock.New())
	l := lockotel.WrapLocker(c.Locker(), tl.opts()...)
	if _, err := l.Lock(tl.ctx, "a"); err != nil {
		t.Fatal(err)
	}
	_ = c.Close(tl.ctx)
	eventually(t, 5*time.Second, "lease end with cause closed not recorded", func() bool {
		return tl.sum(t, "latchkey.lease.ends", cause("closed")) == 1
	})
}

// A Semaphore's spans and metrics say "semaphore" and carry each
// lease's slot.
func TestSemaphore(t *testing.T) {
	tl := newTelemetry(t)
	sem, err := memClient(t, memlock.New()).Semaphore(2)
	if err != nil {
		t.Fatal(err)
	}
	s := lockotel.WrapSemaphore(sem, tl.opts()...)
	ctx := tl.ctx
	a, err := s.Acquire(ctx, "pool")
	if err != nil {
		t.Fatal(err)
	}
	b, err := s.TryAcquire(ctx, "pool")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.TryAcquire(ctx, "pool"); !errors.Is(err, locks.ErrNotAcquired) {
		t.Fatalf("third TryAcquire: %v", err)
	}
	slots := map[int]bool{a.(locks.SlotLease).Slot(): true, b.(locks.SlotLease).Slot(): true}
	if !slots[1] || !slots[2] {
		t.Errorf("slots %v, want 1 and 2", slots)
	}
	checkAttrs(t, tl.lastSpan(t, "latchkey.acquire"), kind("semaphore"), outcome("acquired"),
		lockotel.SlotKey.Int(a.(locks.SlotLease).Slot()))
	checkAttrs(t, tl.ended("latchkey.tryacquire")[0], outcome("acquired"), lockotel.SlotKey.Int(b.(locks.SlotLease).Slot()))
	checkAttrs(t, tl.lastSpan(t, "latchkey.tryacquire"), outcome("not_acquired"))
	if got := tl.sum(t, "latchkey.leases.held", kind("semaphore")); got != 2 {
		t.Errorf("semaphore leases held = %d, want 2", got)
	}
	_ = a.Release(ctx)
	_ = b.Release(ctx)
	checkAttrs(t, tl.lastSpan(t, "latchkey.release"), kind("semaphore"), lockotel.SlotKey.Int(b.(locks.SlotLease).Slot()))
	if got := tl.sum(t, "latchkey.lease.ends", kind("semaphore"), cause("released")); got != 2 {
		t.Errorf("semaphore ends = %d, want 2", got)
	}
}

// WithHashedNames shows a hash instead of the name, on spans and, with
// WithMetricNames, on metrics.
func TestHashedNames(t *testing.T) {
	tl := newTelemetry(t)
	l := lockotel.WrapLocker(memClient(t, memlock.New()).Locker(),
		tl.opts(lockotel.WithHashedNames(), lockotel.WithMetricNames())...)
	lease, err := l.Lock(tl.ctx, "customer-4711")
	if err != nil {
		t.Fatal(err)
	}
	_ = lease.Release(tl.ctx)
	hash := lockotel.HashName("customer-4711")
	if len(hash) != 16 || hash == lockotel.HashName("customer-4712") {
		t.Fatalf("HashName gives %q", hash)
	}
	for _, span := range tl.spans.Ended() {
		checkAttrs(t, span, lockotel.NameHashKey.String(hash))
		if v := attr(span, lockotel.NameKey); v.Type() != attribute.EMPTY {
			t.Errorf("span %s shows the name %s", span.Name(), show(v))
		}
	}
	for _, metric := range []string{"latchkey.lock.acquisitions", "latchkey.lease.ends", "latchkey.lock.hold.duration", "latchkey.lock.wait.duration"} {
		sets := tl.attrSets(t, metric)
		if len(sets) == 0 {
			t.Errorf("no points of %s", metric)
		}
		for _, set := range sets {
			if v, _ := set.Value(lockotel.NameHashKey); v.AsString() != hash {
				t.Errorf("%s point without the hash: %s", metric, set.Encoded(attribute.DefaultEncoder()))
			}
			if _, ok := set.Value(lockotel.NameKey); ok {
				t.Errorf("%s point shows the name: %s", metric, set.Encoded(attribute.DefaultEncoder()))
			}
		}
	}
}

// WithMetricNames puts the name on metrics; WithBackend names the backend.
func TestMetricNamesAndBackend(t *testing.T) {
	tl := newTelemetry(t)
	l := lockotel.WrapLocker(memClient(t, memlock.New()).Locker(),
		tl.opts(lockotel.WithMetricNames(), lockotel.WithBackend("custom"))...)
	lease, err := l.Lock(tl.ctx, "reports")
	if err != nil {
		t.Fatal(err)
	}
	if got := tl.sum(t, "latchkey.leases.held", name("reports"), backend("custom")); got != 1 {
		t.Errorf("held with name and backend = %d, want 1", got)
	}
	_ = lease.Release(tl.ctx)
	if got := tl.sum(t, "latchkey.lock.acquisitions", name("reports"), backend("custom")); got != 1 {
		t.Errorf("acquisitions with name and backend = %d, want 1", got)
	}
	if got := tl.sum(t, "latchkey.lease.ends", name("reports"), cause("released")); got != 1 {
		t.Errorf("ends with name = %d, want 1", got)
	}
	checkAttrs(t, tl.lastSpan(t, "latchkey.lock"), backend("custom"))
}

// Release stays idempotent through the wrapper: every call returns the
// first one's result, each has its span, and the end is counted once.
func TestReleaseIdempotent(t *testing.T) {
	tl := newTelemetry(t)
	l := lockotel.WrapLocker(memClient(t, memlock.New()).Locker(), tl.opts()...)
	lease, err := l.Lock(tl.ctx, "twice")
	if err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		if err := lease.Release(tl.ctx); err != nil {
			t.Fatalf("Release #%d: %v", i+1, err)
		}
	}
	if n := len(tl.ended("latchkey.release")); n != 3 {
		t.Errorf("release spans = %d, want 3", n)
	}
	if got := tl.sum(t, "latchkey.lease.ends"); got != 1 {
		t.Errorf("lease ends = %d, want 1", got)
	}
	if got := tl.sum(t, "latchkey.leases.held"); got != 0 {
		t.Errorf("leases held = %d, want 0", got)
	}
}

// A held lease costs no goroutine of the wrapper's: holding many wrapped
// leases starts no more goroutines than holding as many unwrapped ones.
func TestNoGoroutinePerLease(t *testing.T) {
	tl := newTelemetry(t)
	const n = 200
	hold := func(l locks.Locker) int {
		var leases []locks.Lease
		for i := range n {
			lease, err := l.Lock(tl.ctx, "g"+string(rune('a'+i%26))+string(rune('a'+i/26)))
			if err != nil {
				t.Fatal(err)
			}
			leases = append(leases, lease)
		}
		g := runtime.NumGoroutine()
		for _, lease := range leases {
			_ = lease.Release(tl.ctx)
		}
		return g
	}
	store := memlock.New()
	plain := hold(memClient(t, store).Locker())
	wrapped := hold(lockotel.WrapLocker(memClient(t, store).Locker(), tl.opts()...))
	if wrapped-plain > n/4 {
		t.Errorf("holding %d wrapped leases ran %d goroutines, %d unwrapped", n, wrapped, plain)
	}
	if got := tl.sum(t, "latchkey.lease.ends", cause("released")); got != n {
		t.Errorf("ends = %d, want %d", got, n)
	}
}

// Concurrent Releases are safe: one end is recorded, and every call
// returns nil.
func TestConcurrentRelease(t *testing.T) {
	tl := newTelemetry(t)
	l := lockotel.WrapLocker(memClient(t, memlock.New()).Locker(), tl.opts()...)
	lease, err := l.Lock(tl.ctx, "concurrent")
	if err != nil {
		t.Fatal(err)
	}
	errs := make(chan error, 8)
	for range 8 {
		go func() { errs <- lease.Release(tl.ctx) }()
	}
	for range 8 {
		if err := <-errs; err != nil {
			t.Errorf("Release: %v", err)
		}
	}
	if got := tl.sum(t, "latchkey.lease.ends", cause("released")); got != 1 {
		t.Errorf("ends = %d, want 1", got)
	}
	if got := tl.sum(t, "latchkey.leases.held"); got != 0 {
		t.Errorf("leases held = %d, want 0", got)
	}
}

// nothingLocker is a broken backend whose calls return neither a lease
// nor an error.
type nothingLocker struct{}

func (nothingLocker) Lock(context.Context, string) (locks.Lease, error)    { return nil, nil }
func (nothingLocker) TryLock(context.Context, string) (locks.Lease, error) { return nil, nil }

// The wrapper turns a backend's (nil, nil) into an error, so callers never
// get a nil lease without one.
func TestNeitherLeaseNorError(t *testing.T) {
	tl := newTelemetry(t)
	l := lockotel.WrapLocker(nothingLocker{}, tl.opts()...)
	lease, err := l.TryLock(tl.ctx, "x")
	if lease != nil || err == nil {
		t.Fatalf("TryLock = %v, %v; want nil and an error", lease, err)
	}
	checkAttrs(t, tl.lastSpan(t, "latchkey.trylock"), outcome("error"), backend("tests"))
}

// No goroutine of the wrapper's outlives its leases, whether they end by
// Release, by a loss or by their client's Close.
func TestNoGoroutineOutlivesLeases(t *testing.T) {
	ignore := goleak.IgnoreCurrent()
	tl := newTelemetry(t)
	store := memlock.New()
	c, err := store.NewClient()
	if err != nil {
		t.Fatal(err)
	}
	l := lockotel.WrapLocker(c.Locker(), tl.opts()...)
	var leases []locks.Lease
	for i := range 30 {
		lease, err := l.Lock(tl.ctx, fmt.Sprintf("leak-%d", i))
		if err != nil {
			t.Fatal(err)
		}
		leases = append(leases, lease)
	}
	for i, lease := range leases {
		switch i % 3 {
		case 0:
			_ = lease.Release(tl.ctx)
		case 1:
			store.Revoke(lease.Name())
		}
	}
	_ = c.Close(tl.ctx) // ends the third third
	eventually(t, within, "not every end recorded", func() bool { return tl.sum(t, "latchkey.lease.ends") == 30 })
	goleak.VerifyNone(t, ignore)
}
