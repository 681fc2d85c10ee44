package natsputex_test

// Takeover: a key silent for T = F·R is taken over, and the new holder
// confirms for C·R (C intervals) before the lease is handed out or the
// service started.

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/latchkey-go/latchkey/contracttest"
	"github.com/latchkey-go/latchkey/contracttest/testenv"
	"github.com/latchkey-go/latchkey/contracttest/testenv/natsenv"
	"github.com/latchkey-go/latchkey/locks/driver"
	"github.com/latchkey-go/latchkey/natsputex"
)

// TestConfirmerThatGivesUpLeavesItsLastWrite: "A Supervisor cut off from
// NATS begins Service.Stop at that same moment; a standby starts its service
// no earlier than T + C·R after that write, so Stop has margin + C·R to
// finish before the two could overlap." All agents share R = 200ms, F = 3, C
// = 3 (T = 600ms, C·R = 600ms, margin 100ms: Stop has 700ms). node-a's link
// is black-holed; its Stop takes 550ms. node-b or node-c takes the key over
// after T and confirms; while it confirms it gives up — it is shut down
// (Run's context ends: "blanks the key if it still holds the agent's last
// write (so another agent takes over at once") or its health check fails —
// and the other standby finds the key blank, "free", and starts at once. It
// must not start before node-a's Stop has returned. (Failed before the fix,
// shutdown case, 4 runs of 4: the other standby started 805–807ms after
// node-a's last write, ~245ms before node-a's Stop returned; the
// health-check case held.)
func TestConfirmerThatGivesUpLeavesItsLastWrite(t *testing.T) {
	for _, how := range []string{"shutdown", "healthcheck"} {
		t.Run(how, func(t *testing.T) {
			url, bucket, key := supervisorEnv(t)
			writes := watchWrites(t, url, bucket, key)
			proxy := testenv.NewProxy(t, strings.TrimPrefix(url, "nats://"))
			h := contracttest.NewHistory(1)
			timing := []natsputex.Option{natsputex.WithRenewInterval(200 * time.Millisecond), natsputex.WithFailureThreshold(3), natsputex.WithConfirmations(3)}
			a := startAgent(t, "nats://"+proxy.Addr(), bucket, key, "node-a", h, withFaults(func(a *agent) { a.stopDelay.Store(int64(550 * time.Millisecond)) }), withClientOptions(timing...))
			waitFor(t, 5*time.Second, "node-a starts its service", a.running)
			b := startAgent(t, url, bucket, key, "node-b", h, withClientOptions(timing...))
			c := startAgent(t, url, bucket, key, "node-c", h, withClientOptions(timing...))
			time.Sleep(500 * time.Millisecond)
			proxy.BlackHole()
			confirming := func(ag *agent) bool {
				return ag.sawEvent(func(e natsputex.Event) bool { return e.Phase == natsputex.PhaseConfirming })
			}
			var taker, other *agent
			waitFor(t, 5*time.Second, "a standby takes the key over", func() bool {
				switch {
				case confirming(b):
					taker, other = b, c
				case confirming(c):
					taker, other = c, b
				}
				return taker != nil
			})
			gaveUp := time.Now()
			if how == "shutdown" {
				taker.stop()
			} else {
				taker.failHC.Store(true)
			}
			waitFor(t, 5*time.Second, "the other standby starts", other.running)
			time.Sleep(300 * time.Millisecond)
			proxy.Restore()
			for _, ag := range []*agent{a, b, c} {
				ag.stop()
			}
			a.mu.Lock()
			aStopped := a.stopped
			a.mu.Unlock()
			last, _ := writes.lastBy("node-a", time.Now())
			t.Logf("node-a's last write at %v; %s gave up confirming (%s) at %v; %s started at %v; node-a's service stopped at %v",
				last.created.Format("15:04:05.000"), taker.name, how, gaveUp.Format("15:04:05.000"), other.name,
				other.lastStart().Format("15:04:05.000"), aStopped)
			if s := other.lastStart(); !s.IsZero() && s.Sub(last.created) < 1200*time.Millisecond {
				t.Errorf("%s started %v after node-a's last write, before T + C·R = 1.2s", other.name, s.Sub(last.created).Round(time.Millisecond))
			}
			if err := h.Check(); err != nil {
				t.Errorf("two services ran at once: %v", err)
			}
		})
	}
}

// TestConfirmerCrashKeepsCutOffHoldersBound: the bounds "Supervisors on one
// key with different R, F or C (a rolling change) ... keep": "a standby
// starts its service no earlier than T + C·R after that write, so Stop has
// margin + C·R to finish". node-a (R = 200ms, F = 3, C = 3: T = 600ms, C·R =
// 600ms, margin 100ms, so Stop has 700ms) is cut off; its Stop takes 550ms.
// node-b and node-c run a new timing (R = 50ms, F = 2, C = 1: T = 100ms, C·R
// = 50ms). The first to take node-a's key over waits node-a's T and must
// confirm for node-a's 600ms, but it crashes (kill) while it confirms; the
// other then waits the crashed agent's T (100ms) and confirms for the longer
// of the two agents' C·R (50ms). Neither may start before node-a's T + C·R =
// 1.2s after its last write. (Failed before the fix, 3 runs of 3: the
// survivor started 781–785ms after node-a's last write, "confirming for
// 50ms", ~265ms before node-a's Stop returned.)
func TestConfirmerCrashKeepsCutOffHoldersBound(t *testing.T) {
	url, bucket, key := supervisorEnv(t)
	writes := watchWrites(t, url, bucket, key)
	proxy := testenv.NewProxy(t, strings.TrimPrefix(url, "nats://"))
	h := contracttest.NewHistory(1)
	a := startAgent(t, "nats://"+proxy.Addr(), bucket, key, "node-a", h, withFaults(func(a *agent) { a.stopDelay.Store(int64(550 * time.Millisecond)) }), withClientOptions(natsputex.WithRenewInterval(200*time.Millisecond), natsputex.WithFailureThreshold(3), natsputex.WithConfirmations(3)))
	waitFor(t, 5*time.Second, "node-a starts its service", a.running)
	fast := []natsputex.Option{natsputex.WithRenewInterval(50 * time.Millisecond), natsputex.WithFailureThreshold(2), natsputex.WithConfirmations(1)}
	b := startAgent(t, url, bucket, key, "node-b", h, withClientOptions(fast...))
	c := startAgent(t, url, bucket, key, "node-c", h, withClientOptions(fast...))
	time.Sleep(500 * time.Millisecond)
	proxy.BlackHole()
	confirming := func(ag *agent) bool {
		return ag.sawEvent(func(e natsputex.Event) bool { return e.Phase == natsputex.PhaseConfirming })
	}
	var taker, other *agent
	waitFor(t, 5*time.Second, "a standby takes the key over", func() bool {
		switch {
		case confirming(b):
			taker, other = b, c
		case confirming(c):
			taker, other = c, b
		}
		return taker != nil
	})
	taker.kill()
	waitFor(t, 5*time.Second, "the other standby starts", other.running)
	time.Sleep(300 * time.Millisecond)
	proxy.Restore()
	a.stop()
	other.stop()
	last, _ := writes.lastBy("node-a", time.Now())
	a.mu.Lock()
	aStopped := a.stopped
	a.mu.Unlock()
	t.Logf("node-a's last write at %v; %s crashed while confirming; %s started at %v (%v after node-a's last write); node-a's service stopped at %v",
		last.created.Format("15:04:05.000"), taker.name, other.name, other.lastStart().Format("15:04:05.000"),
		other.lastStart().Sub(last.created).Round(time.Millisecond), aStopped)
	if s := other.lastStart(); !s.IsZero() && s.Sub(last.created) < 1200*time.Millisecond {
		t.Errorf("%s started %v after node-a's last write, before node-a's T + C·R = 1.2s", other.name, s.Sub(last.created).Round(time.Millisecond))
	}
	if err := h.Check(); err != nil {
		t.Errorf("two services ran at once: %v", err)
	}
}

