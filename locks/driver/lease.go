package driver

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/latchkey-go/latchkey/locks"
)

// Spec describes a lease a backend has just won, for [Registry.NewLease]
// (or [NewLease]).
type Spec struct {
	Name  string
	Token uint64 // fencing token, 0 if the backend has none
	Slot  int    // semaphore slot from 1, 0 for a lock

	// Deadline, if not zero, is when the lease ends by itself with
	// [locks.ErrLost] unless [Lease.Extend] moves it first. TTL-based
	// backends set it to the end of the validity they can prove.
	Deadline time.Time

	// Release frees the lease at the broker, checking ownership there
	// atomically. It is called at most once, after the lease's context
	// has ended and its renewal loop has stopped. It may be nil.
	Release func(ctx context.Context) error
}

// Lease is the lease state machine every backend builds on: it owns the
// lease's context and its end cause, the validity deadline and the
// release-once logic; its [Registry] renews it. It implements
// [locks.SlotLease], but a backend hands users [Lease.Handle], never the
// Lease itself, so that Extend and End stay the backend's.
//
// A lease is live until its first end: Release, [Lease.End] (loss or
// preemption reported by the backend) or its deadline passing. The end
// cause never changes afterwards. All methods are safe for concurrent use.
type Lease struct {
	spec   Spec
	reg    *Registry       // nil for a lease made by NewLease
	ctx    context.Context // ends with the lease; internal use
	pub    *leaseContext   // ctx as Context returns it
	cancel context.CancelCauseFunc

	mu       sync.Mutex
	deadline time.Time
	timer    *time.Timer
	// rounds counts the renewal rounds under way with this lease, under
	// mu; roundsOver is closed when it falls back to 0 (nil while none
	// ran). Release waits for them before it tells the broker. A round
	// joins only while the lease is live.
	rounds     int
	roundsOver chan struct{}

	releaseOnce sync.Once
	releaseErr  error
	freeErr     error // the broker's error of the release, whoever ran it
	// bgFree, set under releaseOnce, is closed once a release finishing
	// in the background (see free) has set freeErr.
	bgFree chan struct{}

	afterEnd []*func() // see AfterEnd; under mu, nil once ended
}

var _ locks.SlotLease = (*Lease)(nil)

// NewLease returns a live lease described by spec that belongs to no
// [Registry]: nothing renews it, and no Close ends it. Backends use
// [Registry.NewLease]. Its context carries parent's values but not its
// cancellation: the call that acquired a lease may end long before the
// lease does.
func NewLease(parent context.Context, spec Spec) *Lease {
	ctx, cancel := context.WithCancelCause(context.WithoutCancel(parent))
	l := &Lease{spec: spec, ctx: ctx, cancel: cancel}
	l.pub = &leaseContext{Context: ctx, l: l}
	if !spec.Deadline.IsZero() {
		l.Extend(spec.Deadline)
	}
	return l
}

// Name returns the name the lease was acquired on.
func (l *Lease) Name() string { return l.spec.Name }

// Token returns the fencing token, 0 if the backend has none.
func (l *Lease) Token() uint64 { return l.spec.Token }

// Slot returns the semaphore slot from 1, or 0 for a lock.
func (l *Lease) Slot() int { return l.spec.Slot }

// Context returns the context that ends with the lease. Its Err checks
// the validity deadline itself, so that a process resumed after a pause
// (SIGSTOP, a long GC, a suspended VM) sees its lease ended on its first
// check, before the timer that ends it has had a chance to run.
func (l *Lease) Context() context.Context { return l.pub }

// leaseContext is a lease's context whose Err ends the lease at once when
// its deadline has passed, rather than leaving that to the timer.
type leaseContext struct {
	context.Context
	l *Lease
}

func (c *leaseContext) Err() error {
	if err := c.Context.Err(); err != nil {
		return err
	}
	c.l.mu.Lock()
	if c.l.pastDeadlineLocked() {
		c.l.endLocked(c.l.expired())
	}
	c.l.mu.Unlock()
	return c.Context.Err()
}

