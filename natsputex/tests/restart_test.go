package natsputex_test

// Server restarts and buckets that vanish: the server restarted, the
// bucket deleted and made again, purged or lost (memory storage).

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/goleak"

	"github.com/latchkey-go/latchkey/contracttest"
	"github.com/latchkey-go/latchkey/contracttest/testenv/natsenv"
	"github.com/latchkey-go/latchkey/locks"
	"github.com/latchkey-go/latchkey/locks/driver"
	"github.com/latchkey-go/latchkey/natsputex"
)

// TestStandbyStartedAfterServerRestartWaitsTPlusCR: the server of a
// file-stored bucket goes down under an active node-a (R = 200ms, F = 3, C =
// 2: T = 600ms, C·R = 400ms, margin 100ms) whose Stop takes 450ms, within
// the margin + C·R = 500ms the docs give it: "A Supervisor cut off from NATS
// begins Service.Stop at that same moment; a standby starts its service no
// earlier than T + C·R after that write". node-b (R = 50ms, F = 2) stands by
// throughout; node-c (same timing) is started as the server comes back,
// after down, and may measure the key's silence by the server's stamps. No
// two services may run at once, and no takeover write may come less than
// node-a's T after its last write.
func TestStandbyStartedAfterServerRestartWaitsTPlusCR(t *testing.T) {
	for _, down := range []time.Duration{400 * time.Millisecond, 700 * time.Millisecond} {
		t.Run(fmt.Sprint(down), func(t *testing.T) {
			srv := natsenv.StartServer(t)
			url := srv.URL()
			bucket := uniqueBucket("restart")
			prepareBucket(t, url, bucket)
			const key = "spof-service"
			h := contracttest.NewHistory(1)
			a := startAgent(t, url, bucket, key, "node-a", h, withFaults(func(a *agent) { a.stopDelay.Store(int64(450 * time.Millisecond)) }), withClientOptions(natsputex.WithRenewInterval(200*time.Millisecond), natsputex.WithFailureThreshold(3), natsputex.WithConfirmations(2)))
			waitFor(t, 5*time.Second, "node-a starts its service", a.running)
			fast := []natsputex.Option{natsputex.WithRenewInterval(50 * time.Millisecond), natsputex.WithFailureThreshold(2), natsputex.WithConfirmations(1)}
			b := startAgent(t, url, bucket, key, "node-b", h, withClientOptions(fast...))
			time.Sleep(500 * time.Millisecond)
			srv.Shutdown()
			downAt := time.Now()
			time.Sleep(down)
			if err := srv.Restart(); err != nil {
				t.Fatal(err)
			}
			upAt := time.Now()
			writes := watchWrites(t, url, bucket, key)
			c := startAgent(t, url, bucket, key, "node-c", h, withClientOptions(fast...))
			time.Sleep(2 * time.Second)
			for _, ag := range []*agent{a, b, c} {
				ag.stop()
			}
			t.Logf("server down for %v (restart took %v)", down, upAt.Sub(downAt).Round(time.Millisecond))
			for _, ag := range []*agent{a, b, c} {
				ag.mu.Lock()
				for i, s := range ag.started {
					var st string
					if i < len(ag.stopped) {
						st = ag.stopped[i].Sub(downAt).Round(time.Millisecond).String()
					}
					t.Logf("%s: service up %v .. %s (from the shutdown)", ag.name, s.Sub(downAt).Round(time.Millisecond), st)
				}
				ag.mu.Unlock()
			}
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
					T = 600 * time.Millisecond
				}
				gap := w.created.Sub(prev.created)
				t.Logf("rev %d %q took over rev %d %q %v after it", w.rev, w.value, prev.rev, prev.value, gap.Round(time.Millisecond))
				if gap < T {
					t.Errorf("rev %d %q took over rev %d %q %v after it, before T = %v", w.rev, w.value, prev.rev, prev.value, gap.Round(time.Millisecond), T)
				}
			}
			if err := h.Check(); err != nil {
				t.Errorf("two services ran at once: %v", err)
			}
		})
	}
}

// TestPurgedStreamKeyCountsAsHeldForT: "a waiting call, or a running
// Supervisor, that saw the key counts it as held for T (or the longest T
// a holder's value it read carried), and takes it only after T of
// silence and C·R of confirmation" (the stream purged is one of the
// doc's cases). A holder (R = 400ms, F = 3, T = 1.2s) renews; a Lock
// with T = 100ms (R = 50ms, F = 2) waits on the name, and a Semaphore
// slot likewise; the bucket's stream is purged. The old holder's next
// renewal fails within R = 400ms; the waiter, having read the holder's
// T, must not be granted the name while the holder's lease is live.
func TestPurgedStreamKeyCountsAsHeldForT(t *testing.T) {
	url, bucket := promiseEnv(t, "purge")
	slow := []natsputex.Option{natsputex.WithRenewInterval(400 * time.Millisecond), natsputex.WithFailureThreshold(3), natsputex.WithConfirmations(1)}
	fast := []natsputex.Option{natsputex.WithRenewInterval(50 * time.Millisecond), natsputex.WithFailureThreshold(2), natsputex.WithConfirmations(1)}
	holder := newTestClient(t, url, bucket, append(slow, natsputex.WithHolderID("holder"))...)
	waiter := newTestClient(t, url, bucket, append(fast, natsputex.WithHolderID("waiter"))...)
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	hs, _ := holder.Semaphore(1)
	ws, _ := waiter.Semaphore(1)
	g, gs := newGrants(), newGrants()
	for round := range 3 {
		lock, err := holder.Locker().TryLock(ctx, "job")
		if err != nil {
			t.Fatal(err)
		}
		g.grant("holder", lock)
		slot, err := hs.TryAcquire(ctx, "jobs")
		if err != nil {
			t.Fatal(err)
		}
		gs.grant("holder", slot)
		type res struct {
			l  locks.Lease
			at time.Time
		}
		got, gotSlot := make(chan res, 1), make(chan res, 1)
		go func() {
			l, err := waiter.Locker().Lock(ctx, "job")
			if err != nil {
				t.Errorf("Lock: %v", err)
			}
			if l != nil {
				g.grant("waiter", l)
			}
			got <- res{l, time.Now()}
		}()
		go func() {
			l, err := ws.Acquire(ctx, "jobs")
			if err != nil {
				t.Errorf("Acquire: %v", err)
			}
			if l != nil {
				gs.grant("waiter", l)
			}
			gotSlot <- res{l, time.Now()}
		}()
		// Let the waiters read the holder's value, then purge at various
		// points of the holder's 400ms renewal period.
		time.Sleep(300*time.Millisecond + time.Duration(round)*130*time.Millisecond)
		s, err := mustJS(t, url).Stream(ctx, "KV_"+bucket)
		if err != nil {
			t.Fatal(err)
		}
		if err := s.Purge(ctx); err != nil {
			t.Fatal(err)
		}
		purged := time.Now()
		r, rs := <-got, <-gotSlot
		t.Logf("round %d: lock granted %v after the purge (holder's lease ended %v: %v); slot granted %v after (%v)", round,
			r.at.Sub(purged).Round(time.Millisecond), errors.Is(context.Cause(lock.Context()), locks.ErrLost), context.Cause(lock.Context()),
			rs.at.Sub(purged).Round(time.Millisecond), context.Cause(slot.Context()))
		for _, l := range []locks.Lease{r.l, rs.l, lock, slot} {
			if l != nil {
				_ = l.Release(ctx)
			}
		}
	}
	g.check(t)
	gs.check(t)
}