// TestLockCancelledWhileConfirmingSparesCutOffSupervisor:
// TestConfirmerThatGivesUpLeavesItsLastWrite with a Locker in the middle.
// node-a, a Supervisor (R = 200ms, F = 3, C = 3: T + C·R = 1.2s, Stop has
// margin + C·R = 700ms) is cut off, its Stop takes 550ms; a Locker's Lock
// (same timing) takes the key over after T and "confirms for the longer of
// its own C·R and the holder's", but its context ends while it confirms ("On
// failure Lock returns an error and holds nothing"). node-b, a standby
// Supervisor with node-a's timing, must not start before node-a's T + C·R
// after node-a's last write. (Failed before the fix, 3 runs of 3: node-b
// started 816–822ms after node-a's last write, ~230ms before node-a's Stop
// returned.)
func TestLockCancelledWhileConfirmingSparesCutOffSupervisor(t *testing.T) {
	url, bucket, key := supervisorEnv(t)
	writes := watchWrites(t, url, bucket, key)
	proxy := testenv.NewProxy(t, strings.TrimPrefix(url, "nats://"))
	h := contracttest.NewHistory(1)
	timing := []natsputex.Option{natsputex.WithRenewInterval(200 * time.Millisecond), natsputex.WithFailureThreshold(3), natsputex.WithConfirmations(3)}
	a := startAgent(t, "nats://"+proxy.Addr(), bucket, key, "node-a", h, withFaults(func(a *agent) { a.stopDelay.Store(int64(550 * time.Millisecond)) }), withClientOptions(timing...))
	waitFor(t, 5*time.Second, "node-a starts its service", a.running)
	locker := newTestClient(t, url, bucket, append(timing, natsputex.WithHolderID("locker"))...)
	time.Sleep(300 * time.Millisecond)
	proxy.BlackHole()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	lockErr := make(chan error, 1)
	go func() {
		l, err := locker.Locker().Lock(ctx, key)
		if err == nil {
			_ = l.Release(context.Background())
		}
		lockErr <- err
	}()
	var taken time.Time
	waitFor(t, 5*time.Second, "the Locker takes the key over", func() bool {
		writes.mu.Lock()
		defer writes.mu.Unlock()
		for _, w := range writes.writes {
			if strings.HasPrefix(w.value, "locker/") {
				taken = w.created
				return true
			}
		}
		return false
	})
	b := startAgent(t, url, bucket, key, "node-b", h, withClientOptions(timing...))
	time.Sleep(50 * time.Millisecond)
	cancel()
	t.Logf("Lock returned: %v", <-lockErr)
	waitFor(t, 5*time.Second, "node-b starts", b.running)
	time.Sleep(300 * time.Millisecond)
	proxy.Restore()
	a.stop()
	b.stop()
	last, _ := writes.lastBy("node-a", time.Now())
	t.Logf("node-a's last write at %v; the Locker's takeover at %v; node-b started at %v (%v after node-a's last write)",
		last.created.Format("15:04:05.000"), taken.Format("15:04:05.000"), b.lastStart().Format("15:04:05.000"),
		b.lastStart().Sub(last.created).Round(time.Millisecond))
	if s := b.lastStart(); !s.IsZero() && s.Sub(last.created) < 1200*time.Millisecond {
		t.Errorf("node-b started %v after node-a's last write, before T + C·R = 1.2s", s.Sub(last.created).Round(time.Millisecond))
	}
	if err := h.Check(); err != nil {
		t.Errorf("two services ran at once: %v", err)
	}
}

