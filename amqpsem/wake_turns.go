package amqpsem

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"strconv"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// turnArgs are the declare arguments of the shared wake queues: a wake-up
// nobody takes at once replaces the one before and expires after a
// second, and a queue goes away after a minute without consumers. The
// queues are declared durable: RabbitMQ 4 deprecates queues that are
// neither durable nor exclusive, and from 4.3 refuses them by default,
// closing the whole connection (every lease on it). A durable queue with
// x-expires is what RabbitMQ recommends instead; x-expires deletes it all
// the same, and a broker restart keeps only empty, unused queues, which
// then expire. A shared wake queue left by an older amqpsem (not
// durable) is refused with PRECONDITION_FAILED on its channel only: the
// waiters of that name on this connection then fall back to waking every
// waiter.
var turnArgs = amqp.Table{"x-max-length": int32(1), "x-message-ttl": int32(1000), "x-expires": int32(60000)}

// The prefixes of the shared wake queues' names. No mutex or semaphore
// may use them (see [Layout.checkMutexName]): its queue would be some
// name's shared wake queue.
const (
	turnPrefix     = "amqpsem.wake."
	turnHashPrefix = "amqpsem.wake-sha256."
)

// turnQueue returns the name of key's shared wake queue: turnPrefix +
// key, or, when that is too long for a queue name, turnHashPrefix + the
// key's SHA-256 in hex.
func turnQueue(key string) string {
	if len(turnPrefix)+len(key) <= maxShortString {
		return turnPrefix + key
	}
	sum := sha256.Sum256([]byte(key))
	return turnHashPrefix + hex.EncodeToString(sum[:])
}

// turnTrust is how long after this client last consumed from or
// cancelled on a shared wake queue it takes the queue to exist, bound,
// without declaring it again: unused, it expires after a minute.
const turnTrust = 30 * time.Second

// takeTurns subscribes a waiting Lock to key's wake-ups, one waiter woken
// per release (see [waker]). It falls back to fan-out when the shared
// wake queue cannot be used. The AMQP calls it makes are not interrupted
// by ctx. The returned function ends the subscription; a call that did
// not acquire passes an unused wake-up on, so that the other waiters do
// not lose it.
func (w *waker) takeTurns(ctx context.Context, key string) (*wakeSub, func(acquired bool)) {
	if w.c.opts.wakeExchange == "" {
		return &wakeSub{}, func(bool) {}
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.turnCh != nil && w.turnCh.IsClosed() {
		clear(w.turnTags) // consumers of a closed channel, ending
	}
	if w.turnTags[key] == "" {
		if w.noTurns[key] || w.consumeTurns(ctx, key) != nil {
			sub, stop := w.fanOut(ctx, key)
			return sub, func(bool) { stop() }
		}
	}
	sub := &wakeSub{c: make(chan struct{}, 1), turns: true}
	w.turns[key] = append(w.turns[key], sub)
	return sub, func(acquired bool) { w.leave(key, sub, acquired) }
}

// consumeTurns starts consuming key's shared wake queue. Unless this
// client used the queue recently, it first declares and binds it, on a
// pooled channel, so that a failure breaks only that channel. A key whose
// queue the broker refuses (the name taken by another kind of queue, the
// wake exchange missing, no permission) uses fan-out for the client's
// lifetime. w.mu is held.
func (w *waker) consumeTurns(ctx context.Context, key string) error {
	q := turnQueue(key)
	if err := ctx.Err(); err != nil {
		return err
	}
	if time.Since(w.used[key]) >= turnTrust {
		ch, err := w.c.channel()
		if err != nil {
			return err
		}
		_, err = ch.QueueDeclare(q, true, false, false, false, turnArgs)
		if err == nil {
			err = ch.QueueBind(q, key, w.c.opts.wakeExchange, false, nil)
		}
		w.c.putChannel(ch) // dropped when the error closed it
		if err != nil {
			if amqpCode(err) != 0 {
				w.noTurns[key] = true
			}
			return err
		}
	}
	if w.turnCh == nil || w.turnCh.IsClosed() {
		ch, err := w.c.conn.Channel()
		if err != nil {
			return err
		}
		w.turnCh = ch
	}
	w.lastTag++
	tag := "amqpsem-wake-" + strconv.FormatUint(w.lastTag, 10)
	deliveries, err := w.turnCh.Consume(q, tag, false, false, false, false, nil)
	if err != nil {
		// An AMQP error closes turnCh, ending the other keys' consumers
		// on it too: they consume again at their next waiting Lock.
		switch code := amqpCode(err); {
		case code == amqp.NotFound:
			// The queue was deleted by hand since this client last used
			// it: declare it next time.
			delete(w.used, key)
		case code != 0:
			w.noTurns[key] = true // ACCESS_REFUSED...
		}
		return err
	}
	w.turnTags[key] = tag
	w.markUsed(key)
	if !w.c.goTracked(func() { w.passTurns(key, tag, deliveries) }) {
		return w.c.errClosed()
	}
	return nil
}

// markUsed records that this client used key's shared wake queue now
// (see [turnTrust]), dropping records older than turnTrust now and then.
// w.mu is held.
func (w *waker) markUsed(key string) {
	now := time.Now()
	w.used[key] = now
	sweep(w.used, &w.usedSweepAt, func(t time.Time) bool { return now.Sub(t) >= turnTrust })
}

// turnRetry is how long a client whose waiting calls all hold an unused
// wake-up keeps another before giving it back.
const turnRetry = time.Millisecond

// passTurns gives each wake-up of key's shared queue to the oldest of the
// client's waiting calls that has none, or back to the queue for another
// consumer. It ends when the consumer is cancelled or its channel closes;
// the waiting calls then poll.
func (w *waker) passTurns(key, tag string, deliveries <-chan amqp.Delivery) {
	for d := range deliveries {
		w.mu.Lock()
		var to *wakeSub
		for _, s := range w.turns[key] {
			if !s.pending.Load() {
				to = s
				break
			}
		}
		waiting := len(w.turns[key]) > 0
		if to != nil {
			to.signal()
		}
		w.mu.Unlock()
		if to != nil {
			_ = d.Ack(false)
			continue
		}
		if waiting {
			time.Sleep(turnRetry)
		}
		_ = d.Nack(false, true)
	}
	w.mu.Lock()
	if w.turnTags[key] == tag {
		delete(w.turnTags, key) // the channel closed: consume again next time
	}
	w.mu.Unlock()
}

// leave ends a turn-taking subscription. The last one of a key cancels
// the client's consumer, in the background.
func (w *waker) leave(key string, sub *wakeSub, acquired bool) {
	w.mu.Lock()
	subs := w.turns[key]
	for i, s := range subs {
		if s == sub {
			subs = append(subs[:i:i], subs[i+1:]...)
			break
		}
	}
	if len(subs) == 0 {
		delete(w.turns, key)
	} else {
		w.turns[key] = subs
	}
	unused := !acquired && sub.pending.Load()
	passed := false
	for _, s := range subs {
		if unused && !s.pending.Load() {
			s.signal()
			passed = true
			break
		}
	}
	w.mu.Unlock()
	if unused && !passed {
		w.publish(key, "")
	}
	if len(subs) > 0 {
		return
	}
	w.c.goTracked(func() {
		w.mu.Lock()
		defer w.mu.Unlock()
		tag := w.turnTags[key]
		if tag == "" || len(w.turns[key]) > 0 {
			return
		}
		delete(w.turnTags, key)
		if w.turnCh.Cancel(tag, false) == nil {
			w.markUsed(key)
		}
	})
}
