package lockotel

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"path"
	"reflect"
	"regexp"
	"sync"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"

	"github.com/latchkey-go/latchkey/locks"
	"github.com/latchkey-go/latchkey/locks/driver"
)

// The acquiring operations, as indices into counts.calls.
const (
	opLock = iota
	opTryLock
	opAcquire
	opTryAcquire
	numOps
)

var (
	opNames   = [numOps]string{"lock", "trylock", "acquire", "tryacquire"}
	spanNames = [numOps]string{"latchkey.lock", "latchkey.trylock", "latchkey.acquire", "latchkey.tryacquire"}
)

const releaseSpan = "latchkey.release"

// The outcomes of an acquiring call, as indices into counts.calls.
const (
	outAcquired = iota
	outNotAcquired
	outCanceled
	outError
	numOutcomes
)

var (
	outcomeNames = [numOutcomes]string{OutcomeAcquired, OutcomeNotAcquired, OutcomeCanceled, OutcomeError}
	outcomeAttrs = [numOutcomes]attribute.KeyValue{
		OutcomeKey.String(OutcomeAcquired), OutcomeKey.String(OutcomeNotAcquired),
		OutcomeKey.String(OutcomeCanceled), OutcomeKey.String(OutcomeError),
	}
)

// The causes of a lease's end, as indices into counts.ends.
const (
	causeReleased = iota
	causeLost
	causePreempted
	causeClosed
	causeOther
	numCauses
)

var causeNames = [numCauses]string{CauseReleased, CauseLost, CausePreempted, CauseClosed, CauseOther}

// core is what a Locker and a Semaphore wrapper share: the providers'
// tracer and instruments, the constant attributes, and the subscription
// to the backend's events.
type core struct {
	tracer      trace.Tracer
	ins         *instruments
	backendName string
	backend     attribute.KeyValue
	kind        attribute.KeyValue
	hashNames   bool
	metricNames bool
	rootSpans   bool

	// Made once, so that a call allocates none of them: the options of
	// every span, and the measurement options of metrics without names.
	startOpts []trace.SpanStartOption
	eventOpt  metric.MeasurementOption
	tally     *tally
	reg       metric.Registration // of tally's callback; nil if refused

	flights  *flights // calls under way, for span events; nil without events
	stop     func()   // ends the event subscription
	stopOnce sync.Once

	closeOnce sync.Once
}

func newCore(inner any, kind string, opts []Option) *core {
	var cfg config
	for _, o := range opts {
		if o != nil {
			o(&cfg)
		}
	}
	if cfg.tracers == nil {
		cfg.tracers = otel.GetTracerProvider()
	}
	if cfg.meters == nil {
		cfg.meters = otel.GetMeterProvider()
	}
	if cfg.backend == "" {
		cfg.backend = backendOf(inner)
	}
	meter := cfg.meters.Meter(Scope)
	c := &core{
		tracer:      cfg.tracers.Tracer(Scope),
		ins:         newInstruments(meter),
		backendName: cfg.backend,
		backend:     BackendKey.String(cfg.backend),
		kind:        KindKey.String(kind),
		hashNames:   cfg.hashNames,
		metricNames: cfg.metricNames,
		rootSpans:   cfg.rootSpans,
	}
	c.startOpts = []trace.SpanStartOption{trace.WithSpanKind(trace.SpanKindClient), trace.WithAttributes(c.backend, c.kind)}
	c.tally = &tally{c: c}
	if !c.metricNames {
		c.tally.all = newCounts(c.backend, c.kind)
	}
	reg, err := meter.RegisterCallback(c.tally.observe, c.ins.acquisitions, c.ins.ends, c.ins.held)
	handle(err)
	c.reg = reg
	c.eventOpt = metric.WithAttributeSet(attribute.NewSet(c.backend))
	if obs, ok := inner.(driver.Observable); ok && !cfg.noEvents {
		c.flights = &flights{byName: make(map[string][]*flight)}
		c.stop = obs.Observe(c.onEvent)
	}
	return c
}

// close ends the event subscription and unregisters the callback of the
// observable counters, once.
func (c *core) close() {
	c.stopEvents()
	c.closeOnce.Do(func() {
		if c.reg != nil {
			handle(c.reg.Unregister())
		}
	})
}

// stopEvents ends the event subscription, once.
func (c *core) stopEvents() {
	c.stopOnce.Do(func() {
		if c.stop != nil {
			c.stop()
		}
	})
}

