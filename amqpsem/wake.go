package amqpsem

import (
	"context"
	"sync"

	amqp "github.com/rabbitmq/amqp091-go"
)

// waker delivers release notifications to the client's waiting calls. It
// declares one server-named, exclusive, auto-delete queue per client,
// binds it to the wake exchange with the key of each name being waited
// for, and consumes it on its own channel.
type waker struct {
	c *Client

	mu     sync.Mutex
	ch     *amqp.Channel
	queue  string
	broken bool                                  // wake-ups unavailable: waiters poll
	subs   map[string]map[chan struct{}]struct{} // key -> waiters
	bound  map[string]bool                       // keys bound at the broker

	pubMu sync.Mutex
	pub   *amqp.Channel // releases publish here; see publish
}

// publish announces that key was released. It publishes on a channel of
// its own, never a pooled one: a publish to a missing exchange makes the
// broker close its channel, later and asynchronously, which must not fail
// an unrelated call that took the channel from the pool next. A closed
// publish channel is reopened. Wake-ups are best effort: a lost one only
// costs waiters latency.
func (w *waker) publish(key string) {
	if w.c.opts.wakeExchange == "" || key == "" {
		return
	}
	w.pubMu.Lock()
	defer w.pubMu.Unlock()
	for range 2 { // a channel found open may close under the publish
		if w.pub == nil || w.pub.IsClosed() {
			ch, err := w.c.conn.Channel()
			if err != nil {
				return
			}
			w.pub = ch
		}
		err := w.pub.Publish(w.c.opts.wakeExchange, key, false, false, amqp.Publishing{Expiration: "60000"})
		if err == nil || w.c.conn.IsClosed() {
			return
		}
	}
}

// subscribe returns a channel that receives a value when key is released.
// When wake-ups are unavailable it returns a nil channel (waiters then
// poll) and no error: a missing wake-up only costs latency. The AMQP calls
// it makes are not interrupted by ctx; they end when the connection does.
func (w *waker) subscribe(ctx context.Context, key string) (<-chan struct{}, func()) {
	if w.c.opts.wakeExchange == "" {
		return nil, func() {}
	}
	wake := make(chan struct{}, 1)
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.broken || w.start(ctx) != nil {
		return nil, func() {}
	}
	if !w.bound[key] {
		if err := w.ch.QueueBind(w.queue, key, w.c.opts.wakeExchange, false, nil); err != nil {
			if w.ch.IsClosed() {
				w.broken = true
			}
			return nil, func() {}
		}
		w.bound[key] = true
	}
	if w.subs[key] == nil {
		w.subs[key] = map[chan struct{}]struct{}{}
	}
	w.subs[key][wake] = struct{}{}
	return wake, func() { w.unsubscribe(key, wake) }
}

// start declares and consumes the client's wake queue. w.mu is held.
func (w *waker) start(ctx context.Context) error {
	if w.ch != nil {
		return nil
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	ch, err := w.c.conn.Channel()
	if err != nil {
		w.broken = true
		return err
	}
	q, err := ch.QueueDeclare("", false, true, true, false, amqp.Table{"x-max-length": int32(16)})
	var deliveries <-chan amqp.Delivery
	if err == nil {
		deliveries, err = ch.Consume(q.Name, "", true, true, false, false, nil)
	}
	if err != nil {
		_ = ch.Close()
		w.broken = true
		return err
	}
	w.ch, w.queue = ch, q.Name
	if !w.c.goTracked(func() { w.dispatch(deliveries) }) {
		return w.c.errClosed()
	}
	return nil
}

// dispatch wakes the waiters of each delivery's key; it ends when the
// channel or connection closes.
func (w *waker) dispatch(deliveries <-chan amqp.Delivery) {
	for d := range deliveries {
		w.mu.Lock()
		for wake := range w.subs[d.RoutingKey] {
			select {
			case wake <- struct{}{}:
			default:
			}
		}
		w.mu.Unlock()
	}
}

// unsubscribe removes a waiter; the last waiter of a key unbinds it, in
// the background.
func (w *waker) unsubscribe(key string, wake chan struct{}) {
	w.mu.Lock()
	delete(w.subs[key], wake)
	last := len(w.subs[key]) == 0
	if last {
		delete(w.subs, key)
	}
	w.mu.Unlock()
	if !last {
		return
	}
	w.c.goTracked(func() {
		w.mu.Lock()
		defer w.mu.Unlock()
		if len(w.subs[key]) > 0 || !w.bound[key] || w.ch.IsClosed() {
			return
		}
		if err := w.ch.QueueUnbind(w.queue, key, w.c.opts.wakeExchange, nil); err == nil {
			delete(w.bound, key)
		}
	})
}
