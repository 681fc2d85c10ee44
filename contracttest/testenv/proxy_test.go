package testenv

import (
	"bufio"
	"io"
	"net"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// The faults that pick data by its content: triggers and
// Proxy.DropMatchingReplies.

// TestProxyTriggerLoseReplies: armed, the trigger fires on the request that
// holds its pattern, on that connection only; the request reaches the
// upstream, nothing comes back, and the connection closes no sooner than
// the fault's duration. The reply to the request that fired it never
// passes, even from an upstream that answers at once (the fault starts
// before the request goes on). It fires once.
func TestProxyTriggerLoseReplies(t *testing.T) {
	leakCheck(t)
	const d = 100 * time.Millisecond
	upstream, got := countingEcho(t)
	p := NewProxy(t, upstream)
	trig := p.NewTrigger(Contains("fire"), LoseReplies(d))

	c := dial(t, p.Addr())
	lineEcho(t, c, "fire 0\n") // not armed yet
	other := dial(t, p.Addr())
	trig.Arm()
	trig.Arm() // armed already: one firing
	lineEcho(t, c, "hello\n")
	before := got.Load()
	sent := time.Now()
	if _, err := c.Write([]byte("fire 1\n")); err != nil {
		t.Fatal(err)
	}
	var fired time.Time
	select {
	case fired = <-trig.Fired():
	case <-time.After(5 * time.Second):
		t.Fatal("the trigger did not fire on a request holding its pattern")
	}
	if fired.Before(sent) {
		t.Errorf("Fired() = %v, before the request was sent at %v", fired, sent)
	}
	lineEcho(t, other, "fire 2\n") // another connection, and fired: no fault
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	b, err := io.ReadAll(c)
	closed := time.Since(fired)
	if len(b) > 0 || isTimeout(err) {
		t.Fatalf("after the trigger fired: read %q, %v; want nothing, then the connection closed", b, err)
	}
	if closed < d {
		t.Errorf("the connection closed %v after the trigger fired, before the fault's %v", closed, d)
	}
	want := int64(len("fire 1\n") + len("fire 2\n")) // both connections'
	waitUntil(t, 5*time.Second, "the upstream receives the request that fired the trigger", func() bool {
		return got.Load()-before == want
	})
	lineEcho(t, dial(t, p.Addr()), "fire 3\n") // fired once
	select {
	case at := <-trig.Fired():
		t.Errorf("the trigger fired again at %v without being armed", at)
	default:
	}

	// The upstream answers at once: the fault must start before the
	// request goes on. Each connection fires the trigger with its first
	// request.
	quick := p.NewTrigger(Contains("fire"), LoseReplies(time.Millisecond))
	for i := range 20 {
		c := dial(t, p.Addr())
		quick.Arm()
		if _, err := c.Write([]byte("fire\n")); err != nil {
			t.Fatal(err)
		}
		c.SetReadDeadline(time.Now().Add(5 * time.Second))
		if b, err := io.ReadAll(c); len(b) > 0 || isTimeout(err) {
			t.Fatalf("round %d: the reply to the request that fired the trigger passed: read %q, %v", i, b, err)
		}
		select {
		case <-quick.Fired():
		case <-time.After(5 * time.Second):
			t.Fatalf("round %d: the trigger did not fire", i)
		}
	}
}

// TestProxyTriggerLoseReply: armed, the trigger drops the first reply its
// fault picks after the request that fired it, and nothing else; the
// connection stays up.
func TestProxyTriggerLoseReply(t *testing.T) {
	leakCheck(t)
	upstream, got := countingEcho(t)
	p := NewProxy(t, upstream)
	trig := p.NewTrigger(Contains("req"), LoseReply(Contains("ack")))
	c := dial(t, p.Addr())
	trig.Arm()
	lineEcho(t, c, "ack 0\n") // the trigger has not fired
	lineEcho(t, c, "req 1\n") // fires it; the reply is not picked
	select {
	case <-trig.Fired():
	case <-time.After(5 * time.Second):
		t.Fatal("the trigger did not fire on a request holding its pattern")
	}
	before := got.Load()
	if _, err := c.Write([]byte("ack 2\n")); err != nil {
		t.Fatal(err)
	}
	c.SetReadDeadline(time.Now().Add(300 * time.Millisecond))
	if n, err := c.Read(make([]byte, 16)); !isTimeout(err) {
		t.Fatalf("the reply the fault picks passed: read %d bytes, %v; want a timeout", n, err)
	}
	if n := got.Load() - before; n != int64(len("ack 2\n")) {
		t.Errorf("the upstream received %d bytes of the request whose reply was dropped, want %d", n, len("ack 2\n"))
	}
	lineEcho(t, c, "ack 3\n") // one reply only, on a connection still up
}

// TestProxyTriggerRedis: the answer to a SET, and to it only, is lost on a
// real Redis; the write landed, and the connection stays up.
func TestProxyTriggerRedis(t *testing.T) {
	leakCheck(t)
	s := StartRedis(t, 1)[0]
	p := NewProxy(t, s.Addr())
	trig := p.NewTrigger(Contains("SET"), LoseReply(Contains("+OK")))
	c := dialRedis(t, p.Addr())
	if got := c.do(t, "PING"); got != "+PONG" {
		t.Fatalf("PING = %q", got)
	}
	trig.Arm()
	c.send(t, "SET", "k", "landed")
	select {
	case <-trig.Fired():
	case <-time.After(5 * time.Second):
		t.Fatal("the trigger did not fire on a SET")
	}
	// The trigger fires before the SET goes on upstream: poll for it.
	direct := dialRedis(t, s.Addr())
	got := direct.do(t, "GET", "k")
	for until := time.Now().Add(5 * time.Second); got != "$landed" && time.Now().Before(until); got = direct.do(t, "GET", "k") {
		time.Sleep(5 * time.Millisecond)
	}
	if got != "$landed" {
		t.Errorf("GET k directly = %q 5s after the trigger fired, want the SET whose answer was lost to have landed", got)
	}
	// A PING sent before the proxy read the +OK could be read with it, and
	// lost with it (a CI run): wait for the drop.
	select {
	case <-trig.Lost():
	case <-time.After(5 * time.Second):
		t.Fatal("the +OK of the SET was not dropped within 5s")
	}
	if got := c.do(t, "PING"); got != "+PONG" {
		t.Errorf("PING after the lost answer = %q, want +PONG (and not the lost +OK)", got)
	}
}

// TestProxyDropMatchingReplies: the replies the Match picks are dropped,
// the others pass, until Restore, which closes the connection that lost
// one.
func TestProxyDropMatchingReplies(t *testing.T) {
	leakCheck(t)
	upstream, got := countingEcho(t)
	p := NewProxy(t, upstream)
	c := dial(t, p.Addr())
	p.DropMatchingReplies(Contains("secret"))
	for i := range 2 {
		lineEcho(t, c, "public\n")
		before := got.Load()
		if _, err := c.Write([]byte("secret\n")); err != nil {
			t.Fatal(err)
		}
		c.SetReadDeadline(time.Now().Add(300 * time.Millisecond))
		if n, err := c.Read(make([]byte, 16)); !isTimeout(err) {
			t.Fatalf("round %d: a picked reply passed: read %d bytes, %v; want a timeout", i, n, err)
		}
		if n := got.Load() - before; n != int64(len("secret\n")) {
			t.Errorf("round %d: the upstream received %d bytes of the request, want %d", i, n, len("secret\n"))
		}
	}
	p.Restore()
	lineEcho(t, dial(t, p.Addr()), "secret\n")
	wantClosed(t, c, "a connection that lost a reply, after Restore")
}

// TestProxyRestoreEndsTriggers: Restore disarms a trigger, ends the faults
// that fired triggers started (LoseReplies does not close its connection
// any more), and leaves the connections that lost nothing open.
func TestProxyRestoreEndsTriggers(t *testing.T) {
	leakCheck(t)
	// The upstream answers each line but those starting "quiet".
	upstream := listen(t, func(c net.Conn) {
		r := bufio.NewReader(c)
		for {
			line, err := r.ReadString('\n')
			if err != nil {
				return
			}
			if !strings.HasPrefix(line, "quiet") {
				if _, err := c.Write([]byte(line)); err != nil {
					return
				}
			}
		}
	})
	p := NewProxy(t, upstream)

	armed := p.NewTrigger(Contains("fire"), LoseReplies(0))
	armed.Arm()
	p.Restore()
	c := dial(t, p.Addr())
	lineEcho(t, c, "fire\n")
	select {
	case at := <-armed.Fired():
		t.Errorf("a trigger disarmed by Restore fired at %v", at)
	default:
	}

	const d = 200 * time.Millisecond
	closing := p.NewTrigger(Contains("quiet"), LoseReplies(d))
	losing := p.NewTrigger(Contains("quiet"), LoseReply(Contains("lost")))
	closing.Arm()
	losing.Arm()
	if _, err := c.Write([]byte("quiet\n")); err != nil {
		t.Fatal(err)
	}
	for _, trig := range []*Trigger{closing, losing} {
		select {
		case <-trig.Fired():
		case <-time.After(5 * time.Second):
			t.Fatal("a trigger did not fire on a request holding its pattern")
		}
	}
	p.Restore()
	restored := time.Now()
	lineEcho(t, c, "lost\n") // LoseReply ended
	c.SetReadDeadline(restored.Add(2 * d))
	if n, err := c.Read(make([]byte, 16)); !isTimeout(err) {
		t.Fatalf("%v after Restore ended LoseReplies(%v): read %d bytes, %v; want the connection still open", time.Since(restored), d, n, err)
	}
	lineEcho(t, c, "lost\n")
}

// --- helpers ---

// countingEcho is an echo server that counts the bytes it receives.
func countingEcho(t *testing.T) (string, *atomic.Int64) {
	var got atomic.Int64
	return listen(t, func(c net.Conn) {
		buf := make([]byte, 64)
		for {
			n, err := c.Read(buf)
			got.Add(int64(n))
			if err != nil {
				return
			}
			if _, err := c.Write(buf[:n]); err != nil {
				return
			}
		}
	}), &got
}

// lineEcho checks that line, sent on c, comes back.
func lineEcho(t *testing.T, c net.Conn, line string) {
	t.Helper()
	c.SetDeadline(time.Now().Add(5 * time.Second))
	defer c.SetDeadline(time.Time{})
	if _, err := c.Write([]byte(line)); err != nil {
		t.Fatalf("write %q: %v", line, err)
	}
	got := make([]byte, len(line))
	if _, err := io.ReadFull(c, got); err != nil || string(got) != line {
		t.Fatalf("echo of %q: read %q, %v", line, got, err)
	}
}

// wantClosed fails t unless c, named what, is closed (within 2s).
func wantClosed(t *testing.T, c net.Conn, what string) {
	t.Helper()
	c.SetReadDeadline(time.Now().Add(2 * time.Second))
	if _, err := c.Read(make([]byte, 16)); err == nil || isTimeout(err) {
		t.Errorf("%s: read %v, want it closed", what, err)
	}
}

// waitUntil polls cond until it holds, failing t after timeout.
func waitUntil(t *testing.T, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	for end := time.Now().Add(timeout); !cond(); {
		if time.Now().After(end) {
			t.Fatalf("%s: not within %v", what, timeout)
		}
		time.Sleep(5 * time.Millisecond)
	}
}
