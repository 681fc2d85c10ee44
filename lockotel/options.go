package lockotel

import (
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"
)

// An Option configures a wrapper made by [WrapLocker] or [WrapSemaphore].
// No option can fail: a nil provider or an empty backend name means the
// default.
type Option func(*config)

type config struct {
	tracers     trace.TracerProvider
	meters      metric.MeterProvider
	backend     string
	hashNames   bool
	metricNames bool
	noEvents    bool
	rootSpans   bool
}

// WithTracerProvider sets where the wrapper's spans go. The default is the
// global provider (otel.GetTracerProvider), read when the wrapper is made;
// it forwards to a provider installed later with otel.SetTracerProvider.
func WithTracerProvider(tp trace.TracerProvider) Option {
	return func(c *config) { c.tracers = tp }
}

// WithMeterProvider sets where the wrapper's metrics go. The default is the
// global provider (otel.GetMeterProvider), read when the wrapper is made;
// it forwards to a provider installed later with otel.SetMeterProvider.
func WithMeterProvider(mp metric.MeterProvider) Option {
	return func(c *config) { c.meters = mp }
}

// WithBackend sets the value of the latchkey.backend attribute. The
// default is the last element of the wrapped type's package path
// ("natsputex" for a *natsputex.Locker), or "unknown" for a type without
// one.
func WithBackend(name string) Option {
	return func(c *config) { c.backend = name }
}

// WithHashedNames replaces the lock name in spans and metrics by a short
// hash of it (the first 8 bytes of its SHA-256, in hex), under the
// attribute latchkey.lock.name_hash instead of latchkey.lock.name. The
// hash tells names apart without showing them; it does not hide a name
// from someone who can guess it. The default is the name itself.
func WithHashedNames() Option {
	return func(c *config) { c.hashNames = true }
}

// WithMetricNames adds the lock name (or its hash, with [WithHashedNames])
// to the attributes of every metric. Each name then makes its own time
// series, so use it only when the set of names is small and bounded. The
// default is names on spans only.
func WithMetricNames() Option {
	return func(c *config) { c.metricNames = true }
}

// WithoutEvents makes the wrapper ignore the backend's [driver.Event]s.
// The events of a backend are its client's: a client's Locker and
// Semaphores report the same stream, so when several of them are wrapped,
// all but one should be wrapped WithoutEvents, or each event is counted
// once per wrapper. The default is to record the events of a wrapped
// Locker or Semaphore that implements [driver.Observable].
func WithoutEvents() Option {
	return func(c *config) { c.noEvents = true }
}

// WithRootSpans makes the wrapper start a span for every call, even one
// whose context carries no span; such a span is the root of a trace of
// its own. The default is to trace only calls made inside a trace (their
// context carries a valid span context, local or remote), whose spans
// join the caller's trace, as OpenTelemetry instrumentation of clients
// usually does. Metrics and backend events are recorded either way.
func WithRootSpans() Option {
	return func(c *config) { c.rootSpans = true }
}
