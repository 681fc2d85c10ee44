package lockotel

import (
	"context"
	"errors"
	"sync"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"

	"github.com/latchkey-go/latchkey/locks"
)

// lease is a wrapped lease: it traces Release and records the lease's
// end, whatever ends it, from its context.
type lease struct {
	inner    locks.Lease
	c        *core
	ctx      context.Context // inner's context, with the caller's span
	slot     int
	nameKV   attribute.KeyValue
	acquired time.Time

	endOnce sync.Once
	stop    func() bool // unregisters the AfterFunc that records the end; set once
}

var _ locks.SlotLease = (*lease)(nil)

// newLease wraps inner, acquired at acquired by a call whose caller's span
// was parent, counts it as held, and has its end recorded when its
// context ends.
func (c *core) newLease(inner locks.Lease, parent trace.Span, nameKV attribute.KeyValue, acquired time.Time) *lease {
	l := &lease{
		inner:    inner,
		c:        c,
		ctx:      inner.Context(),
		nameKV:   nameKV,
		acquired: acquired,
	}
	// The backend made the lease's context from the call's, which
	// carries the call's span; work under the lease belongs to the
	// caller's span, as it would without the wrapper. A value context
	// ends with its parent, at the same instant.
	if !trace.SpanContextFromContext(l.ctx).Equal(parent.SpanContext()) {
		l.ctx = trace.ContextWithSpan(l.ctx, parent)
	}
	if sl, ok := inner.(locks.SlotLease); ok {
		l.slot = sl.Slot()
	}
	c.ins.held.Add(l.ctx, 1, c.heldMeasure(nameKV))
	// No goroutine waits for the end: AfterFunc starts one, briefly, when
	// the context ends (unless Release records the end itself).
	l.stop = context.AfterFunc(inner.Context(), func() { l.end(time.Now()) })
	return l
}

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

// Release releases the wrapped lease under a span; see [locks.Lease.Release].
func (l *lease) Release(ctx context.Context) error {
	c := l.c
	start := time.Now()
	ctx, span := c.tracer.Start(ctx, releaseSpan, trace.WithSpanKind(trace.SpanKindClient),
		trace.WithAttributes(c.backend, c.kind, l.nameKV,
			TokenKey.Int64(int64(l.inner.Token())), SlotKey.Int(l.slot)))
	name := l.inner.Name()
	var fl *flight
	if c.flights != nil && span.IsRecording() {
		fl = c.flights.add(name, span)
	}
	// Release records the end itself, so that it is in the metrics when
	// Release returns, unless the lease had ended before: then the
	// AfterFunc has started and end waits for it.
	stopped := l.stop()
	err := l.inner.Release(ctx)
	if fl != nil {
		c.flights.remove(name, fl)
	}
	switch {
	case l.inner.Context().Err() != nil:
		l.end(start)
	case stopped:
		// Not ended by Release (a backend bug): record the end when it
		// comes.
		context.AfterFunc(l.inner.Context(), func() { l.end(time.Now()) })
	}
	out := releaseOutcome(ctx, err)
	if span.IsRecording() {
		span.SetAttributes(OutcomeKey.String(out))
	}
	switch out {
	case OutcomeLost:
		span.SetStatus(codes.Error, err.Error())
	case OutcomeError:
		span.RecordError(err)
		span.SetStatus(codes.Error, err.Error())
	}
	span.End()
	return err
}

// end records the lease's end at at, once.
func (l *lease) end(at time.Time) {
	l.endOnce.Do(func() {
		c := l.c
		cause := causeOf(context.Cause(l.inner.Context()))
		opt := c.endOpts[cause]
		if c.metricNames {
			opt = metric.WithAttributes(c.backend, c.kind, CauseKey.String(causeNames[cause]), l.nameKV)
		}
		c.ins.hold.Record(l.ctx, at.Sub(l.acquired).Seconds(), opt)
		c.ins.ends.Add(l.ctx, 1, opt)
		c.ins.held.Add(l.ctx, -1, c.heldMeasure(l.nameKV))
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