// versionElem matches a major-version suffix of a module path ("v2").
var versionElem = regexp.MustCompile(`^v[0-9]+$`)

// backendOf names the backend of v after its type's package.
func backendOf(v any) string {
	if w, ok := v.(interface{ backendName() string }); ok {
		return w.backendName()
	}
	t := reflect.TypeOf(v)
	for t != nil && t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if t == nil || t.PkgPath() == "" {
		return "unknown"
	}
	p := t.PkgPath()
	if base := path.Base(p); !versionElem.MatchString(base) || path.Dir(p) == "." {
		return base
	}
	return path.Base(path.Dir(p))
}

// HashName returns the hash that [WithHashedNames] shows for name: the
// first 8 bytes of its SHA-256, in hex.
func HashName(name string) string {
	sum := sha256.Sum256([]byte(name))
	return hex.EncodeToString(sum[:8])
}

// nameAttr is the attribute that shows name.
func (c *core) nameAttr(name string) attribute.KeyValue {
	if c.hashNames {
		return NameHashKey.String(HashName(name))
	}
	return NameKey.String(name)
}

// traces reports whether a call made with ctx gets a span: with
// [WithRootSpans], or when ctx carries a valid span context, which the
// call's span then continues.
func (c *core) traces(ctx context.Context) bool {
	return c.rootSpans || trace.SpanContextFromContext(ctx).IsValid()
}

// acquire runs one acquiring call of op on name, under a span if ctx is
// traced, and wraps the lease it returns.
func (c *core) acquire(ctx context.Context, op int, name string, call func(context.Context, string) (locks.Lease, error)) (locks.Lease, error) {
	if err := driver.CheckContext(ctx, "lockotel", opNames[op], name); err != nil {
		return nil, err
	}
	start := time.Now()
	callCtx, span, fl := ctx, trace.Span(nil), (*flight)(nil)
	if c.traces(ctx) {
		callCtx, span = c.tracer.Start(ctx, spanNames[op], c.startOpts...)
		if c.flights != nil && span.IsRecording() {
			fl = c.flights.add(name, span)
		}
	}
	inner, err := call(callCtx, name)
	if err == nil && inner == nil {
		err = fmt.Errorf("lockotel: %s %s %q returned neither a lease nor an error", c.backendName, opNames[op], name)
	}
	if fl != nil {
		c.flights.remove(name, fl)
	}
	end := time.Now()

	out := acquireOutcome(ctx, inner, err)
	var l *lease
	if out == outAcquired {
		l = c.newLease(ctx, inner, span != nil, end)
	}
	if span != nil {
		c.endAcquireSpan(span, name, out, l, err)
	}
	n := c.tally.of(name)
	c.ins.wait.Record(ctx, end.Sub(start).Seconds(), n.waitRec[op][out]...)
	n.calls[op][out].Add(1)
	if l == nil {
		return nil, err
	}
	return l, nil
}

// endAcquireSpan sets the attributes known once an acquiring call on name
// returned, with outcome out, lease l (nil unless acquired) and error err,
// and ends its span.
func (c *core) endAcquireSpan(span trace.Span, name string, out int, l *lease, err error) {
	if span.IsRecording() {
		if l != nil {
			span.SetAttributes(c.nameAttr(name), outcomeAttrs[out], TokenKey.Int64(int64(l.Token())), SlotKey.Int(l.slot))
		} else {
			span.SetAttributes(c.nameAttr(name), outcomeAttrs[out])
		}
	}
	if out == outError {
		span.RecordError(err)
		span.SetStatus(codes.Error, err.Error())
	}
	span.End()
}

// acquireOutcome classifies the result of an acquiring call made with ctx.
func acquireOutcome(ctx context.Context, l locks.Lease, err error) int {
	switch {
	case err == nil && l != nil:
		return outAcquired
	case errors.Is(err, locks.ErrNotAcquired):
		return outNotAcquired
	case ctx.Err() != nil && errors.Is(err, ctx.Err()):
		return outCanceled
	default:
		return outError
	}
}

// causeOf classifies the cause of a lease's end. Preempted and closed
// come before lost, which they also match.
func causeOf(cause error) int {
	switch {
	case errors.Is(cause, locks.ErrReleased):
		return causeReleased
	case errors.Is(cause, locks.ErrPreempted):
		return causePreempted
	case errors.Is(cause, locks.ErrClosed):
		return causeClosed
	case errors.Is(cause, locks.ErrLost):
		return causeLost
	default:
		return causeOther
	}
}
