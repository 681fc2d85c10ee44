package amqpsem

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/latchkey-go/latchkey/locks"
	"github.com/latchkey-go/latchkey/locks/driver"
)

// QuorumLease is a held token of a quorum lock or semaphore (see
// [Quorum]): a message of its token queue that this client holds
// unacknowledged on a channel of its own. It implements
// [locks.SlotLease].
//
// The lease ends with [locks.ErrLost] when its channel or connection
// closes (the broker then gives the token to the next client): among
// others when the token was held longer than the broker's consumer
// timeout (consumer_timeout, 30 minutes by default; the broker closes
// the channel with PRECONDITION_FAILED), when a verification finds its
// queue deleted ([ErrSlotRemoved]), or when no verification has
// succeeded for one heartbeat interval.
//
// A QuorumLease is safe for concurrent use.
type QuorumLease struct {
	base  *driver.Lease
	c     *session
	tc    *tokenChan
	tag   uint64
	queue string

	closing  sync.Once // see giveBack
	closeErr error
}

var _ locks.SlotLease = (*QuorumLease)(nil)

// newQuorumLease registers the token d, held on tc, as a lease valid for
// one heartbeat interval after sent.
func (c *session) newQuorumLease(ctx context.Context, name, queue string, lock bool, tc *tokenChan, d amqp.Delivery, sent time.Time) (*QuorumLease, error) {
	l := &QuorumLease{c: c, tc: tc, tag: d.DeliveryTag, queue: queue}
	cl := c.client
	slot := slotOf(d)
	if lock {
		slot = 0
	}
	base, err := cl.qreg.NewLease(ctx, driver.Spec{
		Name:     name,
		Token:    tokenOf(d),
		Slot:     slot,
		Deadline: sent.Add(c.heartbeat),
		Release:  l.free,
	})
	if err != nil { // the client is closed
		tc.discard()
		return nil, &closedError{client: true}
	}
	l.base = base
	cl.leaseMu.Lock()
	cl.qleases[base] = l
	cl.leaseMu.Unlock()
	if !tc.hold(l) {
		tc.mu.Lock()
		e := tc.cause
		tc.mu.Unlock()
		l.channelLost(e)
	}
	context.AfterFunc(l.base.Context(), func() {
		cl.leaseMu.Lock()
		delete(cl.qleases, base)
		cl.leaseMu.Unlock()
		if errors.Is(context.Cause(l.base.Context()), locks.ErrLost) {
			l.giveBack(false) // a lost lease must not keep the token
		}
	})
	if cause := context.Cause(l.base.Context()); cause != nil {
		return nil, cause
	}
	return l, nil
}

// channelLost ends the lease when its channel is gone (e: the broker's
// reason, nil for a close by the client).
func (l *QuorumLease) channelLost(e *amqp.Error) {
	var cause error = &closedError{}
	if e != nil {
		cause = &closedError{cause: e}
		switch {
		case e.Code == amqp.NotFound && strings.Contains(e.Reason, "'"+l.queue+"'"):
			// The token queue is gone.
			l.c.setMarker(l.queue, false)
			cause = fmt.Errorf("%w: token queue %q of %q is gone: %w", ErrSlotRemoved, l.queue, l.Name(), e)
		case !l.c.conn.IsClosed():
			// The channel alone was closed: a consumer timeout, or
			// another channel error.
			cause = fmt.Errorf("amqpsem: the broker closed the channel holding the token of %q: %w", l.Name(), e)
		}
	}
	l.base.End(driver.Lost(cause))
}

// free gives the token back with a reject with requeue, which the
// broker counts as a return, followed by a round trip, and the channel
// back to the pool. A ctx that has ended does not stop it: free waits up
// to a heartbeat interval, returning ctx's error if it is not done by
// then (the channel's close, or the connection's, gives the token back
// all the same).
func (l *QuorumLease) free(ctx context.Context) error {
	bctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), l.c.heartbeat)
	defer cancel()
	err := l.c.run(bctx, 0, func() error { return l.giveBack(true) }, nil)
	if errors.Is(err, locks.ErrClosed) {
		return nil // the connection's close gave the token back
	}
	if err != nil && ctx.Err() != nil {
		return errors.Join(ctx.Err(), err)
	}
	return err
}