// TestLostConfirmationAnswerGrantsNoOverlap: a holder crashes; a taker (R =
// 100ms, F = 3, C = 4) on a proxy takes its key over, and the answer of one
// of its confirmation writes (the first, or the third) is lost: the write
// lands, its answer is dropped for 300ms and the connection is then closed.
// A second client (C = 1) waits in Lock meanwhile. The confirmation, counted
// by time with "every write in between succeeding", must not hand out a
// lease across the lost answer: no grant while another lease is live, tokens
// rising, and the taker's lease (if it got one) handed out at least C·R
// after the start of a run of writes it saw succeed.
func TestLostConfirmationAnswerGrantsNoOverlap(t *testing.T) {
	for _, k := range []int{0, 2} {
		t.Run(fmt.Sprintf("write%d", k+1), func(t *testing.T) {
			const C, R = 4, 100 * time.Millisecond
			url, bucket := promiseEnv(t, "lostconf")
			writes := watchWrites(t, url, bucket, "job")
			nc, js, err := connect(url)
			if err != nil {
				t.Fatal(err)
			}
			crashed := newClientOn(t, nc, js, bucket, natsputex.WithHolderID("crashed"))
			g := newGrants()
			held, err := crashed.Locker().TryLock(context.Background(), "job")
			if err != nil {
				t.Fatal(err)
			}
			g.grant("crashed", held)
			proxyURL, lose := loseAnswer(t, url, bucket, "job", testenv.LoseReplies(300*time.Millisecond))
			taker := newTestClient(t, proxyURL, bucket, natsputex.WithHolderID("taker"),
				natsputex.WithRenewInterval(R), natsputex.WithConfirmations(C))
			other := newTestClient(t, url, bucket, natsputex.WithHolderID("other"))
			var tookAt atomic.Int64
			defer taker.Locker().Observe(func(e driver.Event) {
				if e.Kind == driver.EventTakeover && tookAt.Load() == 0 {
					tookAt.Store(time.Now().UnixNano())
					time.AfterFunc(time.Duration(k)*R+R/2, lose.Arm)
				}
			})()
			ctx, cancel := context.WithTimeout(context.Background(), 12*time.Second)
			defer cancel()
			var wg sync.WaitGroup
			var mu sync.Mutex
			var takerGrant, otherGrant time.Time
			var takerFree bool // the taker took a blank key: no confirmation
			lockLoop := func(c struct {
				who string
				cl  *natsputex.Client
			}) {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for ctx.Err() == nil {
						l, err := c.cl.Locker().Lock(ctx, "job")
						if err != nil {
							time.Sleep(10 * time.Millisecond)
							continue
						}
						g.grant(c.who, l)
						if c.who == "other" {
							mu.Lock()
							otherGrant = time.Now()
							mu.Unlock()
						}
						if c.who == "taker" {
							grantAt := time.Now()
							// The test's watch may lag the taker's own (seen
							// in a CI run under -race: the blank before a
							// free take was not in yet): wait for the grant.
							seen := func() bool {
								writes.mu.Lock()
								defer writes.mu.Unlock()
								return len(writes.writes) > 0 && writes.writes[len(writes.writes)-1].rev >= l.Token()
							}
							for end := time.Now().Add(2 * time.Second); !seen() && time.Now().Before(end); {
								time.Sleep(5 * time.Millisecond)
							}
							mu.Lock()
							takerGrant = grantAt
							writes.mu.Lock()
							for _, w := range writes.writes {
								if w.rev < l.Token() {
									takerFree = w.value == "" // the last write before the taker's
								}
							}
							writes.mu.Unlock()
							mu.Unlock()
						}
						time.Sleep(300 * time.Millisecond)
						_ = l.Release(context.Background())
						return
					}
				}()
			}
			type locker = struct {
				who string
				cl  *natsputex.Client
			}
			lockLoop(locker{"taker", taker})
			time.Sleep(100 * time.Millisecond)
			nc.Close() // the crash
			select {
			case at := <-lose.Fired():
				t.Logf("answer dropped for the write sent %v after the takeover", at.Sub(time.Unix(0, tookAt.Load())).Round(time.Millisecond))
			case <-time.After(5 * time.Second):
				t.Fatal("the trigger never fired")
			}
			lockLoop(locker{"other", other})
			wg.Wait()
			g.check(t)
			mu.Lock()
			defer mu.Unlock()
			// The other client took the key from a confirming taker: it must
			// have waited T and the taker's longer C·R after the taker's last
			// write (the lost one included).
			if !otherGrant.IsZero() && (takerGrant.IsZero() || otherGrant.Before(takerGrant)) {
				last, _ := writes.lastBy("", time.Time{})
				writes.mu.Lock()
				for _, w := range writes.writes {
					if strings.HasPrefix(w.value, "taker") && w.created.Before(otherGrant) {
						last = w
					}
				}
				writes.mu.Unlock()
				gap := otherGrant.Sub(last.created)
				t.Logf("the other client's lease %v after the taker's last write (rev %d)", gap.Round(time.Millisecond), last.rev)
				if gap < 3*testR+C*R-10*time.Millisecond {
					t.Errorf("the other client's lease came %v after the confirming taker's last write, under T + its C·R = %v", gap.Round(time.Millisecond), 3*testR+C*R)
				}
			}
			if takerGrant.IsZero() || takerFree {
				t.Logf("the taker got no lease over a held key (granted: %t)", !takerGrant.IsZero())
				return
			}
			// The last run of the taker's writes, one R or so apart, before
			// its grant: the grant must come C·R after its first write.
			writes.mu.Lock()
			var runStart, prev time.Time
			for _, w := range writes.writes {
				if w.created.After(takerGrant) {
					break
				}
				if !strings.HasPrefix(w.value, "taker") {
					runStart, prev = time.Time{}, time.Time{}
					continue
				}
				if runStart.IsZero() || w.created.Sub(prev) > 2*R {
					runStart = w.created
				}
				prev = w.created
			}
			writes.mu.Unlock()
			t.Logf("the taker's lease %v after the start of its last run of writes", takerGrant.Sub(runStart).Round(time.Millisecond))
			if takerGrant.Sub(runStart) < C*R-10*time.Millisecond {
				t.Errorf("the taker's lease came %v after its run of writes began, under C·R = %v", takerGrant.Sub(runStart).Round(time.Millisecond), C*R)
			}
		})
	}
}

