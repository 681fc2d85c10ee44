package testenv

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// Why not toxiproxy: github.com/Shopify/toxiproxy/v2 v2.5.0 (the last version
// the module proxy serves) leaks two goroutines per connection whenever a
// write to one side fails while the other side is still sending (its noop
// toxic and ChanWriter block forever on an unbuffered channel nobody reads
// any more): exactly what happens when a test kills a broker under a busy
// client, and what goleak then reports. Updating a toxic in place is also a
// data race. The few faults we need are simpler to get right here.

// proxyDialTimeout bounds the proxy's connection to its upstream.
const proxyDialTimeout = 5 * time.Second

// A Proxy is a TCP proxy on 127.0.0.1 between clients and one upstream
// address, which injects network faults on demand: [Proxy.Cut],
// [Proxy.BlackHole], [Proxy.DropReplies], [Proxy.DelayReplies],
// [Proxy.Latency] and [Proxy.ResetPeer], undone by [Proxy.Restore]. Faults
// apply to connections already open and to new ones, in both directions at
// once (but for DropReplies and DelayReplies), so that a client sees a
// partition or a dead peer rather than a misbehaving server. Two kinds of
// fault pick data by its content instead: [Proxy.DropMatchingReplies]
// drops the replies a [Match] picks, and a [Trigger] loses the reply to
// one chosen request. Its methods are safe to call from several
// goroutines. The proxy and its connections are closed at the end of the
// test that created it (or at the [Env.Close] of the Env that created it).
type Proxy struct {
	env      *Env // gets the errors of Restore
	upstream string
	addr     string
	ctx      context.Context // cancelled at cleanup, ends dials
	cancel   context.CancelFunc
	wg       sync.WaitGroup // the accept loop and every link's goroutines

	mu        sync.Mutex
	ln        net.Listener // nil while cut or closed
	links     map[*link]struct{}
	closed    bool
	blackHole bool
	dropBack  bool // black hole from upstream to client only
	reset     bool
	latency   time.Duration
	lateBack  time.Duration // more delay from upstream to client only
	dropMatch Match         // drops the replies it picks
	triggers  []*Trigger    // the armed triggers
	wake      chan struct{} // closed and replaced when a fault changes
}

// NewProxy starts a proxy listening on a free port of 127.0.0.1 that forwards
// each connection to upstream (host:port), dialled when the client connects;
// if that dial fails, the client's connection is closed. The test fails if
// the proxy cannot listen. NewProxy must be called from the goroutine running
// the test.
func NewProxy(t testing.TB, upstream string) *Proxy {
	t.Helper()
	p, err := ForTest(t).NewProxy(upstream)
	Require(t, err)
	return p
}

