// Package lockotel traces and measures any [locks.Locker] or
// [locks.Semaphore] with OpenTelemetry: wrap one with [WrapLocker] or
// [WrapSemaphore] and use the wrapper in its place.
//
//	client, _ := natsputex.New(ctx, js, "locks")
//	locker := lockotel.WrapLocker(client.Locker())
//	lease, err := locker.Lock(ctx, "nightly-report")
//
// The wrapper needs nothing from the backend: it sees each call's result
// and learns how each lease ended from the cause of its context, so it
// works the same for every backend, memlock included. It depends on the
// OpenTelemetry API only; the application installs the SDK and exporters
// (by default the wrapper uses the global providers, which do nothing
// until one is installed).
//
// # Spans
//
// A call made inside a trace (its context carries a valid span context,
// local or remote, as a request handler's does) is a span of kind client,
// a child of the caller's span: "latchkey.lock", "latchkey.trylock",
// "latchkey.acquire", "latchkey.tryacquire" and "latchkey.release". A
// call outside any trace starts no span, as is usual for OpenTelemetry
// instrumentation of clients: a lock taken by a background job would
// otherwise make a trace of one span per call. [WithRootSpans] makes the
// wrapper trace every call, each call outside a trace the root of its own.
// Metrics and backend events are recorded either way.
//
// A span starts with the attributes latchkey.backend and
// latchkey.lock.kind ("lock" or "semaphore"); when the call returns it
// gets latchkey.lock.name (or latchkey.lock.name_hash, with
// [WithHashedNames]), latchkey.outcome and, once a lease is held,
// latchkey.lease.token (0 from a backend without fencing tokens) and
// latchkey.lease.slot. The outcome of an
// acquiring call is acquired, not_acquired (a Try call found the name
// held), canceled (its context ended first) or error; that of Release is
// released, lost (the lease had been lost), canceled or error. Errors and
// losses set the span's status to Error. The backend's own calls nest
// under the call's span; work done under a lease's Context belongs to the
// caller's span, as it would without the wrapper.
//
// # Metrics
//
// All metrics carry latchkey.backend; with [WithMetricNames] they carry
// the name (or its hash) too.
//
//	latchkey.lock.wait.duration     histogram, s                 time in Lock, TryLock, Acquire, TryAcquire; by kind, operation, outcome
//	latchkey.lock.acquisitions      observable counter, {call}   those calls; by kind, operation, outcome
//	latchkey.lock.hold.duration     histogram, s                 a lease's life, acquisition to end; by kind, cause
//	latchkey.lease.ends             observable counter, {lease}  leases ended; by kind, cause
//	latchkey.leases.held            observable up-down, {lease}  leases held now; by kind
//
// The three counts are kept in memory (an atomic add per call) and
// reported at each collection through a callback the wrapper registers
// with its meter; [Locker.Close] unregisters it.
//
// The cause (latchkey.lease.cause) is released, lost, preempted (a higher
// priority took the lease), closed (its client was closed) or other.
//
// # Backend events
//
// When the wrapped Locker or Semaphore implements [driver.Observable]
// (every latchkey backend does), the wrapper also records the backend's
// [driver.Event]s, which the backends send from their own goroutines:
//
//	latchkey.renew.duration                  histogram, s         renewal rounds (one round renews all of a client's leases)
//	latchkey.renew.failures                  counter, {failure}   renewals that failed without ending the lease
//	latchkey.quorum.errors                   counter, {error}     failed masters of a step short of a quorum; by latchkey.master (redlockprio)
//	latchkey.thefts                          counter, {theft}     names taken by a higher priority (redlockprio)
//	latchkey.theft.ack_wait.duration         histogram, s         a thief's wait for its victim (redlockprio)
//	latchkey.takeovers                       counter, {takeover}  keys taken over from a silent holder (natsputex)
//	latchkey.takeover.confirmation.duration  histogram, s         takeover to confirmation; its count is the confirmations (natsputex)
//	latchkey.verify.failures                 counter, {failure}   failed checks that a held queue is the lease's (amqpsem)
//	latchkey.resource_locked.retries         counter, {retry}     steps retried after RESOURCE_LOCKED (amqpsem)
//
// An event on a name also becomes a span event "latchkey.<kind>" (such as
// "latchkey.theft") on the wrapper's calls under way on that name, with
// the event's token, master, duration and error as attributes.
//
// The events are the client's: a client's Locker and Semaphores report
// the same stream. Wrap all but one of them [WithoutEvents], or each event
// is counted once per wrapper. [Locker.StopEvents] ends a wrapper's
// subscription.
//
// # Cost
//
// A cycle of Lock and Release outside a trace costs the wrapper five
// allocations (about 150 bytes), three atomic adds and, with the SDK
// installed, two histogram measurements. The wrapper learns a lease's end
// through the lease's AfterEnd method where it has one (the leases of
// every latchkey backend do), else through [context.AfterFunc] on its
// Context, which costs about 1µs more; either way no goroutine runs while
// the lease lives. Inside a sampled trace, the two spans cost more than
// the rest together. BenchmarkLockotelCost in the benchmarks module
// measures it.
package lockotel