// TestLateStandbyMeasuresSilenceByServerClock: the server-clock rule. "A
// call measures that silence from the key's last write, as the stream
// leader's clock stamped it, to the time the same server stamps on a write
// of its own made when the call first reads that revision ... so a TryLock,
// or a process started after the holder crashed, takes a key silent for T at
// once"; "A dead holder's key is taken over after about T + C·R of silence
// ... plus up to one interval of alignment". node-a (R = 100ms, F = 3, C =
// 2: T = 300ms, C·R = 200ms) is active when its link is black-holed; node-b
// (same timing, direct link) is made and started only d after node-a's last
// write. node-b must start no sooner than T + C·R after that write (by the
// server's timestamps), and take the key (its first write) within max(d, T)
// + R + 250ms of it: at once when d >= T. The services never overlap (node-a
// stops by itself at T − margin).
func TestLateStandbyMeasuresSilenceByServerClock(t *testing.T) {
	const (
		C     = 2
		T     = testF * testR
		slack = 250 * time.Millisecond
	)
	for _, d := range []time.Duration{T / 2, T, 3 * T} {
		t.Run(fmt.Sprintf("after-%v", d), func(t *testing.T) {
			url, bucket, key := localEnv(t)
			writes := watchWrites(t, url, bucket, key)
			proxy := testenv.NewProxy(t, strings.TrimPrefix(url, "nats://"))
			h := contracttest.NewHistory(1)
			opts := []natsputex.Option{natsputex.WithConfirmations(C)}
			a := startNode(t, "nats://"+proxy.Addr(), bucket, key, "node-a", h, withClientOptions(opts...))
			waitFor(t, 5*time.Second, "node-a starts its service", a.running)
			time.Sleep(3 * testR)
			cut := cutAfterRenewal(t, writes, "node-a", proxy.BlackHole)
			last, _ := writes.lastBy("node-a", cut)
			b := startNode(t, url, bucket, key, "node-b", h, notRunning(), withClientOptions(opts...))
			time.Sleep(time.Until(last.created.Add(d)))
			began := time.Now()
			b.run(b.ctx)
			waitFor(t, 5*time.Second, "node-b starts its service", b.running)
			bStart := b.getStarts()[0].begin
			last, _ = writes.lastBy("node-a", bStart)
			took, _ := writes.firstBy("node-b")
			t.Logf("node-b ran %v after node-a's last write (rev %d); it took the key %v after that write (%v after Run began) and started %v after it (T + C·R = %v)",
				began.Sub(last.created).Round(time.Millisecond), last.rev, took.created.Sub(last.created).Round(time.Millisecond),
				took.created.Sub(began).Round(time.Millisecond), bStart.Sub(last.created).Round(time.Millisecond), T+C*testR)
			if dd := bStart.Sub(last.created); dd < T+C*testR {
				t.Errorf("node-b started %v after node-a's last write, before T + C·R = %v", dd.Round(time.Millisecond), T+C*testR)
			}
			if dd := took.created.Sub(last.created); dd < T {
				t.Errorf("node-b took the key %v after node-a's last write, before T = %v", dd.Round(time.Millisecond), T)
			}
			if dd := took.created.Sub(last.created); dd > max(d, T)+testR+slack {
				t.Errorf("node-b, started %v after node-a's last write, took the key %v after it: later than max(d, T) + R (+%v) = %v",
					d, dd.Round(time.Millisecond), slack, max(d, T)+testR+slack)
			}
			proxy.Restore()
			time.Sleep(3 * testR)
			b.cancel()
			a.cancel()
			a.wait(5 * time.Second)
			b.wait(5 * time.Second)
			if err := h.Check(); err != nil {
				writes.logAll(t, last.created)
				t.Errorf("services overlapped: %v", err)
			}
		})
	}
}