// TestConfirmationGoesOnAcrossServerRestart: a holder crashes; a waiter with
// R = 100ms, F = 3, C = 6 (C·R = 600ms) takes its key over and, 150ms
// into its confirmation, the server is shut down for 300ms. The
// confirmation lasts C·R "counted from the answer to its takeover
// write", every write since succeeding; a write that nats.go refused to
// send while it reconnects is sent again once the connection is back
// (ConnectOptions), so the confirmation goes on across the outage. The
// confirmation event's Duration must be at least C·R, every write of the
// key from the takeover to the grant the taker's, and the write that
// confirmed the hold (the first of the lease's own token: "the last
// confirmation writes the lease's own token") stored by the restarted
// server: it is sent C·R or more after the takeover write was answered,
// when the old server had stopped, so a grant counted on writes that
// never landed would fail here. (Before writes refused during a reconnect
// were sent again, the confirmation failed and began again after the
// restart.) The bucket keeps 64 values per key, so that the writes up to
// the grant are all read after it, renewals since included. "Stored by
// the restarted server" is told by the server's stamp: after Restart was
// called, once Shutdown had returned (the old server gone); not after
// Restart returned, which is later than the server's first writes (it
// waits for the server's health checks, polled, while clients reconnect
// and write). Run on the embedded server and on the nats-server program
// (2.9.10).
func TestConfirmationGoesOnAcrossServerRestart(t *testing.T) {
	for _, kind := range []string{"embedded", "binary"} {
		t.Run(kind, func(t *testing.T) {
			var srv *natsenv.Server
			if kind == "binary" {
				srv = natsenv.StartBinaryServer(t)
			} else {
				srv = natsenv.StartServer(t)
			}
			url := srv.URL()
			bucket := uniqueBucket("restart")
			historyBucket(t, url, bucket)
			nc, js, err := connect(url)
			if err != nil {
				t.Fatal(err)
			}
			crashed := newClientOn(t, nc, js, bucket, natsputex.WithHolderID("crashed"))
			ctx, cancel := context.WithTimeout(context.Background(), 25*time.Second)
			defer cancel()
			held, err := crashed.Locker().TryLock(ctx, "job")
			if err != nil {
				t.Fatal(err)
			}
			const C, R = 6, 100 * time.Millisecond
			// ConnectOptions: no writes buffered by nats.go while the server
			// is down; natsputex sends them again once it is back.
			wnc, err := nats.Connect(url, natsputex.ConnectOptions()...)
			if err != nil {
				t.Fatal(err)
			}
			wjs, err := jetstream.New(wnc)
			if err != nil {
				t.Fatal(err)
			}
			waiter := newClientOn(t, wnc, wjs, bucket, natsputex.WithHolderID("taker"),
				natsputex.WithRenewInterval(R), natsputex.WithFailureThreshold(3), natsputex.WithConfirmations(C))
			takeover := make(chan time.Time, 8)
			var mu sync.Mutex
			var confirms []time.Duration
			stop := waiter.Locker().Observe(func(e driver.Event) {
				switch e.Kind {
				case driver.EventTakeover:
					select {
					case takeover <- time.Now():
					default:
					}
				case driver.EventConfirmation:
					mu.Lock()
					confirms = append(confirms, e.Duration)
					mu.Unlock()
				}
			})
			defer stop()
			type timedGrant struct {
				grant
				at time.Time // when Lock returned
			}
			got := make(chan timedGrant, 1)
			var lockFailures []string
			go func() {
				for {
					l, err := waiter.Locker().Lock(ctx, "job")
					if err != nil && ctx.Err() == nil {
						mu.Lock()
						lockFailures = append(lockFailures, err.Error())
						mu.Unlock()
						time.Sleep(10 * time.Millisecond)
						continue
					}
					got <- timedGrant{grant{lease: l, err: err, otherLive: held.Context().Err() == nil}, time.Now()}
					return
				}
			}()
			time.Sleep(100 * time.Millisecond)
			nc.Close() // the crash
			// tookAt is taken as the takeover is reported, before the
			// confirmation's count begins (at the write's answer).
			var tookAt time.Time
			select {
			case tookAt = <-takeover:
			case <-time.After(5 * time.Second):
				t.Fatal("no takeover within 5s of the crash")
			}
			time.Sleep(150 * time.Millisecond)
			srv.Shutdown() // returns once the server has stopped
			downAt := time.Now()
			// The outage must come while the taker confirms: were the old
			// server still up C·R after the takeover, the confirming write
			// could land on it, and there would be nothing to check.
			if d := downAt.Sub(tookAt); d >= C*R {
				t.Fatalf("the server stopped only %v after the takeover, not within its C·R = %v of confirmation", d, C*R)
			}
			time.Sleep(300 * time.Millisecond)
			restartAt := time.Now() // no server runs: every write stamped later was stored by the restarted one
			if err := srv.Restart(); err != nil {
				t.Fatal(err)
			}
			upAt := time.Now()
			g := <-got
			if g.err != nil {
				t.Fatalf("Lock: %v", g.err)
			}
			defer g.lease.Release(context.Background())
			mu.Lock()
			t.Logf("takeover at 0, server down at %v, restart begun at %v, Restart returned at %v, grant at %v (token %d, crashed holder's %d); confirmations %v",
				downAt.Sub(tookAt).Round(time.Millisecond), restartAt.Sub(tookAt).Round(time.Millisecond), upAt.Sub(tookAt).Round(time.Millisecond),
				g.at.Sub(tookAt).Round(time.Millisecond), g.lease.Token(), held.Token(), confirms)
			if len(lockFailures) > 0 {
				t.Logf("Lock failed %d time(s) while the server was down, first: %s", len(lockFailures), lockFailures[0])
			}
			for _, d := range confirms {
				if d < C*R {
					t.Errorf("a confirmation reported after %v, under C·R = %v", d, C*R)
				}
			}
			mu.Unlock()
			if g.otherLive {
				t.Error("granted while the crashed holder's lease was live")
			}
			if g.lease.Token() <= held.Token() {
				t.Errorf("token %d not above the crashed holder's %d", g.lease.Token(), held.Token())
			}
			hctx, hcancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer hcancel()
			hist, err := mustBucket(t, url, bucket).History(hctx, "job")
			if err != nil {
				t.Fatal(err)
			}
			// The takeover write (at the lease's token) carries the taker's
			// token with its timing, as do the confirmation's writes; the
			// write that confirms the hold carries the token alone, as do
			// the lease's renewals after it.
			var took, confirmed jetstream.KeyValueEntry
			for _, e := range hist {
				if e.Revision() < g.lease.Token() {
					continue
				}
				if took == nil {
					if e.Revision() != g.lease.Token() || !strings.HasPrefix(string(e.Value()), "taker/") || !strings.Contains(string(e.Value()), "\n") {
						t.Fatalf("the lease's token %d is not the revision of a takeover write of the taker's (first write from it: rev %d %q)", g.lease.Token(), e.Revision(), e.Value())
					}
					took = e
					continue
				}
				token := valueToken(took.Value())
				if valueToken(e.Value()) != token {
					t.Errorf("rev %d %q written between the takeover (rev %d) and the grant", e.Revision(), e.Value(), g.lease.Token())
					continue
				}
				if string(e.Value()) == token {
					confirmed = e
					break
				}
			}
			stamp := func(e jetstream.KeyValueEntry) string {
				return fmt.Sprintf("rev %d %q stored at %v", e.Revision(), e.Value(), e.Created().Sub(tookAt.Round(0)).Round(time.Millisecond))
			}
			switch {
			case took == nil:
				t.Fatalf("no takeover write at the lease's token %d in the key's history", g.lease.Token())
			case confirmed == nil:
				t.Errorf("the lease was granted without a write of its own token after the takeover (%s)", stamp(took))
			case !confirmed.Created().After(restartAt.Round(0)):
				t.Errorf("the lease was granted on a write stored before the restart began at %v: %s (takeover %s)",
					restartAt.Sub(tookAt).Round(time.Millisecond), stamp(confirmed), stamp(took))
			default:
				t.Logf("takeover %s; confirmed by %s", stamp(took), stamp(confirmed))
			}
		})
	}
}

