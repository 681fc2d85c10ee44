package redlockprio

import (
	"context"

	"github.com/latchkey-go/latchkey/locks"
	"github.com/latchkey-go/latchkey/locks/driver"
)

// Semaphore is a [locks.Semaphore] of a [Client]: at most size leases per
// name at once, each a slot (a key {name}:1 … {name}:size) held on a
// quorum of the masters with the same guarantees as a lock: validity on
// the local monotonic clock, fencing tokens per name, batch renewal,
// priorities. Get one with [Client.Semaphore]. Its leases are [*Lease]
// values whose Slot is from 1 to size.
//
// A Semaphore is safe for concurrent use. Semaphores of different sizes
// may share a name: each counts only its first size slots.
type Semaphore struct {
	c    *Client
	size int
}

var (
	_ locks.Semaphore   = (*Semaphore)(nil)
	_ driver.Observable = (*Semaphore)(nil)
)

// Acquire blocks until it holds a slot of name; see
// [locks.Semaphore.Acquire] and [Locker.Lock], whose rules it follows.
func (s *Semaphore) Acquire(ctx context.Context, name string) (locks.Lease, error) {
	return s.c.call(ctx, "acquire", name, s.size, true, true)
}

// TryAcquire takes a free slot of name if there is one (or one held by a
// lower priority); see [locks.Semaphore.TryAcquire] and [Locker.TryLock].
func (s *Semaphore) TryAcquire(ctx context.Context, name string) (locks.Lease, error) {
	return s.c.call(ctx, "tryacquire", name, s.size, true, false)
}

// Observe implements [driver.Observable], as [Locker.Observe].
func (s *Semaphore) Observe(fn func(driver.Event)) (stop func()) { return s.c.reg.Observe(fn) }