// TestConfirmationCountsFromTakeoverAnswer: C: "after a takeover, the new
// holder rewrites its token for C intervals, counted from the answer to its
// takeover write (which may land well after it was begun, when it waited for
// a reconnect), before the lease is handed to the caller (or the Supervisor
// starts the service)"; a standby "confirms for the longer C·R of its own
// and the holder's". So a Start, or a Lock returning a key taken over, must
// come at least C·R after the takeover write was stored (the server's
// stamp), and at least the reply's delay more when the answer was held back.
// node-a (direct link, R = 100ms, F = 3) is active, node-b (C = 2 unless
// said) stands by behind a proxy; node-a is killed right after a renewal and
// node-b takes over:
//   - latency: 60ms each way on node-b's link (the write lands 60ms after
//     it began, its answer 60ms after that): Start ≥ write + 60ms + C·R.
//   - slow-replies: node-b's answers held 150ms (the write lands at once):
//     Start ≥ write + 150ms + C·R.
//   - mixed-C: node-a has C = 5 (C·R = 500ms, in its value), node-b C = 1,
//     60ms each way: Start ≥ write + 60ms + 500ms, and node-b's writes
//     while it confirms carry C·R=500ms (but for the last, "until its last
//     confirmation": those stored from C·R − R after the takeover write).
//   - locker: node-a has C = 5; a Locker (C = 0) behind the proxy (60ms
//     each way) waits in Lock for the key: Lock must return ≥ its write +
//     60ms + 500ms; its driver.EventConfirmation's Duration ("the time
//     since the takeover write was answered, from which the confirmation
//     counts", package doc) must be at least C·R, and no more than the
//     time since the write was stored (+20ms) when the event is told (the
//     answer comes after the write is stored, and 60ms later here).
//
// Every takeover comes T after node-a's last write; the services never
// overlap.
func TestConfirmationCountsFromTakeoverAnswer(t *testing.T) {
	const T = testF * testR
	for _, tc := range []struct {
		name           string
		aC, bC         int
		latency, reply time.Duration
		locker         bool
	}{
		{"latency", 2, 2, 60 * time.Millisecond, 0, false},
		{"slow-replies", 2, 2, 0, 150 * time.Millisecond, false},
		{"mixed-C", 5, 1, 60 * time.Millisecond, 0, false},
		{"locker", 5, 0, 60 * time.Millisecond, 0, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			url, bucket, key := localEnv(t)
			writes := watchWrites(t, url, bucket, key)
			raw := watchRaw(t, url, bucket, key)
			proxy := testenv.NewProxy(t, strings.TrimPrefix(url, "nats://"))
			h := contracttest.NewHistory(1)
			a := startNode(t, url, bucket, key, "node-a", h, onConnectOptions(), withClientOptions(natsputex.WithConfirmations(tc.aC)))
			waitFor(t, 5*time.Second, "node-a starts its service", a.running)
			CR := time.Duration(max(tc.aC, tc.bC)) * testR
			delay := tc.latency + tc.reply
			var b *node
			var got <-chan outcome
			var confirmations []driver.Event
			var eventAt []time.Time
			var mu sync.Mutex
			if tc.locker {
				l := dialLink(t, url)
				c := l.client(t, bucket, natsputex.WithConfirmations(tc.bC), natsputex.WithHolderID("locker"))
				stop := c.Locker().Observe(func(e driver.Event) {
					if e.Kind == driver.EventConfirmation || e.Kind == driver.EventTakeover {
						mu.Lock()
						confirmations = append(confirmations, e)
						eventAt = append(eventAt, time.Now())
						mu.Unlock()
					}
				})
				defer stop()
				l.proxy.Latency(tc.latency)
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				defer cancel()
				got = goLock(ctx, c.Locker(), key, false)
				time.Sleep(3 * testR)
				// The proxy of dialLink is l.proxy; node-b is not used.
			} else {
				b = startNode(t, "nats://"+proxy.Addr(), bucket, key, "node-b", h, onConnectOptions(), withClientOptions(natsputex.WithConfirmations(tc.bC)))
				waitFor(t, 5*time.Second, "node-b is standby", func() bool {
					return b.sawEvent(func(e natsputex.Event) bool { return e.Holder == "node-a" })
				})
				if tc.latency > 0 {
					proxy.Latency(tc.latency)
				} else {
					proxy.DelayReplies(tc.reply)
				}
				time.Sleep(3 * testR)
			}
			afterRenewal(t, writes, "node-a", 0, a.kill)
			lastA, _ := writes.lastBy("node-a", time.Now())
			var done time.Time
			var took keyWrite
			if tc.locker {
				o := waitOutcome(t, got, 5*time.Second, "the Locker's Lock")
				if o.err != nil {
					t.Fatalf("the Locker's Lock: %v", o.err)
				}
				defer func() { _ = o.lease.Release(context.Background()) }()
				done, took = o.at, writeAt(t, writes, o.lease.Token())
				mu.Lock()
				for i, e := range confirmations {
					since := eventAt[i].Sub(took.created)
					t.Logf("Locker event %s token %d duration %v (told %v after the takeover write was stored)", e.Kind, e.Token, ms(e.Duration), ms(since))
					if e.Kind != driver.EventConfirmation {
						continue
					}
					if e.Duration > since+20*time.Millisecond {
						t.Errorf("EventConfirmation's Duration is %v, but it was told %v after the takeover write was stored: longer than since the write's answer", ms(e.Duration), ms(since))
					}
					if e.Duration < CR-10*time.Millisecond {
						t.Errorf("EventConfirmation's Duration is %v, under the C·R = %v it confirms for", ms(e.Duration), ms(CR))
					}
				}
				mu.Unlock()
			} else {
				waitFor(t, 5*time.Second, "node-b starts", b.running)
				st := b.getStarts()[0]
				done, took = st.begin, writeAt(t, writes, st.token)
				stopNodes(b)
				checkTakeovers(t, writes, b, T, CR)
			}
			t.Logf("%s: the takeover write rev %d %q stored %v after node-a's last write; handed over %v after it (C·R = %v, delay %v)",
				tc.name, took.rev, took.value, ms(took.created.Sub(lastA.created)), ms(done.Sub(took.created)), CR, delay)
			if d := took.created.Sub(lastA.created); d < T-10*time.Millisecond {
				t.Errorf("the key was taken %v after node-a's last write, before T = %v", ms(d), T)
			}
			if d := done.Sub(took.created); d < delay+CR-10*time.Millisecond {
				t.Errorf("handed over %v after the takeover write was stored, before its answer (held %v) + C·R (%v)", ms(d), delay, CR)
			}
			if tc.name == "mixed-C" {
				for _, w := range raw.all() {
					if w.token == "node-b" {
						t.Logf("  node-b rev %d T=%v C·R=%v stored %v before its Start", w.rev, w.T, w.CR, ms(done.Sub(w.created)))
					}
					if w.token == "node-b" && w.created.Before(took.created.Add(CR-testR)) && w.CR < CR {
						t.Errorf("node-b confirmed with C·R=%v in its value (rev %d), not node-a's longer %v", w.CR, w.rev, CR)
					}
				}
			}
			if err := h.Check(); err != nil {
				t.Errorf("services overlapped: %v", err)
			}
		})
	}
}

// faultAtTakeover starts node-a on url and node-b on bURL (ConnectOptions,
// C = 2), node-b's Standby health check calling fault (and waiting for its
// connection to reconnect) once a takeover of node-a's key is due; node-a
// is killed right after a renewal. It returns the nodes, node-a's last
// write and the time of the fault.
func faultAtTakeover(t *testing.T, url, bURL, bucket, key string, writes *keyWatch, h *contracttest.History, fault func()) (a, b *node, lastA keyWrite, at time.Time) {
	t.Helper()
	const T = testF * testR
	opts := []natsputex.Option{natsputex.WithConfirmations(2)}
	a = startNode(t, url, bucket, key, "node-a", h, onConnectOptions(), withClientOptions(opts...))
	waitFor(t, 5*time.Second, "node-a starts its service", a.running)
	var armed atomic.Pointer[time.Time]
	var bn atomic.Pointer[node]
	hc, faults := faultHook(&armed, fault, func() bool { return bn.Load().nc.IsReconnecting() })
	b = startNode(t, bURL, bucket, key, "node-b", h, onConnectOptions(), withClientOptions(append(opts, natsputex.WithHealthCheck(hc))...))
	bn.Store(b)
	waitFor(t, 5*time.Second, "node-b is standby", func() bool {
		return b.sawEvent(func(e natsputex.Event) bool { return e.Holder == "node-a" })
	})
	time.Sleep(2 * testR)
	afterRenewal(t, writes, "node-a", 0, a.kill)
	lastA, _ = writes.lastBy("node-a", time.Now())
	from := lastA.created.Add(T - 30*time.Millisecond)
	armed.Store(&from)
	select {
	case at = <-faults:
	case <-time.After(5 * time.Second):
		t.Fatal("node-b ran no Standby check before its takeover")
	}
	return a, b, lastA, at
}

