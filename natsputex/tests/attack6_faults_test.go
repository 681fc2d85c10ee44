package natsputex_test

// Attack round 6, continued (see attack6_test.go): the writing-first
// renewal across NATS server restarts, stream leader changes on a
// cluster, a natslock process paused across a renewal, and the bucket
// deleted and made again.

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/goleak"

	"github.com/latchkey-go/latchkey/contracttest"
	"github.com/latchkey-go/latchkey/contracttest/testenv/natsenv"
	"github.com/latchkey-go/latchkey/natsputex"
)

// historyLog gathers a key's writes from its bucket's history (64 values)
// read now and then, so that a test sees them all across server restarts
// and leader changes that a watch may not survive.
type historyLog struct {
	t                *testing.T
	url, bucket, key string
	byRev            map[uint64]keyWrite
}

func newHistoryLog(t *testing.T, url, bucket, key string) *historyLog {
	return &historyLog{t: t, url: url, bucket: bucket, key: key, byRev: map[uint64]keyWrite{}}
}

func (l *historyLog) collect() {
	for _, w := range keyHistory(l.t, l.url, l.bucket, l.key).all() {
		l.byRev[w.rev] = w
	}
}

// watch returns what was collected as a keyWatch, in revision order.
func (l *historyLog) watch() *keyWatch {
	w := &keyWatch{}
	for _, kw := range l.byRev {
		w.writes = append(w.writes, kw)
	}
	slices.SortFunc(w.writes, func(a, b keyWrite) int { return int(a.rev) - int(b.rev) })
	return w
}

// checkLeaks6 fails t if goroutines started during it outlive it (but
// for the servers' consumers).
func checkLeaks6(t *testing.T) {
	ignore := goleak.IgnoreCurrent()
	t.Cleanup(func() { goleak.VerifyNone(t, append(natsenv.ConsumerGoroutines(), ignore)...) })
}

// binaryEnv6 starts a server of the nats-server program on PATH (see
// natsenv.Binary) and makes a bucket on it with a history of 64 values.
func binaryEnv6(t *testing.T, prefix string) (srv *natsenv.Server, url, bucket, key string) {
	t.Helper()
	checkLeaks6(t)
	srv = natsenv.StartBinaryServer(t)
	url, bucket = srv.URL(), uniqueBucket(prefix)
	historyBucket(t, url, bucket)
	return srv, url, bucket, "spof-service"
}

// afterRenewal waits for a write of token that a watch delivered less than
// 5ms ago, sleeps offset and calls f; it returns the time f was called.
func afterRenewal(t *testing.T, writes *keyWatch, token string, offset time.Duration, f func()) time.Time {
	t.Helper()
	var at time.Time
	waitFor(t, 5*time.Second, "a renewal of "+token, func() bool {
		w, ok := writes.lastBy(token, time.Now())
		if !ok || time.Since(w.seen) > 5*time.Millisecond {
			return false
		}
		time.Sleep(offset)
		at = time.Now()
		f()
		return true
	})
	return at
}

// TestAttack6ServerRestart: the NATS server (a process of the nats-server
// on PATH, 2.9.10 on the reference machine; file storage) is restarted
// while node-a or node-b (R = 100ms, F = 3, C = 2, on ConnectOptions) is
// active: at once, a quarter and three quarters of an interval after one
// of its renewals, then down for 2T from halfway through an interval.
// A renewal sent as the server goes away may land with its answer lost,
// and the next one is made at the agent's last revision. One agent must
// be active within 10s of each restart, every takeover come T after
// another token's write and start C·R after its first write
// (checkTakeovers), and the services never overlap.
func TestAttack6ServerRestart(t *testing.T) {
	const (
		C = 2
		T = testF * testR
	)
	srv, url, bucket, key := binaryEnv6(t, "atk6restart")
	hist := newHistoryLog(t, url, bucket, key)
	h := contracttest.NewHistory(1)
	opts := []natsputex.Option{natsputex.WithConfirmations(C)}
	a := startNode5(t, url, bucket, key, "node-a", "node-a", h, true, opts...)
	b := startNode5(t, url, bucket, key, "node-b", "node-b", h, true, opts...)
	for _, n := range []*node4{a, b} {
		n.stopDelay.Store(int64(20 * time.Millisecond))
	}
	for i, tc := range []struct{ offset, down time.Duration }{{0, 0}, {testR / 4, 0}, {3 * testR / 4, 0}, {testR / 2, 2 * T}} {
		up := waitActive4(t, 10*time.Second, a, b)
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
		next := waitActive4(t, 10*time.Second, a, b)
		t.Logf("restart %d, %v after a renewal of %s's, down %v: %s active %v after the restart began", i, tc.offset, up.name, tc.down, next.name, time.Since(at).Round(time.Millisecond))
		time.Sleep(T + C*testR + 3*testR)
		hist.collect()
	}
	stopNodes(a, b)
	hist.collect()
	writes := hist.watch()
	for _, n := range []*node4{a, b} {
		t.Logf("%s: %d starts, %d stops", n.name, len(n.getStarts()), len(n.getStops()))
		checkTakeovers(t, writes, n, T, C*testR)
	}
	if err := h.Check(); err != nil {
		t.Errorf("services overlapped: %v", err)
	}
}

