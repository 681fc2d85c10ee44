package redlockprio

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/latchkey-go/latchkey/locks/driver"
)

// Notifications travel over Redis pub/sub, on every master, through one
// PubSub connection per master per Client, multiplexed:
//   - the Client's inbox channel carries theft notices
//     "N|victim id|reply channel|thief" and acknowledgements "A|victim id";
//   - each name's release channel, subscribed while someone waits on the
//     name, carries the release scripts' PUBLISH.

// subscribeInbox subscribes the Client's inbox on every master, once, and
// waits until a quorum of masters confirmed (a thief publishes its notice
// through every master it reaches, a quorum at least, and two quorums
// share a master), a short time passed, or ctx ended: a dead or hung
// minority does not delay acquisitions. The subscriptions
// are made in the background: a master that does not answer cannot hold
// the caller past ctx.
func (c *Client) subscribeInbox(ctx context.Context) error {
	c.subOnce.Do(func() {
		c.subMu.Lock()
		defer c.subMu.Unlock()
		for i, m := range c.masters {
			ps := m.c.Subscribe(context.Background()) // no channel yet: no I/O
			if !c.goTracked(func() {
				// go-redis holds the PubSub's lock while it connects:
				// the call timeout bounds that too (see connect).
				sctx, cancel := context.WithTimeout(context.Background(), c.callTO)
				err := ps.Subscribe(sctx, c.inbox) // on error, connect subscribes again
				cancel()
				c.receive(i, ps, err == nil)
			}) {
				_ = ps.Close()
				continue
			}
			c.pubsubs = append(c.pubsubs, ps)
		}
		c.goTracked(c.pingLoop)
		limit := min(time.Second, c.o.ttl/4)
		c.goTracked(func() {
			t := time.NewTimer(limit)
			defer t.Stop()
			select {
			case <-t.C:
			case <-c.done:
			case <-c.subQuorumAcked():
			}
			c.subReadyOnce()
		})
	})
	select {
	case <-c.subReady:
		return nil
	default:
	}
	select {
	case <-c.subReady:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// subQuorumAcked returns a channel closed once a quorum of masters
// confirmed the inbox subscription.
func (c *Client) subQuorumAcked() <-chan struct{} {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.subQuorum == nil {
		c.subQuorum = make(chan struct{})
	}
	return c.subQuorum
}

func (c *Client) subReadyOnce() {
	c.mu.Lock()
	defer c.mu.Unlock()
	select {
	case <-c.subReady:
	default:
		close(c.subReady)
	}
}

// pubsubPing is how often the PubSubs are pinged: a ping that cannot be
// written makes the client reconnect and subscribe again, as go-redis's
// own health check would.
const pubsubPing = 3 * time.Second

// receive reads what master i's PubSub delivers until it is closed, and
// dispatches it on this goroutine: the release notice that wakes a waiter
// crosses one goroutine switch, not three (go-redis's Channel forwards
// each message through a goroutine of its own and wakes its health check
// on every message). connected says whether the PubSub is known to be
// connected; when it is not, receive connects it before it reads.
func (c *Client) receive(i int, ps *redis.PubSub, connected bool) {
	ctx := context.Background()
	failures := 0
	for {
		var err error
		if !connected {
			err = c.connect(ps)
		}
		if err == nil {
			var msg any
			msg, err = ps.Receive(ctx)
			if err == nil {
				failures = 0
				c.dispatch(i, msg)
				continue
			}
		}
		if errors.Is(err, redis.ErrClosed) {
			return
		}
		connected = false
		if failures++; failures > 1 {
			t := time.NewTimer(100 * time.Millisecond)
			select {
			case <-t.C:
			case <-c.done:
				t.Stop()
				return
			}
		}
	}
}

// connect connects ps (a no-op when it is connected), subscribing its
// channels again, within the call timeout. A Receive would connect under
// its own context, which has no deadline: go-redis holds the PubSub's
// lock while it connects, and a master that accepts the connection but
// never answers would hold it, and Close's closing of ps behind it, until
// go-redis's own read timeout. Under the call timeout, ps is closed at
// most one call timeout after Close when the masters' clients have
// ContextTimeoutEnabled (go-redis's defaults bound the handshake by their
// own timeouts instead).
func (c *Client) connect(ps *redis.PubSub) error {
	ctx, cancel := context.WithTimeout(context.Background(), c.callTO)
	defer cancel()
	return ps.Ping(ctx) // the Pong is read, and ignored, by receive
}

// pingLoop pings every PubSub each pubsubPing until the Client closes.
func (c *Client) pingLoop() {
	t := time.NewTicker(pubsubPing)
	defer t.Stop()
	for {
		select {
		case <-t.C:
		case <-c.done:
			return
		}
		c.subMu.Lock()
		pss := slices.Clone(c.pubsubs)
		c.subMu.Unlock()
		for _, ps := range pss {
			_ = c.connect(ps)
		}
	}
}

// dispatch handles one message of master i's PubSub.
func (c *Client) dispatch(i int, msg any) {
	switch msg := msg.(type) {
	case *redis.Subscription:
		if msg.Kind == "subscribe" && msg.Channel == c.inbox {
			c.mu.Lock()
			c.subAcked[i] = true
			n := 0
			for _, ok := range c.subAcked {
				if ok {
					n++
				}
			}
			if n >= c.quorum && c.subQuorum == nil {
				c.subQuorum = make(chan struct{})
			}
			if n >= c.quorum {
				select {
				case <-c.subQuorum:
				default:
					close(c.subQuorum)
				}
			}
			c.mu.Unlock()
		}
	case *redis.Message:
		if msg.Channel == c.inbox {
			c.inboxMessage(i, msg.Payload)
			return
		}
		c.mu.Lock()
		if ws := c.watchers[msg.Channel]; ws != nil && ws.heard(i, msg.Payload, c.quorum, len(c.masters)) {
			for w := range ws.waiters {
				select {
				case w <- struct{}{}:
				default:
				}
			}
		}
		c.mu.Unlock()
	}
}

func (c *Client) inboxMessage(i int, payload string) {
	parts := strings.SplitN(payload, "|", 4)
	switch {
	case len(parts) == 2 && (parts[0] == "A" || parts[0] == "U"):
		c.mu.Lock()
		if w := c.acks[parts[1]]; w != nil && (parts[0] == "A" || !w.proxy) {
			close(w.ch)
			delete(c.acks, parts[1])
		}
		c.mu.Unlock()
	case len(parts) == 4 && parts[0] == "W":
		c.mu.Lock()
		if w := c.qwake[payload[2:]]; w != nil {
			w.heard(i, c.quorum)
		}
		c.mu.Unlock()
	case len(parts) == 4 && parts[0] == "N":
		c.notice(parts[1], parts[2], parts[3])
	}
}

// notice handles a thief's notice: the lease (or attempt) with holder id
// vid ends with ErrPreempted at once, and the thief gets its
// acknowledgement once the lease can no longer be in use: when its
// holder has let go of it (Release, or Close), or its validity has run
// out, whichever comes first (at once with WithImmediateAck); an attempt
// never handed out, when it has been given up. When the lease is itself
// a thief still waiting for its own victim (the chain of thieves), the
// acknowledgement waits for that too. An id the Client has forgotten is
// acknowledged at once: as "A" while it is vouched for (a lease let go
// of, an attempt that heard every master), else as unknown ("U"). A
// failed attempt that did not hear every master answers "U" too, once it
// has given up: it may have kept there a key taken from a holder it
// never told, and cannot speak for that holder. A thief whose displaced
// key had been taken from an earlier holder does not count a "U" (see
// victim.proxy), and waits the key out. A failed attempt that may have
// kept another holder's key (see kept) gets no acknowledgement for a
// while at all.
func (c *Client) notice(vid, reply, thief string) {
	c.mu.Lock()
	cl := c.claims[vid]
	if until, ok := c.kept[vid]; cl == nil && ok && time.Now().Before(until) {
		c.mu.Unlock()
		return
	}
	var (
		lease      *driver.Lease
		ackable    chan struct{}
		holderDone chan struct{}
		cause      error
		answer     = "A|"
	)
	if _, ok := c.vouched[vid]; cl == nil && !ok || cl != nil && cl.unsure {
		answer = "U|"
	}
	if cl != nil {
		cause = driver.Preempted(fmt.Errorf("%q taken by %s", cl.name, thief))
		if cl.robbed == nil {
			cl.robbed = cause
		}
		lease, ackable, holderDone = cl.lease, cl.ackable, cl.holderDone
	}
	c.mu.Unlock()
	if lease != nil {
		lease.End(cause)
	}
	c.goTracked(func() {
		// An attempt that never settled (a thief still waiting for its own
		// victims when its Client closed) acknowledges nothing: its keys
		// stay until its victims' validity has run out.
		if ackable != nil {
			select {
			case <-ackable:
			case <-c.done:
				return
			}
		}
		if lease != nil && !c.o.immediate {
			// The holder's code may still be at work: wait for it to let
			// go, at most until its validity ends (it can no longer
			// renew: the thief holds the keys).
			t := time.NewTimer(time.Until(lease.Deadline()))
			select {
			case <-holderDone:
			case <-t.C:
			case <-c.done:
				t.Stop()
				return
			}
			t.Stop()
		}
		if cl != nil && answer == "A|" {
			c.mu.Lock()
			if cl.unsure { // the attempt failed meanwhile, unheard by a master
				answer = "U|"
			}
			c.mu.Unlock()
		}
		c.publish(reply, answer+vid)
	})
}

// rememberKept records that the failed attempt id may have kept keys it
// took from other holders, for as long as such a key can live (keptFor:
// the key expires when its victim's lease would have).
func (c *Client) rememberKept(id string) { c.rememberKeptFor(id, c.keptFor()) }

// rememberKeptFor records that the failed attempt id may have kept keys
// it took from other holders, for at least d.
func (c *Client) rememberKeptFor(id string, d time.Duration) {
	now := time.Now()
	d = max(d, c.o.ttl)
	c.mu.Lock()
	defer c.mu.Unlock()
	for k, until := range c.kept {
		if now.After(until) {
			delete(c.kept, k)
		}
	}
	if until := now.Add(d); until.After(c.kept[id]) {
		c.kept[id] = until
	}
}

// publish sends payload on channel through every master, in the
// background.
func (c *Client) publish(channel, payload string) {
	for _, m := range c.masters {
		send := func() {
			ctx, cancel := context.WithTimeout(context.Background(), max(c.o.ttl/2, time.Second))
			defer cancel()
			_ = m.c.Publish(ctx, channel, payload).Err()
		}
		if !c.goTracked(send) {
			send() // the Client is closed: on the caller's goroutine
		}
	}
}

// watchLinger is how long a release channel stays subscribed after its
// last waiter left, so that a name waited on again soon (a lock passed
// back and forth) needs no new SUBSCRIBE, and a waiter that got the name
// does not unsubscribe on its way out of Lock.
const watchLinger = time.Second

// maxHeard bounds the releases a watchState remembers that fewer than
// every master has announced (a master down, say).
const maxHeard = 64

// watchState is a release channel the Client is subscribed to.
type watchState struct {
	waiters map[chan struct{}]struct{}
	idle    time.Time         // when the last waiter left; zero while one waits
	seen    map[string][]bool // by releasing holder id: the masters that announced it
}

// heard records that master i announced the release of holder id and
// reports whether that makes a quorum of masters: the release has then
// freed the name on enough masters for an attempt to win, and the waiters
// are woken once, not once per master (an attempt started on the first
// announcement would mostly find the name still held on the others).
// guarded by c.mu.
func (ws *watchState) heard(i int, id string, quorum, n int) bool {
	if quorum == 1 {
		return true
	}
	from := ws.seen[id]
	if from == nil {
		if len(ws.seen) >= maxHeard {
			clear(ws.seen)
		}
		from = make([]bool, n)
		ws.seen[id] = from
	}
	if from[i] {
		return false
	}
	from[i] = true
	count := 0
	for _, ok := range from {
		if ok {
			count++
		}
	}
	if count == n {
		delete(ws.seen, id)
	}
	return count == quorum
}

// watch subscribes to a release channel for one waiter and returns its
// wake-up channel and the function that ends the watch. The subscription
// outlives the watch by watchLinger.
func (c *Client) watch(ctx context.Context, channel string) (<-chan struct{}, func()) {
	w := make(chan struct{}, 1)
	c.subMu.Lock()
	defer c.subMu.Unlock()
	c.mu.Lock()
	ws := c.watchers[channel]
	first := ws == nil
	if first {
		ws = &watchState{waiters: map[chan struct{}]struct{}{}, seen: map[string][]bool{}}
		c.watchers[channel] = ws
	}
	ws.waiters[w] = struct{}{}
	ws.idle = time.Time{}
	c.mu.Unlock()
	if first {
		sctx, cancel := context.WithTimeout(ctx, c.callTO)
		for _, ps := range c.pubsubs {
			_ = ps.Subscribe(sctx, channel) // retried by the PubSub on reconnect
		}
		cancel()
	}
	return w, func() {
		c.mu.Lock()
		defer c.mu.Unlock()
		delete(ws.waiters, w)
		if len(ws.waiters) == 0 {
			ws.idle = time.Now()
			if !c.sweeping && !c.closed {
				c.sweeping = true
				c.wg.Go(c.sweep)
			}
		}
	}
}

// sweep unsubscribes the release channels nobody has waited on for
// watchLinger, and exits when none is left idle or the Client closes.
func (c *Client) sweep() {
	t := time.NewTimer(watchLinger)
	defer t.Stop()
	for {
		select {
		case <-t.C:
		case <-c.done:
			return // Close closes the PubSubs
		}
		c.subMu.Lock()
		c.mu.Lock()
		now := time.Now()
		var gone []string
		var next time.Duration
		for ch, ws := range c.watchers {
			if len(ws.waiters) > 0 {
				continue
			}
			if d := ws.idle.Add(watchLinger).Sub(now); d > 0 {
				if next == 0 || d < next {
					next = d
				}
				continue
			}
			delete(c.watchers, ch)
			gone = append(gone, ch)
		}
		if next == 0 {
			c.sweeping = false
		}
		c.mu.Unlock()
		if len(gone) > 0 {
			sctx, cancel := context.WithTimeout(context.Background(), c.callTO)
			for _, ps := range c.pubsubs {
				_ = ps.Unsubscribe(sctx, gone...)
			}
			cancel()
		}
		c.subMu.Unlock()
		if next == 0 {
			return
		}
		t.Reset(next)
	}
}