// NewProxy is [NewProxy] returning an error if the proxy cannot listen.
// The proxy is closed at [Env.Close], which returns the errors of its
// [Proxy.Restore].
func (e *Env) NewProxy(upstream string) (*Proxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("testenv: proxy to %s: %w", upstream, err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	p := &Proxy{
		env:      e,
		upstream: upstream,
		addr:     ln.Addr().String(),
		ctx:      ctx,
		cancel:   cancel,
		ln:       ln,
		links:    map[*link]struct{}{},
		wake:     make(chan struct{}),
	}
	p.wg.Go(func() { p.accept(ln) })
	if err := e.OnClose(func() error { p.close(); return nil }); err != nil {
		return nil, err
	}
	return p, nil
}

// Addr returns the address clients dial, "127.0.0.1:port". It does not change
// across [Proxy.Cut] and [Proxy.Restore].
func (p *Proxy) Addr() string { return p.addr }

// Cut closes every connection through the proxy and refuses new ones until
// [Proxy.Restore], as when the upstream host goes away. Cutting a cut proxy
// does nothing.
func (p *Proxy) Cut() {
	p.mu.Lock()
	if p.ln != nil {
		p.ln.Close()
		p.ln = nil
	}
	links := p.linksLocked(func(*link) bool { return true })
	p.mu.Unlock()
	for _, l := range links {
		l.close(false)
	}
}

// linksLocked returns the open links for which keep returns true.
func (p *Proxy) linksLocked(keep func(*link) bool) []*link {
	var links []*link
	for l := range p.links {
		if keep(l) {
			links = append(links, l)
		}
	}
	return links
}

// BlackHole keeps connections open, and accepts new ones, but delivers nothing
// in either direction, not even a close, until [Proxy.Restore]: as in a
// network partition, clients' writes succeed and their reads time out.
// Restore then closes the connections that lost data or a close (their byte
// streams cannot be repaired); connections that stayed idle go on.
func (p *Proxy) BlackHole() {
	p.setFaults(func() { p.blackHole = true })
}

// DropReplies is [Proxy.BlackHole] in one direction: what clients send
// still reaches the upstream, but nothing comes back, until
// [Proxy.Restore]. A request then runs at the broker while its client
// never hears the reply: the ambiguous outcome a client must clean up.
func (p *Proxy) DropReplies() {
	p.setFaults(func() { p.dropBack = true })
}

// DelayReplies is [Proxy.Latency] in one direction: what clients send
// reaches the upstream at once, but what comes back is held for d more
// before it is delivered (in order), until [Proxy.Restore], which
// delivers what is held at once. A request then runs at the broker at
// once while its client hears the reply late, maybe after it gave up
// waiting: a reply that arrives when its caller no longer expects it. A
// later call replaces the delay, also for data already waiting.
func (p *Proxy) DelayReplies(d time.Duration) {
	p.setFaults(func() { p.lateBack = max(d, 0) })
}

// DropMatchingReplies drops every piece of data the upstream sends that m
// picks, on every connection, until [Proxy.Restore]; the rest goes
// through, and what clients send still reaches the upstream. A later call
// replaces m. Data is picked a read at a time: see [Match].
func (p *Proxy) DropMatchingReplies(m Match) {
	p.setFaults(func() { p.dropMatch = m })
}

// Latency delays each piece of data in each direction by d, so that a
// request and its reply take at least 2*d more, until [Proxy.Restore]. A
// later call replaces the delay, also for data already waiting.
func (p *Proxy) Latency(d time.Duration) {
	p.setFaults(func() { p.latency = max(d, 0) })
}

// ResetPeer makes the proxy reset each connection (TCP RST to both sides,
// "connection reset by peer") as soon as data arrives on it from either side,
// until [Proxy.Restore]. Idle connections are reset when they next carry data.
func (p *Proxy) ResetPeer() {
	p.setFaults(func() { p.reset = true })
}

// Restore removes every fault and accepts connections again, on the same
// address: it also disarms the triggers and ends the faults they started.
// See [Proxy.BlackHole] for the connections it closes. Restoring a
// healthy proxy does nothing. The test fails (without stopping) if the
// address was taken while the proxy was cut (for a proxy of an Env made
// without a test, [Env.Close] returns that error).
func (p *Proxy) Restore() {
	p.mu.Lock()
	p.blackHole, p.dropBack, p.reset, p.latency, p.lateBack = false, false, false, 0, 0
	p.dropMatch = nil
	for _, t := range p.triggers {
		t.armed = false
	}
	p.triggers = nil
	for l := range p.links {
		for _, f := range l.replyFaults {
			if f.stop != nil {
				close(f.stop)
			}
		}
		l.replyFaults = nil
	}
	p.wakeLocked()
	tainted := p.linksLocked(func(l *link) bool { return l.tainted.Load() })
	if p.ln == nil && !p.closed {
		ln, err := net.Listen("tcp", p.addr)
		if err != nil {
			p.env.report(fmt.Errorf("testenv: restore proxy %s: %w", p.addr, err))
		} else {
			p.ln = ln
			p.wg.Go(func() { p.accept(ln) })
		}
	}
	p.mu.Unlock()
	for _, l := range tainted {
		l.close(false)
	}
}

func (p *Proxy) setFaults(set func()) {
	p.mu.Lock()
	defer p.mu.Unlock()
	set()
	p.wakeLocked()
}

// wakeLocked tells waiting writers that the faults changed.
func (p *Proxy) wakeLocked() {
	close(p.wake)
	p.wake = make(chan struct{})
}

// faults returns the current faults that apply when data is written, as
// they apply to data going to the client (toClient) or to the upstream,
// and a channel closed when they change. The others apply when data is
// read: see inspect.
func (p *Proxy) faults(toClient bool) (blackHole bool, latency time.Duration, wake <-chan struct{}) {
	p.mu.Lock()
	defer p.mu.Unlock()
	latency = p.latency
	if toClient {
		latency += p.lateBack
	}
	return p.blackHole || toClient && p.dropBack, latency, p.wake
}

// close stops the proxy for good and waits for all its goroutines.
func (p *Proxy) close() {
	p.mu.Lock()
	p.closed = true
	p.mu.Unlock()
	p.Cut()
	p.cancel()
	p.wg.Wait()
}

func (p *Proxy) accept(ln net.Listener) {
	for {
		c, err := ln.Accept()
		if err != nil {
			return // closed by Cut or cleanup
		}
		p.wg.Go(func() { p.serve(ln, c) })
	}
}

// serve dials the upstream for client connection c, accepted on ln, and
// starts relaying.
func (p *Proxy) serve(ln net.Listener, c net.Conn) {
	d := net.Dialer{Timeout: proxyDialTimeout}
	u, err := d.DialContext(p.ctx, "tcp", p.upstream)
	if err != nil {
		c.Close()
		return
	}
	l := &link{client: c, upstream: u, done: make(chan struct{})}
	p.mu.Lock()
	if p.ln != ln { // cut (or closed) while dialling
		p.mu.Unlock()
		c.Close()
		u.Close()
		return
	}
	l.onClose = func() {
		p.mu.Lock()
		delete(p.links, l)
		p.mu.Unlock()
	}
	p.links[l] = struct{}{}
	p.mu.Unlock()
	for _, dir := range [...]struct {
		src, dst net.Conn
		toClient bool
	}{{c, u, false}, {u, c, true}} {
		q := make(chan chunk, 64)
		p.wg.Go(func() { p.read(l, dir.src, dir.toClient, q) })
		p.wg.Go(func() { p.write(l, dir.dst, dir.toClient, q) })
	}
}

// A link is one client connection and its upstream connection.
type link struct {
	client, upstream net.Conn
	done             chan struct{} // closed by close
	onClose          func()        // called once by close, without Proxy.mu held
	once             sync.Once
	halfClosed       atomic.Int32 // directions whose source closed cleanly
	// tainted is set when data or a close was swallowed by a black hole
	// or a reply was dropped.
	tainted atomic.Bool
	// replyFaults are the faults triggers started on this link, under
	// Proxy.mu.
	replyFaults []*replyFault
}

// close closes both connections, with a TCP RST if rst is set.
func (l *link) close(rst bool) {
	l.once.Do(func() {
		close(l.done)
		for _, c := range []net.Conn{l.client, l.upstream} {
			if tc, ok := c.(*net.TCPConn); ok && rst {
				tc.SetLinger(0)
			}
			c.Close()
		}
		if l.onClose != nil {
			l.onClose()
		}
	})
}

// A chunk is data read from one side, with the time it was read.
type chunk struct {
	b   []byte
	at  time.Time
	rst bool // the source was reset: nothing more comes
}

// read reads from src (the upstream when fromUpstream) into q until src
// ends, then closes q.
func (p *Proxy) read(l *link, src net.Conn, fromUpstream bool, q chan<- chunk) {
	defer close(q)
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			at := time.Now()
			reset, drop := p.inspect(l, buf[:n], at, fromUpstream)
			switch {
			case reset:
				l.close(true)
				return
			case drop:
				l.tainted.Store(true)
			default:
				select {
				case q <- chunk{b: append([]byte(nil), buf[:n]...), at: at}:
				case <-l.done:
					return
				}
			}
		}
		if err != nil {
			if errors.Is(err, syscall.ECONNRESET) {
				select {
				case q <- chunk{rst: true, at: time.Now()}:
				case <-l.done:
				}
			}
			return
		}
	}
}

