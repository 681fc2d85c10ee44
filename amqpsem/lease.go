package amqpsem

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/latchkey-go/latchkey/locks"
	"github.com/latchkey-go/latchkey/locks/driver"
)

// ErrSlotRemoved is the reason a lease ends, wrapped in [locks.ErrLost],
// when verification finds its slot queue A[L] (or its own holder or mutex
// queue) gone: an administrator removed the slot or destroyed the
// semaphore.
var ErrSlotRemoved = errors.New("amqpsem: slot removed")

// Lease is a held mutex or semaphore slot: an exclusive queue this
// client's connection declared. It implements [locks.Lease] and
// [locks.SlotLease].
//
// The lease ends with [locks.ErrLost] when its connection closes, when a
// verification finds its slot removed (see [WithVerifyInterval]), or when
// no verification has succeeded for one heartbeat interval (the broker
// may then drop the connection, and the queue with it). When it ends so
// while the connection is open, the client deletes its queue in the
// background, without waiting for Release. Token is always 0: RabbitMQ
// gives nothing to build a fencing token from.
//
// A Lease is safe for concurrent use.
type Lease struct {
	base      *driver.Lease
	c         *session
	h         *holding
	slotQueue string    // A[L]; "" for a mutex
	deleting  sync.Once // see deleteQueueIfLost
}

var _ locks.SlotLease = (*Lease)(nil)

// newLease registers the lease on h, which this session has just
// declared (sent: when its declare was sent), with the client's
// registry, which verifies it every verify interval. When the client is
// closed meanwhile, or the session is gone, it deletes h's queue and
// returns an error matching [locks.ErrClosed].
func (c *session) newLease(ctx context.Context, name string, slot int, slotQueue string, h *holding, sent time.Time) (*Lease, error) {
	l := &Lease{c: c, h: h, slotQueue: slotQueue}
	base, err := c.client.reg.NewLease(ctx, driver.Spec{
		Name:     name,
		Slot:     slot,
		Deadline: sent.Add(c.heartbeat),
		Release:  func(ctx context.Context) error { return c.free(ctx, h) },
	})
	if err != nil { // the client is closed
		_ = c.free(context.WithoutCancel(ctx), h)
		return nil, &closedError{client: true}
	}
	l.base = base
	c.mu.Lock()
	if c.closed {
		cause := c.cause
		c.mu.Unlock()
		l.base.End(driver.Lost(cause))
		_ = c.free(context.WithoutCancel(ctx), h)
		return nil, asClosed(cause)
	}
	c.leases[l] = struct{}{}
	c.mu.Unlock()
	c.client.track(l)
	context.AfterFunc(l.base.Context(), func() {
		c.mu.Lock()
		delete(c.leases, l)
		c.mu.Unlock()
		c.client.untrack(l)
		l.deleteQueueIfLost()
	})
	return l, nil
}

// deleteQueueIfLost deletes the queue of a lease that ended with
// [locks.ErrLost] while its connection is open (a verification found the
// slot removed, none succeeded in time, or the client is closing): the
// holder no longer believes it holds the slot, so it must not keep it
// until a Release that may never come. The delete runs in the
// background, bounded by a heartbeat interval, and [Client.Close] waits
// for it. Only the first call starts it.
func (l *Lease) deleteQueueIfLost() {
	c := l.c
	if !errors.Is(context.Cause(l.base.Context()), locks.ErrLost) || c.conn.IsClosed() {
		return
	}
	l.deleting.Do(func() {
		c.goTracked(func() {
			ctx, cancel := context.WithTimeout(context.Background(), c.heartbeat)
			defer cancel()
			_ = c.free(ctx, l.h)
		})
	})
}

// Name returns the mutex or semaphore name.
func (l *Lease) Name() string { return l.base.Name() }

// Context returns a context that ends with the lease; [context.Cause]
// says why.
func (l *Lease) Context() context.Context { return l.base.Context() }

// Token returns 0: amqpsem has no fencing tokens.
func (l *Lease) Token() uint64 { return 0 }

// Slot returns the semaphore slot L, from 1, or 0 for a mutex.
func (l *Lease) Slot() int { return l.base.Slot() }

