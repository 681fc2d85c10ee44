package locks

import (
	"context"
	"errors"
)

// A Lease is one held lock or semaphore slot.
//
// All methods are safe for concurrent use.
type Lease interface {
	// Name returns the name the lease was acquired on.
	Name() string

	// Context returns a context that is cancelled when the lease ends.
	// [context.Cause] of it reports why: [ErrReleased] after Release, an
	// error matching [ErrLost] when the lease was taken away or could not
	// be renewed in time, [ErrPreempted] when a higher priority took it.
	// Run the work the lease protects under this context.
	// Every call returns the same context.
	Context() context.Context

	// Token returns the lease's fencing token: strictly greater for every
	// later holder of the same name. Pass it to the resources the lease
	// protects so they can refuse a stale holder. Backends that cannot
	// issue one return 0.
	Token() uint64

	// Release ends the lease and frees it at the broker, checking there,
	// atomically, that it is still this lease's: a stale Release never
	// frees a later holder's lock. The lease's context is cancelled with
	// [ErrReleased] before the broker is told.
	//
	// Release is idempotent: the first call does the work and every call
	// returns its result. If the lease had already been lost, Release
	// still cleans up what remains at the broker and returns an error
	// matching [ErrLost], also when that cleanup fails, so the caller
	// learns that its critical section may not have been exclusive. If ctx
	// ends first (or had ended), Release returns nil or an error matching
	// ctx's error; the lease has still ended locally, and the name is freed
	// without ctx: by the backend finishing the release in the background,
	// or at the latest when the broker's TTL runs out.
	Release(ctx context.Context) error
}

// A Locker hands out exclusive leases on names.
//
// A Locker is safe for concurrent use; one Locker may hold many names.
type Locker interface {
	// Lock blocks until it holds name, and returns the lease. Waiting is
	// woken by the broker's notifications where it has them, with
	// jittered polling as the fallback.
	//
	// On failure, Lock returns an error and holds nothing; when ctx ends
	// first, the error matches ctx.Err().
	Lock(ctx context.Context, name string) (Lease, error)

	// TryLock is Lock without waiting: when name is held elsewhere it
	// returns an error matching [ErrNotAcquired] at once.
	TryLock(ctx context.Context, name string) (Lease, error)
}

// A Semaphore hands out at most N concurrent leases on a name. N is fixed
// when the Semaphore is made.
//
// A Semaphore is safe for concurrent use.
type Semaphore interface {
	// Acquire blocks until it holds one of the name's slots.
	//
	// On failure, Acquire returns an error and holds nothing; when ctx
	// ends first, the error matches ctx.Err().
	Acquire(ctx context.Context, name string) (Lease, error)

	// TryAcquire is Acquire without waiting: when every slot is held it
	// returns an error matching [ErrNotAcquired] at once.
	TryAcquire(ctx context.Context, name string) (Lease, error)
}

// SlotLease is a [Lease] that says which slot it holds. Every lease a
// latchkey backend returns implements it: Slot is the semaphore slot held,
// from 1 to N, for a lease from a [Semaphore], and 0 for a lease from a
// [Locker].
type SlotLease interface {
	Lease
	Slot() int
}

// Do acquires name from l, runs fn under the lease's context and releases
// the lease. fn's context ends early if the lease is lost. Do returns fn's
// error, joined with the lease's loss cause when the lease was lost while fn
// ran, or the error of Lock or Release. When ctx ends while Do waits for
// the lock, it returns an error matching ctx.Err() and fn does not run.
func Do(ctx context.Context, l Locker, name string, fn func(ctx context.Context) error) error {
	return run(ctx, func() (Lease, error) { return l.Lock(ctx, name) }, fn)
}

// DoAcquire is [Do] for a [Semaphore]: it acquires one of name's slots
// from s, runs fn under the lease's context and releases the slot.
func DoAcquire(ctx context.Context, s Semaphore, name string, fn func(ctx context.Context) error) error {
	return run(ctx, func() (Lease, error) { return s.Acquire(ctx, name) }, fn)
}

func run(ctx context.Context, acquire func() (Lease, error), fn func(ctx context.Context) error) error {
	lease, err := acquire()
	if err != nil {
		return err
	}
	ferr := fn(lease.Context())
	rerr := lease.Release(context.WithoutCancel(ctx))
	if ferr == nil {
		return rerr
	}
	if rerr != nil {
		return errors.Join(ferr, rerr)
	}
	return ferr
}
