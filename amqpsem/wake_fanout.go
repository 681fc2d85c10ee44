package amqpsem

import (
	"context"

	amqp "github.com/rabbitmq/amqp091-go"
)

// subscribe returns a fan-out subscription whose channel receives a value
// when key is released. When wake-ups are unavailable its channel is nil
// (waiters then poll) and there is no error: a missing wake-up only costs
// latency. The AMQP calls it makes are not interrupted by ctx; they end
// when the connection does. The returned function ends the subscription.
func (w *waker) subscribe(ctx context.Context, key string) (*wakeSub, func()) {
	if w.c.opts.wakeExchange == "" {
		return &wakeSub{}, func() {}
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.fanOut(ctx, key)
}

// fanOut subscribes to key's fan-out wake-ups. w.mu is held.
func (w *waker) fanOut(ctx context.Context, key string) (*wakeSub, func()) {
	none := &wakeSub{}
	if w.broken || w.start(ctx) != nil {
		return none, func() {}
	}
	if !w.bound[key] {
		if err := w.ch.QueueBind(w.queue, key, w.c.opts.wakeExchange, false, nil); err != nil {
			if w.ch.IsClosed() {
				w.broken = true
			}
			return none, func() {}
		}
		w.bound[key] = true
	}
	sub := &wakeSub{c: make(chan struct{}, 1)}
	if w.subs[key] == nil {
		w.subs[key] = map[*wakeSub]struct{}{}
	}
	w.subs[key][sub] = struct{}{}
	return sub, func() { w.unsubscribe(key, sub) }
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

// dispatch wakes the fan-out waiters of each delivery's key; it ends when
// the channel or connection closes.
func (w *waker) dispatch(deliveries <-chan amqp.Delivery) {
	for d := range deliveries {
		w.mu.Lock()
		for sub := range w.subs[d.RoutingKey] {
			sub.signal()
		}
		w.mu.Unlock()
	}
}

// unsubscribe removes a fan-out waiter; the last waiter of a key unbinds
// it, in the background.
func (w *waker) unsubscribe(key string, sub *wakeSub) {
	w.mu.Lock()
	delete(w.subs[key], sub)
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