// Deadline returns the current validity deadline, zero if the lease has
// none.
func (l *Lease) Deadline() time.Time {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.deadline
}

// pastDeadlineLocked reports whether the validity deadline has passed,
// whether or not its timer has run yet (a process resumed after a pause).
// Call with l.mu held.
func (l *Lease) pastDeadlineLocked() bool {
	return !l.deadline.IsZero() && !time.Now().Before(l.deadline)
}

// Extend moves the validity deadline to until and reports whether the
// lease is still live. A deadline already past, the current one or
// until, ends the lease at once: a renewal answered after the lease ran
// out does not bring it back.
func (l *Lease) Extend(until time.Time) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.ctx.Err() != nil {
		return false
	}
	if l.pastDeadlineLocked() {
		l.endLocked(l.expired())
		return false
	}
	l.deadline = until
	d := time.Until(until)
	if l.timer == nil {
		l.timer = time.AfterFunc(d, l.expire)
	} else {
		l.timer.Reset(d)
	}
	return true
}

func (l *Lease) expire() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if d := time.Until(l.deadline); d > 0 { // moved by a concurrent Extend
		if l.ctx.Err() == nil {
			l.timer.Reset(d)
		}
		return
	}
	l.endLocked(l.expired())
}

// expired is the cause of a lease whose deadline passed.
func (l *Lease) expired() error {
	return Lost(fmt.Errorf("%q: validity deadline passed without a renewal", l.spec.Name))
}

// End ends the lease with cause unless it has ended already, and reports
// whether this call ended it; a lease whose deadline has passed ends as
// expired, whatever the cause. Backends call it with [Lost] or [Preempted]
// when the broker tells them the lease is gone. It does not touch the
// broker: call Release for that.
func (l *Lease) End(cause error) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.endLocked(cause)
}

func (l *Lease) endLocked(cause error) bool {
	if l.ctx.Err() != nil {
		return false
	}
	if l.pastDeadlineLocked() {
		cause = l.expired() // it ran out first, whatever ends it now
	}
	l.cancel(cause)
	if l.timer != nil {
		l.timer.Stop()
	}
	for _, f := range l.afterEnd {
		go (*f)()
	}
	l.afterEnd = nil
	return true
}

// AfterEnd arranges for f to run in its own goroutine once the lease has
// ended (at once if it has), as context.AfterFunc(l.Context(), f) does,
// at a fraction of its cost; code that wraps leases to record their end
// (lockotel) uses it. Calling stop unregisters f; stop reports whether it
// did so before f was started.
func (l *Lease) AfterEnd(f func()) (stop func() bool) {
	p := &f
	l.mu.Lock()
	if l.ctx.Err() != nil {
		l.mu.Unlock()
		go f()
		return func() bool { return false }
	}
	l.afterEnd = append(l.afterEnd, p)
	l.mu.Unlock()
	return func() bool {
		l.mu.Lock()
		defer l.mu.Unlock()
		for i, q := range l.afterEnd {
			if q == p {
				l.afterEnd = append(l.afterEnd[:i], l.afterEnd[i+1:]...)
				return true
			}
		}
		return false
	}
}

// Live reports whether the lease has not ended yet, its deadline
// included (see [Lease.Context]).
func (l *Lease) Live() bool { return l.pub.Err() == nil }

