package amqpsem

import (
	"context"
	"strconv"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// yieldWindow is how long after a release that found waiters the
// releasing client's next Lock on the same name yields to them. It only
// needs to cover the time a woken waiter takes to declare the queue.
const yieldWindow = 100 * time.Millisecond

// release is what the broker said of one release's wake-up.
type release struct {
	at      time.Time
	done    chan struct{} // closed once the answer is known
	waiters bool          // set before done is closed: the broker confirmed the wake-up and routed it to some queue
}

func (r *release) resolve(waiters bool) {
	r.waiters = waiters
	close(r.done)
}

// pubChannel is the publish channel and the wake-ups it awaits confirms
// for. Its delivery tags count publishes from 1, as the broker's do.
type pubChannel struct {
	ch  *amqp.Channel
	tag uint64 // tag of the last publish; guarded by waker.pubMu

	// Guarded by waker.relMu.
	pending map[uint64]*release
	closed  bool // the confirm loop has ended: nothing more resolves
}

// publish announces that key was released, for the client's release of
// queue ("" for a wake-up passed on). Wake-ups are best effort: a lost
// one only costs waiters latency.
func (w *waker) publish(key, queue string) { w.send(key, queue) }

// send publishes key's wake-up and returns its release record, or nil
// when nothing was sent. (The queue's delete is not sent with it, no-wait
// on this channel: the 5-minute chaos runs of the semaphore then saw two
// holders at once, twice in four runs; see Client.free.)
// It publishes on a channel of its own, never a pooled one: a publish to
// a missing exchange makes the broker close its channel, later and
// asynchronously, which must not fail an unrelated call that took the
// channel from the pool next. A closed publish channel is reopened.
func (w *waker) send(key, queue string) *release {
	if w.c.opts.wakeExchange == "" || key == "" {
		return nil
	}
	w.pubMu.Lock()
	defer w.pubMu.Unlock()
	for range 2 { // a channel found open may close under the publish
		if w.pub == nil || w.pub.ch.IsClosed() {
			if w.openPub() != nil {
				return nil
			}
		}
		pc := w.pub
		rel := &release{at: time.Now(), done: make(chan struct{})}
		tag := pc.tag + 1
		w.relMu.Lock()
		if pc.closed {
			w.relMu.Unlock()
			continue
		}
		pc.pending[tag] = rel
		if queue != "" {
			w.remember(queue, rel)
		}
		w.relMu.Unlock()
		err := pc.ch.Publish(w.c.opts.wakeExchange, key, true, false, amqp.Publishing{
			Expiration: "60000",
			MessageId:  strconv.FormatUint(tag, 10),
		})
		if err == nil {
			pc.tag = tag
			return rel
		}
		w.relMu.Lock()
		if pc.pending[tag] == rel {
			delete(pc.pending, tag)
			rel.resolve(false)
		}
		w.relMu.Unlock()
		if w.c.conn.IsClosed() {
			return nil
		}
	}
	return nil
}

// openPub opens the publish channel in confirm mode and starts its
// confirm loop. w.pubMu is held.
func (w *waker) openPub() error {
	ch, err := w.c.conn.Channel()
	if err != nil {
		return err
	}
	if err := ch.Confirm(false); err != nil {
		_ = ch.Close()
		return err
	}
	pc := &pubChannel{ch: ch, pending: map[uint64]*release{}}
	returns := ch.NotifyReturn(make(chan amqp.Return, 16))
	confirms := ch.NotifyPublish(make(chan amqp.Confirmation, 16))
	if !w.c.goTracked(func() { w.confirmLoop(pc, confirms, returns) }) {
		_ = ch.Close()
		return w.c.errClosed()
	}
	w.pub = pc
	return nil
}

// confirmLoop resolves pc's releases as the broker confirms their
// wake-ups. It ends when the channel closes, resolving what is left as
// unconfirmed. The connection's reader hands a return over before the
// confirm that follows it, so when a confirm arrives, its return (if any)
// is already buffered.
func (w *waker) confirmLoop(pc *pubChannel, confirms <-chan amqp.Confirmation, returns <-chan amqp.Return) {
	returned := map[uint64]bool{}
	record := func(r amqp.Return, ok bool) {
		if !ok {
			returns = nil
			return
		}
		if id, err := strconv.ParseUint(r.MessageId, 10, 64); err == nil {
			returned[id] = true
		}
	}
	for {
		select {
		case r, ok := <-returns:
			record(r, ok)
		case c, ok := <-confirms:
			if !ok {
				w.relMu.Lock()
				pc.closed = true
				for tag, rel := range pc.pending {
					delete(pc.pending, tag)
					rel.resolve(false)
				}
				w.relMu.Unlock()
				return
			}
			for drained := false; !drained && returns != nil; {
				select {
				case r, ok := <-returns:
					record(r, ok)
				default:
					drained = true
				}
			}
			w.relMu.Lock()
			rel := pc.pending[c.DeliveryTag]
			delete(pc.pending, c.DeliveryTag)
			w.relMu.Unlock()
			if rel != nil {
				// A confirm, ack or nack, comes after the broker handled
				// what was sent before it on the channel.
				rel.resolve(c.Ack && !returned[c.DeliveryTag])
			}
			delete(returned, c.DeliveryTag)
		}
	}
}

// remember records rel as queue's last release, dropping records older
// than the yield window now and then. w.relMu is held.
func (w *waker) remember(queue string, rel *release) {
	w.releases[queue] = rel
	sweep(w.releases, &w.releasesSweepAt, func(r *release) bool { return rel.at.Sub(r.at) > yieldWindow })
}

// waitedAtRelease reports whether this client released queue within the
// yield window and the broker routed that release's wake-up to some
// queue: a waiter of another client, or of this one, was there. It
// forgets the release, and waits for the broker's answer for at most
// limit.
func (w *waker) waitedAtRelease(ctx context.Context, queue string, limit time.Duration) bool {
	w.relMu.Lock()
	rel := w.releases[queue]
	delete(w.releases, queue)
	w.relMu.Unlock()
	if rel == nil || time.Since(rel.at) > yieldWindow {
		return false
	}
	select {
	case <-rel.done:
		return rel.waiters
	default:
	}
	t := time.NewTimer(limit)
	defer t.Stop()
	select {
	case <-rel.done:
		return rel.waiters
	case <-ctx.Done():
	case <-t.C:
	}
	return false
}
