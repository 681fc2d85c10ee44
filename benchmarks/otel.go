package benchmarks

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"text/tabwriter"
	"time"

	"github.com/latchkey-go/latchkey/lockotel"
	"github.com/latchkey-go/latchkey/locks"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
)

// OtelSuffix ends the name of a system that is another (its twin) wrapped
// with lockotel: "natsputex+otel" is natsputex's Locker wrapped by
// [lockotel.WrapLocker].
const OtelSuffix = "+otel"

// otelTwins are the systems that have a +otel variant in the registry.
var otelTwins = []string{"natsputex", "redlockprio/N3"}

// otelVariant returns the +otel variant of the entry twin: the same
// system, on the same brokers and compared with the same floor and peers,
// whose clients' Lockers (and Semaphores) are wrapped with lockotel on a
// real OpenTelemetry SDK.
func otelVariant(twin Entry) Entry {
	v := twin
	v.Name = twin.Name + OtelSuffix
	v.Twin = twin.Name
	v.New = func(ctx context.Context, env Env) (System, error) {
		inner, err := twin.New(ctx, env)
		if err != nil {
			return nil, err
		}
		return newOtelSystem(inner), nil
	}
	return v
}

// withOtelVariants returns es with the +otel variant of each entry named in
// otelTwins right after it.
func withOtelVariants(es []Entry) []Entry {
	out := make([]Entry, 0, len(es)+len(otelTwins))
	for _, e := range es {
		out = append(out, e)
		for _, t := range otelTwins {
			if e.Name == t {
				out = append(out, otelVariant(e))
			}
		}
	}
	return out
}

// otelSystem is a system whose clients' Lockers are wrapped with lockotel
// in its default configuration, on the SDK as a typical service installs
// it: the default sampler (ParentBased(AlwaysSample)) and a batch span
// processor to an exporter that discards what it gets; every measurement
// is aggregated by a meter provider whose manual reader is never
// collected. The scenarios call outside any trace, as a background job
// would, so the wrapper records metrics and starts no span (its default
// without a caller's span); BenchmarkLockotelCost measures the cost of
// calls inside a trace.
// It has the scenarios of a plain [System] and, if its twin has
// semaphores, the semaphore scenario; the twin's optional System
// interfaces (many, priorities, hung masters) are not carried over.
type otelSystem struct {
	inner   System
	tracers *sdktrace.TracerProvider
	meters  *sdkmetric.MeterProvider
}

func newOtelSystem(inner System) *otelSystem {
	return &otelSystem{
		inner: inner,
		tracers: sdktrace.NewTracerProvider(
			sdktrace.WithBatcher(tracetest.NewNoopExporter()),
		),
		meters: sdkmetric.NewMeterProvider(sdkmetric.WithReader(sdkmetric.NewManualReader())),
	}
}

// locksClient is a [Client] of a latchkey backend that hands out the
// backend's own Locker and Semaphores, for lockotel to wrap.
type locksClient interface {
	Client
	LocksLocker() locks.Locker
	LocksSemaphore(size int) (locks.Semaphore, error)
}

func (s *otelSystem) NewClient(ctx context.Context) (Client, error) {
	c, err := s.inner.NewClient(ctx)
	if err != nil {
		return nil, err
	}
	lc, ok := c.(locksClient)
	if !ok {
		_ = c.Close()
		return nil, fmt.Errorf("%w: %T has no locks.Locker to wrap with lockotel", ErrUnavailable, c)
	}
	opts := []lockotel.Option{lockotel.WithTracerProvider(s.tracers), lockotel.WithMeterProvider(s.meters)}
	return &otelClient{
		Locker: leaseLocker{lockotel.WrapLocker(lc.LocksLocker(), opts...)},
		inner:  lc,
		opts:   opts,
	}, nil
}

// Close closes the twin, then shuts the SDK down (dropping what it holds).
func (s *otelSystem) Close() error {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	return errors.Join(s.inner.Close(), s.tracers.Shutdown(ctx), s.meters.Shutdown(ctx))
}

