package natsputex_test

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/goleak"

	"github.com/latchkey-go/latchkey/contracttest"
	"github.com/latchkey-go/latchkey/contracttest/testenv"
	"github.com/latchkey-go/latchkey/contracttest/testenv/natsenv"
	"github.com/latchkey-go/latchkey/natsputex"
)

// firstBy returns the first write seen of value token, and whether there
// is one.
func (w *keyWatch) firstBy(token string) (keyWrite, bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, kw := range w.writes {
		if kw.value == token {
			return kw, true
		}
	}
	return keyWrite{}, false
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
	a := startAgentWith(t, url, bucket, key, "node-a", "node-a", h, nil, natsputex.WithConfirmations(C), natsputex.WithFailureThreshold(F))
	waitFor(t, 5*time.Second, "node-a starts its service", a.running)
	b := startAgentWith(t, "nats://"+proxy.Addr(), bucket, key, "node-b", "node-b", h, nil, natsputex.WithConfirmations(C), natsputex.WithFailureThreshold(F))
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

// TestSupervisorDuplicateToken: agents must have distinct tokens. When
// two are given the same one, at most one runs the service: an agent that
// finds its token in the key written by someone else stops its service
// (if it runs) and says so, and one that did not write it does not start
// on it.
func TestSupervisorDuplicateToken(t *testing.T) {
	dupEvent := func(e natsputex.Event) bool { return strings.Contains(e.Msg, "same token") }

	t.Run("TwoAgents", func(t *testing.T) {
		url, bucket, key := supervisorEnv(t)
		h := contracttest.NewHistory(1)
		a := startAgentWith(t, url, bucket, key, "agent-1", "node-x", h, nil)
		waitFor(t, 5*time.Second, "agent-1 starts its service", a.running)
		b := startAgentWith(t, url, bucket, key, "agent-2", "node-x", h, nil)
		time.Sleep(3 * (testF + testC) * testR)
		waitFor(t, 2*time.Second, "an agent says its token is someone else's too", func() bool {
			return a.sawEvent(dupEvent) || b.sawEvent(dupEvent)
		})
		a.stop()
		b.stop()
		if err := h.Check(); err != nil {
			t.Fatalf("two agents with the same token ran the service at once: %v", err)
		}
	})

	t.Run("WrittenBehindItsBack", func(t *testing.T) {
		url, bucket, key := supervisorEnv(t)
		kv := mustBucket(t, url, bucket)
		a := startAgentWith(t, url, bucket, key, "agent-1", "node-x", contracttest.NewHistory(1), nil)
		waitFor(t, 5*time.Second, "agent-1 starts its service", a.running)
		time.Sleep(2 * testR)
		if _, err := kv.Put(context.Background(), key, []byte("node-x")); err != nil {
			t.Fatal(err)
		}
		took := waitFor(t, 2*testR+time.Second, "agent-1 stops its service", func() bool { return !a.running() })
		t.Logf("agent-1 stopped %v after another wrote its token", took.Round(time.Millisecond))
		waitFor(t, time.Second, "agent-1 says that someone else writes its token", func() bool { return a.sawEvent(dupEvent) })
	})
}

// TestSupervisorStopBudget: Stop gets the time the docs give it: with
// R = 100ms, F = 3, C = 6, T = 300ms, an agent that stops its service
// after a failed health check has at least margin + C·R = 650ms before a
// standby may start, so a Stop of 500ms is not cut short at T. A Stop
// that fails is not reported as done: the key is not blanked while the
// service may run, and Stop is tried again.
func TestSupervisorStopBudget(t *testing.T) {
	const C = 6
	stopped := func(e natsputex.Event) bool {
		return strings.Contains(e.Msg, "service stopped") && errors.Is(e.Err, natsputex.ErrStopFailed)
	}
	t.Run("SlowStop", func(t *testing.T) {
		url, bucket, key := supervisorEnv(t)
		h := contracttest.NewHistory(1)
		a := startAgentWith(t, url, bucket, key, "node-a", "node-a", h, nil, natsputex.WithConfirmations(C))
		waitFor(t, 5*time.Second, "node-a starts its service", a.running)
		b := startAgentWith(t, url, bucket, key, "node-b", "node-b", h, nil, natsputex.WithConfirmations(C))
		time.Sleep(3 * testR)
		a.stopHonoursCtx.Store(true)
		a.stopDelay.Store(int64(500 * time.Millisecond))
		a.failHC.Store(true)
		waitFor(t, (testF+C+2)*testR+2*time.Second, "node-b starts its service", b.running)
		if n := a.stopsCut.Load(); n > 0 {
			t.Errorf("node-a's Stop of 500ms was cut short %d time(s), though it has margin + C·R = %v", n, testR/2+C*testR)
		}
		if a.sawEvent(stopped) {
			t.Error("node-a said its service stopped though Stop failed")
		}
		a.stop()
		b.stop()
		if err := h.Check(); err != nil {
			t.Fatalf("services overlapped: %v", err)
		}
	})
	t.Run("FailedStop", func(t *testing.T) {
		url, bucket, key := supervisorEnv(t)
		h := contracttest.NewHistory(1)
		a := startAgentWith(t, url, bucket, key, "node-a", "node-a", h, nil, natsputex.WithConfirmations(C))
		waitFor(t, 5*time.Second, "node-a starts its service", a.running)
		b := startAgentWith(t, url, bucket, key, "node-b", "node-b", h, nil, natsputex.WithConfirmations(C))
		time.Sleep(3 * testR)
		a.failStop.Store(true)
		a.failHC.Store(true)
		waitFor(t, 2*time.Second, "node-a tries to stop its service", func() bool { return a.stopCalls.Load() > 1 })
		time.Sleep(2 * testR)
		a.failStop.Store(false) // the next attempt works
		waitFor(t, 2*time.Second, "node-a stops its service", func() bool { return !a.running() })
		waitFor(t, (testF+C+2)*testR+2*time.Second, "node-b starts its service", b.running)
		if n := a.stopCalls.Load(); n < 3 {
			t.Errorf("node-a called Stop %d times: a failed Stop was not tried again", n)
		}
		if a.sawEvent(stopped) {
			t.Error("node-a said its service stopped though Stop failed")
		}
		a.stop()
		b.stop()
		if err := h.Check(); err != nil {
			t.Fatalf("services overlapped: %v", err)
		}
	})
}

// TestSupervisorStartFailsYields: an agent whose Start keeps failing
// leaves the key it blanks to the others: a healthy agent whose health
// check takes 150ms (longer than a stroke of the failing agent, R =
// 100ms) starts its service within 2·T + 1s of starting, every time.
func TestSupervisorStartFailsYields(t *testing.T) {
	const bound = 2*testF*testR + time.Second
	for round := range 3 {
		url, bucket, key := supervisorEnv(t)
		h := contracttest.NewHistory(1)
		a := startAgentWith(t, url, bucket, key, "node-a", "node-a", h, func(a *agent) { a.failStart.Store(true) })
		waitFor(t, 5*time.Second, "node-a's Start fails", func() bool { return a.startFailures.Load() > 0 })
		b := startAgentWith(t, url, bucket, key, "node-b", "node-b", h, func(b *agent) { b.hcDelay.Store(int64(150 * time.Millisecond)) })
		took := waitFor(t, bound, "the healthy node-b starts its service", b.running)
		t.Logf("round %d: node-b started its service %v after it began (node-a's Start failed %d time(s))", round, took.Round(time.Millisecond), a.startFailures.Load())
		a.stop()
		b.stop()
		if err := h.Check(); err != nil {
			t.Fatalf("services overlapped: %v", err)
		}
	}
}

// TestSupervisorStartGetsToken: Start is given the hold's fencing token,
// the revision of the write that won the key: the key's revision when the
// agent took it, and greater for each later holder.
func TestSupervisorStartGetsToken(t *testing.T) {
	url, bucket, key := supervisorEnv(t)
	writes := watchWrites(t, url, bucket, key)
	h := contracttest.NewHistory(1)
	a := startAgent(t, url, bucket, key, "node-a", h)
	waitFor(t, 5*time.Second, "node-a starts its service", a.running)
	b := startAgent(t, url, bucket, key, "node-b", h)
	time.Sleep(3 * testR)
	a.kill()
	waitFor(t, handoverBound+time.Second, "node-b starts its service", b.running)
	b.stop()
	first := func(token string) uint64 {
		w, ok := writes.firstBy(token)
		if !ok {
			t.Fatalf("no write of %s seen", token)
		}
		return w.rev
	}
	a.mu.Lock()
	ta := slices.Clone(a.tokens)
	a.mu.Unlock()
	b.mu.Lock()
	tb := slices.Clone(b.tokens)
	b.mu.Unlock()
	t.Logf("fencing tokens: node-a %v, node-b %v", ta, tb)
	if len(ta) != 1 || len(tb) != 1 {
		t.Fatalf("Start calls: node-a %d, node-b %d; want one each", len(ta), len(tb))
	}
	if ta[0] != first("node-a") || tb[0] != first("node-b") {
		t.Errorf("Start got tokens %d and %d, want the revisions of the writes that won the key: %d and %d", ta[0], tb[0], first("node-a"), first("node-b"))
	}
	if tb[0] <= ta[0] {
		t.Errorf("the later holder's token %d is not greater than the earlier one's %d", tb[0], ta[0])
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

// TestSupervisorClusterLeaderRestart: on a 3-node cluster with an R3
// bucket, restarting the node that leads the bucket's stream never lets
// two agents run the service at once, and one runs it again within 30s
// (a generous liveness bound: the figure is logged).
func TestSupervisorClusterLeaderRestart(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a 3-node cluster")
	}
	ignore := goleak.IgnoreCurrent()
	t.Cleanup(func() { goleak.VerifyNone(t, append(natsenv.ConsumerGoroutines(), ignore)...) })
	cluster := natsenv.StartCluster(t, 3)
	urls := cluster.URLs()
	bucket := uniqueBucket("supcluster")
	prepareBucket(t, urls, bucket, natsputex.WithReplicas(3))
	const key = "spof-service"
	h := contracttest.NewHistory(1)
	agents := []*agent{
		startAgent(t, urls, bucket, key, "node-a", h),
		startAgent(t, urls, bucket, key, "node-b", h),
	}
	waitActive(t, 10*time.Second, agents...)
	kv := mustBucket(t, urls, bucket)
	for round := range 2 {
		time.Sleep(3 * testR)
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		st, err := kv.Status(ctx)
		cancel()
		if err != nil {
			t.Fatal(err)
		}
		info := st.(*jetstream.KeyValueBucketStatus).StreamInfo()
		leader := -1
		for i, s := range cluster.Servers() {
			if info.Cluster != nil && s.Name() == info.Cluster.Leader {
				leader = i
			}
		}
		if leader < 0 {
			t.Fatalf("no stream leader in %+v", info.Cluster)
		}
		began := time.Now()
		if err := cluster.Restart(leader); err != nil {
			t.Fatal(err)
		}
		back := time.Now()
		active := waitActive(t, 30*time.Second, agents...)
		t.Logf("round %d: restarting the stream leader %s took %v; %s runs the service %v after it began", round, cluster.Servers()[leader].Name(), back.Sub(began).Round(time.Millisecond), active.name, time.Since(began).Round(time.Millisecond))
	}
	for _, a := range agents {
		a.stop()
	}
	if err := h.Check(); err != nil {
		t.Fatalf("services overlapped: %v", err)
	}
}

// TestSupervisorMixedTiming: agents on one key with different timing (a
// rolling change of natslock's -r and -f): the active node-a has R =
// 400ms, F = 3, C = 1 (T = 1.2s); the standby node-b R = 50ms, F = 2
// (T = 100ms). node-b reads node-a's advertised timing and waits as long
// as node-a counts on: it never takes the key from the live node-a, and
// once node-a is killed it starts no sooner than node-a's T + C·R
// (1.6s) after node-a's last write.
func TestSupervisorMixedTiming(t *testing.T) {
	url, bucket, key := supervisorEnv(t)
	writes := watchWrites(t, url, bucket, key)
	h := contracttest.NewHistory(1)
	slow := []natsputex.Option{natsputex.WithRenewInterval(400 * time.Millisecond), natsputex.WithFailureThreshold(3), natsputex.WithConfirmations(1)}
	a := startAgentWith(t, url, bucket, key, "node-a", "node-a", h, nil, slow...)
	waitFor(t, 5*time.Second, "node-a starts its service", a.running)
	b := startAgentWith(t, url, bucket, key, "node-b", "node-b", h, nil,
		natsputex.WithRenewInterval(50*time.Millisecond), natsputex.WithFailureThreshold(2), natsputex.WithConfirmations(1))
	for end := time.Now().Add(3 * time.Second); time.Now().Before(end); time.Sleep(time.Millisecond) {
		if b.running() {
			t.Fatalf("node-b (T = 100ms) started its service while node-a (T = 1.2s) was alive")
		}
	}
	a.kill()
	waitFor(t, 5*time.Second, "node-b takes over from the dead node-a", b.running)
	last, ok := writes.lastBy("node-a", time.Now())
	if !ok {
		t.Fatal("the watch saw no write of node-a")
	}
	// From the broker's time of the write (same machine), which no agent
	// can see before: the test's own watch may deliver it late.
	after := b.lastStart().Sub(last.created)
	t.Logf("node-b started %v after node-a's last write (node-a's T + C·R = 1.6s)", after.Round(time.Millisecond))
	if after < 1600*time.Millisecond {
		t.Errorf("node-b started %v after node-a's last write, before node-a's T + C·R = 1.6s", after)
	}
	if !b.sawEvent(func(e natsputex.Event) bool {
		return strings.Contains(e.Msg, "after 1.2s without a write; confirming for 400ms")
	}) {
		t.Error("node-b did not take over after node-a's T and confirm for node-a's C·R")
	}
	b.stop()
	if err := h.Check(); err != nil {
		t.Fatalf("services overlapped: %v", err)
	}
}
