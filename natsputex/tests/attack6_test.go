package natsputex_test

// Attack round 6, on the Supervisor's renewal that writes first: every R
// an active agent updates its key at the revision of its own last write,
// and reads the key only when that write finds it taken, to say who took
// it. Attacked from the package doc: lost and late answers to renewals,
// other writers in the key, agents of mixed timing (this file); server
// restarts, stream leader changes, a paused natslock and a bucket made
// again (attack6_faults_test.go). Most tests run on the NATS server on
// 127.0.0.1:4222 (NATS 2.9.10 on the reference machine), each on a memory
// bucket of its own (atk4Env).

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/latchkey-go/latchkey/contracttest"
	"github.com/latchkey-go/latchkey/contracttest/testenv"
	"github.com/latchkey-go/latchkey/natsputex"
)

// slack6 is what the round's timing checks add to a bound of the docs,
// for a loaded 2-core machine running with -race.
const slack6 = 60 * time.Millisecond

// ackDropper is a TCP proxy to a NATS server that can lose exactly one
// answer: armed, it drops the first acknowledgement of a JetStream publish
// ("seq": in a server-to-client chunk) that follows a publish to the
// watched key, and nothing else; the connection stays up, so nats.go
// never reconnects and the write whose answer was lost is known to have
// landed. With dropReads set it also drops every answer to a direct read
// of a stream message (STREAM.MSG.GET). A small NATS message is one chunk
// on loopback.
type ackDropper struct {
	ln        net.Listener
	upstream  string
	pub       []byte
	armed     atomic.Bool
	sawPub    atomic.Bool
	dropReads atomic.Bool
	dropped   chan time.Time
}

func newAckDropper(t *testing.T, url, bucket, key string) *ackDropper {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &ackDropper{ln: ln, upstream: strings.TrimPrefix(url, "nats://"), pub: []byte("PUB $KV." + bucket + "." + key + " "), dropped: make(chan time.Time, 16)}
	var conns sync.WaitGroup
	var open []net.Conn
	var mu sync.Mutex
	go func() {
		for {
			client, err := ln.Accept()
			if err != nil {
				return
			}
			server, err := net.Dial("tcp", p.upstream)
			if err != nil {
				_ = client.Close()
				continue
			}
			mu.Lock()
			open = append(open, client, server)
			mu.Unlock()
			conns.Add(2)
			go func() { defer conns.Done(); p.forward(server, client, p.fromClient) }()
			go func() { defer conns.Done(); p.forward(client, server, p.fromServer) }()
		}
	}()
	t.Cleanup(func() {
		_ = ln.Close()
		mu.Lock()
		for _, c := range open {
			_ = c.Close()
		}
		mu.Unlock()
		conns.Wait()
	})
	return p
}

func (p *ackDropper) addr() string { return "nats://" + p.ln.Addr().String() }

// arm makes the proxy lose the answer to the next publish to the key.
func (p *ackDropper) arm() { p.sawPub.Store(false); p.armed.Store(true) }

func (p *ackDropper) fromClient(chunk []byte) bool {
	if p.armed.Load() && bytes.Contains(chunk, p.pub) {
		p.sawPub.Store(true)
	}
	return true
}

func (p *ackDropper) fromServer(chunk []byte) bool {
	if p.dropReads.Load() && bytes.Contains(chunk, []byte("stream_msg_get_response")) {
		return false
	}
	if p.sawPub.Load() && bytes.Contains(chunk, []byte(`"seq":`)) && !bytes.Contains(chunk, []byte("stream_msg_get_response")) {
		p.sawPub.Store(false)
		p.armed.Store(false)
		p.dropped <- time.Now()
		return false
	}
	return true
}

