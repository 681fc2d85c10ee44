package memlock

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/latchkey-go/latchkey/locks"
	"github.com/latchkey-go/latchkey/locks/driver"
)

// Client is one process's connection to a [Store]: its Locker and
// Semaphores share its options and its leases, which the client renews
// together, one round for all of them, and which end together when it
// is closed or killed.
//
// A Client is safe for concurrent use.
type Client struct {
	store *Store
	id    string
	opts  options
	reg   *driver.Registry

	// state and holds are guarded by store.mu.
	state clientState
	holds map[*driver.Lease]*hold
}

type clientState int

const (
	alive clientState = iota
	closed
	killed
)

// NewClient returns a client of s with the given options. Invalid options
// return an error matching [locks.ErrInvalidOption]. NewClient does no
// I/O; close the client when done.
func (s *Store) NewClient(opts ...Option) (*Client, error) {
	o := defaults()
	if err := driver.Apply(&o, opts); err != nil {
		return nil, driver.Errorf(backend, "new", "", err)
	}
	if o.renew == 0 {
		o.renew = o.ttl / 3
	}
	if o.renew >= o.ttl {
		return nil, driver.Errorf(backend, "new", "", driver.InvalidOption("renew interval %v must be shorter than the TTL %v", o.renew, o.ttl))
	}
	s.mu.Lock()
	s.nextID++
	id := fmt.Sprintf("client-%d", s.nextID)
	s.mu.Unlock()
	c := &Client{store: s, id: id, opts: o, holds: make(map[*driver.Lease]*hold)}
	reg, err := driver.NewRegistry(driver.Config{Backend: backend, RenewEvery: o.renew, Renew: c.renew})
	if err != nil {
		return nil, driver.Errorf(backend, "new", "", err)
	}
	c.reg = reg
	return c, nil
}

// NewLocker is a shortcut for a new client's [Client.Locker], for tests
// that never close it.
func (s *Store) NewLocker(opts ...Option) (*Locker, error) {
	c, err := s.NewClient(opts...)
	if err != nil {
		return nil, err
	}
	return c.Locker(), nil
}

// ID returns the client's identity, as reported in [locks.HeldError.Holder].
func (c *Client) ID() string { return c.id }

// Close ends every lease of the client with an error matching
// [locks.ErrLost] and [locks.ErrClosed], releases them, makes waiting
// calls return and later calls fail with an error matching
// [locks.ErrClosed]. It returns early, with an error matching ctx.Err(),
// if ctx ends first. Close is idempotent.
func (c *Client) Close(ctx context.Context) error {
	if err := driver.CheckContext(ctx, backend, "close", ""); err != nil {
		return err
	}
	if !c.setState(closed) {
		return nil
	}
	return driver.Errorf("memlock", "close", "", c.reg.Close(ctx, nil))
}

// Kill simulates a crash: the client stops renewing, its leases end at
// once with [locks.ErrLost] on its side, but the Store keeps them until
// their TTL runs out, as a broker would for a dead process. Later calls
// return [locks.ErrClosed]. Kill is idempotent, and does nothing after
// Close.
func (c *Client) Kill() error {
	if !c.setState(killed) {
		return nil
	}
	cause := driver.Lost(fmt.Errorf("memlock: client %s killed: %w", c.id, locks.ErrClosed))
	return c.reg.Close(context.Background(), cause)
}

// setState moves a live client to state to, and reports whether it did.
func (c *Client) setState(to clientState) bool {
	c.store.mu.Lock()
	defer c.store.mu.Unlock()
	if c.state != alive {
		return false
	}
	c.state = to
	return true
}

