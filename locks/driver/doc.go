// Package driver is the kit latchkey's backends are built with, in the
// manner of database/sql/driver: users of locks never need it.
//
// It gives a backend, written once:
//   - [Lease], the lease state machine: a context cancelled with a cause
//     when the lease ends, a validity deadline checked on every Err, and
//     release once; [Lease.Handle] is what users get.
//   - [Registry], a client's leases: registering, renewing them in
//     batches (one [RenewFunc] call per round for all live leases, whose
//     answers extend, end-then-clean-up, or retry each lease), tracked
//     goroutines, and Close(ctx) that ends and releases them all.
//   - [Wait], the wait loop woken by broker notifications with jittered
//     back-off as the fallback.
//   - Validation before any I/O: [NameRule], [CheckHolderID], [Positive],
//     [Fraction], [Apply], [InvalidOption].
//   - The one shape of errors, [Errorf], and the lease-end causes [Lost]
//     and [Preempted].
//   - [Event]s that a backend reports through its registry, and the
//     optional interface [Observable] that telemetry wrappers look for.
//
// This package uses the standard library only.
package driver
