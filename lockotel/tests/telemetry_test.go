package tests

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/latchkey-go/latchkey/lockotel"
)

// telemetry is an SDK tracer and meter provider recording in memory.
type telemetry struct {
	spans  *tracetest.SpanRecorder
	reader *sdkmetric.ManualReader
	tp     *sdktrace.TracerProvider
	mp     *sdkmetric.MeterProvider
	ctx    context.Context // inside a trace: a caller's span, never ended
}

func newTelemetry(t testing.TB) *telemetry {
	tl := &telemetry{spans: tracetest.NewSpanRecorder(), reader: sdkmetric.NewManualReader()}
	tl.tp = sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(tl.spans))
	tl.mp = sdkmetric.NewMeterProvider(sdkmetric.WithReader(tl.reader))
	tl.ctx = tl.traced(context.Background())
	t.Cleanup(func() {
		_ = tl.tp.Shutdown(context.Background())
		_ = tl.mp.Shutdown(context.Background())
	})
	return tl
}

// traced returns ctx with a new caller's span of tl's, so that the
// wrapper's calls made with it are traced (their spans its children).
func (tl *telemetry) traced(ctx context.Context) context.Context {
	ctx, _ = tl.tp.Tracer("test").Start(ctx, "caller")
	return ctx
}

// opts are the wrapper options that send to tl, then more.
func (tl *telemetry) opts(more ...lockotel.Option) []lockotel.Option {
	return append([]lockotel.Option{lockotel.WithTracerProvider(tl.tp), lockotel.WithMeterProvider(tl.mp)}, more...)
}

// metric returns the metric called name, or false.
func (tl *telemetry) metric(t testing.TB, name string) (metricdata.Metrics, bool) {
	t.Helper()
	var rm metricdata.ResourceMetrics
	if err := tl.reader.Collect(context.Background(), &rm); err != nil {
		t.Fatalf("collect: %v", err)
	}
	for _, sm := range rm.ScopeMetrics {
		if sm.Scope.Name != lockotel.Scope {
			continue
		}
		for _, m := range sm.Metrics {
			if m.Name == name {
				return m, true
			}
		}
	}
	return metricdata.Metrics{}, false
}

// has reports whether set holds every one of want.
func has(set attribute.Set, want []attribute.KeyValue) bool {
	for _, kv := range want {
		if v, ok := set.Value(kv.Key); !ok || v != kv.Value {
			return false
		}
	}
	return true
}

// sum adds up the points of the int64 sum name whose attributes include
// attrs.
func (tl *telemetry) sum(t testing.TB, name string, attrs ...attribute.KeyValue) int64 {
	t.Helper()
	m, ok := tl.metric(t, name)
	if !ok {
		return 0
	}
	data, ok := m.Data.(metricdata.Sum[int64])
	if !ok {
		t.Fatalf("%s is a %T, not an int64 sum", name, m.Data)
	}
	var n int64
	for _, p := range data.DataPoints {
		if has(p.Attributes, attrs) {
			n += p.Value
		}
	}
	return n
}

// hist returns the count and sum of the points of the histogram name
// whose attributes include attrs.
func (tl *telemetry) hist(t testing.TB, name string, attrs ...attribute.KeyValue) (uint64, float64) {
	t.Helper()
	m, ok := tl.metric(t, name)
	if !ok {
		return 0, 0
	}
	data, ok := m.Data.(metricdata.Histogram[float64])
	if !ok {
		t.Fatalf("%s is a %T, not a float64 histogram", name, m.Data)
	}
	var n uint64
	var s float64
	for _, p := range data.DataPoints {
		if has(p.Attributes, attrs) {
			n += p.Count
			s += p.Sum
		}
	}
	return n, s
}

// attrSets returns the attribute sets of every point of name.
func (tl *telemetry) attrSets(t testing.TB, name string) []attribute.Set {
	t.Helper()
	m, ok := tl.metric(t, name)
	if !ok {
		return nil
	}
	var sets []attribute.Set
	switch data := m.Data.(type) {
	case metricdata.Sum[int64]:
		for _, p := range data.DataPoints {
			sets = append(sets, p.Attributes)
		}
	case metricdata.Histogram[float64]:
		for _, p := range data.DataPoints {
			sets = append(sets, p.Attributes)
		}
	}
	return sets
}

// unit returns the unit of the metric name.
func (tl *telemetry) unit(t testing.TB, name string) string {
	t.Helper()
	m, ok := tl.metric(t, name)
	if !ok {
		t.Fatalf("no metric %s", name)
	}
	return m.Unit
}

// ended returns the ended spans called name, oldest first.
func (tl *telemetry) ended(name string) []sdktrace.ReadOnlySpan {
	var out []sdktrace.ReadOnlySpan
	for _, s := range tl.spans.Ended() {
		if s.Name() == name {
			out = append(out, s)
		}
	}
	return out
}

// lastSpan returns the last ended span called name, failing the test if
// there is none.
func (tl *telemetry) lastSpan(t testing.TB, name string) sdktrace.ReadOnlySpan {
	t.Helper()
	spans := tl.ended(name)
	if len(spans) == 0 {
		t.Fatalf("no ended span %q; have %s", name, spanNames(tl.spans.Ended()))
	}
	return spans[len(spans)-1]
}

func spanNames(spans []sdktrace.ReadOnlySpan) string {
	var names []string
	for _, s := range spans {
		names = append(names, s.Name())
	}
	return "[" + strings.Join(names, " ") + "]"
}

// attr returns the value of key on span s, or an invalid value.
func attr(s sdktrace.ReadOnlySpan, key attribute.Key) attribute.Value {
	for _, kv := range s.Attributes() {
		if kv.Key == key {
			return kv.Value
		}
	}
	return attribute.Value{}
}

// checkAttrs fails the test unless span s has every one of want.
func checkAttrs(t testing.TB, s sdktrace.ReadOnlySpan, want ...attribute.KeyValue) {
	t.Helper()
	for _, kv := range want {
		if got := attr(s, kv.Key); got != kv.Value {
			t.Errorf("span %s: %s = %s, want %s", s.Name(), kv.Key, show(got), show(kv.Value))
		}
	}
}

func show(v attribute.Value) string {
	if v.Type() == attribute.EMPTY {
		return "(absent)"
	}
	return fmt.Sprintf("%q", v.String())
}

// eventually polls cond until it holds, failing the test after within.
func eventually(t testing.TB, within time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(within)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("after %v: %s", within, what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// Attribute shorthands.
func backend(b string) attribute.KeyValue { return lockotel.BackendKey.String(b) }
func kind(k string) attribute.KeyValue    { return lockotel.KindKey.String(k) }
func op(o string) attribute.KeyValue      { return lockotel.OperationKey.String(o) }
func outcome(o string) attribute.KeyValue { return lockotel.OutcomeKey.String(o) }
func cause(c string) attribute.KeyValue   { return lockotel.CauseKey.String(c) }
func name(n string) attribute.KeyValue    { return lockotel.NameKey.String(n) }