// inspect applies to data, just read at at from l's client (or from its
// upstream when fromUpstream), the faults that look at data: it says
// whether to reset the link, fires the armed triggers that pick data from
// a client, and says whether to drop data from the upstream. The triggers
// fire before the data is forwarded, so that their faults cover its reply.
func (p *Proxy) inspect(l *link, data []byte, at time.Time, fromUpstream bool) (reset, drop bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.reset {
		return true, false
	}
	if !fromUpstream {
		p.triggers = slices.DeleteFunc(p.triggers, func(t *Trigger) bool {
			if !t.when(data) {
				return false
			}
			t.fireLocked(l, at)
			return true
		})
		return false, false
	}
	drop = p.dropMatch != nil && p.dropMatch(data)
	l.replyFaults = slices.DeleteFunc(l.replyFaults, func(f *replyFault) bool {
		switch {
		case f.lose == nil:
			drop = true
		case f.lose(data):
			drop = true
			sendTime(f.t.lost, at)
			return true // one reply only
		}
		return false
	})
	return false, drop
}

// write writes what q delivers to dst (the client when toClient), applying
// the faults, until q is closed or the link is.
func (p *Proxy) write(l *link, dst net.Conn, toClient bool, q <-chan chunk) {
	for {
		var (
			c  chunk
			ok bool
		)
		select {
		case c, ok = <-q:
		case <-l.done:
			return
		}
		for {
			blackHole, latency, wake := p.faults(toClient)
			if blackHole {
				l.tainted.Store(true) // drop it
				break
			}
			if wait := time.Until(c.at.Add(latency)); ok && wait > 0 {
				t := time.NewTimer(wait)
				select {
				case <-t.C:
				case <-wake:
					t.Stop()
				case <-l.done:
					t.Stop()
					return
				}
				continue
			}
			switch {
			case !ok: // the source closed cleanly: pass the close on
				if tc, isTCP := dst.(*net.TCPConn); isTCP && l.halfClosed.Add(1) < 2 {
					tc.CloseWrite()
				} else {
					l.close(false)
				}
				return
			case c.rst:
				l.close(true)
				return
			}
			if _, err := dst.Write(c.b); err != nil {
				l.close(errors.Is(err, syscall.ECONNRESET))
				return
			}
			break
		}
		if !ok { // swallowed by a black hole
			<-l.done
			return
		}
	}
}

