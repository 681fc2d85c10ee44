package lockotel

import (
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
)

// The attribute keys of spans and metrics.
const (
	BackendKey   attribute.Key = "latchkey.backend"        // the backend: "natsputex", "memlock"
	KindKey      attribute.Key = "latchkey.lock.kind"      // "lock" (a Locker) or "semaphore"
	NameKey      attribute.Key = "latchkey.lock.name"      // the lock's name
	NameHashKey  attribute.Key = "latchkey.lock.name_hash" // its hash, with WithHashedNames
	OperationKey attribute.Key = "latchkey.operation"      // lock, trylock, acquire, tryacquire, release
	OutcomeKey   attribute.Key = "latchkey.outcome"        // see the Outcome constants
	TokenKey     attribute.Key = "latchkey.lease.token"    // the fencing token
	SlotKey      attribute.Key = "latchkey.lease.slot"     // the semaphore slot, 0 for a lock
	CauseKey     attribute.Key = "latchkey.lease.cause"    // why a lease ended: see the Cause constants
	MasterKey    attribute.Key = "latchkey.master"         // the broker node of a quorum error
	ErrorKey     attribute.Key = "latchkey.error"          // a backend event's error, on span events
	DurationKey  attribute.Key = "latchkey.duration"       // a backend event's duration in seconds, on span events
)

// The values of [OutcomeKey].
const (
	OutcomeAcquired    = "acquired"     // the call returned a lease
	OutcomeNotAcquired = "not_acquired" // a TryLock or TryAcquire found the name held
	OutcomeCanceled    = "canceled"     // the call's context ended first
	OutcomeError       = "error"        // any other error
	OutcomeReleased    = "released"     // Release returned nil
	OutcomeLost        = "lost"         // Release reported that the lease had been lost
)

// The values of [CauseKey].
const (
	CauseReleased  = "released"  // ended by Release
	CauseLost      = "lost"      // taken away or not renewed in time
	CausePreempted = "preempted" // taken by a higher priority
	CauseClosed    = "closed"    // its client was closed
	CauseOther     = "other"     // a cause the contract does not name
)

// Scope is the instrumentation scope of the wrappers' tracer and meter.
const Scope = "github.com/latchkey-go/latchkey/lockotel"

// Bucket boundaries, in seconds: waits and broker steps from half a
// millisecond to a minute; holds up to an hour.
var (
	waitBuckets = []float64{0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60}
	holdBuckets = []float64{0.001, 0.01, 0.1, 0.5, 1, 5, 10, 30, 60, 300, 600, 1800, 3600}
)

// instruments are the metrics a wrapper records.
type instruments struct {
	wait         metric.Float64Histogram
	hold         metric.Float64Histogram
	acquisitions metric.Int64ObservableCounter
	ends         metric.Int64ObservableCounter
	held         metric.Int64ObservableUpDownCounter

	renewDuration  metric.Float64Histogram
	renewFailures  metric.Int64Counter
	quorumErrors   metric.Int64Counter
	thefts         metric.Int64Counter
	ackWait        metric.Float64Histogram
	takeovers      metric.Int64Counter
	confirmation   metric.Float64Histogram
	verifyFailures metric.Int64Counter
	resourceLocked metric.Int64Counter
}

// newInstruments makes the instruments on m. The counters of calls, ends
// and held leases are observable: a wrapper counts in memory and reports
// at each collection (see [tally]). An instrument the provider
// refuses is reported to otel.Handle and records nothing.
func newInstruments(m metric.Meter) *instruments {
	ins := &instruments{}
	hist := func(name, desc string, buckets []float64) metric.Float64Histogram {
		h, err := m.Float64Histogram(name, metric.WithUnit("s"), metric.WithDescription(desc),
			metric.WithExplicitBucketBoundaries(buckets...))
		handle(err)
		return h
	}
	count := func(name, unit, desc string) metric.Int64Counter {
		c, err := m.Int64Counter(name, metric.WithUnit(unit), metric.WithDescription(desc))
		handle(err)
		return c
	}
	ins.wait = hist("latchkey.lock.wait.duration",
		"How long Lock, TryLock, Acquire and TryAcquire calls took, by outcome.", waitBuckets)
	ins.hold = hist("latchkey.lock.hold.duration",
		"How long leases lived, from acquisition to their end, by cause.", holdBuckets)
	observed := func(name, unit, desc string) metric.Int64ObservableCounter {
		c, err := m.Int64ObservableCounter(name, metric.WithUnit(unit), metric.WithDescription(desc))
		handle(err)
		return c
	}
	ins.acquisitions = observed("latchkey.lock.acquisitions", "{call}",
		"Lock, TryLock, Acquire and TryAcquire calls, by outcome.")
	ins.ends = observed("latchkey.lease.ends", "{lease}", "Leases that ended, by cause.")
	held, err := m.Int64ObservableUpDownCounter("latchkey.leases.held", metric.WithUnit("{lease}"),
		metric.WithDescription("Leases held now."))
	handle(err)
	ins.held = held

	ins.renewDuration = hist("latchkey.renew.duration",
		"How long the backend's renewal rounds took (one round renews all of a client's leases).", waitBuckets)
	ins.renewFailures = count("latchkey.renew.failures", "{failure}",
		"Lease renewals that failed without ending the lease (retried until its deadline).")
	ins.quorumErrors = count("latchkey.quorum.errors", "{error}",
		"Masters that failed a step that then reached fewer than a quorum, by master (redlockprio).")
	ins.thefts = count("latchkey.thefts", "{theft}",
		"Names a higher priority took from their holder (redlockprio).")
	ins.ackWait = hist("latchkey.theft.ack_wait.duration",
		"How long thieves waited for their victim's acknowledgement or expiry (redlockprio).", waitBuckets)
	ins.takeovers = count("latchkey.takeovers", "{takeover}",
		"Keys taken over from a silent holder (natsputex).")
	ins.confirmation = hist("latchkey.takeover.confirmation.duration",
		"Time from a takeover to its confirmation; its count is the confirmations (natsputex).", holdBuckets)
	ins.verifyFailures = count("latchkey.verify.failures", "{failure}",
		"Checks that a held queue is still the lease's that failed (amqpsem).")
	ins.resourceLocked = count("latchkey.resource_locked.retries", "{retry}",
		"Steps retried after the broker answered RESOURCE_LOCKED (amqpsem).")
	return ins
}

func handle(err error) {
	if err != nil {
		otel.Handle(err)
	}
}
