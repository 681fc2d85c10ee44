// Package locks defines what a distributed lock is in latchkey: a [Locker]
// hands out exclusive [Lease]s on names, a [Semaphore] hands out at most N
// leases on a name, and a Lease carries a context that ends when the lease
// does, with a cause that says why ([ErrReleased], [ErrLost],
// [ErrPreempted]), and a fencing token.
//
// Backends live in their own modules (natsputex, amqpsem, redlockprio) and
// keep the contract stated on each method here; the conformance suite in
// contracttest proves they do. The package memlock is an in-memory
// reference backend for the unit tests of code that uses locks.
//
// The rest of this package is the machinery every backend shares, written
// once: [BaseLease] (the lease state machine: cancellation with a cause,
// release once, a validity deadline and a renewal loop), [Wait] (the wait
// loop woken by broker notifications with jittered back-off as fallback),
// and the validation helpers [NameRule], [Positive], [Fraction] and
// [Apply], so bad input fails before any I/O.
//
// This module uses the standard library only.
package locks