// A Match picks pieces of data by their content, for a [Trigger] or
// [Proxy.DropMatchingReplies]. The proxy calls it with the data of each
// read from one side, up to 32 KiB, and nothing else: a pattern split
// across two reads is missed (on loopback, a small message of a
// request-reply protocol such as NATS or RESP is one read). It must not
// keep or change data, must return quickly, and must not call the proxy,
// whose lock is held.
type Match func(data []byte) bool

// Contains returns the [Match] that picks the data holding s.
func Contains(s string) Match {
	b := []byte(s)
	return func(data []byte) bool { return bytes.Contains(data, b) }
}

// A ReplyFault is what a [Trigger] does, once it has fired, to the replies
// on the connection that fired it: [LoseReplies] or [LoseReply]. Other
// connections are left alone.
type ReplyFault struct {
	lose       Match // the one reply to drop; nil: every reply
	closeAfter time.Duration
}

// LoseReplies is the [ReplyFault] that drops everything the upstream sends
// on the connection for d, then closes the connection (both sides, as when
// a peer goes away): the request that fired the trigger reaches the
// upstream but its reply, and those to what the client sends meanwhile,
// are lost, and the client finds out only when the connection ends. A
// client that reconnects gets a healthy connection.
func LoseReplies(d time.Duration) ReplyFault {
	return ReplyFault{closeAfter: max(d, 0)}
}

// LoseReply is the [ReplyFault] that drops the first piece of data the
// upstream sends on the connection, from the moment the trigger fired,
// that m picks, and nothing else: the connection stays up, so that its
// client knows its request reached the upstream and never hears how it
// went. Replies the proxy read in the same piece of data are lost with it;
// [Trigger.Lost] says when the drop happened.
func LoseReply(m Match) ReplyFault {
	return ReplyFault{lose: m}
}

// A replyFault is a ReplyFault at work on one link.
type replyFault struct {
	lose Match         // as in ReplyFault
	stop chan struct{} // closed by Restore: LoseReplies does not close the link
	t    *Trigger      // the trigger that started it
}

