package natsputex_test

// Renewal: a holder renews every R, in one batched round for all the
// leases of its Client; its lease ends by itself at the start of its last
// successful write plus T − margin, and a late answer never revives it.

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/latchkey-go/latchkey/contracttest"
	"github.com/latchkey-go/latchkey/contracttest/testenv"
	"github.com/latchkey-go/latchkey/contracttest/testenv/natsenv"
	"github.com/latchkey-go/latchkey/locks"
	"github.com/latchkey-go/latchkey/natsputex"
)

// TestStolenKeyEndsOnlyItsLeaseOfTheBatch: one Client holds 16 leases (R =
// 100ms, F = 3), renewed together. A rogue write lands on one key behind the
// holder's back. That lease must end within about R ("A holder learns it
// lost its key at its next renewal, within R"); the other 15 must go on
// being renewed (their deadlines keep moving) and no lease may be live past
// its deadline.
func TestStolenKeyEndsOnlyItsLeaseOfTheBatch(t *testing.T) {
	url, bucket := promiseEnv(t, "steal")
	c := newTestClient(t, url, bucket, natsputex.WithHolderID("batch"))
	v := watchValidity(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	names := leaseNames(16)
	leases := make([]locks.Lease, len(names))
	for i, n := range names {
		l, err := c.Locker().TryLock(ctx, n)
		if err != nil {
			t.Fatal(err)
		}
		leases[i] = l
		v.add(n, l)
	}
	time.Sleep(300 * time.Millisecond)
	kv := mustBucket(t, url, bucket)
	if _, err := kv.Put(ctx, names[5], []byte("rogue")); err != nil {
		t.Fatal(err)
	}
	stolenAt := time.Now()
	select {
	case <-leases[5].Context().Done():
		t.Logf("the stolen lease ended %v after the rogue write: %v", time.Since(stolenAt).Round(time.Millisecond), context.Cause(leases[5].Context()))
		if d := time.Since(stolenAt); d > testR+150*time.Millisecond {
			t.Errorf("the stolen lease ended %v after the rogue write, beyond R = %v (+150ms slack)", d.Round(time.Millisecond), testR)
		}
		if !errors.Is(context.Cause(leases[5].Context()), locks.ErrLost) {
			t.Errorf("the stolen lease's cause %v does not match ErrLost", context.Cause(leases[5].Context()))
		}
	case <-time.After(2 * time.Second):
		t.Fatal("the stolen lease was still live 2s after the rogue write")
	}
	before := leases[0].(interface{ Deadline() time.Time }).Deadline()
	time.Sleep(800 * time.Millisecond)
	after := leases[0].(interface{ Deadline() time.Time }).Deadline()
	if !after.After(before.Add(500 * time.Millisecond)) {
		t.Errorf("lease 0's deadline moved by %v in 800ms after the theft: its renewals stalled", after.Sub(before))
	}
	for i, l := range leases {
		if i != 5 && l.Context().Err() != nil {
			t.Errorf("lease %s ended with the stolen one: %v", names[i], context.Cause(l.Context()))
		}
	}
	for _, l := range leases {
		_ = l.Release(ctx)
	}
	v.check(t)
}

// TestDelayedRepliesEndBatchedLeasesByDeadline: 12 leases of one Client (R =
// 100ms, F = 3, margin 50ms: validity 250ms) behind a proxy whose replies
// are held for 400ms, longer than the validity, while another client waits
// in Lock on every name. Every lease must end by its deadline, and no waiter
// may be granted a name while its holder's lease is live; tokens rise. On
// the embedded server and on the nats-server program (2.9.10).
func TestDelayedRepliesEndBatchedLeasesByDeadline(t *testing.T) {
	t.Run("embedded", func(t *testing.T) {
		url, bucket := promiseEnv(t, "delay")
		batchRepliesDelayed(t, url, bucket)
	})
	t.Run("binary", func(t *testing.T) {
		url := natsenv.StartBinaryServer(t).URL()
		bucket := uniqueBucket("delay")
		prepareBucket(t, url, bucket)
		batchRepliesDelayed(t, url, bucket)
	})
}

func batchRepliesDelayed(t *testing.T, url, bucket string) {
	holder, proxy := proxiedClient(t, url, bucket, natsputex.WithHolderID("batch"), natsputex.WithSafetyMargin(50*time.Millisecond))
	waiter := newTestClient(t, url, bucket, natsputex.WithHolderID("waiter"),
		natsputex.WithRenewInterval(50*time.Millisecond), natsputex.WithFailureThreshold(2), natsputex.WithConfirmations(1))
	v := watchValidity(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	names := leaseNames(12)
	gs := make([]*grants, len(names))
	for i, n := range names {
		l, err := holder.Locker().TryLock(ctx, n)
		if err != nil {
			t.Fatal(err)
		}
		gs[i] = newGrants()
		gs[i].grant("holder", l)
		v.add(n, l)
	}
	var wg sync.WaitGroup
	var granted atomic.Int32
	for i, n := range names {
		wg.Add(1)
		go func() {
			defer wg.Done()
			l, err := waiter.Locker().Lock(ctx, n)
			if err != nil {
				t.Errorf("waiter on %s: %v", n, err)
				return
			}
			gs[i].grant("waiter", l)
			granted.Add(1)
			v.add(n+"/waiter", l)
		}()
	}
	time.Sleep(350 * time.Millisecond)
	proxy.DelayReplies(400 * time.Millisecond)
	delayed := time.Now()
	wg.Wait()
	t.Logf("all %d waiters granted %v after the delay began", granted.Load(), time.Since(delayed).Round(time.Millisecond))
	proxy.Restore()
	for _, g := range gs {
		g.check(t)
	}
	v.check(t)
}

// TestSupervisorWithSlowRepliesNeverOverlapsLocker: an active Supervisor (R
// = 100ms, F = 3, C = 1, margin 50ms) behind a proxy whose replies are
// delayed 150ms, then 240ms, then 400ms (1.5s each), while a fast Locker (R
// = 50ms, F = 2, C = 1) loops Lock on the same key. The Supervisor's
// deadline is a kit lease extended by each successful write from the write's
// start: its service and the Locker's leases must never overlap (one
// monotonic clock), and tokens rise.
func TestSupervisorWithSlowRepliesNeverOverlapsLocker(t *testing.T) {
	url, bucket, key := supervisorEnv(t)
	proxy := testenv.NewProxy(t, strings.TrimPrefix(url, "nats://"))
	h := contracttest.NewHistory(1)
	a := startAgent(t, "nats://"+proxy.Addr(), bucket, key, "node-a", h, withClientOptions(natsputex.WithSafetyMargin(50*time.Millisecond)))
	waitFor(t, 5*time.Second, "node-a starts its service", a.running)
	locker := newTestClient(t, url, bucket, natsputex.WithHolderID("locker"),
		natsputex.WithRenewInterval(50*time.Millisecond), natsputex.WithFailureThreshold(2), natsputex.WithConfirmations(1))
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	var grantsN atomic.Int32
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for ctx.Err() == nil {
			l, err := locker.Locker().Lock(ctx, key)
			if err != nil {
				continue
			}
			grantsN.Add(1)
			exit := sync.OnceFunc(h.Enter("locker", l.Token()))
			go func() { <-l.Context().Done(); exit() }()
			time.Sleep(200 * time.Millisecond)
			exit()
			_ = l.Release(context.Background())
			time.Sleep(100 * time.Millisecond)
		}
	}()
	for _, d := range []time.Duration{150 * time.Millisecond, 240 * time.Millisecond, 400 * time.Millisecond} {
		proxy.DelayReplies(d)
		time.Sleep(1500 * time.Millisecond)
	}
	proxy.Restore()
	time.Sleep(time.Second)
	cancel()
	wg.Wait()
	a.stop()
	a.mu.Lock()
	t.Logf("node-a's service started %d time(s), tokens %v; the Locker got the key %d time(s)", len(a.started), a.tokens, grantsN.Load())
	a.mu.Unlock()
	if err := h.Check(); err != nil {
		t.Errorf("overlap: %v", err)
	}
}

// TestLateRenewalAnswerDoesNotReviveLease: "a lease whose validity deadline
// has passed stays ended (a late renewal no longer revives it)": "A holder
// that cannot renew ends its lease by itself at the start of its last
// successful write plus T minus a safety margin". One Client behind a proxy
// (R = 100ms, F = 3, C = 2, margin 50ms: T − margin = 250ms) holds a Locker
// lease on "job" and runs an active Supervisor; another client waits in Lock
// on "job" (looping) and node-b stands by on the Supervisor's key. The proxy
// delays every answer by 150ms, 240ms, 300ms, then 450ms, 1.5s each. The
// Locker lease must never be live past its Deadline; "job" never granted
// twice at once; the services never overlap; and whenever node-a starts
// again it has either taken a blank key or confirmed C·R after its first
// write since it last stopped.
func TestLateRenewalAnswerDoesNotReviveLease(t *testing.T) {
	const (
		C      = 2
		margin = 50 * time.Millisecond
	)
	url, bucket, key := localEnv(t)
	writes := watchWrites(t, url, bucket, key)
	proxy := testenv.NewProxy(t, strings.TrimPrefix(url, "nats://"))
	h := contracttest.NewHistory(1)
	opts := []natsputex.Option{natsputex.WithConfirmations(C), natsputex.WithSafetyMargin(margin)}
	a := startNode(t, "nats://"+proxy.Addr(), bucket, key, "node-a", h, withClientOptions(append(opts, natsputex.WithHolderID("client-a"))...))
	a.stopDelay.Store(int64(30 * time.Millisecond))
	waitFor(t, 5*time.Second, "node-a starts its service", a.running)
	b := startNode(t, url, bucket, key, "node-b", h, withClientOptions(opts...))
	v := watchValidity(t)
	g := newGrants()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	l, err := a.c.Locker().TryLock(ctx, "job")
	if err != nil {
		t.Fatal(err)
	}
	v.add("client-a job", l)
	g.grant("client-a", l)
	waiter := newTestClient(t, url, bucket, natsputex.WithHolderID("waiter"))
	loopCtx, stopLoops := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for loopCtx.Err() == nil {
			l, err := waiter.Locker().Lock(loopCtx, "job")
			if err != nil {
				continue
			}
			g.grant("waiter", l)
			_ = sleepCtx(loopCtx, 100*time.Millisecond)
			_ = l.Release(context.Background())
			// client-a takes it back when it can.
			if l2, err := a.c.Locker().TryLock(loopCtx, "job"); err == nil {
				v.add("client-a job", l2)
				g.grant("client-a", l2)
			}
		}
	}()
	time.Sleep(3 * testR)
	faultAt := time.Now()
	for _, d := range []time.Duration{150 * time.Millisecond, 240 * time.Millisecond, 300 * time.Millisecond, 450 * time.Millisecond} {
		proxy.DelayReplies(d)
		time.Sleep(1500 * time.Millisecond)
	}
	proxy.Restore()
	time.Sleep(time.Second)
	stopLoops()
	wg.Wait()
	a.cancel()
	b.cancel()
	a.wait(5 * time.Second)
	b.wait(5 * time.Second)
	v.check(t)
	g.check(t)
	all := writes.all()
	stops := a.getStops()
	for _, st := range a.getStarts() {
		if st.begin.Before(faultAt) {
			continue
		}
		var lastStop time.Time
		for _, sp := range stops {
			if sp.begin.Before(st.begin) {
				lastStop = sp.begin
			}
		}
		first := -1
		for i, w := range all {
			if w.created.After(lastStop) && w.value == "node-a" {
				first = i
				break
			}
		}
		if first < 0 {
			t.Errorf("node-a started at %v without a write since its last Stop", st.begin.Format("15:04:05.000"))
			continue
		}
		free := first == 0 || all[first-1].value == ""
		t.Logf("node-a started %v after its first write (rev %d) since its last Stop; it took a free key: %t", st.begin.Sub(all[first].created).Round(time.Millisecond), all[first].rev, free)
		if !free && st.begin.Sub(all[first].created) < C*testR-10*time.Millisecond {
			t.Errorf("node-a started %v after its first write since it last stopped (rev %d, over %q), before C·R = %v",
				st.begin.Sub(all[first].created).Round(time.Millisecond), all[first].rev, all[first-1].value, C*testR)
		}
	}
	a.mu.Lock()
	t.Logf("node-a: %d starts, %d stops; node-b: %d starts", len(a.starts), len(a.stops), len(b.getStarts()))
	a.mu.Unlock()
	if err := h.Check(); err != nil {
		t.Errorf("services overlapped: %v", err)
	}
}