// giveBack returns the token, once, whoever asks first: with reject, a
// reject with requeue, and the channel goes back to the pool; without,
// the channel's close (a lost lease's: the broker returns what a closed
// channel held).
func (l *QuorumLease) giveBack(reject bool) error {
	l.closing.Do(func() {
		if !reject {
			l.tc.discard()
			return
		}
		err := l.tc.ch.Reject(l.tag, true)
		if err == nil {
			// A round trip after the reject, answered by the channel
			// itself (basic.qos involves no queue): the channel has
			// handled the reject, and sent the return to the queue,
			// when Release returns, so that a client told of the
			// release finds the token free.
			err = l.tc.ch.Qos(1, 0, false)
		}
		if err != nil {
			l.tc.discard()
			if errors.Is(err, amqp.ErrClosed) || amqpCode(err) == amqp.NotFound {
				err = nil // a closed channel gave the token back, or the queue is gone
			}
			l.closeErr = err
			return
		}
		l.tc.put()
	})
	return l.closeErr
}

// verifyQuorum is the quorum registry's renewal: each lease checks that
// its token queue exists (a passive declare on a pooled channel, not the
// token channel, which a failed check would close). A success extends the
// lease to one heartbeat interval after the check was sent; a missing
// queue ends it with [locks.ErrLost] and [ErrSlotRemoved].
func (c *Client) verifyQuorum(ctx context.Context, batch []*driver.Lease) []driver.Renewal {
	out := make([]driver.Renewal, len(batch))
	ls := make([]*QuorumLease, len(batch))
	c.leaseMu.Lock()
	for i, b := range batch {
		ls[i] = c.qleases[b]
	}
	c.leaseMu.Unlock()
	done := make(chan struct{}, len(batch))
	for i, l := range ls {
		if l == nil {
			done <- struct{}{}
			continue
		}
		go func() {
			defer func() { done <- struct{}{} }()
			sent := time.Now()
			err := l.c.call(ctx, func(ch *amqp.Channel) error {
				_, err := ch.QueueDeclarePassive(l.queue, true, false, false, false, nil)
				return err
			}, nil)
			switch {
			case amqpCode(err) == amqp.NotFound:
				l.c.setMarker(l.queue, false)
				cause := driver.Lost(fmt.Errorf("%w: token queue %q of %q is gone", ErrSlotRemoved, l.queue, l.Name()))
				c.qreg.Emit(driver.Event{Kind: driver.EventVerifyFailed, Name: l.Name(), Err: cause})
				out[i] = driver.Renewal{Err: cause}
			case err != nil:
				out[i] = driver.Renewal{Err: err}
			default:
				out[i] = driver.Renewal{Until: sent.Add(l.c.heartbeat)}
			}
		}()
	}
	for range batch {
		<-done
	}
	return out
}

// Name returns the lock or semaphore name.
func (l *QuorumLease) Name() string { return l.base.Name() }

// Context returns a context that ends with the lease; [context.Cause]
// says why.
func (l *QuorumLease) Context() context.Context { return l.base.Context() }

// Token returns the lease's fencing token: one more than the number of
// times the broker handed out this token message before, plus the
// token's base (0). Every later holder of the same token has a greater
// one, as long as the token queue is not destroyed: a name made again
// starts from 1. For a semaphore it is per slot: strictly increasing
// among the holders of one [QuorumLease.Slot].
func (l *QuorumLease) Token() uint64 { return l.base.Token() }

// Slot returns the token's slot, from 1, or 0 for a lock.
func (l *QuorumLease) Slot() int { return l.base.Slot() }

// Queue returns the token queue.
func (l *QuorumLease) Queue() string { return l.queue }

// Release ends the lease with [locks.ErrReleased] and gives the token
// back to the queue, where the longest-waiting client gets it. It is
// idempotent.
func (l *QuorumLease) Release(ctx context.Context) error {
	if err := checkCtx(ctx, "release", l.base.Name()); err != nil {
		return err
	}
	return l.base.Release(ctx)
}

// AfterEnd arranges for f to run in its own goroutine once the lease has
// ended; see [driver.Lease.AfterEnd].
func (l *QuorumLease) AfterEnd(f func()) (stop func() bool) { return l.base.AfterEnd(f) }