// TestServerRestartWhileAgentConfirms: the NATS server (embedded, file
// storage: the key survives) is shut down and started again with the same
// store while an agent confirms a takeover. node-c (active) is killed;
// node-a and node-b (R = 100ms, F = 3, C = 5: C·R = 500ms) stand by; 150ms
// after one of them took the key over, the server goes down for 0 or 2T.
// "it starts the service only once C intervals (C·R) have passed since
// the start of its first write of the hold that it saw succeed, every
// write since having succeeded too"; "A taker-over that gives up before
// its confirmations are done (... a failed check or write) never blanks
// the key". So: no blank of the key before the first Start after the
// restart; every Start comes C·R after the first write of the run of its
// agent's writes before it, and a run that displaced another token's write
// came T after it (checkTakeovers); one agent is active within 5s of the
// server's return; the services never overlap.
func TestServerRestartWhileAgentConfirms(t *testing.T) {
	const (
		C = 5
		T = testF * testR
	)
	for _, tc := range []struct {
		name      string
		down      time.Duration
		conn      nodeOption // how the agents connect
		buffering bool
	}{
		{"down-0s", 0, onConnectOptions(), false},
		{"down-2T", 2 * T, onConnectOptions(), false},
		{"down-2T-buffering-conn", 2 * T, withConn(nats.IgnoreDiscoveredServers()), true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ignore := goleak.IgnoreCurrent()
			t.Cleanup(func() { goleak.VerifyNone(t, append(natsenv.ConsumerGoroutines(), ignore)...) })
			srv := natsenv.StartServer(t)
			url := srv.URL()
			bucket := uniqueBucket("restart")
			historyBucket(t, url, bucket)
			const key = "spof-service"
			h := contracttest.NewHistory(1)
			c := startNode(t, url, bucket, key, "node-c", h, tc.conn)
			waitFor(t, 5*time.Second, "node-c starts its service", c.running)
			opts := []natsputex.Option{natsputex.WithConfirmations(C)}
			a := startNode(t, url, bucket, key, "node-a", h, tc.conn, withClientOptions(opts...))
			b := startNode(t, url, bucket, key, "node-b", h, tc.conn, withClientOptions(opts...))
			for _, n := range []*node{a, b} {
				n.stopDelay.Store(int64(20 * time.Millisecond))
				waitFor(t, 5*time.Second, n.name+" is standby", func() bool {
					return n.sawEvent(func(e natsputex.Event) bool { return e.Holder == "node-c" })
				})
			}
			time.Sleep(2 * testR)
			c.kill()
			var conf *node
			waitFor(t, 3*time.Second, "an agent confirms", func() bool {
				for _, n := range []*node{a, b} {
					if n.sup.Phase() == natsputex.PhaseConfirming {
						conf = n
						return true
					}
				}
				return false
			})
			time.Sleep(150 * time.Millisecond)
			shut := time.Now()
			srv.Shutdown()
			time.Sleep(tc.down)
			if err := srv.Restart(); err != nil {
				t.Fatal(err)
			}
			back := time.Now()
			up := waitActiveNode(t, 5*time.Second, a, b)
			st := up.getStarts()[0]
			time.Sleep(T + C*testR)
			for _, n := range []*node{a, b} {
				n.cancel()
				n.wait(5 * time.Second)
			}
			writes := keyHistory(t, url, bucket, key)
			var first keyWrite
			for _, w := range writes.all() {
				if w.rev == st.token {
					first = w
				}
			}
			t.Logf("%s confirmed when the server went down (for %v, back after %v); %s started %v after it was back, %v after its winning write (rev %d, stored %v after the shutdown) (C·R = %v)",
				conf.name, tc.down, back.Sub(shut).Round(time.Millisecond), up.name, st.begin.Sub(back).Round(time.Millisecond),
				st.begin.Sub(first.created).Round(time.Millisecond), st.token, first.created.Sub(shut).Round(time.Millisecond), C*testR)
			var run []string
			for _, w := range writes.writesAfter(first.created.Add(-time.Millisecond)) {
				if w.created.After(st.begin) {
					break
				}
				run = append(run, fmt.Sprintf("rev %d %q at %+v", w.rev, w.value, w.created.Sub(shut).Round(time.Millisecond)))
			}
			t.Logf("writes from the winning one to the Start (times from the shutdown): %s", strings.Join(run, "; "))
			for _, bl := range writes.blanksAfter(time.Time{}) {
				if bl.created.Before(st.begin) {
					t.Errorf("the key was blanked (rev %d) %v after the shutdown, before the first Start after it", bl.rev, bl.created.Sub(shut).Round(time.Millisecond))
				}
			}
			for _, n := range []*node{a, b} {
				// On a connection that buffers writes while reconnecting, a
				// takeover write made while the server was down lands after
				// its return: its agent counts C·R from the write's start
				// (as the doc says), so it may start less than C·R after the
				// write was stored (seen: 102ms, 2 runs of 6). Only the
				// bound from the displaced token's last write is promised.
				if tc.buffering {
					checkAfterOther(t, writes, n, T+C*testR)
				} else {
					checkTakeovers(t, writes, n, T, C*testR)
				}
			}
			if err := h.Check(); err != nil {
				t.Errorf("services overlapped: %v", err)
			}
			if t.Failed() {
				writes.logAll(t, shut)
			}
		})
	}
}