// TestLostRenewalAnswerEndsHoldByDeadline: the answer to an active agent's
// renewal is lost. The docs: "A holder's lease ends at once, with
// locks.ErrLost, when a write fails"; "here a renewal is bounded by the
// holder's own validity (T minus the margin)"; a holder "ends its lease by
// itself at the start of its last successful write plus T minus a safety
// margin"; an agent that finds its own token "after a write whose answer was
// lost ... starts the service only after C·R of its own writes that it saw
// succeed, on every path".
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
func TestLostRenewalAnswerEndsHoldByDeadline(t *testing.T) {
	t.Run("one-at-a-time", func(t *testing.T) {
		const (
			F, C   = 5, 2
			T      = F * testR
			margin = testR / 2
		)
		url, bucket, key := localEnv(t)
		writes := watchWrites(t, url, bucket, key)
		proxyURL, lose := loseAnswer(t, url, bucket, key, testenv.LoseReply(pubAck))
		h := contracttest.NewHistory(1)
		opts := []natsputex.Option{natsputex.WithFailureThreshold(F), natsputex.WithConfirmations(C)}
		a, b := activeAndStandby(t, proxyURL, url, bucket, key, h, 20*time.Millisecond, opts...)
		var drops []time.Time
		for i := range 3 {
			time.Sleep(3 * testR)
			if !a.running() {
				break
			}
			lose.Arm()
			select {
			case d := <-lose.Fired():
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
			// d is when the proxy read the write whose answer it lost:
			// the first of node-a's that the server stored after d.
			since := nodeWrites(writes, "node-a", d)
			if len(since) == 0 {
				t.Fatalf("drop %d: no write of node-a's after it", i)
			}
			lost := since[0]
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
			if dd := stop.begin.Sub(answered.created); dd > T-margin+timingSlack {
				t.Errorf("drop %d: node-a began Stop %v after its last answered write, later than T − margin = %v (+%v)", i, dd.Round(time.Millisecond), T-margin, timingSlack)
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
		if dd := stop.begin.Sub(answered.created); dd > T-margin+timingSlack {
			t.Errorf("node-a began Stop %v after its last write, later than T − margin = %v (+%v)", dd.Round(time.Millisecond), T-margin, timingSlack)
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

// TestLateRenewalAnswerAfterTakeoverStopsService: the answer to an active
// agent's renewal comes late (its proxy delays every answer). The write
// landed; its answer says it succeeded. "a holder ... ends its lease by
// itself at the start of its last successful write plus T minus a safety
// margin"; "A process paused longer than T ... its lease's context then ends
// at once". node-a (R = 100ms, F = 3, C = 1: T = 300ms, margin 50ms) and
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
func TestLateRenewalAnswerAfterTakeoverStopsService(t *testing.T) {
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
			waitActiveNode(t, 5*time.Second, a, b)
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
			if dd := stop.begin.Sub(answered.created); dd > T-margin+timingSlack {
				t.Errorf("node-a began Stop %v after its last answered write, later than T − margin = %v (+%v): the late success kept it", dd.Round(time.Millisecond), T-margin, timingSlack)
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

// TestValidityCountsFromSendNotAnswer: "A holder that cannot renew ends its
// lease by itself at the start of its last successful write plus T minus a
// safety margin"; change B: the validity counts from when the write that was
// answered was sent. Were it counted from the answer, a slow answer would
// carry the deadline past T of silence after the stored write. A holder (R =
// 100ms, F = 3, margin 50ms: validity 250ms) gets every answer 80ms or 140ms
// late (its proxy delays replies: more than the margin), and its link is cut
// 30ms after a renewal is stored for 80ms, three times, so that renewals are
// refused and sent again, their answers late too. A waiter (R = 50ms, C = 0)
// on a direct link waits in Lock. Every deadline the lease shows must lie
// within T − margin (+2ms) of the server's stamp of its latest write stored
// then; no lease live past its deadline; the waiter granted only once the
// holder's lease has ended.
func TestValidityCountsFromSendNotAnswer(t *testing.T) {
	const (
		T      = testF * testR
		margin = testR / 2
	)
	for _, delay := range []time.Duration{80 * time.Millisecond, 140 * time.Millisecond} {
		t.Run(fmt.Sprintf("delay%v", delay), func(t *testing.T) {
			url, bucket, key := localEnv(t)
			writes := watchWrites(t, url, bucket, key)
			l := dialLink(t, url)
			holder := l.client(t, bucket, natsputex.WithHolderID("holder"))
			waiter := newTestClient(t, url, bucket, natsputex.WithRenewInterval(testR/2), natsputex.WithConfirmations(0), natsputex.WithHolderID("waiter"))
			lease, token, v, g, ds := holdWatched(t, holder, writes, key)
			ctx, cancel := context.WithTimeout(context.Background(), 8*time.Second)
			defer cancel()
			waiting := goLock(ctx, waiter.Locker(), key, false)
			l.proxy.DelayReplies(delay)
			for i := 0; i < 3 && lease.Context().Err() == nil; i++ {
				time.Sleep(3 * testR)
				if lease.Context().Err() != nil {
					break
				}
				// Cut 30ms after a renewal is stored, its answer still on
				// its way: the next renewal is refused and sent again.
				for end := time.Now().Add(2 * time.Second); time.Now().Before(end) && lease.Context().Err() == nil; time.Sleep(time.Millisecond) {
					if w, ok := writes.lastBy(token, time.Now()); ok && time.Since(w.seen) < 3*time.Millisecond {
						time.Sleep(30 * time.Millisecond)
						l.proxy.Cut()
						break
					}
				}
				time.Sleep(80 * time.Millisecond)
				l.proxy.Restore()
				l.proxy.DelayReplies(delay)
				t.Logf("cut %d: link down 80ms; lease live: %v", i, lease.Context().Err() == nil)
			}
			time.Sleep(3 * testR)
			live := lease.Context().Err() == nil
			if live {
				_ = lease.Release(context.Background())
			}
			o := waitOutcome(t, waiting, 8*time.Second, "the waiter's Lock")
			most := ds.check(t, writes, token, T-margin)
			t.Logf("answers %v late: the holder's lease live to the end: %v (%v); deadlines at most %v after the stored write; holder writes: %d; the waiter: lease %v, err %v",
				delay, live, context.Cause(lease.Context()), ms(most), len(nodeWrites(writes, token, time.Time{})), o.lease != nil, o.err)
			if o.err != nil {
				t.Fatalf("the waiter's Lock: %v", o.err)
			}
			g.grant("waiter", o.lease)
			v.add("waiter", o.lease)
			if !live {
				last, _ := writes.lastBy(token, time.Now())
				w := writeAt(t, writes, o.lease.Token())
				if d := w.created.Sub(last.created); d < T-5*time.Millisecond {
					t.Errorf("the waiter took the key %v after the holder's last write, before T = %v", ms(d), T)
				}
			}
			_ = o.lease.Release(context.Background())
			v.check(t)
			g.check(t)
		})
	}
}

// TestPausedServerNeverExtendsValidity: change B's claim is that a write
// cannot be stored before it was sent. With the server paused (SIGSTOP of
// nats-server), writes are sent and neither stored nor answered until it
// resumes; the server then stamps them at once, late. A holder (R = 100ms, F
// = 3, C = 1, margin 50ms) and a waiter (R = 50ms, C = 0, waiting in Lock)
// both connect with ConnectOptions to the server, which is paused 20ms after
// a renewal is stored for 150ms, 230ms (a renewal sent just before the
// holder's deadline is answered just after it), 400ms and 1.2s (past T).
// Every deadline the holder's lease shows must lie within T − margin (+2ms)
// of the stamp of its latest write stored then; no lease live past its
// deadline; the waiter granted only once the holder's lease has ended, its
// takeover write T after the holder's last one; and the waiter must get the
// key within T + 1.5s of the holder's last write once the holder stops
// renewing (its lease ended, or released 1s after the resume).
func TestPausedServerNeverExtendsValidity(t *testing.T) {
	const (
		T      = testF * testR
		margin = testR / 2
	)
	checkLeaks(t)
	srv := startPausable(t)
	for i, pause := range []time.Duration{150 * time.Millisecond, 230 * time.Millisecond, 400 * time.Millisecond, 1200 * time.Millisecond} {
		t.Run(fmt.Sprintf("pause%v", pause), func(t *testing.T) {
			bucket, key := uniqueBucket("p"), fmt.Sprintf("job%d", i)
			prepareBucket(t, srv.url, bucket, natsputex.WithStorage(jetstream.MemoryStorage))
			writes := watchWrites(t, srv.url, bucket, key)
			dial := func() (*nats.Conn, jetstream.JetStream) {
				nc, js, err := connect(srv.url, natsputex.ConnectOptions()...)
				if err != nil {
					t.Fatal(err)
				}
				return nc, js
			}
			hnc, hjs := dial()
			holder := newClientOn(t, hnc, hjs, bucket, natsputex.WithHolderID("holder"))
			wnc, wjs := dial()
			waiter := newClientOn(t, wnc, wjs, bucket, natsputex.WithRenewInterval(testR/2), natsputex.WithConfirmations(0), natsputex.WithHolderID("waiter"))
			lease, token, v, g, ds := holdWatched(t, holder, writes, key)
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			waiting := goLock(ctx, waiter.Locker(), key, false)
			time.Sleep(3 * testR)
			paused := afterRenewal(t, writes, token, 20*time.Millisecond, func() {
				if err := srv.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
					t.Error(err)
				}
			})
			time.Sleep(time.Until(paused.Add(pause)))
			if err := srv.cmd.Process.Signal(syscall.SIGCONT); err != nil {
				t.Fatal(err)
			}
			resumed := time.Now()
			time.Sleep(time.Second)
			live := lease.Context().Err() == nil
			if live {
				_ = lease.Release(context.Background())
			}
			o := waitOutcome(t, waiting, 8*time.Second, "the waiter's Lock")
			last, _ := writes.lastBy(token, time.Now())
			most := ds.check(t, writes, token, T-margin)
			t.Logf("paused %v (resumed %v after the pause); the holder's last write rev %d stored %v after the resume; lease live 1s after the resume: %v (%v); deadlines at most %v after the stored write; the waiter returned %v after the holder's last write: lease %v, err %v",
				pause, ms(resumed.Sub(paused)), last.rev, ms(last.created.Sub(resumed)), live, context.Cause(lease.Context()), ms(most), ms(o.at.Sub(last.created)), o.lease != nil, o.err)
			if o.err != nil {
				t.Fatalf("the waiter's Lock: %v", o.err)
			}
			g.grant("waiter", o.lease)
			v.add("waiter", o.lease)
			w := writeAt(t, writes, o.lease.Token())
			if !live {
				if d := w.created.Sub(last.created); d < T-5*time.Millisecond {
					t.Errorf("the waiter took the key %v after the holder's last write, before T = %v", ms(d), T)
				}
				if d := o.at.Sub(last.created); d > T+1500*time.Millisecond {
					t.Errorf("the waiter got the key %v after the holder's last write, not within T + 1.5s", ms(d))
				}
			}
			_ = o.lease.Release(context.Background())
			v.check(t)
			g.check(t)
		})
	}
}

// TestSlowLinkHolderEndsBeforeTakeover: a live holder whose link to NATS
// gets slower (a proxy adding 0 to 250ms each way, or delaying only its
// answers by 100 to 400ms) while a TryLock loop with the same options, on a
// direct link, tries the name every 5ms: whenever the server's clock shows
// the key silent for T the holder's lease must already have ended (its
// validity counts from the start of its last successful write).
func TestSlowLinkHolderEndsBeforeTakeover(t *testing.T) {
	url, bucket := promiseEnv(t, "slowlink")
	proxy := testenv.NewProxy(t, strings.TrimPrefix(url, "nats://"))
	holder := newTestClient(t, "nats://"+proxy.Addr(), bucket, natsputex.WithHolderID("holder"))
	trier := newTestClient(t, url, bucket, natsputex.WithHolderID("trier"))
	g := newGrants()
	ctx, cancel := context.WithTimeout(context.Background(), 40*time.Second)
	defer cancel()
	faults := []func(){
		func() { proxy.Latency(60 * time.Millisecond) },
		func() { proxy.Latency(120 * time.Millisecond) },
		func() { proxy.Latency(160 * time.Millisecond) },
		func() { proxy.Latency(250 * time.Millisecond) },
		func() { proxy.DelayReplies(100 * time.Millisecond) },
		func() { proxy.DelayReplies(230 * time.Millisecond) },
		func() { proxy.DelayReplies(400 * time.Millisecond) },
	}
	for i, fault := range faults {
		proxy.Restore()
		var held locks.Lease
		waitFor(t, 5*time.Second, "the holder takes the name", func() bool {
			l, err := holder.Locker().TryLock(ctx, "job")
			if err == nil {
				held = l
			}
			return err == nil
		})
		g.grant("holder", held)
		fault()
		end := time.Now().Add(time.Second)
		for time.Now().Before(end) {
			l, err := trier.Locker().TryLock(ctx, "job")
			if err == nil {
				g.grant("trier", l)
				_ = l.Release(ctx)
				break
			}
			time.Sleep(5 * time.Millisecond)
		}
		t.Logf("fault %d: holder's lease: %v", i, context.Cause(held.Context()))
		proxy.Restore()
		_ = held.Release(ctx)
	}
	g.check(t)
}

// TestCutOffHolderStopsBeforeT: with F = 1 (T = R) and no confirmation, a
// holder cut off from NATS ends its lease before a waiter, taking over
// after T of silence, gets the key; and a lease is never valid for T or
// more ahead.
func TestCutOffHolderStopsBeforeT(t *testing.T) {
	const R = 200 * time.Millisecond
	opts := []natsputex.Option{natsputex.WithRenewInterval(R), natsputex.WithFailureThreshold(1), natsputex.WithConfirmations(0)}
	url := natsenv.StartServer(t).URL()
	bucket := uniqueBucket("cutoff")
	prepareBucket(t, url, bucket)
	proxy := testenv.NewProxy(t, strings.TrimPrefix(url, "nats://"))
	holder := newTestClient(t, "nats://"+proxy.Addr(), bucket, opts...)
	waiter := newTestClient(t, url, bucket, opts...).Locker()
	T := holder.TTL()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	lease, err := holder.Locker().TryLock(ctx, "job")
	if err != nil {
		t.Fatal(err)
	}
	dl, ok := lease.(interface{ Deadline() time.Time })
	if !ok {
		t.Fatalf("%T has no Deadline method", lease)
	}
	if ahead := time.Until(dl.Deadline()); ahead >= T {
		t.Errorf("a new lease is valid for %v, want < T = %v", ahead, T)
	}
	got := lockBehind(ctx, waiter, "job", lease)
	for range 4 { // renewals
		time.Sleep(R / 2)
		if ahead := time.Until(dl.Deadline()); lease.Context().Err() == nil && ahead >= T {
			t.Errorf("a renewed lease is valid for %v, want < T = %v", ahead, T)
		}
	}
	if lease.Context().Err() != nil {
		t.Fatalf("the holder lost its lease before it was cut off: %v", context.Cause(lease.Context()))
	}
	proxy.BlackHole()
	g := mustGrant(t, got)
	if g.otherLive {
		t.Fatal("double grant: the waiter took the key over while the cut-off holder's lease was live")
	}
	if cause := context.Cause(lease.Context()); !errors.Is(cause, locks.ErrLost) {
		t.Errorf("the holder's lease ended with %v, want ErrLost", cause)
	}
	proxy.Restore()
}

// TestLossNoticedWithinR: a holder whose key is deleted behind its back
// learns it at its next renewal: its lease ends with ErrLost within R
// (plus one write's time).
func TestLossNoticedWithinR(t *testing.T) {
	url, bucket := promiseEnv(t, "loss")
	holder := newTestClient(t, url, bucket).Locker()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	lease, err := holder.TryLock(ctx, "job")
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(2 * testR)
	kv := mustBucket(t, url, bucket)
	if err := kv.Delete(ctx, "job"); err != nil {
		t.Fatal(err)
	}
	deleted := time.Now()
	const slack = 150 * time.Millisecond // one write, and a loaded machine
	select {
	case <-lease.Context().Done():
	case <-time.After(testR + slack + time.Second):
		t.Fatalf("the lease is still live %v after its key was deleted", time.Since(deleted).Round(time.Millisecond))
	}
	took := time.Since(deleted)
	t.Logf("the holder saw its loss %v after the delete (R = %v)", took.Round(time.Millisecond), testR)
	if took > testR+slack {
		t.Errorf("the holder saw its loss %v after the delete, want within R = %v (+%v)", took.Round(time.Millisecond), testR, slack)
	}
	if cause := context.Cause(lease.Context()); !errors.Is(cause, locks.ErrLost) {
		t.Errorf("the lease ended with %v, want ErrLost", cause)
	}
}

// TestShortValidityRenewsOften: a holder renews every R, unless its
// validity T − margin is shorter than 2R; it then renews every
// (T − margin)/2, so that one late renewal does not end the lease
// (F = 1, R = 200ms: T − margin = 100ms, a renewal every 50ms, not every
// R). With F = 10 (T − margin = 950ms) it renews every R = 100ms, not
// every (T − margin)/2. The writes are counted by a watch on the bucket
// for one second.
func TestShortValidityRenewsOften(t *testing.T) {
	url, bucket := promiseEnv(t, "cadence")
	kv := mustBucket(t, url, bucket)
	for _, tc := range []struct {
		what     string
		opts     []natsputex.Option
		interval time.Duration
	}{
		{"F=10 R=100ms: every R", []natsputex.Option{natsputex.WithRenewInterval(100 * time.Millisecond), natsputex.WithFailureThreshold(10)}, 100 * time.Millisecond},
		{"F=1 R=200ms: every (T-margin)/2", []natsputex.Option{natsputex.WithRenewInterval(200 * time.Millisecond), natsputex.WithFailureThreshold(1)}, 50 * time.Millisecond},
	} {
		t.Run(tc.what, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			name := "cadence-" + strconv.Itoa(int(tc.interval/time.Millisecond))
			lease, err := newTestClient(t, url, bucket, tc.opts...).Locker().TryLock(ctx, name)
			if err != nil {
				t.Fatal(err)
			}
			defer func() { _ = lease.Release(ctx) }()
			w, err := kv.Watch(ctx, name, jetstream.UpdatesOnly())
			if err != nil {
				t.Fatal(err)
			}
			defer func() { _ = w.Stop() }()
			const window = time.Second
			end := time.After(window)
			writes := 0
		count:
			for {
				select {
				case e := <-w.Updates():
					if e != nil {
						writes++
					}
				case <-end:
					break count
				}
			}
			if err := context.Cause(lease.Context()); err != nil {
				t.Fatalf("the lease ended while it was renewed: %v", err)
			}
			want := int(window / tc.interval)
			t.Logf("%d renewals in %v (one every %v would be %d)", writes, window, tc.interval, want)
			if writes < want*6/10 || writes > want*14/10 {
				t.Errorf("%d renewals in %v, want about %d (one every %v)", writes, window, want, tc.interval)
			}
		})
	}
}
