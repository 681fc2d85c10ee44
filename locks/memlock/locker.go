package memlock

import (
	"context"

	"github.com/latchkey-go/latchkey/locks"
	"github.com/latchkey-go/latchkey/locks/driver"
)

// Locker is a [locks.Locker] of one [Client]. Its leases implement
// [locks.SlotLease], with Slot 0.
//
// A Locker is safe for concurrent use.
type Locker struct{ c *Client }

var (
	_ locks.Locker      = (*Locker)(nil)
	_ driver.Observable = (*Locker)(nil)
)

// Locker returns the client's Locker.
func (c *Client) Locker() *Locker { return &Locker{c} }

// Lock blocks until it holds name; see [locks.Locker.Lock]. A client with a
// higher priority takes the name from a lower-priority holder at once.
// When ctx ends first it returns an error matching ctx.Err(); when the
// client is closed, one matching [locks.ErrClosed].
func (l *Locker) Lock(ctx context.Context, name string) (locks.Lease, error) {
	if err := driver.CheckContext(ctx, backend, "lock", name); err != nil {
		return nil, err
	}
	if err := names.Check(name); err != nil {
		return nil, driver.Errorf(backend, "lock", "", err)
	}
	lease, err := l.c.wait(ctx, name, 1, false)
	return lease, wrap("lock", name, err)
}

// TryLock takes name if it is free; see [locks.Locker.TryLock].
func (l *Locker) TryLock(ctx context.Context, name string) (locks.Lease, error) {
	if err := driver.CheckContext(ctx, backend, "trylock", name); err != nil {
		return nil, err
	}
	if err := names.Check(name); err != nil {
		return nil, driver.Errorf(backend, "trylock", "", err)
	}
	lease, err := l.c.acquire(ctx, name, 1, false)
	return lease, wrap("trylock", name, err)
}

// Observe implements [driver.Observable] with the client's events.
func (l *Locker) Observe(fn func(driver.Event)) (stop func()) { return l.c.reg.Observe(fn) }

// Semaphore is a [locks.Semaphore] of one [Client]. Its leases implement
// [locks.SlotLease], with slots from 1.
//
// A Semaphore is safe for concurrent use.
type Semaphore struct {
	c    *Client
	size int
}

var (
	_ locks.Semaphore   = (*Semaphore)(nil)
	_ driver.Observable = (*Semaphore)(nil)
)

// Semaphore returns a Semaphore with size slots per name. A size outside
// 1 to [MaxSemaphoreSize] returns an error matching
// [locks.ErrInvalidOption]. Semaphores of different sizes may share a
// name: each counts only the first size slots.
func (c *Client) Semaphore(size int) (*Semaphore, error) {
	if size < 1 || size > MaxSemaphoreSize {
		return nil, driver.Errorf(backend, "semaphore", "", driver.InvalidOption("semaphore size must be from 1 to %d, got %d", MaxSemaphoreSize, size))
	}
	return &Semaphore{c: c, size: size}, nil
}

// Acquire blocks until it holds a slot of name; see
// [locks.Semaphore.Acquire]. When ctx ends first it returns an error
// matching ctx.Err(); when the client is closed, one matching
// [locks.ErrClosed].
func (s *Semaphore) Acquire(ctx context.Context, name string) (locks.Lease, error) {
	if err := driver.CheckContext(ctx, backend, "acquire", name); err != nil {
		return nil, err
	}
	if err := names.Check(name); err != nil {
		return nil, driver.Errorf(backend, "acquire", "", err)
	}
	lease, err := s.c.wait(ctx, name, s.size, true)
	return lease, wrap("acquire", name, err)
}

// TryAcquire takes a free slot of name if there is one; see
// [locks.Semaphore.TryAcquire].
func (s *Semaphore) TryAcquire(ctx context.Context, name string) (locks.Lease, error) {
	if err := driver.CheckContext(ctx, backend, "tryacquire", name); err != nil {
		return nil, err
	}
	if err := names.Check(name); err != nil {
		return nil, driver.Errorf(backend, "tryacquire", "", err)
	}
	lease, err := s.c.acquire(ctx, name, s.size, true)
	return lease, wrap("tryacquire", name, err)
}

// Observe implements [driver.Observable] with the client's events.
func (s *Semaphore) Observe(fn func(driver.Event)) (stop func()) { return s.c.reg.Observe(fn) }

// wrap gives err the one shape of errors ([driver.Errorf], which names
// name once).
func wrap(op, name string, err error) error { return driver.Errorf(backend, op, name, err) }
