package memlock

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/latchkey-go/latchkey/locks"
	"github.com/latchkey-go/latchkey/locks/driver"
)

// names is the rule memlock applies to names, so that tests of user code
// catch empty or garbled names as a real backend would.
var names = driver.NameRule{What: "memlock name", MaxLen: 1024}

// Store is the in-memory broker: all clients made from one Store contend
// for the same names. The zero Store is not usable; call [New].
//
// A Store is safe for concurrent use.
type Store struct {
	mu      sync.Mutex
	entries map[string]*entry
	nextID  uint64
}

type entry struct {
	holds   []*hold // by slot; nil or expired means free
	counter uint64  // last fencing token handed out
	waiters map[chan struct{}]struct{}
}

type hold struct {
	client   *Client
	lease    *driver.Lease
	expires  time.Time
	priority int
}

// New returns an empty Store.
func New() *Store {
	return &Store{entries: make(map[string]*entry)}
}

// Client is one process's connection to a [Store]: its Locker and
// Semaphores share its options and end together when it is closed or
// killed.
//
// A Client is safe for concurrent use.
type Client struct {
	store *Store
	id    string
	opts  options

	// state and leases are guarded by store.mu.
	state  clientState
	leases map[*hold]struct{}
}

type clientState int

const (
	alive clientState = iota
	closed
	killed
)

// NewClient returns a client of s with the given options. Invalid options
// return an error matching [locks.ErrInvalidOption].
func (s *Store) NewClient(opts ...Option) (*Client, error) {
	o := defaults()
	if err := driver.Apply(&o, opts); err != nil {
		return nil, fmt.Errorf("memlock: %w", err)
	}
	if o.renew == 0 {
		o.renew = o.ttl / 3
	}
	if o.renew >= o.ttl {
		return nil, fmt.Errorf("memlock: %w", driver.InvalidOption("renew interval %v must be shorter than the TTL %v", o.renew, o.ttl))
	}
	s.mu.Lock()
	s.nextID++
	id := fmt.Sprintf("client-%d", s.nextID)
	s.mu.Unlock()
	return &Client{store: s, id: id, opts: o, leases: make(map[*hold]struct{})}, nil
}

// NewLocker is a shortcut for a new client's [Client.Locker].
func (s *Store) NewLocker(opts ...Option) (*Locker, error) {
	c, err := s.NewClient(opts...)
	if err != nil {
		return nil, err
	}
	return c.Locker(), nil
}

// ID returns the client's identity, as reported in [locks.HeldError.Holder].
func (c *Client) ID() string { return c.id }

// Close releases every lease the client holds and makes its Lockers and
// Semaphores return [locks.ErrClosed]. Close is idempotent.
func (c *Client) Close() error {
	return c.stop(closed, driver.Lost(fmt.Errorf("memlock: client %s: %w", c.id, locks.ErrClosed)))
}

// Kill simulates a crash: the client stops renewing, its leases end at
// once with [locks.ErrLost] on its side, but the Store keeps them until
// their TTL runs out, as a broker would for a dead process. Later calls
// return [locks.ErrClosed].
func (c *Client) Kill() error {
	return c.stop(killed, driver.Lost(fmt.Errorf("memlock: client %s killed", c.id)))
}

func (c *Client) stop(to clientState, cause error) error {
	s := c.store
	s.mu.Lock()
	if c.state != alive {
		s.mu.Unlock()
		return nil
	}
	c.state = to
	var held []*hold
	for h := range c.leases {
		held = append(held, h)
	}
	if to == closed {
		for _, h := range held {
			s.dropLocked(h)
		}
	}
	s.mu.Unlock()
	for _, h := range held {
		h.lease.End(cause)
		_ = h.lease.Release(context.Background()) // waits for the renewal loop
	}
	return nil
}

