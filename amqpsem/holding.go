package amqpsem

import (
	"context"
	"errors"
	"sync"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/latchkey-go/latchkey/locks"
)

// holding is one exclusive queue this client declared or is declaring.
type holding struct {
	queue   string
	wakeKey string

	mu      sync.Mutex
	freeing bool          // a free has started
	freed   chan struct{} // closed when it is over; err is then set
	err     error
}

// reserve claims queue for this client, so that two of its own calls never
// both "win" a queue (a connection may redeclare its own exclusive queue).
func (c *session) reserve(queue, wakeKey string) (*holding, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return nil, asClosed(c.cause)
	}
	if c.held[queue] != nil {
		return nil, nil
	}
	h := &holding{queue: queue, wakeKey: wakeKey, freed: make(chan struct{})}
	c.held[queue] = h
	return h, nil
}

func (c *session) unreserve(h *holding) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.held[h.queue] == h {
		delete(c.held, h.queue)
	}
}

func (c *session) reserved(queue string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.held[queue] != nil
}

// declareExclusive declares h's queue, exclusive to this connection. When
// it fails, h is no longer reserved; when ctx ends first and the declare
// then succeeds, the queue is deleted.
func (c *session) declareExclusive(ctx context.Context, h *holding, args amqp.Table) error {
	return c.call(ctx, func(ch *amqp.Channel) error {
		_, err := ch.QueueDeclare(h.queue, false, false, true, false, args)
		if err != nil {
			c.unreserve(h) // nothing was declared
		}
		return err
	}, func() { _ = c.free(context.Background(), h) })
}

// freeAttempts bounds the deletes of one free on fresh channels after the
// first one's channel broke.
const freeAttempts = 3

// free deletes h's queue, once, and then wakes the waiters of its key.
// The delete waits for the broker's answer before the queue may be
// declared again by this client (a no-wait delete sent with the wake-up,
// one round trip less, let two holders in at once in the chaos runs). When the connection is gone, the
// queue is gone with it (or will be soon) and free reports no error. When
// the delete fails while the connection lives (its channel was closed by
// the broker for an earlier error on it), the queue is still there: free
// tries again on a fresh channel. When ctx ends during the delete, free
// waits up to a heartbeat interval more (see Client.call), then returns
// ctx's error while the delete goes on. A ctx that has ended already does
// not stop the delete: free waits up to a heartbeat interval for it, and
// returns ctx's error only if it is not done by then. Later calls return
// the first one's result, waiting for it until their ctx ends.
func (c *session) free(ctx context.Context, h *holding) error {
	h.mu.Lock()
	first := !h.freeing
	h.freeing = true
	h.mu.Unlock()
	if !first {
		select {
		case <-h.freed:
			return h.err
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	defer close(h.freed)
	runCtx, grace, cancel := ctx, c.heartbeat, context.CancelFunc(func() {})
	if ctx.Err() != nil {
		// ctx ended before the release: delete all the same, waiting for
		// up to a heartbeat interval in all (no grace on top).
		runCtx, cancel = context.WithTimeout(context.WithoutCancel(ctx), c.heartbeat)
		grace = 0
	}
	defer cancel()
	err := c.run(runCtx, grace, func() error {
		ch, err := c.channel()
		if err != nil {
			return err
		}
		err = deleteOwn(ch, h.queue)
		c.putChannel(ch)
		for try := 1; err != nil && !c.conn.IsClosed() && try < freeAttempts; try++ {
			var fresh *amqp.Channel
			if fresh, err = c.conn.Channel(); err == nil {
				err = deleteOwn(fresh, h.queue)
				c.putChannel(fresh)
			}
		}
		if err == nil || c.conn.IsClosed() {
			c.unreserve(h)
		}
		if err == nil {
			c.wakes.publish(h.wakeKey, h.queue)
		}
		return err
	}, nil)
	if err != nil && runCtx != ctx && runCtx.Err() != nil {
		err = ctx.Err() // still deleting, in the background
	}
	if errors.Is(err, locks.ErrClosed) {
		// Only when the connection is gone, and its exclusive queues
		// with it.
		c.unreserve(h)
		err = nil
	}
	if err != nil {
		err = errorf("amqpsem: delete queue %q: %w", h.queue, err)
	}
	h.err = err
	return err
}

// deleteOwn deletes queue q, which this connection declared exclusive.
// Deleting a missing queue succeeds; RESOURCE_LOCKED means that q is now
// another connection's (ours was deleted already, by a delete whose
// answer was lost with its channel), which is success too.
func deleteOwn(ch *amqp.Channel, q string) error {
	_, err := ch.QueueDelete(q, false, false, false)
	if amqpCode(err) == amqp.ResourceLocked {
		return nil
	}
	return err
}
