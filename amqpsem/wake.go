package amqpsem

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// waker delivers release notifications to the client's waiting calls, in
// two ways.
//
// Waiting [Mutex] Locks take turns: the client consumes the name's
// shared wake queue (see [turnQueue]), bound to the wake exchange with
// the name as key, and RabbitMQ hands each release's wake-up to one of
// its consumers, in turn. The client passes it to its oldest waiting call,
// which declares at once; a client with no call to take it gives it back
// (nack, requeue) for the next consumer. So a release wakes one waiter,
// not all of them: those would all declare, and all but one would break
// a channel on RESOURCE_LOCKED.
//
// Semaphore and Admin waiters, and Locks when the shared queue cannot be
// used, are woken by fan-out: one server-named, exclusive, auto-delete
// queue per client, bound to the wake exchange with the key of each name
// being waited for, consumed on its own channel; every waiter wakes and
// checks.
//
// Releases publish their wake-up with the mandatory flag on a channel in
// confirm mode: the broker returns it when no queue is bound to the key,
// so the releasing client learns whether anyone waits (see
// [waker.waitedAtRelease]).
type waker struct {
	c *session

	mu     sync.Mutex
	ch     *amqp.Channel
	queue  string
	broken bool                             // fan-out unavailable: waiters poll
	subs   map[string]map[*wakeSub]struct{} // key -> fan-out waiters
	bound  map[string]bool                  // keys bound at the broker

	turnCh      *amqp.Channel         // consumes the shared wake queues
	turns       map[string][]*wakeSub // key -> waiters taking turns, oldest first
	turnTags    map[string]string     // key -> tag of the consumer of its shared wake queue on turnCh
	lastTag     uint64                // numbers the consumer tags
	noTurns     map[string]bool       // keys whose shared wake queue failed: fan-out
	used        map[string]time.Time  // key -> when this client last consumed from or cancelled on its shared wake queue
	usedSweepAt int                   // see sweep

	pubMu sync.Mutex
	pub   *pubChannel // releases publish here; see send

	relMu           sync.Mutex
	releases        map[string]*release // queue -> its last release, until a Lock asks
	releasesSweepAt int                 // see sweep
}

func newWaker(c *session) *waker {
	return &waker{
		c:        c,
		subs:     map[string]map[*wakeSub]struct{}{},
		bound:    map[string]bool{},
		turns:    map[string][]*wakeSub{},
		turnTags: map[string]string{},
		noTurns:  map[string]bool{},
		used:     map[string]time.Time{},
		releases: map[string]*release{},
	}
}

// sweep deletes the entries of m that are stale, once m has *at entries
// or more, and sets *at to twice what is left (at least 64): it keeps a
// map of recent events small, at a constant amortized cost per entry.
func sweep[V any](m map[string]V, at *int, stale func(V) bool) {
	if len(m) < *at {
		return
	}
	for k, v := range m {
		if stale(v) {
			delete(m, k)
		}
	}
	*at = max(64, 2*len(m))
}

// wakeSub is one waiting call's subscription. c is nil when wake-ups are
// unavailable.
type wakeSub struct {
	c       chan struct{}
	turns   bool        // taking turns: a release wakes one waiter
	pending atomic.Bool // a wake-up arrived that the call has not used
}

// woken reports whether a wake-up arrived since it was last called, and
// uses it up.
func (s *wakeSub) woken() bool { return s.pending.Swap(false) }

func (s *wakeSub) signal() {
	s.pending.Store(true)
	select {
	case s.c <- struct{}{}:
	default:
	}
}

// --- releases ---

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

// --- taking turns ---

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

// --- fan-out ---

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
