package redlockprio

import (
	"context"
	"fmt"

	"github.com/latchkey-go/latchkey/locks"
	"github.com/latchkey-go/latchkey/locks/driver"
)

// Semaphore is a [locks.Semaphore] of one [Locker]: at most size leases
// per name at once, each a slot (a key {name}:1 … {name}:size) held on a
// quorum of the masters with the same guarantees as a lock: validity on
// the local monotonic clock, fencing tokens per name, batch renewal,
// priorities. Its leases implement [locks.SlotLease].
//
// A Semaphore is safe for concurrent use. Semaphores of different sizes
// may share a name: each counts only its first size slots.
type Semaphore struct {
	l    *Locker
	size int
}

var _ locks.Semaphore = (*Semaphore)(nil)

// Semaphore returns a Semaphore with size slots per name sharing the
// Locker's connections, options and renewal. A size outside [1, 1024]
// returns an error matching [locks.ErrInvalidOption].
func (l *Locker) Semaphore(size int) (*Semaphore, error) {
	if size < 1 || size > maxSlots {
		return nil, fmt.Errorf("redlockprio: %w", driver.InvalidOption("semaphore size must be in [1, %d], got %d", maxSlots, size))
	}
	return &Semaphore{l: l, size: size}, nil
}

// Acquire blocks until it holds a slot of name; see
// [locks.Semaphore.Acquire] and [Locker.Lock], whose rules it follows.
func (s *Semaphore) Acquire(ctx context.Context, name string) (locks.Lease, error) {
	if err := names.Check(name); err != nil {
		return nil, fmt.Errorf("redlockprio: acquire: %w", err)
	}
	return s.l.wait(ctx, name, s.size)
}

// TryAcquire takes a free slot of name if there is one (or one held by a
// lower priority); see [locks.Semaphore.TryAcquire] and [Locker.TryLock].
func (s *Semaphore) TryAcquire(ctx context.Context, name string) (locks.Lease, error) {
	if err := names.Check(name); err != nil {
		return nil, fmt.Errorf("redlockprio: acquire: %w", err)
	}
	var floor uint64
	return s.l.acquire(ctx, name, s.size, &floor)
}
