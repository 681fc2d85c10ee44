package amqpsem

import (
	"context"
	"errors"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/latchkey-go/latchkey/locks"
	"github.com/latchkey-go/latchkey/locks/driver"
)

// Locker is the exclusive-queue mutex: holding name means this client's
// connection has declared the exclusive queue the layout names for it
// (for [DefaultLayout], the queue "name" itself). RabbitMQ lets one
// connection at a time own an exclusive queue, and deletes it when that
// connection closes. A Locker's lock on a semaphore's name is that
// semaphore's administration mutex. It implements [locks.Locker]; its
// leases are *[Lease]s with Slot 0.
//
// A Locker is safe for concurrent use; a name held by one of its leases
// is not available to another call of the same client (leases are not
// reentrant).
type Locker struct {
	cl   *Client
	c    *session // of one call; see bind
	opts options
}

var (
	_ locks.Locker      = (*Locker)(nil)
	_ driver.Observable = (*Locker)(nil)
)

// Observe implements [driver.Observable]: fn sees the client's events.
func (m *Locker) Observe(fn func(driver.Event)) (stop func()) { return m.cl.Observe(fn) }

// bind returns m bound to the client's live session, for one call,
// waiting for a reconnection until ctx ends; a bound m is returned as
// it is.
func (m *Locker) bind(ctx context.Context) (*Locker, error) {
	if m.c != nil {
		return m, nil
	}
	s, err := m.cl.session(ctx)
	if err != nil {
		return nil, err
	}
	b := *m
	b.c = s
	return &b, nil
}

// derive applies opts on top of the client's options.
func (c *Client) derive(opts []Option) (options, error) {
	o := c.opts
	o.connSet = false
	if err := driver.Apply(&o, opts); err != nil {
		return o, err
	}
	if o.connSet {
		return o, driver.InvalidOption("connection options are given to Dial")
	}
	return o, nil
}

// TryLock declares name's exclusive queue and returns the lease. When
// another connection holds it (RESOURCE_LOCKED), or this client does, it
// returns an error matching [locks.ErrNotAcquired] at once. Invalid names
// return an error matching [locks.ErrInvalidName] before any I/O. On
// failure nothing is held; when ctx ends first, the error matches
// ctx.Err().
func (m *Locker) TryLock(ctx context.Context, name string) (locks.Lease, error) {
	if err := checkCtx(ctx, "trylock", name); err != nil {
		return nil, err
	}
	if _, err := m.opts.layout.checkMutexName(name); err != nil {
		return nil, opError("trylock", name, err)
	}
	ctx, cancel := m.cl.reg.Bind(ctx)
	defer cancel()
	b, err := m.bind(ctx)
	if err != nil {
		return nil, m.cl.fail(ctx, "trylock", name, err)
	}
	l, err := b.try(ctx, name, false)
	if err != nil {
		return nil, m.cl.fail(ctx, "trylock", name, err)
	}
	return l, nil
}

// Lock blocks until it holds name. Invalid names return an error
// matching [locks.ErrInvalidName] before any I/O. On failure nothing is
// held; when ctx ends first, the error matches ctx.Err().
//
// Waiting Locks take turns: a clean release wakes one waiting client at
// once (see [WithWakeExchange]), which declares the queue without
// checking first; were the shared wake queue unusable, every waiter
// wakes, and checks first. A Lock within 100ms of this client releasing
// name while others waited does not take it straight back: it waits for
// its turn too. A crashed holder is noticed by polling with the client's
// back-off, once the broker drops the dead connection (see the package
// documentation). A poll checks whether the queue exists, so that
// polling breaks no channel; while wake-ups work, a queue found free is
// only declared when it is still free at the next poll, so as not to
// race the waiter a release woke: a lost wake-up costs up to two
// back-off delays.
func (m *Locker) Lock(ctx context.Context, name string) (locks.Lease, error) {
	if err := checkCtx(ctx, "lock", name); err != nil {
		return nil, err
	}
	q, err := m.opts.layout.checkMutexName(name)
	if err != nil {
		return nil, opError("lock", name, err)
	}
	ctx, cancel := m.cl.reg.Bind(ctx)
	defer cancel()
	b, err := m.bind(ctx)
	if err != nil {
		return nil, m.cl.fail(ctx, "lock", name, err)
	}
	l, err := b.lock(ctx, name, q)
	if err != nil {
		return nil, m.cl.fail(ctx, "lock", name, err)
	}
	return l, nil
}