// TestAttack6RestartKeepsHold: ConnectOptions reconnects "every 100 ms
// with up to 100 ms of jitter ... rather than nats.go's 2 s, which alone
// is longer than T − margin with a short T, so that a holder whose server
// restarted renews again in time"; "While the connection is down, holders
// cannot renew: one cut off for T − margin loses its lease (ErrLost), as
// in a partition". node-a (R = 100ms, F = 20: T = 2s, T − margin = 1.95s)
// is active and its client holds a Locker lease ("job"); the NATS server
// (nats-server on PATH, file storage) is restarted three times, each down
// for a few milliseconds, a quarter, half and three quarters of an
// interval after one of node-a's renewals. The connection is back well
// within T − margin each time: node-a's service must never stop and the
// lease must stay live.
func TestAttack6RestartKeepsHold(t *testing.T) {
	const F = 20
	srv, url, bucket, key := binaryEnv6(t, "atk6keep")
	h := contracttest.NewHistory(1)
	a := startNode5(t, url, bucket, key, "node-a", "node-a", h, true, natsputex.WithFailureThreshold(F))
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

// TestAttack6ClusterLeaderChange: an embedded 3-node cluster (the
// nats-server library, 2.11; the nats-server 2.9.10 on PATH is older than
// MinClusterVersion, so New refuses an R3 bucket on it) with an R3 bucket.
// node-a and node-b (R = 100ms, F = 3, C = 2, on ConnectOptions, each
// connected to all the nodes) on one key; the active agent's client also
// holds a Locker lease. The bucket's stream leader is asked to step down
// three times, at 0, R/3 and 2R/3 after a renewal of the active agent's,
// then the leader node is shut down mid-interval. Writes in flight across
// a leader change may be answered late or not at all, and the next
// renewal is made at the agent's last revision. The Locker lease is
// never live past its Deadline; every takeover comes T after another
// token's write and starts C·R after its first write; one agent is active
// again within 15s of each change; the services never overlap.
func TestAttack6ClusterLeaderChange(t *testing.T) {
	const (
		C = 2
		T = testF * testR
	)
	if testing.Short() {
		t.Skip("starts a 3-node cluster")
	}
	checkLeaks6(t)
	cluster := natsenv.StartCluster(t, 3)
	urls := cluster.URLs()
	servers := cluster.Servers()
	bucket := uniqueBucket("atk6cluster")
	js := mustJS(t, urls)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: bucket, History: 64, Replicas: 3}); err != nil {
		t.Fatal(err)
	}
	const key = "spof-service"
	hist := newHistoryLog(t, urls, bucket, key)
	h := contracttest.NewHistory(1)
	conn := natsputex.ConnectOptions()
	var nodes []*node4
	for _, name := range []string{"node-a", "node-b"} {
		n := startNodeConn(t, conn, urls, bucket, key, name, name, h, true, natsputex.WithConfirmations(C), natsputex.WithHolderID("client-"+name))
		n.stopDelay.Store(int64(20 * time.Millisecond))
		nodes = append(nodes, n)
	}
	up := waitActive4(t, 10*time.Second, nodes...)
	v := watchValidity(t)
	lease, err := up.c.Locker().TryLock(ctx, "job")
	if err != nil {
		t.Fatal(err)
	}
	v.add(up.name+" job", lease)
	for i, offset := range []time.Duration{0, testR / 3, 2 * testR / 3} {
		up = waitActive4(t, 15*time.Second, nodes...)
		writes := watchWrites(t, urls, bucket, key)
		time.Sleep(3 * testR)
		at := afterRenewal(t, writes, up.name, offset, func() {
			if err := stepDown(ctx, js.Conn(), "KV_"+bucket); err != nil {
				t.Logf("step-down %d: %v", i, err)
			}
		})
		next := waitActive4(t, 15*time.Second, nodes...)
		t.Logf("step-down %d, %v after a renewal of %s's: %s active %v after it; the lease: %v", i, offset, up.name, next.name, time.Since(at).Round(time.Millisecond), context.Cause(lease.Context()))
		time.Sleep(T + C*testR + 3*testR)
		hist.collect()
	}
	up = waitActive4(t, 15*time.Second, nodes...)
	leader := bucketLeader(t, urls, bucket, servers, -1)
	writes := watchWrites(t, urls, bucket, key)
	time.Sleep(3 * testR)
	at := afterRenewal(t, writes, up.name, testR/2, func() { cluster.Stop(leader) })
	next := waitActive4(t, 15*time.Second, nodes...)
	t.Logf("stream leader %s shut down halfway between two renewals of %s's: %s active %v after it", servers[leader].Name(), up.name, next.name, time.Since(at).Round(time.Millisecond))
	time.Sleep(T + C*testR + 3*testR)
	stopNodes(nodes...)
	hist.collect()
	_ = lease.Release(context.Background())
	v.check(t)
	for _, n := range nodes {
		checkTakeovers(t, hist.watch(), n, T, C*testR)
	}
	if err := h.Check(); err != nil {
		t.Errorf("services overlapped: %v", err)
	}
}

