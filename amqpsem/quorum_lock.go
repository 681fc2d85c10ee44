package amqpsem

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/latchkey-go/latchkey/locks"
	"github.com/latchkey-go/latchkey/locks/driver"
)

// QuorumLocker is the lock of the quorum layout (see [Quorum]): holding
// name means holding the one token message of the quorum queue "name-Q"
// unacknowledged. It implements [locks.Locker]; its leases are
// *[QuorumLease]s with Slot 0 and a fencing token.
//
// Waiting Locks are served in the order they started waiting: each
// subscribes to the queue with a prefetch of one, and the broker hands a
// returned token to the subscriber that has waited longest.
//
// A QuorumLocker is safe for concurrent use.
type QuorumLocker struct {
	q *Quorum
}

// QuorumSemaphore is the semaphore of the quorum layout (see [Quorum]):
// holding a slot of name means holding one of the token messages of the
// quorum queue "name-Q" unacknowledged. It implements
// [locks.Semaphore]; its leases are *[QuorumLease]s whose Slot is the
// token's slot and whose Token is that slot's fencing token.
//
// A QuorumSemaphore is safe for concurrent use.
type QuorumSemaphore struct {
	q    *Quorum
	size int
}

var (
	_ locks.Locker      = (*QuorumLocker)(nil)
	_ locks.Semaphore   = (*QuorumSemaphore)(nil)
	_ driver.Observable = (*QuorumLocker)(nil)
	_ driver.Observable = (*QuorumSemaphore)(nil)
)

// Locker returns the quorum layout's lock. With [WithCreate], a Lock on a
// name that does not exist makes it with one token.
func (q *Quorum) Locker() *QuorumLocker { return &QuorumLocker{q: q} }

// Semaphore returns the quorum layout's semaphore. With [WithCreate], an
// acquire on a name that does not exist makes it with size tokens; size
// is used for nothing else. A size out of 1..[MaxSemaphoreSize] gives an
// error matching [ErrInvalidSlots].
func (q *Quorum) Semaphore(size int) (*QuorumSemaphore, error) {
	if err := checkCount("size", size); err != nil {
		return nil, driver.Errorf(backend, "semaphore", "", err)
	}
	return &QuorumSemaphore{q: q, size: size}, nil
}

// Observe implements [driver.Observable]: fn sees the client's quorum
// leases' events.
func (m *QuorumLocker) Observe(fn func(driver.Event)) (stop func()) { return m.q.cl.qreg.Observe(fn) }

// Observe implements [driver.Observable]: fn sees the client's quorum
// leases' events.
func (s *QuorumSemaphore) Observe(fn func(driver.Event)) (stop func()) {
	return s.q.cl.qreg.Observe(fn)
}

// TryLock takes name's token if it is free now, in one round trip, and
// returns an error matching [locks.ErrNotAcquired] otherwise.
func (m *QuorumLocker) TryLock(ctx context.Context, name string) (locks.Lease, error) {
	return m.q.acquire(ctx, "trylock", name, 0, false)
}

// Lock waits until it holds name's token. On failure nothing is held;
// when ctx ends first, the error matches ctx.Err().
func (m *QuorumLocker) Lock(ctx context.Context, name string) (locks.Lease, error) {
	return m.q.acquire(ctx, "lock", name, 0, true)
}

// TryAcquire takes one of name's tokens if one is free now, and returns
// an error matching [locks.ErrNotAcquired] otherwise.
func (s *QuorumSemaphore) TryAcquire(ctx context.Context, name string) (locks.Lease, error) {
	return s.q.acquire(ctx, "tryacquire", name, s.size, false)
}

// Acquire waits until it holds one of name's tokens.
func (s *QuorumSemaphore) Acquire(ctx context.Context, name string) (locks.Lease, error) {
	return s.q.acquire(ctx, "acquire", name, s.size, true)
}

// acquire takes a token of name, waiting for one if wait; size 0 is the
// lock. A name without a token queue is made with size tokens (one for
// the lock) when the client was dialed [WithCreate], and is an error
// matching [ErrNoSlots] otherwise.
func (q *Quorum) acquire(ctx context.Context, op, name string, size int, wait bool) (locks.Lease, error) {
	if err := checkCtx(ctx, op, name); err != nil {
		return nil, err
	}
	queue, err := checkQuorumName(name)
	if err != nil {
		return nil, opError(op, name, err)
	}
	ctx, cancel := q.cl.qreg.Bind(ctx)
	defer cancel()
	created := false
	for {
		s, err := q.cl.session(ctx)
		if err != nil {
			return nil, q.cl.fail(ctx, op, name, err)
		}
		l, err := s.takeToken(ctx, name, queue, size == 0, wait)
		if errors.Is(err, errNoQueue) && q.cl.opts.create && !created {
			created = true
			if err := q.create(ctx, name, max(size, 1)); err != nil && !errors.Is(err, ErrExists) {
				return nil, q.cl.fail(ctx, op, name, err)
			}
			continue
		}
		if err != nil {
			return nil, q.cl.fail(ctx, op, name, err)
		}
		return l, nil
	}
}

