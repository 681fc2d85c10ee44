package lockotel

import (
	"context"
	"errors"
	"sync"
	"time"

	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/latchkey-go/latchkey/locks"
	"github.com/latchkey-go/latchkey/locks/driver"
)

// lease is a wrapped lease: it traces Release and records the lease's
// end, whatever ends it, from its context.
type lease struct {
	inner    locks.Lease
	c        *core
	ctx      context.Context // inner's context, with the caller's span
	slot     int
	acquired time.Time

	endOnce sync.Once
	stop    func() bool // unregisters the AfterFunc that records the end; set once
}

var _ locks.SlotLease = (*lease)(nil)

// newLease wraps inner, acquired at acquired by a call made with ctx
// (under a span of the wrapper's if traced), counts it as held, and has
// its end recorded when its context ends.
func (c *core) newLease(ctx context.Context, inner locks.Lease, traced bool, acquired time.Time) *lease {
	l := &lease{
		inner:    inner,
		c:        c,
		ctx:      inner.Context(),
		acquired: acquired,
	}
	// The backend made the lease's context from the call's, which
	// carries the wrapper's span if it started one; work under the lease
	// belongs to the caller's span, as it would without the wrapper. A
	// value context ends with its parent, at the same instant.
	if traced {
		if parent := trace.SpanFromContext(ctx); !trace.SpanContextFromContext(l.ctx).Equal(parent.SpanContext()) {
			l.ctx = trace.ContextWithSpan(l.ctx, parent)
		}
	}
	if sl, ok := inner.(locks.SlotLease); ok {
		l.slot = sl.Slot()
	}
	c.tally.of(inner.Name()).addHeld(1)
	// No goroutine waits for the end: one starts, briefly, when the
	// context ends (unless Release records the end itself).
	l.stop = afterEnd(inner, l.endNow)
	return l
}

// afterEnder is a lease that runs a function once it has ended, as
// context.AfterFunc on its Context does, more cheaply: the leases of the
// driver kit's backends are.
type afterEnder interface {
	AfterEnd(f func()) (stop func() bool)
}

// afterEnd runs f in its own goroutine once l has ended; stop is
// context.AfterFunc's.
func afterEnd(l locks.Lease, f func()) (stop func() bool) {
	if a, ok := l.(afterEnder); ok {
		return a.AfterEnd(f)
	}
	return context.AfterFunc(l.Context(), f)
}

// AfterEnd arranges for f to run in its own goroutine once the lease has
// ended, as context.AfterFunc on its Context does; stop unregisters f and
// reports whether it did so before f started. It lets wrappers stack at
// no extra cost.
func (l *lease) AfterEnd(f func()) (stop func() bool) { return afterEnd(l.inner, f) }

// Name returns the name the lease was acquired on.
func (l *lease) Name() string { return l.inner.Name() }

// Context returns the wrapped lease's context, carrying the span of the
// call that acquired it.
func (l *lease) Context() context.Context { return l.ctx }

// Token returns the wrapped lease's fencing token.
func (l *lease) Token() uint64 { return l.inner.Token() }

// Slot returns the wrapped lease's slot, or 0 if it does not say.
func (l *lease) Slot() int { return l.slot }

// Unwrap returns the backend's lease.
func (l *lease) Unwrap() locks.Lease { return l.inner }

// Release releases the wrapped lease, under a span if ctx is traced; see
// [locks.Lease.Release].
func (l *lease) Release(ctx context.Context) error {
	if err := driver.CheckContext(ctx, "lockotel", "release", l.inner.Name()); err != nil {
		return err
	}
	c := l.c
	start := time.Now()
	name := l.inner.Name()
	callCtx, span, fl := ctx, trace.Span(nil), (*flight)(nil)
	if c.traces(ctx) {
		callCtx, span = c.tracer.Start(ctx, releaseSpan, c.startOpts...)
		if c.flights != nil && span.IsRecording() {
			fl = c.flights.add(name, span)
		}
	}
	// Release records the end itself, so that it is in the metrics when
	// Release returns, unless the lease had ended before: then the
	// AfterFunc has started and end waits for it.
	stopped := l.stop()
	err := l.inner.Release(callCtx)
	if fl != nil {
		c.flights.remove(name, fl)
	}
	switch {
	case l.inner.Context().Err() != nil:
		l.end(start)
	case stopped:
		// Not ended by Release (a backend bug): record the end when it
		// comes.
		afterEnd(l.inner, l.endNow)
	}
	if span != nil {
		l.endReleaseSpan(span, releaseOutcome(ctx, err), err)
	}
	return err
}

// endReleaseSpan sets the attributes of a Release's span, whose outcome
// was out and error err, and ends it.
func (l *lease) endReleaseSpan(span trace.Span, out string, err error) {
	if span.IsRecording() {
		span.SetAttributes(l.c.nameAttr(l.inner.Name()), OutcomeKey.String(out),
			TokenKey.Int64(int64(l.inner.Token())), SlotKey.Int(l.slot))
	}
	switch out {
	case OutcomeLost:
		span.SetStatus(codes.Error, err.Error())
	case OutcomeError:
		span.RecordError(err)
		span.SetStatus(codes.Error, err.Error())
	}
	span.End()
}

// endNow records the lease's end now, once.
func (l *lease) endNow() { l.end(time.Now()) }

// end records the lease's end at at, once.
func (l *lease) end(at time.Time) {
	l.endOnce.Do(func() {
		c := l.c
		cause := causeOf(context.Cause(l.inner.Context()))
		n := c.tally.of(l.inner.Name())
		c.ins.hold.Record(l.ctx, at.Sub(l.acquired).Seconds(), n.holdRec[cause]...)
		n.ends[cause].Add(1)
		n.addHeld(-1)
	})
}

// releaseOutcome classifies the result of a Release made with ctx.
func releaseOutcome(ctx context.Context, err error) string {
	switch {
	case err == nil:
		return OutcomeReleased
	case errors.Is(err, locks.ErrLost):
		return OutcomeLost
	case ctx.Err() != nil && errors.Is(err, ctx.Err()):
		return OutcomeCanceled
	default:
		return OutcomeError
	}
}