// TestLockConfirmsAcrossLostTakeoverAnswer: a waiting Lock, on a connection
// through a proxy, takes a crashed holder's key over; the answer to its
// takeover write (and only to it) is lost: the write lands, the proxy
// drops what comes back for dropFor and then closes the connection. A
// TryLock loop on a direct connection races it. No two leases are live at
// once, tokens rise, and whoever's write took the key over (the waiter's,
// or the trier's if it won the race) gets its lease no sooner than C·R
// after that write ("after a takeover, the new holder rewrites its token
// for C intervals before the lease is handed to the caller").
func TestLockConfirmsAcrossLostTakeoverAnswer(t *testing.T) {
	for _, dropFor := range []time.Duration{50 * time.Millisecond, 400 * time.Millisecond} {
		t.Run(dropFor.String(), func(t *testing.T) { lostTakeoverReplyLocker(t, dropFor) })
	}
}

func lostTakeoverReplyLocker(t *testing.T, dropFor time.Duration) {
	const C = 5
	url, bucket := promiseEnv(t, "lostreply")
	writes := watchWrites(t, url, bucket, "job")
	nc, js, err := connect(url)
	if err != nil {
		t.Fatal(err)
	}
	crashed, err := natsputex.New(context.Background(), js, bucket, natsputex.WithHolderID("crashed"),
		natsputex.WithRenewInterval(testR), natsputex.WithFailureThreshold(testF), natsputex.WithConfirmations(C))
	if err != nil {
		t.Fatal(err)
	}
	g := newGrants()
	held, err := crashed.Locker().TryLock(context.Background(), "job")
	if err != nil {
		t.Fatal(err)
	}
	g.grant("crashed", held)
	proxyURL, lose := loseAnswer(t, url, bucket, "job", testenv.LoseReplies(dropFor))
	waiter := newTestClient(t, proxyURL, bucket, natsputex.WithConfirmations(C), natsputex.WithHolderID("waiter"))
	trier := newTestClient(t, url, bucket, natsputex.WithConfirmations(C), natsputex.WithHolderID("trier"))
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	got := make(chan time.Time, 1)
	go func() {
		wl, err := waiter.Locker().Lock(ctx, "job")
		if err != nil {
			t.Errorf("waiter: %v", err)
			got <- time.Time{}
			return
		}
		g.grant("waiter", wl)
		got <- time.Now()
		time.Sleep(200 * time.Millisecond)
		_ = wl.Release(context.Background())
	}()
	time.Sleep(2 * testR)
	lose.Arm()
	nc.Close() // crash
	t.Cleanup(func() { _ = crashed.Close(context.Background()) })
	var fired time.Time
	select {
	case fired = <-lose.Fired():
	case <-time.After(3 * time.Second):
		t.Fatal("the waiter never wrote the key")
	}
	stopTry := time.Now().Add(2 * time.Second)
	for time.Now().Before(stopTry) {
		tl, err := trier.Locker().TryLock(ctx, "job")
		if err == nil {
			g.grant("trier", tl)
			time.Sleep(50 * time.Millisecond)
			_ = tl.Release(context.Background())
		}
		time.Sleep(10 * time.Millisecond)
	}
	select {
	case <-got:
	case <-time.After(10 * time.Second):
	}
	// The waiter's write may lose the race to the trier's: then its lost
	// answer is a refusal, and the trier's takeover is the one to confirm.
	// Either way, the client whose write took the crashed key gets its
	// lease no sooner than C·R after that write.
	_, took, ok := writes.takeover("crashed")
	if !ok {
		t.Fatal("nobody took the crashed holder's key over")
	}
	who, _, _ := strings.Cut(took.value, "/")
	t.Logf("the waiter's write sent at %v (answer dropped for %v); the key taken over by %s's write rev %d at %v",
		fired.Format("15:04:05.000"), dropFor, who, took.rev, took.created.Format("15:04:05.000"))
	if at, ok := g.firstOf(who); ok {
		after := at.Sub(took.created)
		t.Logf("%s got its lease %v after its takeover write landed (C·R = %v)", who, after.Round(time.Millisecond), C*testR)
		if after < C*testR {
			t.Errorf("%s's lease was handed out %v after the write that took the key over, before C·R = %v", who, after.Round(time.Millisecond), C*testR)
		}
	} else {
		t.Errorf("%s took the key over and was never granted a lease", who)
	}
	g.check(t)
	silence(t, writes, "crashed", testF*testR)
}

// TestSupervisorLostTakeoverReplyWithRacingAgent: node-b, standby on a
// connection through a proxy, takes over from the killed node-a; the answer
// to its takeover write, and only to it, is lost (the proxy drops what comes
// back for dropFor, then closes the connection; nats.go reconnects and,
// without ReconnectBufSize(-1), may send writes buffered meanwhile late).
// node-c, a third agent on a direct link, races it. "it starts the service
// only after C·R of its own writes that it saw succeed, on every path": no
// service starts less than C·R after its agent's first write of the hold,
// and no two run at once.
func TestSupervisorLostTakeoverReplyWithRacingAgent(t *testing.T) {
	const C = 4
	for _, tc := range []struct {
		dropFor time.Duration
		racer   bool
	}{{30 * time.Millisecond, false}, {250 * time.Millisecond, false}, {30 * time.Millisecond, true}} {
		dropFor := tc.dropFor
		t.Run(fmt.Sprintf("%v/racer=%t", dropFor, tc.racer), func(t *testing.T) {
			url, bucket, key := supervisorEnv(t)
			writes := watchWrites(t, url, bucket, key)
			proxyURL, lose := loseAnswer(t, url, bucket, key, testenv.LoseReplies(dropFor))
			h := contracttest.NewHistory(1)
			a := startAgent(t, url, bucket, key, "node-a", h, withClientOptions(natsputex.WithConfirmations(C)))
			waitFor(t, 5*time.Second, "node-a starts its service", a.running)
			b := startAgent(t, proxyURL, bucket, key, "node-b", h, withClientOptions(natsputex.WithConfirmations(C)))
			agents := []*agent{b}
			if tc.racer {
				agents = append(agents, startAgent(t, url, bucket, key, "node-c", h, withClientOptions(natsputex.WithConfirmations(C))))
			}
			time.Sleep(3 * testR)
			lose.Arm()
			a.kill()
			select {
			case <-lose.Fired():
			case <-time.After(3 * time.Second):
				t.Log("node-b never wrote the key (node-c won)")
			}
			active := waitActive(t, (testF+C+4)*testR+3*time.Second, agents...)
			time.Sleep(500 * time.Millisecond)
			first, _ := writes.firstBy(active.name)
			after := active.lastStart().Sub(first.created)
			t.Logf("%s started its service %v after its first write of the key (rev %d); C·R = %v", active.name, after.Round(time.Millisecond), first.rev, C*testR)
			for _, ag := range agents {
				ag.mu.Lock()
				st := append([]time.Time(nil), ag.started...)
				ag.mu.Unlock()
				w, ok := writes.firstBy(ag.name)
				for _, s := range st {
					if ok && s.Sub(w.created) < C*testR {
						t.Errorf("%s started its service %v after its first write, before C·R = %v", ag.name, s.Sub(w.created).Round(time.Millisecond), C*testR)
					}
				}
			}
			for _, ag := range agents {
				ag.stop()
			}
			if err := h.Check(); err != nil {
				t.Errorf("services overlapped: %v", err)
			}
		})
	}
}