type otelClient struct {
	Locker
	inner locksClient
	opts  []lockotel.Option
}

// Semaphore wraps the twin's semaphore WithoutEvents: the client's
// Locker wrapper already records the client's events.
func (c *otelClient) Semaphore(_ context.Context, size int) (Locker, error) {
	s, err := c.inner.LocksSemaphore(size)
	if err != nil {
		return nil, err
	}
	return semLocker{lockotel.WrapSemaphore(s, append(slices.Clip(c.opts), lockotel.WithoutEvents())...)}, nil
}

func (c *otelClient) Close() error { return c.inner.Close() }

// OverheadMetric names the metric of a variant's result (see [Entry.Twin])
// that is its overhead over its twin in the same scenario and run, as a
// fraction: 0.03 is 3% slower. It is p50 ÷ the twin's p50 − 1 for the
// latency scenarios, and the twin's ops/s ÷ the variant's − 1 for
// contended (the hand-off time).
const OverheadMetric = "overhead_vs_twin"

// addOverheads records [OverheadMetric] for every variant's result whose
// twin was measured in the same scenario.
func (rep *Report) addOverheads() {
	for _, r := range rep.Results {
		e, ok := Lookup(r.System)
		if !ok || e.Twin == "" || r.Scenario == Many {
			continue
		}
		t, ok := rep.Find(e.Twin, r.Scenario)
		if !ok || headline(t) == 0 || headline(r) == 0 {
			continue
		}
		v := headline(r)/headline(t) - 1
		if HigherIsBetter(r.Scenario) {
			v = headline(t)/headline(r) - 1
		}
		rep.Metrics = append(rep.Metrics, Metric{System: r.System, Scenario: r.Scenario, Name: OverheadMetric, Value: v})
	}
}

// writeOverheads writes each variant's overhead over its twin.
func (rep *Report) writeOverheads(w io.Writer) error {
	var lines []Metric
	for _, m := range rep.Metrics {
		if m.Name == OverheadMetric {
			lines = append(lines, m)
		}
	}
	if len(lines) == 0 {
		return nil
	}
	fmt.Fprintln(w)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight|tabwriter.Debug)
	fmt.Fprintln(tw, "overhead: system\tscenario\tfigure\tvariant\ttwin\toverhead\t")
	for _, m := range lines {
		r, _ := rep.Find(m.System, m.Scenario)
		e, _ := Lookup(m.System)
		t, _ := rep.Find(e.Twin, m.Scenario)
		figure, rv, tv := "p50", FormatDuration(r.P50Duration()), FormatDuration(t.P50Duration())
		if HigherIsBetter(m.Scenario) {
			figure, rv, tv = "ops/s", FormatRate(r.Ops), FormatRate(t.Ops)
		}
		fmt.Fprintf(tw, "%s vs %s\t%s\t%s\t%s\t%s\t%+.1f%%\t\n", m.System, e.Twin, m.Scenario, figure, rv, tv, 100*m.Value)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintln(w, "overhead: the +otel variant's cost over its twin in the same run (each figure the median round's with --rounds):")
	fmt.Fprintln(w, "          p50 ÷ twin's p50 − 1; for contended, twin's ops/s ÷ variant's ops/s − 1.")
	return nil
}

// joinKey, brokerOps and wideOps are the inner system's, for the waiters
// scenario's worker processes and broker counters.
func (s *otelSystem) joinKey() string {
	if j, ok := s.inner.(joinable); ok {
		return j.joinKey()
	}
	return ""
}

func (s *otelSystem) brokerOps(ctx context.Context) (brokerOps, error) {
	if c, ok := s.inner.(brokerCounter); ok {
		return c.brokerOps(ctx)
	}
	return brokerOps{}, errors.New("benchmarks: no broker counters")
}

func (s *otelSystem) wideOps() bool {
	c, ok := s.inner.(brokerCounter)
	return ok && c.wideOps()
}