// Queue returns the exclusive queue the lease holds: B[L] for a slot, the
// mutex queue for a mutex.
func (l *Lease) Queue() string { return l.h.queue }

// Release ends the lease with [locks.ErrReleased] and deletes its queue,
// which frees the slot and wakes waiting clients. It is idempotent; see
// [locks.Lease.Release]. If ctx ends during the delete, Release waits up
// to a heartbeat interval more for it, then returns an error matching
// ctx.Err() while the delete goes on in the background. A ctx that has
// ended already does not stop the delete either: Release waits up to a
// heartbeat interval for it, returning nil if it is done by then, else an
// error matching ctx.Err() while it goes on.
func (l *Lease) Release(ctx context.Context) error {
	if err := checkCtx(ctx, "release", l.base.Name()); err != nil {
		return err
	}
	return l.base.Release(ctx)
}

// AfterEnd arranges for f to run in its own goroutine once the lease has
// ended, as [driver.Lease.AfterEnd] does; wrappers such as lockotel use
// it. stop unregisters f and reports whether it did so before f started.
func (l *Lease) AfterEnd(f func()) (stop func() bool) { return l.base.AfterEnd(f) }

// Verify checks at the broker, now, that the lease still holds its slot:
// that A[L] and B[L] (for a mutex, its queue) exist. When they do not, the
// lease ends with [locks.ErrLost] and [ErrSlotRemoved], its queue is
// deleted, and Verify returns that cause. On a lease that has ended,
// Verify returns its cause. When ctx ends first, the error matches
// ctx.Err() and the lease is left as it was.
func (l *Lease) Verify(ctx context.Context) error {
	if cause := context.Cause(l.base.Context()); cause != nil {
		return cause
	}
	r := l.c.verifyLeases(ctx, []*Lease{l})[0]
	if r.Err != nil {
		if errors.Is(r.Err, locks.ErrLost) {
			l.base.End(r.Err)
			l.deleteQueueNow()
		}
		return r.Err
	}
	l.base.Extend(r.Until)
	return nil
}

// deleteQueueNow deletes the lease's queue, waiting up to a heartbeat
// interval for it: the slot is void, and the specification asks holders
// of removed slots to relinquish them.
func (l *Lease) deleteQueueNow() {
	ctx, cancel := context.WithTimeout(context.Background(), l.c.heartbeat)
	defer cancel()
	_ = l.c.free(ctx, l.h)
}

// verifyLeases checks the queues of leases, all of this session, with one
// pipelined probe, and returns one renewal per lease: a new validity of
// one heartbeat after the probes were sent (the broker heard from the
// client then, and keeps its connection for at least two heartbeats of
// silence); a loss, with [ErrSlotRemoved], when a queue is gone; or the
// probe's error for all of them.
func (c *session) verifyLeases(ctx context.Context, leases []*Lease) []driver.Renewal {
	var queues []string
	for _, l := range leases {
		queues = append(queues, l.h.queue)
		if l.slotQueue != "" {
			queues = append(queues, l.slotQueue)
		}
	}
	out := make([]driver.Renewal, len(leases))
	got, sent, err := c.verifier.probe(ctx, queues...)
	k := 0
	for i, l := range leases {
		n := 1
		if l.slotQueue != "" {
			n = 2
		}
		switch {
		case err != nil:
			out[i] = driver.Renewal{Err: err}
		case !allTrue(got[k : k+n]):
			gone := queues[k]
			if got[k] {
				gone = queues[k+1]
			}
			cause := driver.Lost(fmt.Errorf("%w: queue %q of %q is gone", ErrSlotRemoved, gone, l.Name()))
			c.client.reg.Emit(driver.Event{Kind: driver.EventVerifyFailed, Name: l.Name(), Err: cause})
			out[i] = driver.Renewal{Err: cause}
		default:
			out[i] = driver.Renewal{Until: sent.Add(c.heartbeat)}
		}
		k += n
	}
	return out
}

func allTrue(bs []bool) bool {
	for _, b := range bs {
		if !b {
			return false
		}
	}
	return true
}