// takeToken takes a token of queue on a token channel: first with
// basic.get (one round trip when a token is free), then, if wait, by
// subscribing with a prefetch of one until the broker delivers one.
func (c *session) takeToken(ctx context.Context, name, queue string, lock, wait bool) (*QuorumLease, error) {
	tc, err := c.tokenChannel()
	if err != nil {
		return nil, err
	}
	ch := tc.ch
	var (
		d   amqp.Delivery
		got bool
	)
	sent := time.Now()
	err = c.run(ctx, c.heartbeat, func() error {
		// The marker exchange exists once the queue is up: a basic.get
		// on a quorum queue whose Raft members are still starting fails
		// the whole connection (INTERNAL_ERROR, measured on 3.10.8).
		// The session checks it once per name. (Not pipelined with the
		// get: a get sent after a failed passive declare, which the
		// broker answers by closing the channel, can reach the broker
		// after the close handshake and fail the connection.)
		if !c.markerSeen(queue) {
			if err := ch.ExchangeDeclarePassive(queue, amqp.ExchangeFanout, true, false, false, false, nil); err != nil {
				return err
			}
			c.setMarker(queue, true)
		}
		for {
			var err error
			d, got, err = ch.Get(queue, false)
			if err != nil || !got || isToken(d) {
				return err
			}
			// Not a token (a message someone else published to the
			// queue, such as another layout's existence probe): drop it.
			if err := ch.Ack(d.DeliveryTag, false); err != nil {
				return err
			}
		}
	}, func() {
		if got {
			tc.giveBackNow(d)
		} else {
			tc.put()
		}
	})
	if err != nil {
		err = tc.closeReason(err)
	}
	switch {
	case amqpCode(err) == amqp.NotFound:
		c.setMarker(queue, false)
		return nil, fmt.Errorf("%w: queue %q", errNoQueue, queue)
	case err != nil:
		tc.discard()
		return nil, err
	case got:
		return c.newQuorumLease(ctx, name, queue, lock, tc, d, sent)
	case !wait:
		tc.put()
		return nil, &locks.HeldError{Name: name, Err: unprefixed{ErrAllHeld}}
	}
	var deliveries <-chan amqp.Delivery
	subscribed := time.Now()
	tag := fmt.Sprintf("latchkey-%d", consumerSeq.Add(1))
	err = c.run(ctx, c.heartbeat, func() error {
		var err error
		deliveries, err = ch.Consume(queue, tag, false, false, false, false, nil)
		return err
	}, func() { tc.abandon(tag) })
	if err != nil {
		if err = tc.closeReason(err); amqpCode(err) == amqp.NotFound {
			c.setMarker(queue, false)
			return nil, fmt.Errorf("%w: queue %q", errNoQueue, queue)
		}
		tc.discard()
		return nil, err
	}
	var d2 amqp.Delivery
	for {
		var ok bool
		select {
		case <-ctx.Done():
			tc.abandon(tag) // a token delivered meanwhile goes back
			return nil, ctx.Err()
		case <-tc.dead:
			tc.mu.Lock()
			e := tc.cause
			tc.mu.Unlock()
			if e != nil && e.Code == amqp.NotFound {
				c.setMarker(queue, false)
				return nil, fmt.Errorf("%w: queue %q: %w", ErrSlotRemoved, queue, e)
			}
			return nil, c.connErr(&closedError{cause: e})
		case d2, ok = <-deliveries:
		}
		if !ok {
			c.setMarker(queue, false)
			tc.discard()
			return nil, c.connErr(fmt.Errorf("amqpsem: the broker cancelled the subscription to %q (queue deleted?)", queue))
		}
		if isToken(d2) {
			break
		}
		// Not a token: drop it and wait on (the credit comes back).
		if err := ch.Ack(d2.DeliveryTag, false); err != nil {
			tc.discard()
			return nil, c.connErr(err)
		}
	}
	d = d2
	// Stop the subscription: with a prefetch of one nothing else is
	// delivered while the token is unacknowledged, and the channel keeps
	// the token after the cancel. No answer is awaited: the release's
	// reject comes after the cancel in the channel's order.
	if err := ch.Cancel(d.ConsumerTag, true); err != nil {
		tc.discard()
		return nil, c.connErr(err)
	}
	// The broker heard from this client when it answered the
	// subscription: the lease is valid for a heartbeat interval from
	// then. After a long wait, a probe starts it afresh.
	if time.Since(subscribed) > c.heartbeat/2 {
		subscribed = time.Now()
		err := c.run(ctx, c.heartbeat, func() error {
			_, err := ch.QueueDeclarePassive(queue, true, false, false, false, nil)
			return err
		}, tc.closeNow)
		if err != nil {
			tc.discard()
			return nil, tc.closeReason(err)
		}
	}
	return c.newQuorumLease(ctx, name, queue, lock, tc, d, subscribed)
}

// consumerSeq numbers the subscriptions of the process, for their tags.
var consumerSeq atomic.Uint64

// isToken reports whether d is a token of the quorum layout (it carries
// the slot header Create gives every token).
func isToken(d amqp.Delivery) bool {
	_, ok := intHeader(d.Headers, headerSlot)
	return ok
}