// overlapsNatslock fails t if one of n's services (in-process, recorded
// in its Start and Stop calls) was up when p's (natslock, timed by its
// service commands) started, or the other way round.
func overlapsNatslock(t *testing.T, p *lockProc, n *node4) {
	t.Helper()
	evs := p.events(t)
	upAt := func(at time.Time) bool {
		up := false
		for _, e := range evs {
			if e.at.After(at) {
				break
			}
			up = e.kind == "start"
		}
		return up
	}
	stops := n.getStops()
	for _, st := range n.getStarts() {
		if upAt(st.begin) {
			t.Errorf("%s started its service at %s while %s's was up", n.name, st.begin.Format("15:04:05.000"), p.name)
		}
		for _, e := range evs {
			if e.kind != "start" || e.at.Before(st.begin) {
				continue
			}
			i := slices.IndexFunc(stops, func(s call4) bool { return s.begin.After(st.begin) })
			if i < 0 || stops[i].end.After(e.at) {
				t.Errorf("%s started its service at %s while %s's, started at %s, was up", p.name, e.at.Format("15:04:05.000"), n.name, st.begin.Format("15:04:05.000"))
			}
			break
		}
	}
}

// TestAttack6NatslockPaused: natslock (-r 100ms -f 5 -c 1: T = 500ms,
// margin 50ms, so its hold lasts 450ms from the start of its last
// successful write) is active; node-b (in-process, F = 5) stands by. It
// is paused with SIGSTOP right after one of its renewals, across the next:
//   - 250ms (inside its hold): nothing happens; it renews once resumed,
//     its service runs on, no other agent writes the key.
//   - 470ms (past its hold, short of T): "A holder that cannot renew ends
//     its lease by itself at the start of its last successful write plus
//     T minus a safety margin"; resumed, it must run its stop command
//     (within 300ms) whoever holds the key, before any start; the
//     services never overlap.
//   - 1.2s (past T): node-b takes over; "its lease's context then ends at
//     once": resumed, node-a must run its stop command within 500ms, never
//     write the key nor start again, and its log must name node-b.
func TestAttack6NatslockPaused(t *testing.T) {
	requireNanoDate(t)
	if testing.Short() {
		t.Skip("builds and runs natslock")
	}
	bin := buildNatslock(t)
	for _, tc := range []struct {
		name  string
		pause time.Duration
	}{{"inside-hold", 250 * time.Millisecond}, {"past-hold-short-of-T", 470 * time.Millisecond}, {"past-T", 1200 * time.Millisecond}} {
		t.Run(tc.name, func(t *testing.T) {
			url, bucket, key := atk4Env(t)
			writes := watchWrites(t, url, bucket, key)
			h := contracttest.NewHistory(1)
			a := startNatslock(t, bin, url, bucket, key, "node-a", "-r", "100ms", "-f", "5", "-c", "1")
			waitFor(t, 10*time.Second, "node-a starts its service", func() bool { return a.lastState() == "start" })
			b := startNode4(t, url, bucket, key, "node-b", "node-b", h, true, natsputex.WithFailureThreshold(5))
			b.stopDelay.Store(int64(20 * time.Millisecond))
			waitFor(t, 5*time.Second, "node-b is standby", func() bool {
				return b.sawEvent(func(e natsputex.Event) bool { return e.Holder == "node-a" })
			})
			time.Sleep(3 * testR)
			paused := afterRenewal(t, writes, "node-a", 0, func() {
				if err := a.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
					t.Fatal(err)
				}
			})
			last, _ := writes.lastBy("node-a", paused)
			time.Sleep(time.Until(paused.Add(tc.pause)))
			logged := len(a.logs())
			resumed := time.Now()
			if err := a.cmd.Process.Signal(syscall.SIGCONT); err != nil {
				t.Fatal(err)
			}
			time.Sleep(1500 * time.Millisecond)
			b.cancel()
			b.wait(5 * time.Second)
			var stop serviceEvent
			for _, e := range a.events(t) {
				if e.kind == "stop" && e.at.After(paused) {
					stop = e
					break
				}
			}
			after := a.logs()[logged:]
			stopInfo := "never"
			if !stop.at.IsZero() {
				stopInfo = stop.at.Sub(resumed).Round(time.Millisecond).String() + " after it resumed"
			}
			t.Logf("node-a paused %v, %v after its write rev %d; resumed %v after that write; its stop command ran %s",
				resumed.Sub(paused).Round(time.Millisecond), paused.Sub(last.seen).Round(time.Millisecond), last.rev,
				resumed.Sub(last.created).Round(time.Millisecond), stopInfo)
			switch tc.name {
			case "inside-hold":
				if !stop.at.IsZero() {
					t.Errorf("node-a stopped its service %v after it resumed, though its hold had %v left", stop.at.Sub(resumed).Round(time.Millisecond), last.created.Add(450*time.Millisecond).Sub(resumed).Round(time.Millisecond))
				}
				if ws := nodeWrites(writes, "node-a", resumed); len(ws) == 0 || ws[0].created.Sub(resumed) > 300*time.Millisecond {
					t.Error("node-a did not renew within 300ms of resuming")
				}
				for _, w := range writes.writesAfter(last.created) {
					if w.value != "node-a" {
						t.Errorf("%q wrote the key (rev %d) %v after node-a's last write, before T", w.value, w.rev, w.created.Sub(last.created).Round(time.Millisecond))
					}
				}
				overlapsNatslock(t, a, b)
			case "past-hold-short-of-T":
				if stop.at.IsZero() || stop.at.Sub(resumed) > 300*time.Millisecond {
					t.Errorf("node-a, resumed %v after its last write (its hold lasts 450ms), did not run its stop command within 300ms", resumed.Sub(last.created).Round(time.Millisecond))
				}
				for _, e := range a.events(t) {
					if e.kind == "start" && e.at.After(paused) && (stop.at.IsZero() || e.at.Before(stop.at)) {
						t.Errorf("node-a ran its start command %v after it resumed, before its stop command", e.at.Sub(resumed).Round(time.Millisecond))
					}
				}
				overlapsNatslock(t, a, b)
			case "past-T":
				if len(b.getStarts()) == 0 {
					t.Fatal("node-b never took over from the paused node-a")
				}
				if stop.at.IsZero() || stop.at.Sub(resumed) > 500*time.Millisecond {
					t.Errorf("node-a, resumed after node-b took over, did not run its stop command within 500ms")
				}
				for _, e := range a.events(t) {
					if e.kind == "start" && e.at.After(paused) {
						t.Errorf("node-a ran its start command %v after it resumed, while node-b held the key", e.at.Sub(resumed).Round(time.Millisecond))
					}
				}
				for _, w := range nodeWrites(writes, "node-a", resumed) {
					t.Errorf("node-a wrote the key (rev %d) %v after it resumed, while node-b held it", w.rev, w.created.Sub(resumed).Round(time.Millisecond))
				}
				if !strings.Contains(after, "holder=node-b") {
					t.Errorf("node-a's log after it resumed never names node-b, which took its key:\n%s", after)
				}
			}
		})
	}
}

// TestAttack6BucketRecreated: node-a is active and node-b stands by
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
func TestAttack6BucketRecreated(t *testing.T) {
	const (
		C      = 1
		T      = testF * testR
		margin = testR / 2
	)
	for _, gone := range []time.Duration{0, 2 * T} {
		t.Run(fmt.Sprintf("gone-%v", gone), func(t *testing.T) {
			url, bucket, key := atk4Env(t)
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
			waitActive4(t, 5*time.Second, a, b)
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
			if d := stop.begin.Sub(deleted); gone == 0 && d > testR+slack6 {
				t.Errorf("node-a began Stop %v after its bucket was deleted and made again, later than R = %v (+%v)", d.Round(time.Millisecond), testR, slack6)
			}
			if d := stop.begin.Sub(lastOld.created); d > T-margin+slack6 {
				t.Errorf("node-a began Stop %v after its last write, later than T − margin = %v (+%v)", d.Round(time.Millisecond), T-margin, slack6)
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
			for _, n := range []*node4{a, b} {
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