// TestSupervisorAcrossServerRestarts: the NATS server (a process of the
// nats-server on PATH, 2.9.10 on the reference machine; file storage) is
// restarted while node-a or node-b (R = 100ms, F = 3, C = 2, on
// ConnectOptions) is active: at once, a quarter and three quarters of an
// interval after one of its renewals, then down for 2T from halfway through
// an interval. A renewal sent as the server goes away may land with its
// answer lost, and the next one is made at the agent's last revision. One
// agent must be active within 10s of each restart, every takeover come T
// after another token's write and start C·R after its first write
// (checkTakeovers), and the services never overlap.
func TestSupervisorAcrossServerRestarts(t *testing.T) {
	const (
		C = 2
		T = testF * testR
	)
	srv, url, bucket, key := binaryEnv(t, "restart")
	hist := newHistoryLog(t, url, bucket, key)
	h := contracttest.NewHistory(1)
	opts := []natsputex.Option{natsputex.WithConfirmations(C)}
	a := startNode(t, url, bucket, key, "node-a", h, onConnectOptions(), withClientOptions(opts...))
	b := startNode(t, url, bucket, key, "node-b", h, onConnectOptions(), withClientOptions(opts...))
	for _, n := range []*node{a, b} {
		n.stopDelay.Store(int64(20 * time.Millisecond))
	}
	for i, tc := range []struct{ offset, down time.Duration }{{0, 0}, {testR / 4, 0}, {3 * testR / 4, 0}, {testR / 2, 2 * T}} {
		up := waitActiveNode(t, 10*time.Second, a, b)
		writes := watchWrites(t, url, bucket, key)
		time.Sleep(3 * testR)
		hist.collect()
		at := afterRenewal(t, writes, up.name, tc.offset, func() {
			if tc.down == 0 {
				if err := srv.Restart(); err != nil {
					t.Fatal(err)
				}
				return
			}
			srv.Shutdown()
			time.Sleep(tc.down)
			if err := srv.Restart(); err != nil {
				t.Fatal(err)
			}
		})
		next := waitActiveNode(t, 10*time.Second, a, b)
		t.Logf("restart %d, %v after a renewal of %s's, down %v: %s active %v after the restart began", i, tc.offset, up.name, tc.down, next.name, time.Since(at).Round(time.Millisecond))
		time.Sleep(T + C*testR + 3*testR)
		hist.collect()
	}
	stopNodes(a, b)
	hist.collect()
	writes := hist.watch()
	for _, n := range []*node{a, b} {
		t.Logf("%s: %d starts, %d stops", n.name, len(n.getStarts()), len(n.getStops()))
		checkTakeovers(t, writes, n, T, C*testR)
	}
	if err := h.Check(); err != nil {
		t.Errorf("services overlapped: %v", err)
	}
}

// TestQuickServerRestartKeepsServiceAndLease: ConnectOptions reconnects
// "every 100 ms with up to 100 ms of jitter ... rather than nats.go's 2 s,
// which alone is longer than T − margin with a short T, so that a holder
// whose server restarted renews again in time"; "While the connection is
// down, holders cannot renew: one cut off for T − margin loses its lease
// (ErrLost), as in a partition". node-a (R = 100ms, F = 20: T = 2s, T −
// margin = 1.95s) is active and its client holds a Locker lease ("job"); the
// NATS server (nats-server on PATH, file storage) is restarted three times,
// each down for a few milliseconds, a quarter, half and three quarters of an
// interval after one of node-a's renewals. The connection is back well
// within T − margin each time: node-a's service must never stop and the
// lease must stay live.
func TestQuickServerRestartKeepsServiceAndLease(t *testing.T) {
	const F = 20
	srv, url, bucket, key := binaryEnv(t, "keep")
	h := contracttest.NewHistory(1)
	a := startNode(t, url, bucket, key, "node-a", h, onConnectOptions(), withClientOptions(natsputex.WithFailureThreshold(F)))
	waitFor(t, 5*time.Second, "node-a starts its service", a.running)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	lease, err := a.c.Locker().TryLock(ctx, "job")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = lease.Release(context.Background()) }()
	first := a.getStarts()[0].begin
	for i, offset := range []time.Duration{testR / 4, testR / 2, 3 * testR / 4} {
		writes := watchWrites(t, url, bucket, key)
		time.Sleep(3 * testR)
		var took time.Duration
		at := afterRenewal(t, writes, "node-a", offset, func() {
			began := time.Now()
			if err := srv.Restart(); err != nil {
				t.Fatal(err)
			}
			took = time.Since(began)
		})
		time.Sleep(500 * time.Millisecond)
		t.Logf("restart %d, %v after a renewal: the server was back in %v; node-a runs its service: %v; the lease: %v",
			i, offset, took.Round(time.Millisecond), a.running(), context.Cause(lease.Context()))
		for _, e := range eventsAfter(a, at) {
			if e.Phase != natsputex.PhaseActive {
				t.Logf("  node-a: %v", e)
			}
		}
	}
	for _, st := range a.getStops() {
		if st.begin.After(first) {
			t.Errorf("node-a stopped its service %v after it started, though the server was down for milliseconds each time and T − margin is %v",
				st.begin.Sub(first).Round(time.Millisecond), F*testR-testR/2)
			break
		}
	}
	if err := lease.Context().Err(); err != nil {
		t.Errorf("the Locker lease of node-a's client ended: %v", context.Cause(lease.Context()))
	}
}

// TestSupervisorAcrossBucketMadeAgain: node-a is active and node-b stands by
// (R = 100ms, F = 3, C = 1) when the bucket is deleted, halfway between
// two renewals, and made again (memory, 64 values of history) at once or
// 2T later. "The old holder's next renewal fails (a write at its
// revision, which the new bucket does not have), so it learns within
// R"; "a running Supervisor, that saw the key counts it as held for T
// ..., and takes it only after T of silence and C·R of confirmation, as a
// dead holder's". node-a's Stop must begin within R (+60ms) of the
// deletion when the bucket is made again at once, and in any case no
// later than T − margin after its last write (while there is no bucket
// its write is not refused: it goes unanswered); no agent may write the
// key in the new bucket sooner than T after node-a's last write in the
// old one, nor start sooner than T + C·R after it and C·R after its own
// first write there; the services never overlap.
func TestSupervisorAcrossBucketMadeAgain(t *testing.T) {
	const (
		C      = 1
		T      = testF * testR
		margin = testR / 2
	)
	for _, gone := range []time.Duration{0, 2 * T} {
		t.Run(fmt.Sprintf("gone-%v", gone), func(t *testing.T) {
			url, bucket, key := localEnv(t)
			old := watchWrites(t, url, bucket, key)
			js := mustJS(t, url)
			h := contracttest.NewHistory(1)
			a, b := activeAndStandby(t, url, url, bucket, key, h, 20*time.Millisecond)
			time.Sleep(2 * testR)
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			recreate := func() {
				if _, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: bucket, History: 64, Storage: jetstream.MemoryStorage}); err != nil {
					t.Fatal(err)
				}
			}
			var deleted time.Time
			cutAfterRenewal(t, old, "node-a", func() {
				deleted = time.Now()
				if err := js.DeleteKeyValue(ctx, bucket); err != nil {
					t.Fatal(err)
				}
				if gone == 0 {
					recreate()
				}
			})
			if gone > 0 {
				time.Sleep(time.Until(deleted.Add(gone)))
				recreate()
			}
			waitActiveNode(t, 5*time.Second, a, b)
			time.Sleep(T + C*testR + 3*testR)
			stopNodes(a, b)
			lastOld, _ := old.lastBy("node-a", deleted)
			stop, ok := a.firstStopAfter(deleted)
			if !ok {
				t.Fatal("node-a never stopped its service")
			}
			e, _ := endEvent(a, deleted)
			t.Logf("node-a's Stop began %v after the deletion (R = %v), %v after its last write (T − margin = %v): %v",
				stop.begin.Sub(deleted).Round(time.Millisecond), testR, stop.begin.Sub(lastOld.created).Round(time.Millisecond), T-margin, e)
			if d := stop.begin.Sub(deleted); gone == 0 && d > testR+timingSlack {
				t.Errorf("node-a began Stop %v after its bucket was deleted and made again, later than R = %v (+%v)", d.Round(time.Millisecond), testR, timingSlack)
			}
			if d := stop.begin.Sub(lastOld.created); d > T-margin+timingSlack {
				t.Errorf("node-a began Stop %v after its last write, later than T − margin = %v (+%v)", d.Round(time.Millisecond), T-margin, timingSlack)
			}
			neu := keyHistory(t, url, bucket, key).all()
			if len(neu) == 0 {
				t.Fatal("no write in the new bucket")
			}
			t.Logf("first write in the new bucket: rev %d %q, %v after node-a's last write in the old one (rev %d; T = %v)",
				neu[0].rev, neu[0].value, neu[0].created.Sub(lastOld.created).Round(time.Millisecond), lastOld.rev, T)
			if d := neu[0].created.Sub(lastOld.created); d < T-10*time.Millisecond {
				t.Errorf("%s wrote the key in the new bucket %v after node-a's last write in the old one, before T = %v", neu[0].value, d.Round(time.Millisecond), T)
			}
			for _, n := range []*node{a, b} {
				for _, st := range n.getStarts() {
					if st.begin.Before(deleted) {
						continue
					}
					t.Logf("%s started %v after node-a's last write in the old bucket (T + C·R = %v)", n.name, st.begin.Sub(lastOld.created).Round(time.Millisecond), T+C*testR)
					if d := st.begin.Sub(lastOld.created); d < T+C*testR-10*time.Millisecond {
						t.Errorf("%s started %v after node-a's last write in the old bucket, before T + C·R = %v", n.name, d.Round(time.Millisecond), T+C*testR)
					}
					i := slices.IndexFunc(neu, func(w keyWrite) bool { return w.value == n.name })
					if i >= 0 && st.begin.Sub(neu[i].created) < C*testR-10*time.Millisecond {
						t.Errorf("%s started %v after its first write in the new bucket (rev %d), before C·R = %v", n.name, st.begin.Sub(neu[i].created).Round(time.Millisecond), neu[i].rev, C*testR)
					}
				}
			}
			if err := h.Check(); err != nil {
				t.Errorf("services overlapped: %v", err)
			}
		})
	}
}