// TestTwoStandbysRaceLoserWaitsT: node-a is killed; node-b and node-c, both
// standby with the same timing (R = 100ms, F = 3), race for its key. The
// one that loses must not take the winner's key over before it has gone
// T without a write ("waits until the key has gone T = F·R without any
// write, by its own clock, then writes its token at the revision it
// read"): every write of a token other than the key's last one comes T or
// more after that last write (by the server's stamps). With C = 0 (a
// takeover starts the service at once), no two services may overlap.
func TestTwoStandbysRaceLoserWaitsT(t *testing.T) {
	for _, C := range []int{0, 1} {
		t.Run(fmt.Sprintf("C=%d", C), func(t *testing.T) {
			for round := range 1 {
				url, bucket, key := supervisorEnv(t)
				writes := watchWrites(t, url, bucket, key)
				h := contracttest.NewHistory(1)
				opt := natsputex.WithConfirmations(C)
				a := startAgent(t, url, bucket, key, "node-a", h, withClientOptions(opt))
				waitFor(t, 5*time.Second, "node-a starts its service", a.running)
				b := startAgent(t, url, bucket, key, "node-b", h, withClientOptions(opt))
				c := startAgent(t, url, bucket, key, "node-c", h, withClientOptions(opt))
				time.Sleep(time.Duration(3+round) * testR / 2)
				a.kill()
				time.Sleep(2 * time.Second)
				b.stop()
				c.stop()
				writes.mu.Lock()
				ws := append([]keyWrite(nil), writes.writes...)
				writes.mu.Unlock()
				for i := 1; i < len(ws); i++ {
					prev, w := ws[i-1], ws[i]
					if w.value == "" || prev.value == "" || w.value == prev.value {
						continue
					}
					gap := w.created.Sub(prev.created)
					t.Logf("round %d: rev %d %q took over rev %d %q %v after it", round, w.rev, w.value, prev.rev, prev.value, gap.Round(time.Millisecond))
					if gap < testF*testR {
						t.Errorf("round %d: %s took the key over %v after %s's write (rev %d), before T = %v", round, w.value, gap.Round(time.Millisecond), prev.value, prev.rev, testF*testR)
					}
				}
				if err := h.Check(); err != nil {
					t.Errorf("round %d: services overlapped: %v", round, err)
				}
			}
		})
	}
}

// TestLateStandbyCountsFromNewHoldersWrite: node-a (R = 400ms, F = 3, T =
// 1.2s) is killed; node-c (R = 50ms, F = 2, T = 100ms), standby from the
// start, takes its key over after node-a's T; node-b (node-c's timing),
// started 500ms after the kill, is still counting node-a's T when node-c
// writes. node-b must then count its T = 100ms from node-c's write, not
// take the key at once.
func TestLateStandbyCountsFromNewHoldersWrite(t *testing.T) {
	for _, C := range []int{1, 0} {
		t.Run(fmt.Sprintf("C=%d", C), func(t *testing.T) {
			url, bucket, key := supervisorEnv(t)
			writes := watchWrites(t, url, bucket, key)
			h := contracttest.NewHistory(1)
			a := startAgent(t, url, bucket, key, "node-a", h, withClientOptions(natsputex.WithRenewInterval(400*time.Millisecond), natsputex.WithFailureThreshold(3), natsputex.WithConfirmations(C)))
			waitFor(t, 5*time.Second, "node-a starts its service", a.running)
			fast := []natsputex.Option{natsputex.WithRenewInterval(50 * time.Millisecond), natsputex.WithFailureThreshold(2), natsputex.WithConfirmations(C)}
			c := startAgent(t, url, bucket, key, "node-c", h, withClientOptions(fast...))
			time.Sleep(500 * time.Millisecond)
			a.kill()
			time.Sleep(500 * time.Millisecond)
			b := startAgent(t, url, bucket, key, "node-b", h, withClientOptions(fast...))
			time.Sleep(1500 * time.Millisecond)
			b.stop()
			c.stop()
			writes.mu.Lock()
			ws := append([]keyWrite(nil), writes.writes...)
			writes.mu.Unlock()
			for i := 1; i < len(ws); i++ {
				prev, w := ws[i-1], ws[i]
				if w.value == "" || prev.value == "" || w.value == prev.value {
					continue
				}
				T := 100 * time.Millisecond
				if prev.value == "node-a" {
					T = 1200 * time.Millisecond
				}
				gap := w.created.Sub(prev.created)
				t.Logf("rev %d %q took over rev %d %q %v after it", w.rev, w.value, prev.rev, prev.value, gap.Round(time.Millisecond))
				if gap < T {
					t.Errorf("rev %d %q took over rev %d %q %v after it, before T = %v", w.rev, w.value, prev.rev, prev.value, gap.Round(time.Millisecond), T)
				}
			}
			if err := h.Check(); err != nil {
				t.Errorf("services overlapped: %v", err)
			}
		})
	}
}