// forward copies src to dst, chunk by chunk, leaving out the chunks keep
// refuses; it closes both when either side ends.
func (p *ackDropper) forward(dst, src net.Conn, keep func([]byte) bool) {
	defer func() { _ = src.Close(); _ = dst.Close() }()
	buf := make([]byte, 64<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 && keep(buf[:n]) {
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

// rawWrite is a write to a key with the timing its value carries (a
// Supervisor writes "token\nT=… C·R=…"; zero when the value has none).
type rawWrite struct {
	rev     uint64
	token   string
	T, CR   time.Duration
	created time.Time
}

// rawWatch records every write to a key, timing included.
type rawWatch struct {
	mu     sync.Mutex
	writes []rawWrite
}

func parseRaw(rev uint64, value []byte, created time.Time) rawWrite {
	w := rawWrite{rev: rev, created: created}
	token, timing, _ := strings.Cut(string(value), "\n")
	w.token = token
	for _, f := range strings.Fields(timing) {
		k, v, _ := strings.Cut(f, "=")
		d, _ := time.ParseDuration(v)
		switch k {
		case "T":
			w.T = d
		case "C·R":
			w.CR = d
		}
	}
	return w
}

// watchRaw watches key on url until the test's cleanup.
func watchRaw(t *testing.T, url, bucket, key string) *rawWatch {
	t.Helper()
	w := &rawWatch{}
	kw, err := mustBucket(t, url, bucket).Watch(context.Background(), key)
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for e := range kw.Updates() {
			if e == nil {
				continue
			}
			rw := parseRaw(e.Revision(), e.Value(), e.Created())
			w.mu.Lock()
			w.writes = append(w.writes, rw)
			w.mu.Unlock()
		}
	}()
	t.Cleanup(func() { _ = kw.Stop(); wg.Wait() })
	return w
}

func (w *rawWatch) all() []rawWrite {
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([]rawWrite(nil), w.writes...)
}

// endEvent returns n's first event at or after since that puts it in
// standby: the one that says why its hold ended.
func endEvent(n *node4, since time.Time) (natsputex.Event, bool) {
	n.mu.Lock()
	defer n.mu.Unlock()
	for _, e := range n.events {
		if !e.Time.Before(since) && e.Phase == natsputex.PhaseStandby {
			return e, true
		}
	}
	return natsputex.Event{}, false
}

// eventsAfter returns n's events at or after since.
func eventsAfter(n *node4, since time.Time) []natsputex.Event {
	n.mu.Lock()
	defer n.mu.Unlock()
	var out []natsputex.Event
	for _, e := range n.events {
		if !e.Time.Before(since) {
			out = append(out, e)
		}
	}
	return out
}

// nodeWrites returns the writes of token the watch saw stored after t.
func nodeWrites(w *keyWatch, token string, t time.Time) []keyWrite {
	var out []keyWrite
	for _, kw := range w.writesAfter(t) {
		if kw.value == token {
			out = append(out, kw)
		}
	}
	return out
}

// writeBefore returns the last write of token stored before rev.
func writeBefore(w *keyWatch, token string, rev uint64) (keyWrite, bool) {
	var out keyWrite
	for _, kw := range w.all() {
		if kw.rev < rev && kw.value == token {
			out = kw
		}
	}
	return out, out.rev != 0
}

// checkRestart fails t unless n's first Start after after began C·R or
// more after n's first write since its Stop before that Start: what the
// doc asks of an agent that finds its own token after a write whose
// answer was lost ("it starts the service only after C·R of its own
// writes that it saw succeed, on every path"). It returns false if n did
// not start again.
func checkRestart(t *testing.T, writes *keyWatch, n *node4, after time.Time, CR time.Duration) bool {
	t.Helper()
	var st call4
	for _, s := range n.getStarts() {
		if s.begin.After(after) {
			st = s
			break
		}
	}
	if st.begin.IsZero() {
		return false
	}
	var stopped time.Time
	for _, s := range n.getStops() {
		if s.begin.Before(st.begin) {
			stopped = s.begin
		}
	}
	ws := nodeWrites(writes, n.name, stopped)
	if len(ws) == 0 {
		t.Errorf("%s started again at %v with no write of its own since it stopped", n.name, st.begin.Format("15:04:05.000"))
		return true
	}
	t.Logf("%s started again %v after its first write (rev %d) since it stopped (C·R = %v)", n.name, st.begin.Sub(ws[0].created).Round(time.Millisecond), ws[0].rev, CR)
	if d := st.begin.Sub(ws[0].created); d < CR-10*time.Millisecond {
		t.Errorf("%s started again %v after its first write since it stopped (rev %d), before C·R = %v", n.name, d.Round(time.Millisecond), ws[0].rev, CR)
	}
	return true
}

// activeAndStandby starts node-a on aURL and, once its service runs,
// node-b on bURL (both on ConnectOptions, with opts; each Stop takes
// stop), and returns once node-b has seen node-a hold the key.
func activeAndStandby(t *testing.T, aURL, bURL, bucket, key string, h *contracttest.History, stop time.Duration, opts ...natsputex.Option) (a, b *node4) {
	t.Helper()
	a = startNode5(t, aURL, bucket, key, "node-a", "node-a", h, true, opts...)
	a.stopDelay.Store(int64(stop))
	waitFor(t, 5*time.Second, "node-a starts its service", a.running)
	b = startNode5(t, bURL, bucket, key, "node-b", "node-b", h, true, opts...)
	b.stopDelay.Store(int64(stop))
	waitFor(t, 5*time.Second, "node-b is standby", func() bool {
		return b.sawEvent(func(e natsputex.Event) bool { return e.Holder == "node-a" })
	})
	return a, b
}

// proxiedPair is activeAndStandby on a fresh bucket of the local server
// with node-a behind a proxy (Stop takes 30ms), 2R after node-b first saw
// node-a hold the key; writes watches the key.
func proxiedPair(t *testing.T) (writes *keyWatch, proxy *testenv.Proxy, h *contracttest.History, a, b *node4) {
	t.Helper()
	url, bucket, key := atk4Env(t)
	writes = watchWrites(t, url, bucket, key)
	proxy = testenv.NewProxy(t, strings.TrimPrefix(url, "nats://"))
	h = contracttest.NewHistory(1)
	a, b = activeAndStandby(t, "nats://"+proxy.Addr(), url, bucket, key, h, 30*time.Millisecond)
	time.Sleep(2 * testR)
	return writes, proxy, h, a, b
}

// stopNodes ends the nodes' Runs (a SIGTERM each) and waits for them.
func stopNodes(nodes ...*node4) {
	for _, n := range nodes {
		n.cancel()
	}
	for _, n := range nodes {
		n.wait(5 * time.Second)
	}
}

// TestAttack6LostRenewalReply: the answer to an active agent's renewal is
// lost. The docs: "A holder's lease ends at once, with locks.ErrLost, when
// a write fails"; "here a renewal is bounded by the holder's own validity
// (T minus the margin)"; a holder "ends its lease by itself at the start
// of its last successful write plus T minus a safety margin"; an agent
// that finds its own token "after a write whose answer was lost ... starts
// the service only after C·R of its own writes that it saw succeed, on
// every path".
//   - one-at-a-time (F = 5, C = 2: T = 500ms, margin 50ms, C·R = 200ms):
//     three times, the answer to one renewal of node-a's, and only it,
//     is lost (the write lands; the connection stays up). node-a must
//     begin Stop no later than T − margin (+60ms) after the last write
//     whose answer it had (it may not keep the hold on a write it never
//     saw succeed), and start again only C·R after its first write since,
//     having said it confirms its own token; node-b, standby, takes the
//     key only after T of silence.
//   - longer-than-T (F = 3, C = 1): node-a's answers are all dropped for
//     1.5s (5T): node-a stops T − margin after its last write, node-b
//     takes over T + C·R after node-a's last write, and after Stop
//     returned; once its answers come back node-a never starts again nor
//     writes the key, and its events name node-b.
//
// The services never overlap.
func TestAttack6LostRenewalReply(t *testing.T) {
	t.Run("one-at-a-time", func(t *testing.T) {
		const (
			F, C   = 5, 2
			T      = F * testR
			margin = testR / 2
		)
		url, bucket, key := atk4Env(t)
		writes := watchWrites(t, url, bucket, key)
		p := newAckDropper(t, url, bucket, key)
		h := contracttest.NewHistory(1)
		opts := []natsputex.Option{natsputex.WithFailureThreshold(F), natsputex.WithConfirmations(C)}
		a, b := activeAndStandby(t, p.addr(), url, bucket, key, h, 20*time.Millisecond, opts...)
		var drops []time.Time
		for i := range 3 {
			time.Sleep(3 * testR)
			if !a.running() {
				break
			}
			p.arm()
			select {
			case d := <-p.dropped:
				drops = append(drops, d)
			case <-time.After(3 * time.Second):
				t.Fatal("node-a wrote nothing to lose the answer of")
			}
			waitFor(t, 5*time.Second, "an agent runs the service again", func() bool {
				return len(a.getStarts()) > i+1 || len(b.getStarts()) > 0
			})
		}
		time.Sleep(2 * testR)
		stopNodes(a, b)
		for i, d := range drops {
			lost, ok := writes.lastBy("node-a", d)
			if !ok {
				t.Fatalf("drop %d: no write of node-a's before it", i)
			}
			answered, ok := writeBefore(writes, "node-a", lost.rev)
			if !ok {
				t.Fatalf("drop %d: no write of node-a's answered before rev %d", i, lost.rev)
			}
			stop, ok := a.firstStopAfter(lost.created)
			if !ok {
				t.Errorf("drop %d: node-a kept its service after the answer to rev %d was lost: it holds on a write it never saw succeed", i, lost.rev)
				continue
			}
			t.Logf("drop %d: the answer to rev %d was lost; node-a's Stop began %v after its last answered write (rev %d), %v after the lost one (T − margin = %v)",
				i, lost.rev, stop.begin.Sub(answered.created).Round(time.Millisecond), answered.rev, stop.begin.Sub(lost.created).Round(time.Millisecond), T-margin)
			if dd := stop.begin.Sub(answered.created); dd > T-margin+slack6 {
				t.Errorf("drop %d: node-a began Stop %v after its last answered write, later than T − margin = %v (+%v)", i, dd.Round(time.Millisecond), T-margin, slack6)
			}
			if checkRestart(t, writes, a, stop.begin, C*testR) {
				confirmed := false
				for _, e := range eventsAfter(a, stop.begin) {
					if e.Phase == natsputex.PhaseActive {
						break
					}
					confirmed = confirmed || e.Phase == natsputex.PhaseConfirming && e.Holder == "node-a"
				}
				if !confirmed {
					t.Errorf("drop %d: node-a became active again without confirming its own token first", i)
				}
			}
		}
		checkTakeovers(t, writes, a, T, C*testR)
		checkTakeovers(t, writes, b, T, C*testR)
		if err := h.Check(); err != nil {
			t.Errorf("services overlapped: %v", err)
		}
	})
	t.Run("longer-than-T", func(t *testing.T) {
		const (
			C      = 1
			T      = testF * testR
			margin = testR / 2
		)
		writes, proxy, h, a, b := proxiedPair(t)
		cut := cutAfterRenewal(t, writes, "node-a", proxy.DropReplies)
		waitFor(t, 3*time.Second, "node-b starts its service", b.running)
		time.Sleep(time.Until(cut.Add(5 * T)))
		restored := time.Now()
		proxy.Restore()
		waitFor(t, 3*time.Second, "node-a names node-b once its answers come back", func() bool {
			for _, e := range eventsAfter(a, restored) {
				if e.Holder == "node-b" {
					return true
				}
			}
			return false
		})
		time.Sleep(3 * testR)
		stopNodes(a, b)
		answered, _ := writes.lastBy("node-a", cut)
		stop, ok := a.firstStopAfter(cut)
		if !ok {
			t.Fatal("node-a never stopped its service")
		}
		bStart := b.getStarts()[0].begin
		last, _ := writes.lastBy("node-a", bStart)
		t.Logf("node-a's Stop began %v after its last write before the answers were dropped (rev %d; T − margin = %v); node-b started %v after node-a's last write (rev %d; T + C·R = %v) and %v after node-a's Stop returned",
			stop.begin.Sub(answered.created).Round(time.Millisecond), answered.rev, T-margin,
			bStart.Sub(last.created).Round(time.Millisecond), last.rev, T+C*testR, bStart.Sub(stop.end).Round(time.Millisecond))
		if dd := stop.begin.Sub(answered.created); dd > T-margin+slack6 {
			t.Errorf("node-a began Stop %v after its last write, later than T − margin = %v (+%v)", dd.Round(time.Millisecond), T-margin, slack6)
		}
		if bStart.Before(stop.end) {
			t.Errorf("node-b started %v before node-a's Stop returned", stop.end.Sub(bStart).Round(time.Millisecond))
		}
		for _, st := range a.getStarts() {
			if st.begin.After(cut) {
				t.Errorf("node-a started again %v after its answers were dropped, while node-b held the key", st.begin.Sub(cut).Round(time.Millisecond))
			}
		}
		if first, ok := writes.firstBy("node-b"); ok {
			for _, w := range nodeWrites(writes, "node-a", first.created) {
				t.Errorf("node-a wrote the key (rev %d) %v after node-b took it over", w.rev, w.created.Sub(first.created).Round(time.Millisecond))
			}
		}
		checkTakeovers(t, writes, b, T, C*testR)
		if err := h.Check(); err != nil {
			t.Errorf("services overlapped: %v", err)
		}
	})
}

// TestAttack6LateReplyAfterTakeover: the answer to an active agent's
// renewal comes late (its proxy delays every answer). The write landed;
// its answer says it succeeded. "a holder ... ends its lease by itself at
// the start of its last successful write plus T minus a safety margin";
// "A process paused longer than T ... its lease's context then ends at
// once". node-a (R = 100ms, F = 3, C = 1: T = 300ms, margin 50ms) and
// node-b (direct link) on one key.
//   - after-takeover: answers delayed 900ms (> T + C·R + R), from halfway
//     between two renewals, for 2s: node-a must stop T − margin (+60ms)
//     after its last answered write, node-b take over T + C·R after
//     node-a's last write; the late success must not make node-a start
//     again or write the key after node-b's takeover, and its events must
//     name node-b once it reads the key.
//   - between-validity-and-T: answers delayed 280ms, for 600ms: the late
//     success of node-a's next renewal comes after its hold ran out
//     (250ms) but before anyone may take over (300ms). node-a must have
//     stopped at T − margin all the same; should it start again, only
//     C·R after a write of its own since.
//
// The services never overlap.
func TestAttack6LateReplyAfterTakeover(t *testing.T) {
	const (
		C      = 1
		T      = testF * testR
		margin = testR / 2
	)
	for _, tc := range []struct {
		name         string
		delay, until time.Duration
	}{
		{"after-takeover", 900 * time.Millisecond, 2 * time.Second},
		{"between-validity-and-T", 280 * time.Millisecond, 600 * time.Millisecond},
	} {
		t.Run(tc.name, func(t *testing.T) {
			writes, proxy, h, a, b := proxiedPair(t)
			cut := cutAfterRenewal(t, writes, "node-a", func() { proxy.DelayReplies(tc.delay) })
			time.Sleep(time.Until(cut.Add(tc.until)))
			proxy.Restore()
			waitActive4(t, 5*time.Second, a, b)
			time.Sleep(T + C*testR + 3*testR)
			stopNodes(a, b)
			answered, _ := writes.lastBy("node-a", cut)
			stop, ok := a.firstStopAfter(cut)
			if !ok {
				t.Fatal("node-a never stopped its service, though its answers came later than its hold lasts")
			}
			late := nodeWrites(writes, "node-a", cut)
			lateInfo := "none"
			if len(late) > 0 {
				lateInfo = fmt.Sprintf("rev %d, its answer due %v after the Stop began", late[0].rev, late[0].created.Add(tc.delay).Sub(stop.begin).Round(time.Millisecond))
			}
			t.Logf("node-a's Stop began %v after its last answered write (rev %d; T − margin = %v); its next write: %s",
				stop.begin.Sub(answered.created).Round(time.Millisecond), answered.rev, T-margin, lateInfo)
			if dd := stop.begin.Sub(answered.created); dd > T-margin+slack6 {
				t.Errorf("node-a began Stop %v after its last answered write, later than T − margin = %v (+%v): the late success kept it", dd.Round(time.Millisecond), T-margin, slack6)
			}
			if tc.name == "after-takeover" {
				bs := b.getStarts()
				if len(bs) == 0 {
					t.Fatal("node-b never took over")
				}
				for _, st := range a.getStarts() {
					if st.begin.After(cut) {
						t.Errorf("node-a started again %v after its answers were delayed, while node-b held the key", st.begin.Sub(cut).Round(time.Millisecond))
					}
				}
				first, _ := writes.firstBy("node-b")
				for _, w := range nodeWrites(writes, "node-a", first.created) {
					t.Errorf("node-a wrote the key (rev %d) %v after node-b took it over", w.rev, w.created.Sub(first.created).Round(time.Millisecond))
				}
				named := false
				for _, e := range eventsAfter(a, cut) {
					named = named || e.Holder == "node-b"
				}
				if !named {
					t.Error("node-a's events never name node-b, which took its key")
				}
			} else {
				checkRestart(t, writes, a, stop.begin, C*testR)
			}
			checkTakeovers(t, writes, a, T, C*testR)
			checkTakeovers(t, writes, b, T, C*testR)
			if err := h.Check(); err != nil {
				writes.logAll(t, cut)
				t.Errorf("services overlapped: %v", err)
			}
		})
	}
}

// names reports whether e names what an agent read in the key: the token,
// in Event.Holder ("the holder's token in the key ..., when it was read")
// or in its message; for a free key, a message that says it was blanked,
// deleted or purged.
func names(e natsputex.Event, token, own string) bool {
	if token != "" && token == own {
		return e.Holder == token || strings.Contains(e.Msg, "same token")
	}
	if token != "" {
		return e.Holder == token || strings.Contains(e.Msg, `"`+token+`"`) || strings.Contains(e.Msg, " "+token)
	}
	msg := strings.ToLower(e.Msg)
	for _, w := range []string{"blank", "delet", "purg", "missing", "free", "vanish"} {
		if strings.Contains(msg, w) {
			return e.Holder == ""
		}
	}
	return false
}

// TestAttack6ForeignWrite: while node-a is active (R = 100ms, F = 3,
// C = 1) and node-b stands by, a raw KV client, halfway between two
// renewals, writes another token ("intruder"), writes node-a's own value
// (a duplicate), blanks the key, deletes it, purges it, or purges the
// whole stream. The docs: "A holder learns it lost its key at its next
// renewal, within R"; "A failed write or health check, or another write
// in the key, stops the service at once"; "an agent holding the key that
// finds its token written by someone else stops its service and says
// so"; the renewal reads the key "when that write finds it taken ... to
// say who took it" (architecture.md); Event.Holder is "the holder's
// token in the key ..., when it was read; "" when free".
//
// In every case node-a's Stop must begin within R (+60ms) of the foreign
// write, and the event that ends its hold must name what it read: the
// token now in the key, or that the key was blanked or deleted. An
// intruder's or duplicate's write is a write like any other: no agent may
// write the key until T after it ("waits for T without a write"), and the
// services never overlap. A purged stream makes the key vanish: "a
// running Supervisor that saw the key counts it as held for T": no agent
// writes it until T after node-a's last write, and no overlap. A blanked,
// deleted or purged key is free ("An empty value, a missing key or a
// deleted key is free"): node-b takes it at once, while node-a learns at
// its next renewal; the overlap that leaves is logged, bounded by the
// check on node-a's Stop.
func TestAttack6ForeignWrite(t *testing.T) {
	const (
		C = 1
		T = testF * testR
	)
	for _, mode := range []string{"intruder", "same-token", "blank", "blank-at-renewal", "delete", "purge-key", "purge-stream"} {
		t.Run(mode, func(t *testing.T) {
			url, bucket, key := atk4Env(t)
			writes := watchWrites(t, url, bucket, key)
			kv := mustBucket(t, url, bucket)
			h := contracttest.NewHistory(1)
			a, b := activeAndStandby(t, url, url, bucket, key, h, 20*time.Millisecond)
			time.Sleep(2 * testR)
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			cur, err := kv.Get(ctx, key)
			if err != nil {
				t.Fatal(err)
			}
			var opErr error
			var before time.Time
			write := func() {
				before = time.Now()
				switch mode {
				case "intruder":
					_, opErr = kv.Put(ctx, key, []byte("intruder"))
				case "same-token":
					_, opErr = kv.Put(ctx, key, cur.Value())
				case "blank", "blank-at-renewal":
					_, opErr = kv.Put(ctx, key, nil)
				case "delete":
					opErr = kv.Delete(ctx, key)
				case "purge-key":
					opErr = kv.Purge(ctx, key)
				case "purge-stream":
					var s jetstream.Stream
					if s, opErr = mustJS(t, url).Stream(ctx, "KV_"+bucket); opErr == nil {
						opErr = s.Purge(ctx)
					}
				}
			}
			if mode == "blank-at-renewal" {
				// Right after a renewal: node-b, woken, may take the free
				// key before node-a's next renewal.
				afterRenewal(t, writes, "node-a", 0, write)
			} else {
				cutAfterRenewal(t, writes, "node-a", write)
			}
			if opErr != nil {
				t.Fatal(opErr)
			}
			// The foreign write: the first the watch saw stored since the
			// test made it (the server's clock is the machine's), or, for a
			// purged stream, which leaves no write, when the test asked.
			foreign := keyWrite{created: before}
			if mode != "purge-stream" {
				waitFor(t, 2*time.Second, "the watch sees the foreign write", func() bool {
					ws := writes.writesAfter(before.Add(-2 * time.Millisecond))
					if len(ws) > 0 {
						foreign = ws[0]
					}
					return len(ws) > 0
				})
			}
			lastA, _ := writes.lastBy("node-a", before)
			waitFor(t, 5*time.Second, "node-a stops its service", func() bool { _, ok := a.firstStopAfter(before); return ok })
			waitActive4(t, 5*time.Second, a, b)
			time.Sleep(T + C*testR + 2*testR)
			stopNodes(a, b)

			stop, _ := a.firstStopAfter(before)
			t.Logf("%s (rev %d): node-a's Stop began %v after it (R = %v)", mode, foreign.rev, stop.begin.Sub(foreign.created).Round(time.Millisecond), testR)
			if d := stop.begin.Sub(foreign.created); d > testR+slack6 {
				t.Errorf("node-a began Stop %v after the foreign write, later than R = %v (+%v)", d.Round(time.Millisecond), testR, slack6)
			}
			// What node-a could read when its write failed: the key's last
			// write before its Stop began.
			read := keyWrite{}
			for _, w := range writes.writesAfter(foreign.created.Add(-time.Millisecond)) {
				if w.created.Before(stop.begin) {
					read = w
				}
			}
			if mode == "purge-stream" && read.rev == 0 {
				read.value = ""
			}
			if e, ok := endEvent(a, before); !ok {
				t.Error("node-a reported no end of its hold")
			} else {
				t.Logf("node-a's event: holder=%q revision=%d msg=%q err=%v (the key held %q at rev %d)", e.Holder, e.Revision, e.Msg, e.Err, read.value, read.rev)
				if !names(e, read.value, "node-a") {
					what := fmt.Sprintf("the token %q", read.value)
					if read.value == "" {
						what = "that the key was blanked or deleted"
					}
					t.Errorf("node-a's event ending its hold does not say %s, which it read (rev %d): holder=%q msg=%q", what, read.rev, e.Holder, e.Msg)
				}
			}
			switch mode {
			case "intruder", "same-token", "purge-stream":
				from := foreign
				if mode == "purge-stream" {
					from = lastA
				}
				for _, w := range writes.writesAfter(from.created) {
					if w.value == "node-a" || w.value == "node-b" {
						t.Logf("the first agent's write after it: rev %d %q, %v after the last write before (T = %v)", w.rev, w.value, w.created.Sub(from.created).Round(time.Millisecond), T)
						if d := w.created.Sub(from.created); d < T-10*time.Millisecond {
							t.Errorf("%s wrote the key (rev %d) %v after the last write before (rev %d), before T = %v", w.value, w.rev, d.Round(time.Millisecond), from.rev, T)
						}
						break
					}
				}
				if err := h.Check(); err != nil {
					t.Errorf("services overlapped: %v", err)
				}
			default:
				for _, st := range append(a.getStarts(), b.getStarts()...) {
					if st.begin.After(before) {
						t.Logf("the free key: Start with token %d %v after the foreign write (node-a's Stop returned %v after it)",
							st.token, st.begin.Sub(foreign.created).Round(time.Millisecond), stop.end.Sub(foreign.created).Round(time.Millisecond))
					}
				}
				if err := h.Check(); err != nil {
					t.Logf("documented (a free key is taken at once; node-a learns at its next renewal): %v", err)
				}
			}
			checkTakeovers(t, writes, a, T, C*testR)
			checkTakeovers(t, writes, b, T, C*testR)
		})
	}
}

// timingSpec is one agent's R, F and C.
type timingSpec struct {
	name string
	R    time.Duration
	F, C int
}

func (s timingSpec) opts() []natsputex.Option {
	return []natsputex.Option{natsputex.WithRenewInterval(s.R), natsputex.WithFailureThreshold(s.F), natsputex.WithConfirmations(s.C)}
}

// TestAttack6MixedTiming: three agents on one key with different timing:
// a (R = 50ms, F = 2, C = 1: T = 100ms, C·R = 50ms; it renews every
// (T − margin)/2), b (R = 200ms, F = 3, C = 2: T = 600ms, C·R = 400ms) and
// c (R = 100ms, F = 4, C = 1: T = 400ms, C·R = 100ms). "a standby waits for
// the longer of its own T and the holder's, and confirms for the longer
// C·R", "While it confirms, a taker-over writes its token with the longer
// T and C·R of its own and of the value it displaced", "a client with a
// shorter T never takes a live holder's key between two of its renewals".
// b is active first for 1.5s with a and c standing by; then the active
// agent is killed four times (each time started again under a new token
// with the same timing). Every takeover must come at least the T its
// displaced value carries after that write, every Start at least the
// longer of its agent's C·R and the displaced value's after the agent's
// first write of the run; the services never overlap.
func TestAttack6MixedTiming(t *testing.T) {
	url, bucket, key := atk4Env(t)
	raw := watchRaw(t, url, bucket, key)
	h := contracttest.NewHistory(1)
	specs := map[string]timingSpec{
		"a": {"a", 50 * time.Millisecond, 2, 1},
		"b": {"b", 200 * time.Millisecond, 3, 2},
		"c": {"c", 100 * time.Millisecond, 4, 1},
	}
	var all, live []*node4
	spec := map[*node4]timingSpec{}
	runs := map[string]int{}
	start := func(s timingSpec) *node4 {
		runs[s.name]++
		name := fmt.Sprintf("node-%s%d", s.name, runs[s.name])
		n := startNode5(t, url, bucket, key, name, name, h, true, s.opts()...)
		n.stopDelay.Store(int64(20 * time.Millisecond))
		all = append(all, n)
		live = append(live, n)
		spec[n] = s
		return n
	}
	start(specs["b"])
	waitFor(t, 5*time.Second, "node-b1 starts its service", func() bool { return live[0].running() })
	start(specs["a"])
	start(specs["c"])
	time.Sleep(1500 * time.Millisecond)
	if !live[0].running() {
		t.Error("node-b1, active with T = 600ms, lost the service while agents of shorter T stood by")
	}
	for round := range 4 {
		up := waitActive4(t, 5*time.Second, live...)
		time.Sleep(time.Duration(200+150*round) * time.Millisecond)
		up.kill()
		for i, n := range live {
			if n == up {
				live = append(live[:i], live[i+1:]...)
				break
			}
		}
		t.Logf("round %d: killed %s", round, up.name)
		start(spec[up])
	}
	waitActive4(t, 5*time.Second, live...)
	time.Sleep(500 * time.Millisecond)
	stopNodes(live...)
	ws := raw.all()
	takeovers := 0
	for i := 1; i < len(ws); i++ {
		p, w := ws[i-1], ws[i]
		if p.token == "" || w.token == "" || p.token == w.token {
			continue
		}
		takeovers++
		gap := w.created.Sub(p.created)
		t.Logf("rev %d %q (T=%v C·R=%v) took over rev %d %q (T=%v C·R=%v) %v after it", w.rev, w.token, w.T, w.CR, p.rev, p.token, p.T, p.CR, gap.Round(time.Millisecond))
		if p.T == 0 {
			t.Errorf("rev %d %q carries no timing", p.rev, p.token)
		}
		if gap < p.T-10*time.Millisecond {
			t.Errorf("rev %d %q took over rev %d %q %v after it, before the T = %v its value carries", w.rev, w.token, p.rev, p.token, gap.Round(time.Millisecond), p.T)
		}
	}
	if takeovers < 4 {
		t.Errorf("only %d takeovers in the run", takeovers)
	}
	for _, n := range all {
		own := time.Duration(spec[n].C) * spec[n].R
		for _, st := range n.getStarts() {
			last := -1
			for i, w := range ws {
				if w.created.After(st.begin) {
					break
				}
				last = i
			}
			if last < 0 || ws[last].token != n.name {
				t.Errorf("%s started without its token in the key", n.name)
				continue
			}
			first := last
			for first > 0 && ws[first-1].token == n.name {
				first--
			}
			if first == 0 || ws[first-1].token == "" {
				continue
			}
			need := max(own, ws[first-1].CR)
			if d := st.begin.Sub(ws[first].created); d < need-10*time.Millisecond {
				t.Errorf("%s started %v after its takeover write (rev %d) over %q (C·R %v), before the longer C·R = %v", n.name, d.Round(time.Millisecond), ws[first].rev, ws[first-1].token, ws[first-1].CR, need)
			}
		}
	}
	if err := h.Check(); err != nil {
		t.Errorf("services overlapped: %v", err)
	}
}