// acquire tries once to win a slot of name among the first size slots.
func (c *Client) acquire(ctx context.Context, name string, size int) (*driver.Lease, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	s := c.store
	s.mu.Lock()
	if c.state != alive {
		s.mu.Unlock()
		return nil, fmt.Errorf("memlock: %q: %w", name, locks.ErrClosed)
	}
	e := s.entryLocked(name, size)
	now := time.Now()
	slot, victim := -1, -1
	for i, h := range e.holds[:size] {
		if h == nil || !h.expires.After(now) {
			slot = i
			break
		}
		if h.priority < c.opts.priority && (victim < 0 || h.priority < e.holds[victim].priority) {
			victim = i
		}
	}
	var preempted *hold
	if slot < 0 && victim >= 0 {
		slot, preempted = victim, e.holds[victim]
		s.dropLocked(preempted)
	}
	if slot < 0 {
		err := s.heldErrorLocked(name, e, size, now)
		s.mu.Unlock()
		return nil, err
	}
	e.counter++
	h := &hold{client: c, expires: now.Add(c.opts.ttl), priority: c.opts.priority}
	h.lease = driver.NewLease(ctx, driver.Spec{
		Name:     name,
		Token:    e.counter,
		Slot:     slot + 1,
		Deadline: h.expires,
		Release:  func(context.Context) error { s.release(h); return nil },
	})
	e.holds[slot] = h
	c.leases[h] = struct{}{}
	s.mu.Unlock()

	if preempted != nil {
		// In one process the victim's acknowledgement is immediate: its
		// lease has ended before the thief's call returns.
		preempted.lease.End(driver.Preempted(fmt.Errorf("memlock: %q taken by %s with priority %d", name, c.id, c.opts.priority)))
	}
	h.lease.KeepAlive(c.opts.renew, func(context.Context) (time.Time, error) { return s.renew(h) })
	return h.lease, nil
}

func (s *Store) heldErrorLocked(name string, e *entry, size int, now time.Time) error {
	first := e.holds[0]
	soonest := first.expires
	for _, h := range e.holds[:size] {
		if h.expires.Before(soonest) {
			first, soonest = h, h.expires
		}
	}
	return &locks.HeldError{Name: name, Holder: first.client.id, RetryAfter: soonest.Sub(now)}
}

func (s *Store) entryLocked(name string, size int) *entry {
	e := s.entries[name]
	if e == nil {
		e = &entry{waiters: make(map[chan struct{}]struct{})}
		s.entries[name] = e
	}
	for len(e.holds) < size {
		e.holds = append(e.holds, nil)
	}
	return e
}

func (s *Store) renew(h *hold) (time.Time, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if h.client.state != alive {
		return time.Time{}, driver.Lost(errors.New("memlock: client is not alive"))
	}
	now := time.Now()
	if !s.holdsLocked(h) || !h.expires.After(now) {
		s.dropLocked(h)
		return time.Time{}, driver.Lost(fmt.Errorf("memlock: %q expired or was taken away", h.lease.Name()))
	}
	h.expires = now.Add(h.client.opts.ttl)
	return h.expires, nil
}

func (s *Store) release(h *hold) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if h.client.state == killed {
		return // a dead process cannot tell the broker anything
	}
	s.dropLocked(h)
}

func (s *Store) holdsLocked(h *hold) bool {
	e := s.entries[h.lease.Name()]
	return e != nil && h.lease.Slot() <= len(e.holds) && e.holds[h.lease.Slot()-1] == h
}

// dropLocked removes h from its slot if it is still there and wakes the
// name's waiters.
func (s *Store) dropLocked(h *hold) {
	delete(h.client.leases, h)
	if !s.holdsLocked(h) {
		return
	}
	e := s.entries[h.lease.Name()]
	e.holds[h.lease.Slot()-1] = nil
	s.wakeLocked(e)
}

func (s *Store) wakeLocked(e *entry) {
	for w := range e.waiters {
		select {
		case w <- struct{}{}:
		default:
		}
	}
}

