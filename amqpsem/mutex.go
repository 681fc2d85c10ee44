package amqpsem

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/latchkey-go/latchkey/locks"
)

// Mutex is the exclusive-queue mutex: holding name means this client's
// connection has declared the exclusive queue the layout names for it
// (for [DefaultLayout], the queue "name" itself). RabbitMQ lets one
// connection at a time own an exclusive queue, and deletes it when that
// connection closes. A Mutex on a semaphore's name is that semaphore's
// administration mutex. It implements [locks.Locker].
//
// A Mutex is safe for concurrent use; a name held by one of its leases is
// not available to another call of the same client (leases are not
// reentrant).
type Mutex struct {
	c    *Client
	opts options
}

var _ locks.Locker = (*Mutex)(nil)

// Mutex returns the client's mutex, with opts on top of the client's
// options. Invalid options, and connection options, return an error
// matching [locks.ErrInvalidOption].
func (c *Client) Mutex(opts ...Option) (*Mutex, error) {
	o, err := c.derive(opts)
	if err != nil {
		return nil, err
	}
	return &Mutex{c: c, opts: o}, nil
}

// derive applies opts on top of the client's options.
func (c *Client) derive(opts []Option) (options, error) {
	o := c.opts
	o.connSet = false
	if err := locks.Apply(&o, opts); err != nil {
		return o, fmt.Errorf("amqpsem: %w", err)
	}
	if o.connSet {
		return o, fmt.Errorf("amqpsem: %w", locks.InvalidOption("connection options are given to Dial"))
	}
	return o, nil
}

// TryLock declares name's exclusive queue and returns the lease. When
// another connection holds it (RESOURCE_LOCKED), or this client does, it
// returns an error matching [locks.ErrNotAcquired] at once. Invalid names
// return an error matching [locks.ErrInvalidName] before any I/O. On
// failure nothing is held; when ctx ends first, the error matches
// ctx.Err().
func (m *Mutex) TryLock(ctx context.Context, name string) (locks.Lease, error) {
	l, err := m.try(ctx, name, false)
	if err != nil {
		return nil, err
	}
	return l, nil
}

// Lock blocks until it holds name. A clean release by another client
// wakes it at once (see [WithWakeExchange]); a crashed holder is noticed
// by polling with the client's back-off, once the broker drops the dead
// connection (see the package documentation). Each retry first checks
// whether the queue exists, so that waiting does not break a channel per
// attempt. On failure nothing is held; when ctx ends first, the error
// matches ctx.Err().
func (m *Mutex) Lock(ctx context.Context, name string) (locks.Lease, error) {
	l, err := m.try(ctx, name, false)
	if err == nil {
		return l, nil
	}
	if !errors.Is(err, locks.ErrNotAcquired) {
		return nil, err
	}
	wake, unsubscribe := m.c.wakes.subscribe(ctx, name)
	defer unsubscribe()
	l, err = locks.Wait(ctx, wake, m.opts.backoff, func(ctx context.Context) (*Lease, error) {
		return m.try(ctx, name, true)
	})
	if err != nil {
		return nil, err
	}
	return l, nil
}

func (m *Mutex) try(ctx context.Context, name string, probeFirst bool) (*Lease, error) {
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
		return nil, fmt.Errorf("amqpsem: lock %q: %w", name, err)
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
		return nil, declareError("lock", name, q, err)
	}
	return c.newLease(ctx, name, 0, "", h, sent)
}

// declareError classifies the error of declaring exclusive queue q.
func declareError(op, name, q string, err error) error {
	switch code := amqpCode(err); {
	case code == 405: // RESOURCE_LOCKED: another connection owns it
		return &locks.HeldError{Name: name, Err: fmt.Errorf("amqpsem: queue %q: %w", q, err)}
	case code == 406: // PRECONDITION_FAILED: different arguments
		return fmt.Errorf("amqpsem: %s %q: queue %q exists with other arguments (another layout?): %w", op, name, q, err)
	}
	return fmt.Errorf("amqpsem: %s %q: %w", op, name, err)
}
