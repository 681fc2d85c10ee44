package redlockprio

import (
	"context"
	"errors"
	"fmt"

	"github.com/latchkey-go/latchkey/locks"
	"github.com/latchkey-go/latchkey/locks/driver"
)

// Locker is the [locks.Locker] of a [Client]: a lease is held on a quorum
// (N/2+1) of the Client's masters. Get it with [Client.Locker]. Its
// leases are [*Lease] values whose Slot is 0.
//
// A Locker is safe for concurrent use and may hold many names at once.
type Locker struct {
	c *Client
}

var (
	_ locks.Locker      = (*Locker)(nil)
	_ driver.Observable = (*Locker)(nil)
)

// Lock blocks until it holds name on a quorum of the masters; see
// [locks.Locker.Lock]. When the name is held it joins the name's waiter
// queue (FIFO among equal priorities, higher priorities first) and is
// woken when it is its turn; it also tries again when the holder's keys
// would have expired. When the Client has a higher priority
// than the holder ([WithPriority]), it takes the name, tells the holder,
// and returns once the holder has let go (its Release; see the package
// doc) or its validity has provably run out.
//
// A held name is waited for also while a minority of the masters is
// down or hung. When fewer than a quorum of masters answer, Lock fails
// with a [*QuorumError] after its attempt's call timeout (the Locks of one
// name through one Client make their attempts one at a time, so the k-th
// fails after about k call timeouts). Two masters found to be one
// server on first contact fail it with an error matching
// [locks.ErrInvalidOption]. When ctx ends first, Lock returns an error
// matching ctx.Err() and holds nothing: it first deletes what an attempt
// in flight got, waiting up to the call timeout ([WithCallTimeout]) more
// (a master still silent then is cleaned up in the background); when the
// Client closes first, an error matching [locks.ErrClosed]. Lock is safe for concurrent use.
func (l *Locker) Lock(ctx context.Context, name string) (locks.Lease, error) {
	return l.c.call(ctx, "lock", name, 1, false, true)
}

// TryLock takes name if it is free (or held by a lower priority) and no
// Lock of an equal or higher priority is queued for it: TryLock does not
// jump the queue. See [locks.Locker.TryLock]. When it is held elsewhere
// (or released to such a queued Lock), TryLock returns a
// [*locks.HeldError] (matching [locks.ErrNotAcquired]) naming the holder,
// whose RetryAfter is the holder's remaining TTL — also while a minority
// of the masters is down; only when fewer than a quorum of masters
// answer, a [*QuorumError].
//
// The one exception to "TryLock does not wait": when the holder has a
// lower priority, TryLock takes the name and, like Lock, returns once
// the displaced holder has let go or its validity has provably run out
// (at most its remaining PTTL plus the drift allowance), or when ctx
// ends (then holding nothing). Without that wait it would hand out a
// name the victim may still use. TryLock is safe for concurrent use.
func (l *Locker) TryLock(ctx context.Context, name string) (locks.Lease, error) {
	return l.c.call(ctx, "trylock", name, 1, false, false)
}

// Observe implements [driver.Observable]: fn gets the Client's events
// (quorum errors per master, thefts, waits for acknowledgements, renewal
// rounds) until stop is called.
func (l *Locker) Observe(fn func(driver.Event)) (stop func()) { return l.c.reg.Observe(fn) }

// call runs the call op on name, among size slots (a Semaphore's when
// semaphore is set): one attempt, or the wait loop when wait is set. Its
// errors have the one shape of [driver.Errorf].
func (c *Client) call(ctx context.Context, op, name string, size int, semaphore, wait bool) (locks.Lease, error) {
	if err := driver.CheckContext(ctx, backend, op, name); err != nil {
		return nil, err
	}
	if err := names.Check(name); err != nil {
		return nil, driver.Errorf(backend, op, "", err)
	}
	if err := ctx.Err(); err != nil {
		return nil, driver.Errorf(backend, op, name, err)
	}
	c.mu.Lock()
	if c.closing || c.reg.Closed() {
		c.mu.Unlock()
		return nil, c.reg.ErrClosed(op, name)
	}
	c.calls.Add(1)
	c.mu.Unlock()
	defer c.calls.Done()
	bound, cancel := c.reg.Bind(ctx)
	defer cancel()
	t := target{name: name, size: size, semaphore: semaphore}
	if !semaphore {
		t.q = &queued{member: "-"}
	}
	var (
		lease locks.Lease
		err   error
	)
	if wait {
		lease, err = c.wait(bound, t)
	} else {
		var floor uint64
		lease, err = c.acquire(bound, t, &floor)
	}
	if err != nil && ctx.Err() == nil && errors.Is(context.Cause(bound), locks.ErrClosed) {
		return nil, c.reg.ErrClosed(op, name)
	}
	return lease, c.callError(op, name, err)
}

// target is what an acquisition is for: a name of size slots, of a
// Semaphore or of the Locker.
type target struct {
	name      string
	size      int
	semaphore bool
	q         *queued // a Locker's call: it respects the name's queue
}

// wait runs the shared wait loop on t, woken by release notifications.
func (c *Client) wait(ctx context.Context, t target) (locks.Lease, error) {
	if err := c.subscribeInbox(ctx); err != nil {
		return nil, err
	}
	// Uncontended, the first attempt wins: no subscription needed. Else
	// subscribe to the name's releases, then try again at once (a release
	// in between is not missed).
	var floor uint64
	lease, err := c.acquire(ctx, t, &floor)
	if cerr := ctx.Err(); err != nil && cerr != nil {
		// ctx ended while the attempt failed for another reason (it was
		// robbed while it waited for its victim, say): say ctx's error,
		// as driver.Wait does. (ctx is read once: read twice, it could
		// end between the reads and let the attempt's error through.)
		if errors.Is(err, cerr) {
			return nil, err
		}
		return nil, fmt.Errorf("%w (the attempt: %v)", cerr, err)
	}
	if err == nil || !errors.Is(err, locks.ErrNotAcquired) {
		return lease, err
	}
	if t.q != nil {
		return c.waitQueued(ctx, t, &floor)
	}
	wake, stop := c.watch(ctx, c.relChannel(t.name))
	defer stop()
	return driver.Wait(ctx, wake, c.o.backoff, func(ctx context.Context) (locks.Lease, error) {
		return c.acquire(ctx, t, &floor)
	})
}