// wait runs the shared wait loop for name, woken by releases.
func (c *Client) wait(ctx context.Context, name string, size int) (locks.Lease, error) {
	s := c.store
	wake := make(chan struct{}, 1)
	s.mu.Lock()
	e := s.entryLocked(name, size)
	e.waiters[wake] = struct{}{}
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		delete(e.waiters, wake)
		s.mu.Unlock()
	}()
	return driver.Wait(ctx, wake, c.opts.backoff, func(ctx context.Context) (locks.Lease, error) {
		return c.acquire(ctx, name, size)
	})
}

// Revoke takes every lease on name away at once, as an administrator
// deleting the lock at the broker would: their contexts end with
// [locks.ErrLost] and waiters are woken. It reports how many leases ended.
func (s *Store) Revoke(name string) int {
	s.mu.Lock()
	e := s.entries[name]
	var gone []*hold
	if e != nil {
		for _, h := range e.holds {
			if h != nil {
				gone = append(gone, h)
				s.dropLocked(h)
			}
		}
	}
	s.mu.Unlock()
	for _, h := range gone {
		h.lease.End(driver.Lost(fmt.Errorf("memlock: %q revoked", name)))
	}
	return len(gone)
}

// Expire makes every lease on name expire now at the Store, as if its
// holders had stopped renewing for a whole TTL. The holders are not told:
// each finds out on its next renewal, and its lease then ends with
// [locks.ErrLost]. Meanwhile others may take the name, so Expire is the
// way to test that code stops when its lease's context ends.
func (s *Store) Expire(name string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	e := s.entries[name]
	if e == nil {
		return
	}
	now := time.Now()
	for _, h := range e.holds {
		if h != nil {
			h.expires = now
		}
	}
	s.wakeLocked(e)
}

// Locker is a [locks.Locker] of one [Client].
type Locker struct{ c *Client }

var _ locks.Locker = (*Locker)(nil)

// Locker returns the client's Locker.
func (c *Client) Locker() *Locker { return &Locker{c} }

// Lock blocks until it holds name; see [locks.Locker.Lock]. A client with a
// higher priority takes the name from a lower-priority holder at once.
func (l *Locker) Lock(ctx context.Context, name string) (locks.Lease, error) {
	if err := names.Check(name); err != nil {
		return nil, fmt.Errorf("memlock: lock: %w", err)
	}
	return l.c.wait(ctx, name, 1)
}

// TryLock takes name if it is free; see [locks.Locker.TryLock].
func (l *Locker) TryLock(ctx context.Context, name string) (locks.Lease, error) {
	if err := names.Check(name); err != nil {
		return nil, fmt.Errorf("memlock: lock: %w", err)
	}
	return l.c.acquire(ctx, name, 1)
}

// Semaphore is a [locks.Semaphore] of one [Client]. Its leases implement
// [locks.SlotLease].
type Semaphore struct {
	c    *Client
	size int
}

var _ locks.Semaphore = (*Semaphore)(nil)

// Semaphore returns a Semaphore with size slots per name. A size below 1
// returns an error matching [locks.ErrInvalidOption]. Semaphores of
// different sizes may share a name: each counts only the first size slots.
func (c *Client) Semaphore(size int) (*Semaphore, error) {
	if size < 1 {
		return nil, fmt.Errorf("memlock: %w", driver.InvalidOption("semaphore size must be >= 1, got %d", size))
	}
	return &Semaphore{c: c, size: size}, nil
}

// Acquire blocks until it holds a slot of name; see [locks.Semaphore.Acquire].
func (s *Semaphore) Acquire(ctx context.Context, name string) (locks.Lease, error) {
	if err := names.Check(name); err != nil {
		return nil, fmt.Errorf("memlock: acquire: %w", err)
	}
	return s.c.wait(ctx, name, s.size)
}

// TryAcquire takes a free slot of name if there is one; see
// [locks.Semaphore.TryAcquire].
func (s *Semaphore) TryAcquire(ctx context.Context, name string) (locks.Lease, error) {
	if err := names.Check(name); err != nil {
		return nil, fmt.Errorf("memlock: acquire: %w", err)
	}
	return s.c.acquire(ctx, name, s.size)
}