// TestServerRestartAtTakeoverWrite: the same on the nats-server program (file
// storage), both agents on ConnectOptions: node-a (C = 2) is killed right
// after a renewal; node-b's (C = 2) Standby health check, run before its
// takeover write, shuts the server down and returns once nats.go
// reconnects; the server is started again at once. node-b's takeover
// write waits for the reconnect and lands well after it was begun: its
// Start must still come C·R after the write was stored (checkTakeovers,
// from the bucket's history), T after node-a's last write.
func TestServerRestartAtTakeoverWrite(t *testing.T) {
	const T = testF * testR
	srv, url, bucket, key := binaryEnv(t, "takeover")
	hist := newHistoryLog(t, url, bucket, key)
	h := contracttest.NewHistory(1)
	_, b, lastA, at := faultAtTakeover(t, url, url, bucket, key, watchWrites(t, url, bucket, key), h, srv.Shutdown)
	if err := srv.Restart(); err != nil {
		t.Fatal(err)
	}
	up := time.Now()
	waitFor(t, 10*time.Second, "node-b starts", b.running)
	stopNodes(b)
	hist.collect()
	all := hist.watch()
	st := b.getStarts()[0]
	var took keyWrite
	for _, w := range all.all() {
		if w.rev == st.token {
			took = w
		}
	}
	t.Logf("server shut down %v after node-a's last write, back %v later; node-b's takeover write rev %d stored %v after the shutdown; Start %v after it (C·R = %v)",
		ms(at.Sub(lastA.created)), ms(up.Sub(at)), took.rev, ms(took.created.Sub(at)), ms(st.begin.Sub(took.created)), 2*testR)
	if !took.created.After(at) {
		t.Errorf("node-b's takeover write landed before the shutdown: the path was not exercised")
	}
	checkTakeovers(t, all, b, T, 2*testR)
	if err := h.Check(); err != nil {
		t.Errorf("services overlapped: %v", err)
	}
}

