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
// Every blocking call takes a context and, when it ends first, returns an
// error matching ctx.Err() and holds nothing. [Do] and [DoAcquire] run a
// function under a lease and release it.
//
// Backend authors: the machinery every backend shares (the lease state
// machine, the client's lease registry with batched renewal, the wait
// loop, validation and the one shape of errors) is in package
// [github.com/latchkey-go/latchkey/locks/driver].
//
// This module uses the standard library only.
package locks
