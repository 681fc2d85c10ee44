package amqpsem

import (
	"sync"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// tokenPoolSize bounds the idle token channels a client keeps.
const tokenPoolSize = 16

// tokenChan is a channel that takes and holds tokens of the quorum
// layout, one at a time, with a prefetch of one. A released token is
// rejected on it and the channel goes back to its client's pool: an
// acquire costs no channel.open, a release no round trip. One watcher
// per channel ends its holder's lease when the channel closes.
type tokenChan struct {
	s    *session
	ch   *amqp.Channel
	dead chan struct{} // closed once the channel is gone; cause is then set

	mu    sync.Mutex
	cause *amqp.Error  // the broker's reason, nil for a close by the client
	lease *QuorumLease // the holder of the token on it, if any
}

// tokenPool is a client's idle token channels, all of one session.
type tokenPool struct {
	mu    sync.Mutex
	s     *session
	free  []*tokenChan
	ready map[string]bool // token queues whose marker this session has seen
}

// markerSeen reports whether this session has seen queue's marker.
func (c *session) markerSeen(queue string) bool {
	p := &c.client.tpool
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.s == c && p.ready[queue]
}

// setMarker records (or, with seen false, forgets) queue's marker.
func (c *session) setMarker(queue string, seen bool) {
	p := &c.client.tpool
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.s != c {
		p.s, p.free, p.ready = c, nil, nil
	}
	if p.ready == nil {
		p.ready = map[string]bool{}
	}
	if seen {
		p.ready[queue] = true
	} else {
		delete(p.ready, queue)
	}
}

// tokenChannel returns an idle token channel of session c, or a new one.
func (c *session) tokenChannel() (*tokenChan, error) {
	p := &c.client.tpool
	p.mu.Lock()
	if p.s != c {
		p.s, p.free, p.ready = c, nil, nil // the channels of a lost session are gone
	}
	for len(p.free) > 0 {
		tc := p.free[len(p.free)-1]
		p.free = p.free[:len(p.free)-1]
		if !tc.ch.IsClosed() {
			p.mu.Unlock()
			return tc, nil
		}
	}
	p.mu.Unlock()
	ch, err := c.conn.Channel()
	if err != nil {
		return nil, c.connErr(err)
	}
	if err := ch.Qos(1, 0, false); err != nil {
		_ = ch.Close()
		return nil, c.connErr(err)
	}
	tc := &tokenChan{s: c, ch: ch, dead: make(chan struct{})}
	closes := ch.NotifyClose(make(chan *amqp.Error, 1))
	if !c.goTracked(func() { tc.watch(closes) }) {
		_ = ch.Close()
		return nil, c.errClosed()
	}
	return tc, nil
}

// watch waits for the channel's end, then ends its holder's lease.
func (tc *tokenChan) watch(closes chan *amqp.Error) {
	e := <-closes
	tc.mu.Lock()
	tc.cause = e
	l := tc.lease
	tc.mu.Unlock()
	close(tc.dead)
	if l != nil {
		l.channelLost(e)
	}
}

// hold makes l the holder of the token on tc; it reports false when the
// channel is gone already (l must then end).
func (tc *tokenChan) hold(l *QuorumLease) bool {
	tc.mu.Lock()
	defer tc.mu.Unlock()
	select {
	case <-tc.dead:
		return false
	default:
	}
	tc.lease = l
	return true
}

// put gives an idle tc back to its client's pool (or closes it when the
// pool is full or of another session).
func (tc *tokenChan) put() {
	tc.mu.Lock()
	tc.lease = nil
	tc.mu.Unlock()
	if tc.ch.IsClosed() {
		return
	}
	p := &tc.s.client.tpool
	p.mu.Lock()
	if p.s == tc.s && len(p.free) < tokenPoolSize {
		p.free = append(p.free, tc)
		p.mu.Unlock()
		return
	}
	p.mu.Unlock()
	tc.discard()
}

// discard closes tc, in the background: whatever it holds goes back to
// its queue.
func (tc *tokenChan) discard() {
	if !tc.s.goTracked(func() { _ = tc.ch.Close() }) {
		_ = tc.ch.Close() // the session is closing: the close is quick
	}
}

// closeNow closes tc and waits for the broker's close-ok, up to a
// heartbeat interval: a token it held is back in its queue when it
// returns (an acquire whose ctx ended must leave nothing held).
func (tc *tokenChan) closeNow() {
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = tc.ch.Close()
	}()
	t := time.NewTimer(tc.s.heartbeat)
	defer t.Stop()
	select {
	case <-done:
	case <-t.C:
	}
}

// abandon ends an acquire that subscribed with consumer tag and will not
// take a token: it cancels the subscription, waiting for the broker's
// answer, which comes after any delivery to it; returns whatever the
// channel holds (a nack of everything, with requeue); and syncs on the
// channel with basic.qos, so that the return has been handed to the
// queue when it returns. A channel's close would return the token too,
// but after its close-ok (measured: a third client could still find the
// name held). On any failure, or after a heartbeat interval, it closes
// the channel instead.
func (tc *tokenChan) abandon(tag string) {
	done := make(chan error, 1)
	started := tc.s.goTracked(func() {
		err := tc.ch.Cancel(tag, false)
		if err == nil {
			err = tc.ch.Nack(0, true, true)
		}
		if err == nil {
			err = tc.ch.Qos(1, 0, false)
		}
		done <- err
	})
	if !started {
		tc.closeNow()
		return
	}
	t := time.NewTimer(tc.s.heartbeat)
	defer t.Stop()
	select {
	case err := <-done:
		if err == nil {
			tc.put()
			return
		}
	case <-t.C:
	}
	tc.closeNow()
}

// giveBackNow returns a token d that an acquire took but will not keep:
// a reject with requeue and a basic.qos round trip, or the channel's
// close when that fails.
func (tc *tokenChan) giveBackNow(d amqp.Delivery) {
	err := tc.ch.Reject(d.DeliveryTag, true)
	if err == nil {
		err = tc.ch.Qos(1, 0, false)
	}
	if err != nil {
		tc.closeNow()
		return
	}
	tc.put()
}

// closeReason returns the broker's reason when err is a call failing on
// tc because the broker closed the channel (a pipelined passive declare
// that failed: the call after it sees only a closed channel).
func (tc *tokenChan) closeReason(err error) error {
	if !tc.ch.IsClosed() {
		return err
	}
	<-tc.dead
	tc.mu.Lock()
	defer tc.mu.Unlock()
	if tc.cause != nil && amqpCode(err) != tc.cause.Code {
		return tc.cause
	}
	return err
}
