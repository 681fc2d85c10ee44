package lockotel

import (
	"context"

	"github.com/latchkey-go/latchkey/locks"
	"github.com/latchkey-go/latchkey/locks/driver"
)

// Locker is a [locks.Locker] that traces and measures another. Its leases
// implement [locks.SlotLease] and have an Unwrap() locks.Lease method
// that returns the backend's lease.
//
// A Locker is safe for concurrent use, as the Locker it wraps must be.
type Locker struct {
	inner locks.Locker
	c     *core
}

var (
	_ locks.Locker      = (*Locker)(nil)
	_ driver.Observable = (*Locker)(nil)
)

// WrapLocker returns a Locker that passes every call to l and records it:
// a span per call made inside a trace (per call, with [WithRootSpans]),
// the metrics of the package doc, and, if l implements
// [driver.Observable] (and no [WithoutEvents] is given), the backend's
// events until [Locker.StopEvents]. A nil l is an error, not a panic:
// every Lock and TryLock of the Locker returned then returns an error
// matching [locks.ErrInvalidOption] that says so.
func WrapLocker(l locks.Locker, opts ...Option) *Locker {
	return &Locker{inner: l, c: newCore(l, "lock", opts)}
}

// Lock calls the wrapped Lock under a span "latchkey.lock" if ctx
// is traced; see [locks.Locker.Lock].
func (l *Locker) Lock(ctx context.Context, name string) (locks.Lease, error) {
	if l.inner == nil {
		return nil, nilArg(opLock, name, "WrapLocker was given a nil Locker")
	}
	return l.c.acquire(ctx, opLock, name, l.inner.Lock)
}

// TryLock calls the wrapped TryLock under a span "latchkey.trylock" if
// ctx is traced; see [locks.Locker.TryLock].
func (l *Locker) TryLock(ctx context.Context, name string) (locks.Lease, error) {
	if l.inner == nil {
		return nil, nilArg(opTryLock, name, "WrapLocker was given a nil Locker")
	}
	return l.c.acquire(ctx, opTryLock, name, l.inner.TryLock)
}

// Unwrap returns the wrapped Locker.
func (l *Locker) Unwrap() locks.Locker { return l.inner }

// StopEvents ends the wrapper's subscription to the backend's events;
// calls and leases are still recorded. It is idempotent and safe for
// concurrent use, also from an event observer. A
// wrapper that lives as long as its backend's client need not call it:
// the subscription holds no goroutine.
func (l *Locker) StopEvents() { l.c.stopEvents() }

// Close ends the wrapper's subscription to the backend's events and
// unregisters the callback through which it reports its counters
// (acquisitions, lease ends, leases held), which then leave the metrics;
// the histograms and spans are still recorded. It is idempotent and safe
// for concurrent use. A wrapper that lives as long as its meter provider
// need not call it; one made for a shorter time should, or the provider
// keeps reporting (and holding) its counters.
func (l *Locker) Close() { l.c.close() }

// Observe implements [driver.Observable] by passing fn to the wrapped
// Locker, so that wrappers stack; if that Locker reports no events, fn is
// never called.
func (l *Locker) Observe(fn func(driver.Event)) (stop func()) { return observe(l.inner, fn) }

func (l *Locker) backendName() string { return l.c.backendName }

// Semaphore is a [locks.Semaphore] that traces and measures another. Its
// leases implement [locks.SlotLease] (with the wrapped lease's slot) and
// have an Unwrap() locks.Lease method that returns the backend's lease.
//
// A Semaphore is safe for concurrent use, as the Semaphore it wraps must
// be.
type Semaphore struct {
	inner locks.Semaphore
	c     *core
}

var (
	_ locks.Semaphore   = (*Semaphore)(nil)
	_ driver.Observable = (*Semaphore)(nil)
)

// WrapSemaphore returns a Semaphore that passes every call to s and
// records it as [WrapLocker] does. A nil s is an error, not a panic: every
// Acquire and TryAcquire of the Semaphore returned then returns an error
// matching [locks.ErrInvalidOption] that says so.
func WrapSemaphore(s locks.Semaphore, opts ...Option) *Semaphore {
	return &Semaphore{inner: s, c: newCore(s, "semaphore", opts)}
}

// Acquire calls the wrapped Acquire under a span "latchkey.acquire" if
// ctx is traced; see [locks.Semaphore.Acquire].
func (s *Semaphore) Acquire(ctx context.Context, name string) (locks.Lease, error) {
	if s.inner == nil {
		return nil, nilArg(opAcquire, name, "WrapSemaphore was given a nil Semaphore")
	}
	return s.c.acquire(ctx, opAcquire, name, s.inner.Acquire)
}

// TryAcquire calls the wrapped TryAcquire under a span
// "latchkey.tryacquire" if ctx is traced; see [locks.Semaphore.TryAcquire].
func (s *Semaphore) TryAcquire(ctx context.Context, name string) (locks.Lease, error) {
	if s.inner == nil {
		return nil, nilArg(opTryAcquire, name, "WrapSemaphore was given a nil Semaphore")
	}
	return s.c.acquire(ctx, opTryAcquire, name, s.inner.TryAcquire)
}

// Unwrap returns the wrapped Semaphore.
func (s *Semaphore) Unwrap() locks.Semaphore { return s.inner }

// StopEvents ends the wrapper's subscription to the backend's events; see
// [Locker.StopEvents].
func (s *Semaphore) StopEvents() { s.c.stopEvents() }

// Close ends the wrapper's event subscription and unregisters its
// counters' callback; see [Locker.Close].
func (s *Semaphore) Close() { s.c.close() }

// Observe implements [driver.Observable]; see [Locker.Observe].
func (s *Semaphore) Observe(fn func(driver.Event)) (stop func()) { return observe(s.inner, fn) }

func (s *Semaphore) backendName() string { return s.c.backendName }

func observe(inner any, fn func(driver.Event)) (stop func()) {
	if obs, ok := inner.(driver.Observable); ok {
		return obs.Observe(fn)
	}
	return func() {}
}

// nilArg returns the error of the operation op on name given a nil
// argument, matching [locks.ErrInvalidOption]: what returns errors here
// never panics on nil.
func nilArg(op int, name, msg string) error {
	return driver.Errorf("lockotel", opNames[op], name, driver.InvalidOption("%s", msg))
}