// acquire tries once to win a slot of name among the first size slots;
// a lock (slotted false) is slot 0 for its user, a semaphore's slots
// count from 1.
func (c *Client) acquire(ctx context.Context, name string, size int, slotted bool) (locks.Lease, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	s := c.store
	s.mu.Lock()
	if c.state != alive {
		s.mu.Unlock()
		return nil, fmt.Errorf("client %s: %w", c.id, locks.ErrClosed)
	}
	e := s.entryLocked(name, size)
	now := time.Now()
	slot, victim := c.pickSlotLocked(e, size, now)
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
	h, err := c.holdLocked(ctx, e, name, slot, slotted, now)
	if err == nil && preempted != nil {
		// In one process the victim's acknowledgement is immediate: its
		// lease ends before the store is unlocked, so before anyone can
		// take the name from the thief in turn (ended after the unlock, a
		// thief's thief could be granted while it still ran: a chaos
		// run's chain of three priorities).
		preempted.lease.End(driver.Preempted(fmt.Errorf("memlock: %q taken by %s with priority %d", name, c.id, c.opts.priority)))
	}
	s.mu.Unlock()
	if err != nil {
		return nil, err
	}
	return h.lease.Handle(), nil
}

// pickSlotLocked returns the first free slot of e's first size, or -1
// and the slot of the lowest priority below the client's, or -1.
func (c *Client) pickSlotLocked(e *entry, size int, now time.Time) (slot, victim int) {
	victim = -1
	for i, h := range e.holds[:size] {
		if h == nil || !h.expires.After(now) {
			return i, -1
		}
		if h.priority < c.opts.priority && (victim < 0 || h.priority < e.holds[victim].priority) {
			victim = i
		}
	}
	return -1, victim
}

// holdLocked makes the client's hold of slot and its lease.
func (c *Client) holdLocked(ctx context.Context, e *entry, name string, slot int, slotted bool, now time.Time) (*hold, error) {
	s := c.store
	h := &hold{client: c, name: name, slot: slot, expires: now.Add(c.opts.ttl), priority: c.opts.priority}
	spec := driver.Spec{
		Name:     name,
		Token:    e.counter + 1,
		Deadline: h.expires,
		Release:  func(context.Context) error { s.release(h); return nil },
	}
	if slotted {
		spec.Slot = slot + 1
	}
	lease, err := c.reg.NewLease(ctx, spec)
	if err != nil {
		return nil, err
	}
	e.counter++
	h.lease = lease
	e.holds[slot] = h
	c.holds[lease] = h
	return h, nil
}

// renew renews a batch of the client's leases, one round under the
// Store's lock. A lease whose hold expired or was taken away is lost,
// then dropped from the Store.
func (c *Client) renew(_ context.Context, batch []*driver.Lease) []driver.Renewal {
	s := c.store
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]driver.Renewal, len(batch))
	now := time.Now()
	for i, l := range batch {
		h := c.holds[l]
		switch {
		case c.state != alive:
			out[i].Err = driver.Lost(errors.New("memlock: client is not alive"))
		case h == nil || !s.holdsLocked(h) || !h.expires.After(now):
			out[i].Err = driver.Lost(fmt.Errorf("memlock: %q expired or was taken away", l.Name()))
			if h != nil {
				out[i].Then = func() {
					s.mu.Lock()
					defer s.mu.Unlock()
					s.dropLocked(h)
				}
			}
		default:
			h.expires = now.Add(c.opts.ttl)
			out[i].Until = h.expires
		}
	}
	return out
}

// wait runs the shared wait loop for name, woken by releases; it ends
// when the client closes too.
func (c *Client) wait(ctx context.Context, name string, size int, slotted bool) (locks.Lease, error) {
	ctx, cancel := c.reg.Bind(ctx)
	defer cancel()
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
	lease, err := driver.Wait(ctx, wake, c.opts.backoff, func(ctx context.Context) (locks.Lease, error) {
		return c.acquire(ctx, name, size, slotted)
	})
	if err != nil && c.reg.Closed() && !errors.Is(err, locks.ErrClosed) {
		err = fmt.Errorf("client %s: %w: %w", c.id, locks.ErrClosed, err)
	}
	return lease, err
}