// lock is Lock on a bound Locker, for queue q of name.
func (m *Locker) lock(ctx context.Context, name, q string) (*Lease, error) {
	yieldToWoken := m.c.wakes.waitedAtRelease(ctx, q, m.opts.backoff.Min)
	if !yieldToWoken {
		l, err := m.try(ctx, name, false)
		if err == nil {
			return l, nil
		}
		if !errors.Is(err, locks.ErrNotAcquired) {
			return nil, err
		}
	}
	sub, leave := m.c.wakes.takeTurns(ctx, name)
	freeSeen := false
	l, err := driver.Wait(ctx, sub.c, m.opts.backoff, func(ctx context.Context) (*Lease, error) {
		if yieldToWoken {
			// Let the woken waiters go first: sleep until a wake-up or
			// the first back-off delay.
			yieldToWoken = false
			return nil, &locks.HeldError{Name: name, Holder: "a client this one yields to"}
		}
		if err := ctx.Err(); err != nil {
			return nil, err // a wake-up not used is passed on by leave
		}
		woken := sub.woken()
		if !sub.turns {
			// Fan-out wakes every waiter, or nothing does: check first.
			return m.try(ctx, name, true)
		}
		if woken {
			// A release handed this call its turn: the queue is most
			// likely free, so declare it without checking first.
			freeSeen = false
			l, err := m.try(ctx, name, false)
			if amqpCode(err) == amqp.ResourceLocked {
				// Another client took it first; the wait goes on.
				m.cl.reg.Emit(driver.Event{Kind: driver.EventResourceLocked, Name: name, Err: err})
			}
			if err != nil && !errors.Is(err, locks.ErrNotAcquired) {
				// Not used (ctx ended, the channel broke...): leave
				// passes it on, or the other waiters would poll.
				sub.pending.Store(true)
			}
			return l, err
		}
		// Polling while waiters take turns: a free queue found without
		// a wake-up is most likely being handed to the waiter the
		// release woke. Declare only when it is still free at the next
		// poll (its holder crashed, or the wake-up was lost).
		held, err := m.held(ctx, q)
		switch {
		case err != nil:
			return nil, err
		case held || !freeSeen:
			freeSeen = !held
			return nil, &locks.HeldError{Name: name}
		}
		freeSeen = false
		return m.try(ctx, name, false)
	})
	leave(err == nil)
	return l, err
}

func (m *Locker) try(ctx context.Context, name string, probeFirst bool) (*Lease, error) {
	q, err := m.opts.layout.checkMutexName(name)
	if err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	c := m.c
	h, err := c.reserve(q, name)
	if err != nil {
		return nil, err
	}
	if h == nil {
		return nil, &locks.HeldError{Name: name, Holder: "this client"}
	}
	if probeFirst {
		got, _, err := c.probes.probe(ctx, q)
		if err != nil || got[0] {
			c.unreserve(h)
			if err != nil {
				return nil, err
			}
			return nil, &locks.HeldError{Name: name}
		}
	}
	sent := time.Now()
	if err := c.declareExclusive(ctx, h, m.opts.layout.Args); err != nil {
		return nil, declareError(name, q, err)
	}
	return c.newLease(ctx, name, 0, "", h, sent)
}

// held reports whether queue q exists, or is held or being declared by
// this client.
func (m *Locker) held(ctx context.Context, q string) (bool, error) {
	if m.c.reserved(q) {
		return true, nil
	}
	got, _, err := m.c.probes.probe(ctx, q)
	if err != nil {
		return false, err
	}
	return got[0], nil
}

// declareError classifies the error of declaring exclusive queue q for
// name.
func declareError(name, q string, err error) error {
	switch code := amqpCode(err); {
	case code == amqp.ResourceLocked: // another connection owns it
		return &locks.HeldError{Name: name, Err: errorf("queue %q: %w", q, err)}
	case code == amqp.PreconditionFailed: // different arguments
		return errorf("amqpsem: queue %q exists with other arguments (another layout?): %w", q, err)
	}
	return err
}