// takeAcrossFault runs a Lock (ctx 15s, C = 1) of key on a client of
// connection nc whose Standby health check, once the ghost's key is due
// for a takeover, calls fault (and waits for nats.go to reconnect); then
// heal. It checks that Lock returns the lease, its write T after the
// ghost's and after the fault, and Lock C·R after that write, with the
// writes read from hist (the bucket's history) once done.
func takeAcrossFault(t *testing.T, nc *nats.Conn, js jetstream.JetStream, kv jetstream.KeyValue, hist *historyLog, bucket, key string, fault, heal func()) {
	t.Helper()
	const T = testF * testR
	var armed atomic.Pointer[time.Time]
	r0 := nc.Stats().Reconnects
	hc, faults := faultHook(&armed, fault, func() bool { return nc.IsReconnecting() || nc.Stats().Reconnects > r0 })
	taker := newClientOn(t, nc, js, bucket, natsputex.WithHolderID("taker"), natsputex.WithHealthCheck(hc))
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	if _, err := kv.Put(ctx, key, []byte("ghost")); err != nil {
		t.Fatal(err)
	}
	e, err := kv.Get(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	from := e.Created().Add(T - 30*time.Millisecond)
	armed.Store(&from)
	got := goLock(ctx, taker.Locker(), key, false)
	var at time.Time
	select {
	case at = <-faults:
	case o := <-got:
		hist.collect()
		for _, kw := range hist.watch().all() {
			t.Logf("rev %d %q %v after the ghost's write", kw.rev, kw.value, ms(kw.created.Sub(e.Created())))
		}
		t.Fatalf("Lock returned (lease %v, token %d, %v) %v after the ghost's write, before its Standby check", o.lease != nil, tokenOf(o.lease), o.err, ms(o.at.Sub(e.Created())))
	case <-time.After(5 * time.Second):
		t.Fatal("no Standby health check before the takeover")
	}
	healStart := time.Now()
	heal()
	healed := time.Now()
	o := waitOutcome(t, got, 16*time.Second, "the Lock")
	t.Logf("fault %v after the ghost's write; healed %v after the fault (took %v); Lock returned %v after the fault: lease %v, err %v",
		ms(at.Sub(e.Created())), ms(healed.Sub(at)), ms(healed.Sub(healStart)), ms(o.at.Sub(at)), o.lease != nil, o.err)
	if o.err != nil {
		t.Fatalf("Lock (ctx 15s) failed across the fault: %v", o.err)
	}
	defer func() { _ = o.lease.Release(context.Background()) }()
	hist.collect()
	var w keyWrite
	for _, kw := range hist.watch().all() {
		if kw.rev == o.lease.Token() {
			w = kw
		}
	}
	if !strings.HasPrefix(w.value, "taker") {
		t.Fatalf("the lease's token %d is not a write of the taker's in the key's history (%q)", o.lease.Token(), w.value)
	}
	t.Logf("the takeover write rev %d stored %v after the fault, %v after the ghost's; Lock returned %v after it", w.rev, ms(w.created.Sub(at)), ms(w.created.Sub(e.Created())), ms(o.at.Sub(w.created)))
	if d := w.created.Sub(e.Created()); d < T-10*time.Millisecond {
		t.Errorf("the taker took the key %v after the ghost's write, before T = %v", ms(d), T)
	}
	if !w.created.After(at) {
		t.Errorf("the takeover write landed before the fault: the path was not exercised")
	}
	if d := o.at.Sub(w.created); d < testC*testR-10*time.Millisecond {
		t.Errorf("Lock returned %v after its takeover write was stored, before C·R = %v", ms(d), testC*testR)
	}
}

// TestTakeoverResentAcrossServerRestart: ConnectOptions: "natsputex sends
// such a write again itself once the connection is back, while the write's
// own bound lasts"; C is "counted from the answer to its takeover write
// (which may land well after it was begun, when it waited for a reconnect)".
// A key written by hand ("ghost"); a client on ConnectOptions (R = 100ms, F
// = 3, C = 1) waits in Lock; its Standby health check, run before the
// takeover write, shuts the NATS server (nats-server on PATH, file storage)
// down and returns once nats.go reconnects; the server is started again at
// once. Lock must return the lease: its write stored after the shutdown, T
// after the ghost's, Lock returning C·R after it.
func TestTakeoverResentAcrossServerRestart(t *testing.T) {
	srv, url, bucket, key := binaryEnv(t, "restart")
	nc, js, err := connect(url, natsputex.ConnectOptions()...)
	if err != nil {
		t.Fatal(err)
	}
	kv := mustBucket(t, url, bucket)
	takeAcrossFault(t, nc, js, kv, newHistoryLog(t, url, bucket, key), bucket, key, srv.Shutdown, func() {
		if err := srv.Restart(); err != nil {
			t.Fatal(err)
		}
	})
}

// TestResentWriteIntoWipedBucket: ConnectOptions: a refused write is sent again
// once the connection is back; package doc: a key that vanishes (the
// bucket made again, a memory bucket whose servers restarted) "is not free
// at once to a caller that saw it before: a waiting call, or a running
// Supervisor, that saw the key counts it as held for T ... and takes it
// only after T of silence and C·R of confirmation"; "The old holder's next
// renewal fails (a write at its revision, which the new bucket does not
// have), so it learns within R". node-a (a Supervisor, R = 100ms, F = 10,
// C = 1) is active and its client holds a Locker lease ("job"); node-b
// stands by and another client waits in Lock for "job" (backoff 20s, so
// that no poll runs while nats.go reconnects: see
// TestWaitingLockAcrossLinkCut).
//   - remade-behind-cut (local server, memory bucket): node-a's link is
//     cut halfway between two renewals, the bucket deleted and made again
//     meanwhile, the link restored 250ms after the cut: node-a's renewals,
//     refused while it reconnected and sent again into the new bucket,
//     must be refused there.
//   - memory-restart (nats-server on PATH, memory bucket): the server is
//     restarted (it comes back without the bucket) and the bucket made
//     again at once, every client reconnecting.
//
// In both: node-a's Stop and the lease's end must come within R (+60ms)
// of its reconnect (or before); no write of node-a's or of the lease's
// may land in the new bucket before another's; node-b and the waiter take
// the keys only T after node-a's and the lease's last writes in the old
// bucket (the old lease's token never written in the new one), the
// waiter's lease granted only once the old one ended; the services never
// overlap. (Tokens start from 1 again in the new bucket: documented.)
func TestResentWriteIntoWipedBucket(t *testing.T) {
	const (
		F = 10
		T = F * testR
	)
	for _, mode := range []string{"remade-behind-cut", "memory-restart"} {
		t.Run(mode, func(t *testing.T) {
			var url, aURL, bucket, key string
			var srv *natsenv.Server
			var l *link
			if mode == "memory-restart" {
				checkLeaks(t)
				srv = natsenv.StartBinaryServer(t)
				url, bucket, key = srv.URL(), uniqueBucket("wipe"), "spof-service"
				prepareBucket(t, url, bucket, natsputex.WithStorage(jetstream.MemoryStorage))
				aURL = url
			} else {
				url, bucket, key = localEnv(t)
				l = dialLink(t, url)
				aURL = "nats://" + l.proxy.Addr()
			}
			old := map[string]*keyWatch{key: watchWrites(t, url, bucket, key), "job": watchWrites(t, url, bucket, "job")}
			h := contracttest.NewHistory(1)
			opts := []natsputex.Option{natsputex.WithFailureThreshold(F)}
			a, b := activeAndStandby(t, aURL, url, bucket, key, h, 20*time.Millisecond, opts...)
			lease, err := a.c.Locker().TryLock(context.Background(), "job")
			if err != nil {
				t.Fatal(err)
			}
			endedAt := make(chan time.Time, 1)
			go func() { <-lease.Context().Done(); endedAt <- time.Now() }()
			token := writeAt(t, old["job"], lease.Token()).value
			wnc, wjs, err := connect(url, natsputex.ConnectOptions()...)
			if err != nil {
				t.Fatal(err)
			}
			waiter := newClientOn(t, wnc, wjs, bucket, append(opts, natsputex.WithHolderID("waiter"), natsputex.WithBackoff(locks.Backoff{Min: 20 * time.Second, Max: 20 * time.Second}))...)
			wctx, wcancel := context.WithTimeout(context.Background(), 15*time.Second)
			defer wcancel()
			waiting := goLock(wctx, waiter.Locker(), "job", false)
			time.Sleep(3 * testR)
			// R (and the old flat slack) after the connection is back,
			// plus a round trip and the scheduler's stalls until the
			// checks (a CI run: 199ms against R plus a flat 60ms).
			bound := contracttest.MeasureBound(t, testR+timingSlack, wnc.Flush).Watched(t)
			var fault time.Time
			var fresh map[string]*keyWatch
			remake := func() {
				deleteBucket(url, bucket)
				prepareBucket(t, url, bucket, natsputex.WithStorage(jetstream.MemoryStorage))
				fresh = map[string]*keyWatch{key: watchWrites(t, url, bucket, key), "job": watchWrites(t, url, bucket, "job")}
			}
			if mode == "memory-restart" {
				fault = afterRenewal(t, old[key], "node-a", testR/2, func() {
					if err := srv.Restart(); err != nil {
						t.Fatal(err)
					}
					remake()
				})
			} else {
				fault = cutAfterRenewal(t, old[key], "node-a", l.proxy.Cut)
				waitFor(t, 2*time.Second, "node-a's connection reconnects", a.nc.IsReconnecting)
				remake()
				time.Sleep(time.Until(fault.Add(250 * time.Millisecond)))
				l.proxy.Restore()
			}
			waitFor(t, 3*time.Second, "node-a's connection is back", a.nc.IsConnected)
			back := time.Now()
			lastA, _ := old[key].lastBy("node-a", fault)
			lastL, _ := old["job"].lastBy(token, fault)
			waitFor(t, 3*time.Second, "node-a stops", func() bool { _, ok := a.firstStopAfter(fault); return ok })
			var ended time.Time
			select {
			case ended = <-endedAt:
			case <-time.After(3 * time.Second):
				t.Fatal("the lease did not end")
			}
			stop, _ := a.firstStopAfter(fault)
			w := waitOutcome(t, waiting, 10*time.Second, "the waiter's Lock")
			relocked := false
			if mode == "memory-restart" && errors.Is(w.err, jetstream.ErrStreamNotFound) {
				// The waiter read the key between the restart and the
				// bucket's remaking (the Lock fails then, as documented
				// for a bucket that is gone): it asks again, a new call
				// that never saw the old key, and may take it at once.
				t.Logf("the waiter's Lock met the bucket gone: %v; locking again", w.err)
				w = waitOutcome(t, goLock(wctx, waiter.Locker(), "job", false), 10*time.Second, "the waiter's second Lock")
				relocked = true
			}
			if w.err != nil {
				t.Fatalf("the waiter's Lock: %v", w.err)
			}
			defer func() { _ = w.lease.Release(context.Background()) }()
			if w.at.Before(ended) {
				t.Errorf("the waiter got the lease %v before the old lease ended", ms(ended.Sub(w.at)))
			}
			waitActiveNode(t, 5*time.Second, a, b)
			time.Sleep(T + testC*testR)
			stopNodes(a, b)
			t.Logf("%s: back %v after the fault; node-a's Stop %v after it, the lease ended %v after it (%v)", mode, ms(back.Sub(fault)), ms(stop.begin.Sub(back)), ms(ended.Sub(back)), context.Cause(lease.Context()))
			bound.Check(t, "node-a's Stop after its connection was back", stop.begin.Sub(back))
			bound.Check(t, "the lease's end after its connection was back", ended.Sub(back))
			if !errors.Is(context.Cause(lease.Context()), locks.ErrLost) {
				t.Errorf("the lease ended with %v, not ErrLost", context.Cause(lease.Context()))
			}
			for k, lastOld := range map[string]keyWrite{key: lastA, "job": lastL} {
				ws := fresh[k].all()
				for i, fw := range ws {
					t.Logf("  new bucket %q: rev %d %q %v after the old holder's last write", k, fw.rev, fw.value, ms(fw.created.Sub(lastOld.created)))
					if i > 3 {
						break
					}
				}
				if len(ws) == 0 {
					t.Errorf("nothing was written to %q in the new bucket", k)
					continue
				}
				for _, fw := range ws {
					if fw.value == lastOld.value && fw.created.Before(lastOld.created.Add(T)) {
						t.Errorf("the old holder's %q was written in the new bucket (rev %d) %v after its last write in the old one: a write sent again into the new bucket landed", fw.value, fw.rev, ms(fw.created.Sub(lastOld.created)))
					}
				}
				if d := ws[0].created.Sub(lastOld.created); d < T-10*time.Millisecond && !(k == "job" && relocked) {
					t.Errorf("%q was taken in the new bucket (rev %d %q) %v after the old holder's last write, before T = %v", k, ws[0].rev, ws[0].value, ms(d), T)
				}
			}
			if err := h.Check(); err != nil {
				t.Errorf("services overlapped: %v", err)
			}
		})
	}
}

// TestLostMemoryBucketKeepsHolderT: a memory-stored bucket
// (WithStorage) is lost when its server restarts ("a memory-stored bucket
// whose servers all restarted counts from 1 again"), and New on any
// client makes it again, empty, while the agents keep running. node-a
// (R = 400ms, F = 3) takes the key again (node-b's health check fails
// meanwhile); node-b (R = 50ms, F = 2), healthy again, and node-c, started
// after the bucket was lost, must wait for node-a's T, and node-b and
// node-c for each other's. (Failed before the fix: agents advertised
// their timing in keys of their own, lost with the bucket, and node-a did
// not advertise again, so node-b and node-c went by their own T; and the
// waiters' silence clocks ignored the new bucket's revisions, lower than
// the old ones, as stale, so node-b took node-c's key 3–40ms after its
// write. Now the timing is in the supervised key's value, and a clock
// restarts on any change of revision.)
func TestLostMemoryBucketKeepsHolderT(t *testing.T) {
	for _, C := range []int{1, 0} {
		t.Run(fmt.Sprintf("C=%d", C), func(t *testing.T) { timingLostWithMemoryBucket(t, C) })
	}
}

func timingLostWithMemoryBucket(t *testing.T, C int) {
	srv := natsenv.StartServer(t)
	url := srv.URL()
	bucket := uniqueBucket("memtiming")
	prepareBucket(t, url, bucket, natsputex.WithStorage(jetstream.MemoryStorage))
	const key = "spof-service"
	h := contracttest.NewHistory(1)
	hbc := h
	a := startAgent(t, url, bucket, key, "node-a", h, withClientOptions(natsputex.WithRenewInterval(400*time.Millisecond), natsputex.WithFailureThreshold(3), natsputex.WithConfirmations(C)))
	waitFor(t, 5*time.Second, "node-a starts its service", a.running)
	b := startAgent(t, url, bucket, key, "node-b", hbc, withClientOptions(natsputex.WithRenewInterval(50*time.Millisecond), natsputex.WithFailureThreshold(2), natsputex.WithConfirmations(C)))
	time.Sleep(time.Second)
	if err := h.Check(); err != nil {
		t.Fatalf("overlap before the restart: %v", err)
	}
	if err := hbc.Check(); err != nil {
		t.Fatalf("overlap before the restart: %v", err)
	}
	var writes *keyWatch
	b.failHC.Store(true)
	if err := srv.Restart(); err != nil {
		t.Fatal(err)
	}
	prepareBucket(t, url, bucket, natsputex.WithStorage(jetstream.MemoryStorage))
	writes = watchWrites(t, url, bucket, key)
	waitFor(t, 10*time.Second, "node-a starts its service again", func() bool {
		a.mu.Lock()
		defer a.mu.Unlock()
		return len(a.started) > 1 && a.exit != nil
	})
	kv := mustBucket(t, url, bucket)
	keys, _ := kv.ListKeys(context.Background())
	var all []string
	for k := range keys.Keys() {
		all = append(all, k)
	}
	t.Logf("node-a active again; keys in the new bucket: %v", all)
	b.failHC.Store(false)
	time.Sleep(time.Second)
	// A node that joins now (node-c, R = 50ms, F = 2) has seen no timing
	// of node-a's before the bucket was lost.
	c := startAgent(t, url, bucket, key, "node-c", hbc, withClientOptions(natsputex.WithRenewInterval(50*time.Millisecond), natsputex.WithFailureThreshold(2), natsputex.WithConfirmations(C)))
	time.Sleep(1500 * time.Millisecond)
	for _, ag := range []*agent{a, b, c} {
		ag.stop()
		ag.mu.Lock()
		t.Logf("%s started %d time(s)", ag.name, len(ag.started))
		ag.mu.Unlock()
	}
	writes.mu.Lock()
	ws := append([]keyWrite(nil), writes.writes...)
	writes.mu.Unlock()
	for i := 1; i < len(ws); i++ {
		prev, w := ws[i-1], ws[i]
		if w.value == "" || prev.value == "" || w.value == prev.value {
			continue
		}
		T := 100 * time.Millisecond // node-b's and node-c's
		if prev.value == "node-a" {
			T = 1200 * time.Millisecond
		}
		gap := w.created.Sub(prev.created)
		t.Logf("rev %d %q took over rev %d %q %v after it (the holder's T = %v)", w.rev, w.value, prev.rev, prev.value, gap.Round(time.Millisecond), T)
		if gap < T {
			t.Errorf("rev %d %q took over rev %d %q %v after it, before T = %v", w.rev, w.value, prev.rev, prev.value, gap.Round(time.Millisecond), T)
		}
	}
	if err := h.Check(); err != nil {
		t.Errorf("two services ran at once: %v", err)
	}
}

// TestServerRestartMidTakeover: a live holder renewing, a waiting Lock
// and a TryLock loop on one name of a file-stored bucket; the server is
// shut down for 0, T/2, T and 2T and started again, each time around the
// moment a takeover may happen. Every grant is checked: no lease is live
// when another is granted, and tokens rise in grant order.
func TestServerRestartMidTakeover(t *testing.T) {
	srv := natsenv.StartServer(t)
	url := srv.URL()
	bucket := uniqueBucket("restart")
	prepareBucket(t, url, bucket, natsputex.WithStorage(jetstream.FileStorage))
	g := newGrants()
	ctx, cancel := context.WithTimeout(context.Background(), 40*time.Second)
	defer cancel()
	stop := make(chan struct{})
	var wg sync.WaitGroup
	// Three clients, each alternating Lock (hold 250ms, so that others
	// wait and take over) and TryLock.
	for i := range 3 {
		c := newTestClient(t, url, bucket, natsputex.WithHolderID(fmt.Sprintf("c%d", i)))
		wg.Add(1)
		go func() {
			defer wg.Done()
			for n := 0; ; n++ {
				select {
				case <-stop:
					return
				default:
				}
				lctx, lcancel := context.WithTimeout(ctx, 2*time.Second)
				var l locks.Lease
				var err error
				if n%2 == 0 {
					l, err = c.Locker().Lock(lctx, "job")
				} else {
					l, err = c.Locker().TryLock(lctx, "job")
				}
				lcancel()
				if err != nil {
					time.Sleep(20 * time.Millisecond)
					continue
				}
				g.grant(fmt.Sprintf("c%d", i), l)
				select {
				case <-l.Context().Done():
				case <-time.After(250 * time.Millisecond):
				}
				_ = l.Release(context.Background())
			}
		}()
	}
	T := testF * testR
	for _, down := range []time.Duration{0, T / 2, T, 2 * T} {
		time.Sleep(700 * time.Millisecond)
		srv.Shutdown()
		time.Sleep(down)
		if err := srv.Restart(); err != nil {
			t.Fatal(err)
		}
	}
	time.Sleep(time.Second)
	close(stop)
	wg.Wait()
	g.mu.Lock()
	n := len(g.leases)
	g.mu.Unlock()
	t.Logf("%d grants", n)
	g.check(t)
}

// TestBucketMadeAgainUnderSupervisors: the bucket is deleted and made
// again (New makes a missing one; the docs mention this case only for
// fencing tokens, which count from 1 again) while two agents with the same
// timing (R = 100ms, F = 3) run. node-b finds the key free in the new
// bucket and starts at once, while node-a's hold, from its last write in
// the old bucket, is still valid and its service runs until its next
// renewal fails: "at most one runs the service at a time". Also checked:
// every takeover in the new bucket comes T or more after the last write.
func TestBucketMadeAgainUnderSupervisors(t *testing.T) {
	for _, C := range []int{1, 0} {
		t.Run(fmt.Sprintf("C=%d", C), func(t *testing.T) {
			url, bucket, key := supervisorEnv(t)
			kv := mustBucket(t, url, bucket)
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			for i := range 50 { // revisions well above what the new bucket reaches
				if _, err := kv.Put(ctx, "filler", []byte(fmt.Sprint(i))); err != nil {
					t.Fatal(err)
				}
			}
			h := contracttest.NewHistory(1)
			a := startAgent(t, url, bucket, key, "node-a", h, withClientOptions(natsputex.WithConfirmations(C)))
			waitFor(t, 5*time.Second, "node-a starts its service", a.running)
			b := startAgent(t, url, bucket, key, "node-b", h, withClientOptions(natsputex.WithConfirmations(C)))
			time.Sleep(500 * time.Millisecond)
			deleteBucket(url, bucket)
			prepareBucket(t, url, bucket)
			writes := watchWrites(t, url, bucket, key)
			time.Sleep(2 * time.Second)
			a.stop()
			b.stop()
			writes.mu.Lock()
			ws := append([]keyWrite(nil), writes.writes...)
			writes.mu.Unlock()
			bad := 0
			for i := 1; i < len(ws); i++ {
				prev, w := ws[i-1], ws[i]
				if w.value == "" || prev.value == "" || w.value == prev.value {
					continue
				}
				gap := w.created.Sub(prev.created)
				t.Logf("rev %d %q took over rev %d %q %v after it", w.rev, w.value, prev.rev, prev.value, gap.Round(time.Millisecond))
				if gap < testF*testR {
					bad++
					t.Errorf("rev %d %q took over rev %d %q %v after it, before T = %v", w.rev, w.value, prev.rev, prev.value, gap.Round(time.Millisecond), testF*testR)
				}
			}
			if err := h.Check(); err != nil {
				t.Errorf("services overlapped: %v", err)
			}
		})
	}
}

// TestSupervisorServerRestart: across restarts of the NATS server (file
// storage: the key survives), down for 0, T and 2T, two agents never run
// the service at once, and one runs it again within T + C·R + 3R + 1s of
// the server's return.
func TestSupervisorServerRestart(t *testing.T) {
	// Goroutines running now are not the test's; IgnoreCurrent must be
	// taken now, not in the cleanup, where it would ignore every leak.
	ignore := goleak.IgnoreCurrent()
	t.Cleanup(func() { goleak.VerifyNone(t, append(natsenv.ConsumerGoroutines(), ignore)...) })
	srv := natsenv.StartServer(t)
	url := srv.URL()
	bucket := uniqueBucket("suprestart")
	prepareBucket(t, url, bucket, natsputex.WithStorage(jetstream.FileStorage))
	const key = "spof-service"
	h := contracttest.NewHistory(1)
	agents := []*agent{
		startAgent(t, url, bucket, key, "node-a", h),
		startAgent(t, url, bucket, key, "node-b", h),
	}
	waitActive(t, 5*time.Second, agents...)
	for round := range 3 {
		time.Sleep(3 * testR)
		down := time.Now()
		srv.Shutdown()
		// Down for longer than a hold lasts: the active agent stops its
		// service, and the other's takeover clock runs out.
		time.Sleep(time.Duration(round) * testF * testR)
		if err := srv.Restart(); err != nil {
			t.Fatal(err)
		}
		back := time.Now()
		active := waitActive(t, (testF+testC+3)*testR+time.Second, agents...)
		t.Logf("round %d: the server was down %v; %s runs the service %v after it was back", round, back.Sub(down).Round(time.Millisecond), active.name, time.Since(back).Round(time.Millisecond))
	}
	for _, a := range agents {
		a.stop()
	}
	if err := h.Check(); err != nil {
		t.Fatalf("services overlapped: %v", err)
	}
}