// A Trigger is a one-shot fault of a [Proxy], made by [Proxy.NewTrigger]:
// once armed, it fires on the first piece of data a client sends that its
// [Match] picks, and applies its [ReplyFault] to that client's connection
// alone. The fault starts before the data goes on to the upstream, so that
// it covers the reply to it. Firing disarms the trigger; [Trigger.Arm]
// arms it again. Its methods are safe to call from several goroutines.
type Trigger struct {
	p     *Proxy
	when  Match
	fault ReplyFault
	armed bool // under p.mu
	fired chan time.Time
	lost  chan time.Time
}

// NewTrigger returns a trigger, not armed, that applies fault to the
// connection of the first piece of data from a client that when picks.
func (p *Proxy) NewTrigger(when Match, fault ReplyFault) *Trigger {
	return &Trigger{p: p, when: when, fault: fault, fired: make(chan time.Time, 1), lost: make(chan time.Time, 1)}
}

// Arm arms the trigger, for connections already open and new ones, until
// it fires or [Proxy.Restore] disarms it. Arming an armed trigger does
// nothing.
func (t *Trigger) Arm() {
	t.p.mu.Lock()
	defer t.p.mu.Unlock()
	if !t.armed {
		t.armed = true
		t.p.triggers = append(t.p.triggers, t)
	}
}

// Fired returns the channel, the same at every call, that receives the
// time at which the proxy read the data that fired the trigger: before the
// upstream got it, so that all the data caused there came later. It holds
// one time: a firing replaces a time not yet received.
func (t *Trigger) Fired() <-chan time.Time { return t.fired }

// Lost returns the channel, the same at every call, that receives the
// time at which a [LoseReply] fault of t dropped the reply it picks (a
// [LoseReplies] fault sends nothing). A test waits for it before it sends
// more on that connection: a reply read together with the lost one, in one
// piece of data, would be lost with it. It holds one time, as Fired does.
func (t *Trigger) Lost() <-chan time.Time { return t.lost }

// sendTime sends at on ch, replacing a time not yet received.
func sendTime(ch chan time.Time, at time.Time) {
	select {
	case <-ch:
	default:
	}
	ch <- at
}

// fireLocked fires t on l for data read at at. The proxy's lock is held.
func (t *Trigger) fireLocked(l *link, at time.Time) {
	t.armed = false
	f := &replyFault{lose: t.fault.lose, t: t}
	if f.lose == nil {
		f.stop = make(chan struct{})
		t.p.wg.Go(func() {
			timer := time.NewTimer(t.fault.closeAfter)
			defer timer.Stop()
			select {
			case <-timer.C:
				l.close(false)
			case <-f.stop:
			case <-l.done:
			}
		})
	}
	l.replyFaults = append(l.replyFaults, f)
	sendTime(t.fired, at)
}

// Proxies are proxies faulted together: one client's links to several
// brokers, such as Redlock masters. Each method applies to every proxy.
type Proxies []*Proxy

// Cut cuts every proxy; see [Proxy.Cut].
func (ps Proxies) Cut() { ps.each((*Proxy).Cut) }

// BlackHole black-holes every proxy; see [Proxy.BlackHole].
func (ps Proxies) BlackHole() { ps.each((*Proxy).BlackHole) }

// DropReplies drops every proxy's replies; see [Proxy.DropReplies].
func (ps Proxies) DropReplies() { ps.each((*Proxy).DropReplies) }

// ResetPeer makes every proxy reset its connections; see [Proxy.ResetPeer].
func (ps Proxies) ResetPeer() { ps.each((*Proxy).ResetPeer) }

// DelayReplies delays every proxy's replies by d; see [Proxy.DelayReplies].
func (ps Proxies) DelayReplies(d time.Duration) {
	for _, p := range ps {
		p.DelayReplies(d)
	}
}

// Latency delays every proxy's data by d; see [Proxy.Latency].
func (ps Proxies) Latency(d time.Duration) {
	for _, p := range ps {
		p.Latency(d)
	}
}

// Restore restores every proxy; see [Proxy.Restore].
func (ps Proxies) Restore() { ps.each((*Proxy).Restore) }

func (ps Proxies) each(f func(*Proxy)) {
	for _, p := range ps {
		f(p)
	}
}