// TestTakeoverWaitsTPlusCR: a waiter takes a silent holder's key over no
// sooner than T of silence since the holder's last write plus C
// confirmation intervals, and not much later. (The server runs on this
// machine: the time it stamped on the last write is on the test's clock.)
func TestTakeoverWaitsTPlusCR(t *testing.T) {
	url, bucket := promiseEnv(t, "takeover")
	proxy := testenv.NewProxy(t, strings.TrimPrefix(url, "nats://"))
	holder := newTestClient(t, "nats://"+proxy.Addr(), bucket)
	waiter := newTestClient(t, url, bucket).Locker()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	lease, err := holder.Locker().TryLock(ctx, "job")
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(2 * testR)
	proxy.BlackHole() // the holder goes silent, without blanking the key
	defer proxy.Restore()
	time.Sleep(testR) // a renewal in flight, black-holed, is never stored
	last, err := mustBucket(t, url, bucket).Get(ctx, "job")
	if err != nil {
		t.Fatal(err)
	}
	start := last.Created() // the holder's last write
	g := mustGrant(t, lockBehind(ctx, waiter, "job", lease))
	took := time.Since(start)
	T := holder.TTL()
	least := T + testC*testR
	t.Logf("took the silent holder's key over %v after its last write (T + C·R = %v)", took.Round(time.Millisecond), least)
	if took < least {
		t.Errorf("took the key over %v after the holder's last write, sooner than T + C·R = %v", took, least)
	}
	if most := least + 2*testR + 500*time.Millisecond; took > most {
		t.Errorf("took the key over after %v, want within %v", took, most)
	}
	if g.otherLive {
		t.Error("double grant: the silent holder's lease was live when the waiter got the key")
	}
}

// TestFreshLockTakesSilentKey: a process that starts after a holder crashed
// and its key has gone T without a write (by the server's clock) takes the
// key over at once, with only the C confirmation intervals, instead of
// watching it for a full T of its own first. (TryLock does the same: see
// the conformance suite's TryLockRecoversCrash.)
func TestFreshLockTakesSilentKey(t *testing.T) {
	const (
		r = 500 * time.Millisecond
		f = 3
		c = 1
		T = f * r
	)
	url := natsenv.StartServer(t).URL()
	bucket := uniqueBucket("fresh")
	prepareBucket(t, url, bucket)
	opts := []natsputex.Option{natsputex.WithRenewInterval(r), natsputex.WithFailureThreshold(f), natsputex.WithConfirmations(c)}

	nc, js, err := connect(url)
	if err != nil {
		t.Fatal(err)
	}
	holder, err := natsputex.New(context.Background(), js, bucket, opts...)
	if err != nil {
		t.Fatal(err)
	}
	held, err := holder.Locker().TryLock(context.Background(), "job")
	if err != nil {
		t.Fatal(err)
	}
	nc.Close() // the holder crashes: no release, no renewal
	t.Cleanup(func() { _ = holder.Close(context.Background()) })
	time.Sleep(T + r) // longer than T since its last write

	fresh := newTestClient(t, url, bucket, opts...)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	start := time.Now()
	lease, err := fresh.Locker().Lock(ctx, "job")
	took := time.Since(start)
	if err != nil {
		t.Fatalf("Lock: %v", err)
	}
	defer lease.Release(context.Background())
	t.Logf("a fresh Lock took a key silent for %v after %v (T = %v, C·R = %v)", T+r, took.Round(time.Millisecond), T, c*r)
	if took >= T {
		t.Fatalf("a fresh Lock took %v to take a key already silent for %v: it watched the key for T = %v itself", took.Round(time.Millisecond), T+r, T)
	}
	if lease.Token() <= held.Token() {
		t.Errorf("token %d not above the crashed holder's %d", lease.Token(), held.Token())
	}
}

// TestSupervisorLostTakeoverReply: a standby whose takeover write lands
// but whose answer is lost (its proxy drops every reply) finds its own
// token in the key on a later stroke. It must not start its service at
// once: it starts only after C full intervals of its own writes that it
// saw succeed, so no sooner than C·R after the takeover write landed
// (C = 8 here: 800ms, far above the time it takes to reconnect and read
// the key again). F = 10 (T = 1s) leaves node-b time to read the key
// before its replies are dropped at T/2, even on a loaded machine. (The
// code before this test re-read the key only every T in standby, so its
// last read could fall after T/2 and the takeover never came: dropping at
// T − R/2 instead, it started its service 121–173ms after the write.)
func TestSupervisorLostTakeoverReply(t *testing.T) {
	const C, F = 8, 10
	url, bucket, key := supervisorEnv(t)
	writes := watchWrites(t, url, bucket, key)
	proxy := testenv.NewProxy(t, strings.TrimPrefix(url, "nats://"))
	h := contracttest.NewHistory(1)
	a := startAgent(t, url, bucket, key, "node-a", h, withClientOptions(natsputex.WithConfirmations(C), natsputex.WithFailureThreshold(F)))
	waitFor(t, 5*time.Second, "node-a starts its service", a.running)
	b := startAgent(t, "nats://"+proxy.Addr(), bucket, key, "node-b", h, withClientOptions(natsputex.WithConfirmations(C), natsputex.WithFailureThreshold(F)))
	waitFor(t, 5*time.Second, "node-b is standby", func() bool {
		return b.sawEvent(func(e natsputex.Event) bool { return e.Holder == "node-a" })
	})
	time.Sleep(2 * testR)
	a.kill()
	// node-b takes over T after node-a's last write; drop its replies
	// from halfway there, once that write has reached node-b.
	time.Sleep(time.Until(writes.lastWrite().Add(F * testR / 2)))
	proxy.DropReplies()
	waitFor(t, 3*F*testR+time.Second, "node-b's takeover write reaches the key", func() bool {
		_, ok := writes.firstBy("node-b")
		return ok
	})
	takeover, _ := writes.firstBy("node-b")
	time.Sleep(testR / 2) // node-b's write times out
	proxy.Restore()
	waitFor(t, (F+C+4)*testR+2*time.Second, "node-b starts its service", b.running)
	after := b.lastStart().Sub(takeover.created)
	t.Logf("node-b's takeover write (revision %d) lost its answer; node-b started its service %v after that write (C·R = %v)",
		takeover.rev, after.Round(time.Millisecond), C*testR)
	if after < C*testR {
		t.Errorf("node-b started its service %v after its takeover write, before C·R = %v: it skipped the confirmations", after, C*testR)
	}
	b.stop()
	if err := h.Check(); err != nil {
		t.Fatalf("services overlapped: %v", err)
	}
}