// Release ends the lease with [locks.ErrReleased], waits for any renewal
// under way to finish and frees the lease at the broker; see
// [locks.Lease.Release]. If ctx ends while it waits for the renewal, it
// returns ctx's error and frees the lease in the background once the
// renewal is over, with ctx's values but not its cancellation (the
// backend bounds its calls); a [Registry.Close] waits for that release
// and returns its error.
func (l *Lease) Release(ctx context.Context) error {
	if err := CheckContext(ctx, l.backend(), "release", l.spec.Name); err != nil {
		return err // the lease stays held: Release may be called again
	}
	l.releaseOnce.Do(func() {
		released := l.End(locks.ErrReleased)
		err := l.free(ctx)
		// A lease that had ended already reports why (ErrLost...), also
		// when the cleanup at the broker failed too.
		var errs []error
		if !released {
			errs = append(errs, context.Cause(l.ctx))
		}
		if err != nil {
			if cerr := ctx.Err(); cerr != nil && !errors.Is(err, cerr) {
				errs = append(errs, cerr)
			}
			errs = append(errs, err)
		}
		if len(errs) > 0 {
			l.releaseErr = Errorf(l.backend(), "release", l.spec.Name, errors.Join(errs...))
		}
	})
	return l.releaseErr
}

// free waits for the renewals under way, calls the spec's Release, and
// forgets the lease in its registry. It sets l.freeErr to the broker's
// error and returns it. It runs under releaseOnce.
//
// If ctx ends while a renewal round is under way, free returns ctx's
// error at once and finishes in the background: once the round is over,
// it calls the spec's Release with ctx's values but not its cancellation
// (the backend bounds its own calls, as for [Registry.Close]; a context
// that a Close ends would leave the name held until the broker's TTL),
// sets l.freeErr and closes l.bgFree. A Close waits for it and returns its
// error.
func (l *Lease) free(ctx context.Context) error {
	if over := l.roundsUnderWay(); over != nil {
		select {
		case <-over:
		case <-ctx.Done():
			l.bgFree = make(chan struct{})
			bg := func() {
				<-over // the round is bounded by the lease's deadline
				l.freeErr = l.release(context.WithoutCancel(ctx))
				close(l.bgFree)
			}
			if l.reg == nil || !l.reg.Go(bg) {
				go bg()
			}
			return ctx.Err()
		}
	}
	l.freeErr = l.release(ctx)
	return l.freeErr
}

// release calls the spec's Release and forgets the lease in its
// registry. It returns the broker's error.
func (l *Lease) release(ctx context.Context) error {
	var err error
	if l.spec.Release != nil {
		err = l.spec.Release(ctx)
	}
	if l.reg != nil {
		l.reg.forget(l)
	}
	return err
}

func (l *Lease) backend() string {
	if l.reg != nil {
		return l.reg.backend
	}
	return "locks"
}

// joinRound counts the lease into a renewal round unless it has ended,
// and reports whether it did; the round calls l.roundDone after.
func (l *Lease) joinRound() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.ctx.Err() != nil {
		return false
	}
	if l.rounds == 0 {
		l.roundsOver = make(chan struct{})
	}
	l.rounds++
	return true
}

// roundDone counts a round of joinRound's out.
func (l *Lease) roundDone() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.rounds--; l.rounds == 0 {
		close(l.roundsOver)
	}
}

// roundsUnderWay returns a channel closed once the renewal rounds under
// way with the lease are over, or nil if none is.
func (l *Lease) roundsUnderWay() <-chan struct{} {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.rounds == 0 {
		return nil
	}
	return l.roundsOver
}

// Handle returns the lease as users see it: a [locks.SlotLease] whose
// methods are the lease's, without Extend, End or the rest of the
// backend's side. Every call returns an equal value.
func (l *Lease) Handle() locks.SlotLease { return handle{l} }

type handle struct{ l *Lease }

func (h handle) Name() string                      { return h.l.Name() }
func (h handle) Context() context.Context          { return h.l.Context() }
func (h handle) Token() uint64                     { return h.l.Token() }
func (h handle) Slot() int                         { return h.l.Slot() }
func (h handle) Release(ctx context.Context) error { return h.l.Release(ctx) }

// AfterEnd is [Lease.AfterEnd].
func (h handle) AfterEnd(f func()) (stop func() bool) { return h.l.AfterEnd(f) }
