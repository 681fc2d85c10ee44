package natsputex_test

// Mixed timing: clients of one name may differ in R, F and C (a rolling
// change); a call waits for the longer of its own T and its holder's, and
// confirms for the longer C·R.

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

	"github.com/latchkey-go/latchkey/contracttest"
	"github.com/latchkey-go/latchkey/contracttest/testenv"
	"github.com/latchkey-go/latchkey/contracttest/testenv/natsenv"
	"github.com/latchkey-go/latchkey/locks"
	"github.com/latchkey-go/latchkey/natsputex"
)

// TestHolderIDLookingLikeTimingKeepsHolderT: a Locker's value is
// "<holder id>/<random suffix>/<T>", and a holder id may contain '/', as
// well as " T=": "A Locker's token carries its T", and "a call waits for
// the longer of its own T and the T its holder's value carries". A live
// holder (R = 400ms, F = 3, T = 1.2s) whose holder id looks like a value
// of its own ("team/job", "x/1ms", "a/b/1ms/c", "x T=1ms") renews every
// 400ms; a TryLock loop with T = 100ms (R = 50ms, F = 2) must never get
// the key while the holder's lease is live.
func TestHolderIDLookingLikeTimingKeepsHolderT(t *testing.T) {
	url, bucket := promiseEnv(t, "oddid")
	slow := []natsputex.Option{natsputex.WithRenewInterval(400 * time.Millisecond), natsputex.WithFailureThreshold(3), natsputex.WithConfirmations(1)}
	trier := newTestClient(t, url, bucket, natsputex.WithRenewInterval(50*time.Millisecond), natsputex.WithFailureThreshold(2), natsputex.WithConfirmations(1), natsputex.WithHolderID("trier"))
	kv := mustBucket(t, url, bucket)
	for i, id := range []string{"team/job", "x/1ms", "a/b/1ms/c", "x T=1ms"} {
		name := fmt.Sprintf("job%d", i)
		holder := newTestClient(t, url, bucket, append(slow, natsputex.WithHolderID(id))...)
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		held, err := holder.Locker().TryLock(ctx, name)
		if err != nil {
			t.Fatal(err)
		}
		e, _ := kv.Get(ctx, name)
		end := time.Now().Add(1300 * time.Millisecond)
		for time.Now().Before(end) {
			l, err := trier.Locker().TryLock(ctx, name)
			if errors.Is(err, locks.ErrNotAcquired) {
				time.Sleep(10 * time.Millisecond)
				continue
			}
			if err != nil {
				t.Fatal(err)
			}
			live := held.Context().Err() == nil
			t.Logf("holder id %q (value %q): the T = 100ms TryLock got token %d; holder's lease (token %d) live: %t (%v)", id, e.Value(), l.Token(), held.Token(), live, context.Cause(held.Context()))
			if live {
				t.Errorf("holder id %q (value %q): a TryLock with T = 100ms took the key of a live holder with T = 1.2s", id, e.Value())
			}
			_ = l.Release(ctx)
			break
		}
		_ = held.Release(ctx)
		cancel()
	}
}

// TestTokenLookingLikeTimingKeepsHolderT: a Supervisor's token is any printable
// string, '/' and " T=" included, and its value is "<token>\nT=.. C·R=..".
// An active node (R = 400ms, F = 3, T = 1.2s) whose token looks like a
// Locker's value ("node/x/100ms") or carries a fake timing ("node-a
// T=100ms C·R=0s") renews every 400ms; a standby Supervisor (R = 50ms,
// F = 2) and a Locker's TryLock loop (R = 50ms, F = 2) on the same key
// must wait for the holder's T: no standby service starts while node-a's
// runs, and no lease is granted while it runs.
func TestTokenLookingLikeTimingKeepsHolderT(t *testing.T) {
	for _, token := range []string{"node/x/100ms", "node-a T=100ms C·R=0s", "n/1/100ms T=100ms"} {
		t.Run(token, func(t *testing.T) {
			url, bucket, key := supervisorEnv(t)
			h := contracttest.NewHistory(1)
			fast := []natsputex.Option{natsputex.WithRenewInterval(50 * time.Millisecond), natsputex.WithFailureThreshold(2), natsputex.WithConfirmations(1)}
			a := startAgent(t, url, bucket, key, "node-a", h, withToken(token), withClientOptions(natsputex.WithRenewInterval(400*time.Millisecond), natsputex.WithFailureThreshold(3), natsputex.WithConfirmations(1)))
			waitFor(t, 5*time.Second, "node-a starts its service", a.running)
			b := startAgent(t, url, bucket, key, "node-b", h, withClientOptions(fast...))
			locker := newTestClient(t, url, bucket, append(fast, natsputex.WithHolderID("locker"))...)
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			end := time.Now().Add(1500 * time.Millisecond)
			for time.Now().Before(end) {
				l, err := locker.Locker().TryLock(ctx, key)
				if err == nil {
					up := a.running() || b.running()
					t.Logf("the locker got token %d; a service ran then: %t", l.Token(), up)
					if up {
						t.Errorf("token %q: a Locker with T = 100ms got the key while a service ran", token)
					}
					_ = l.Release(ctx)
					break
				}
				time.Sleep(10 * time.Millisecond)
			}
			a.stop()
			b.stop()
			if err := h.Check(); err != nil {
				t.Errorf("token %q: two services ran at once: %v", token, err)
			}
		})
	}
}

// TestLockWaitsCutOffSupervisorTPlusCR: "a call waits for the longer of
// its own T and the T its holder's value carries, and confirms for the
// longer of its own C·R and the holder's (a Supervisor's value carries
// it)". node-a, a Supervisor with R = 200ms, F = 3, C = 5 (T = 600ms,
// C·R = 1s, margin 100ms) is active when its link is black-holed; its
// Stop takes 800ms, within the margin + C·R = 1.1s the docs give it. A
// Locker with R = 50ms, F = 2, C = 1, waiting in Lock on the key, must be
// handed its lease no sooner than T + C·R = 1.6s after node-a's last
// write, after node-a's Stop has returned.
func TestLockWaitsCutOffSupervisorTPlusCR(t *testing.T) {
	url, bucket, key := supervisorEnv(t)
	writes := watchWrites(t, url, bucket, key)
	proxy := testenv.NewProxy(t, strings.TrimPrefix(url, "nats://"))
	h := contracttest.NewHistory(1)
	a := startAgent(t, "nats://"+proxy.Addr(), bucket, key, "node-a", h, withFaults(func(a *agent) { a.stopDelay.Store(int64(800 * time.Millisecond)) }), withClientOptions(natsputex.WithRenewInterval(200*time.Millisecond), natsputex.WithFailureThreshold(3), natsputex.WithConfirmations(5)))
	waitFor(t, 5*time.Second, "node-a starts its service", a.running)
	locker := newTestClient(t, url, bucket, natsputex.WithRenewInterval(50*time.Millisecond), natsputex.WithFailureThreshold(2),
		natsputex.WithConfirmations(1), natsputex.WithHolderID("locker"))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	got := make(chan time.Time, 1)
	var runningAtGrant bool
	go func() {
		l, err := locker.Locker().Lock(ctx, key)
		now := time.Now()
		if err != nil {
			t.Errorf("Lock: %v", err)
			got <- time.Time{}
			return
		}
		runningAtGrant = a.running()
		got <- now
		exit := h.Enter("locker", l.Token())
		time.Sleep(200 * time.Millisecond)
		exit()
		_ = l.Release(context.Background())
	}()
	time.Sleep(500 * time.Millisecond)
	proxy.BlackHole()
	at := <-got
	a.mu.Lock()
	var stoppedAt time.Time
	if len(a.stopped) > 0 {
		stoppedAt = a.stopped[len(a.stopped)-1]
	}
	a.mu.Unlock()
	last, _ := writes.lastBy("node-a", at)
	t.Logf("node-a's last write rev %d at %v; its service stopped at %v; the locker's lease at %v (%v after the write; T + C·R = 1.6s); node-a ran then: %t",
		last.rev, last.created.Format("15:04:05.000"), stoppedAt.Format("15:04:05.000"), at.Format("15:04:05.000"), at.Sub(last.created).Round(time.Millisecond), runningAtGrant)
	if !at.IsZero() && at.Sub(last.created) < 1600*time.Millisecond {
		t.Errorf("the Locker was handed the key %v after the Supervisor's last write, before its T + C·R = 1.6s", at.Sub(last.created).Round(time.Millisecond))
	}
	if runningAtGrant {
		t.Errorf("the Locker's lease was granted while node-a's service still ran (its Stop had margin + C·R = 1.1s)")
	}
	proxy.Restore()
	a.stop()
	if err := h.Check(); err != nil {
		t.Errorf("node-a's service and the Locker's lease overlapped: %v", err)
	}
}

// TestStandbyWaitsForLockerT: a Locker (R = 400ms, F = 3,
// T = 1.2s) holds the key a Supervisor (R = 50ms, F = 2, C = 1) stands
// by on: "A Locker's token carries its T", so the standby must not start
// its service while the Locker's lease is live.
func TestStandbyWaitsForLockerT(t *testing.T) {
	url, bucket, key := supervisorEnv(t)
	holder := newTestClient(t, url, bucket, natsputex.WithRenewInterval(400*time.Millisecond), natsputex.WithFailureThreshold(3),
		natsputex.WithConfirmations(1), natsputex.WithHolderID("locker"))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	l, err := holder.Locker().TryLock(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	h := contracttest.NewHistory(1)
	exit := h.Enter("locker", l.Token())
	b := startAgent(t, url, bucket, key, "node-b", h, withClientOptions(natsputex.WithRenewInterval(50*time.Millisecond), natsputex.WithFailureThreshold(2), natsputex.WithConfirmations(1)))
	deadline := time.Now().Add(1500 * time.Millisecond)
	for time.Now().Before(deadline) && l.Context().Err() == nil {
		if b.running() {
			t.Errorf("node-b (T = 100ms) started its service while the Locker's lease (T = 1.2s) was live")
			break
		}
		time.Sleep(2 * time.Millisecond)
	}
	t.Logf("the Locker's lease: %v", context.Cause(l.Context()))
	exit()
	_ = l.Release(ctx)
	b.stop()
	if err := h.Check(); err != nil {
		t.Errorf("overlap: %v", err)
	}
}

// TestTryLockWaitsCrashedHoldersT: "A TryLock made T or more after a
// crashed holder's last write takes the key", where T is "the longer of
// its own T and the T its holder's value carries". Two TryLock loops, one
// with T = 100ms (R = 50ms, F = 2), one with T = 1.2s (R = 400ms, F = 3),
// race for names whose holders crash: first a holder with T = 1.2s (the
// fast loop must wait 1.2s of server-stamped silence), then one with T =
// 300ms. Every takeover write of a crashed holder's key comes no sooner
// than the crashed holder's T after its last write (server stamps), and
// no grant overlaps a live lease.
func TestTryLockWaitsCrashedHoldersT(t *testing.T) {
	url, bucket := promiseEnv(t, "trymixed")
	fast := []natsputex.Option{natsputex.WithRenewInterval(50 * time.Millisecond), natsputex.WithFailureThreshold(2), natsputex.WithConfirmations(1)}
	slow := []natsputex.Option{natsputex.WithRenewInterval(400 * time.Millisecond), natsputex.WithFailureThreshold(3), natsputex.WithConfirmations(1)}
	cases := []struct {
		name string
		opts []natsputex.Option
		T    time.Duration
	}{
		{"slow", slow, 1200 * time.Millisecond},
		{"suite", nil, testF * testR},
	}
	for _, cs := range cases {
		name := "job-" + cs.name
		writes := watchWrites(t, url, bucket, name)
		nc, js, err := connect(url)
		if err != nil {
			t.Fatal(err)
		}
		opts := cs.opts
		if opts == nil {
			opts = []natsputex.Option{natsputex.WithRenewInterval(testR), natsputex.WithFailureThreshold(testF), natsputex.WithConfirmations(testC)}
		}
		crashed, err := natsputex.New(context.Background(), js, bucket, append(opts, natsputex.WithHolderID("crashed"))...)
		if err != nil {
			t.Fatal(err)
		}
		g := newGrants()
		held, err := crashed.Locker().TryLock(context.Background(), name)
		if err != nil {
			t.Fatal(err)
		}
		g.grant("crashed", held)
		time.Sleep(cs.T / 2)
		nc.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		var wg sync.WaitGroup
		for i, o := range [][]natsputex.Option{fast, slow} {
			who := []string{"fast", "slow"}[i]
			c := newTestClient(t, url, bucket, append(o, natsputex.WithHolderID(who))...)
			wg.Add(1)
			go func() {
				defer wg.Done()
				end := time.Now().Add(cs.T + 1500*time.Millisecond)
				for time.Now().Before(end) {
					l, err := c.Locker().TryLock(ctx, name)
					if errors.Is(err, locks.ErrNotAcquired) {
						time.Sleep(5 * time.Millisecond)
						continue
					}
					if err != nil {
						t.Errorf("%s: %v", who, err)
						return
					}
					g.grant(who, l)
					time.Sleep(100 * time.Millisecond)
					_ = l.Release(context.Background())
				}
			}()
		}
		wg.Wait()
		cancel()
		_ = crashed.Close(context.Background())
		g.check(t)
		writes.mu.Lock()
		var last keyWrite
		for _, w := range writes.writes {
			if strings.HasPrefix(w.value, "crashed") {
				last = w
				continue
			}
			if last.rev != 0 && w.value != "" {
				gap := w.created.Sub(last.created)
				t.Logf("%s: crashed holder's last write rev %d; taken over by %q %v later (its T = %v)", name, last.rev, w.value, gap.Round(time.Millisecond), cs.T)
				if gap < cs.T {
					t.Errorf("%s: a crashed holder's key (T = %v) was taken over %v after its last write", name, cs.T, gap.Round(time.Millisecond))
				}
				break
			}
		}
		writes.mu.Unlock()
	}
}

// TestStandbyWaitsCutOffLockersTPlusOwnCR: a Locker with a long T (R = 200ms,
// F = 3: T = 600ms, margin 100ms) holds the key a fast Supervisor
// (R = 50ms, F = 2, C = 2: T = 100ms, C·R = 100ms) stands by on; the
// Locker's link is black-holed. The Supervisor must start its service no
// sooner than the Locker's T + its own C·R (700ms) after the Locker's
// last write, after the Locker's lease ended.
func TestStandbyWaitsCutOffLockersTPlusOwnCR(t *testing.T) {
	url, bucket, key := supervisorEnv(t)
	writes := watchWrites(t, url, bucket, key)
	locker, proxy := proxiedClient(t, url, bucket, natsputex.WithHolderID("locker"),
		natsputex.WithRenewInterval(200*time.Millisecond), natsputex.WithFailureThreshold(3), natsputex.WithConfirmations(1))
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	l, err := locker.Locker().TryLock(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	h := contracttest.NewHistory(1)
	exit := h.Enter("locker", l.Token())
	go func() { <-l.Context().Done(); exit() }()
	b := startAgent(t, url, bucket, key, "node-b", h, withClientOptions(natsputex.WithRenewInterval(50*time.Millisecond), natsputex.WithFailureThreshold(2), natsputex.WithConfirmations(2)))
	time.Sleep(500 * time.Millisecond)
	if b.running() {
		t.Fatal("node-b started while the Locker held the key")
	}
	proxy.BlackHole()
	waitFor(t, 5*time.Second, "node-b starts its service", b.running)
	started := b.lastStart()
	var last keyWrite
	writes.mu.Lock()
	for _, w := range writes.writes {
		if strings.HasPrefix(w.value, "locker") && !w.created.After(started) {
			last = w
		}
	}
	writes.mu.Unlock()
	t.Logf("locker's last write at %v, node-b started %v later; the Locker's lease: %v",
		last.created.Format("15:04:05.000"), started.Sub(last.created).Round(time.Millisecond), context.Cause(l.Context()))
	if started.Sub(last.created) < 700*time.Millisecond {
		t.Errorf("node-b started %v after the Locker's last write, before its T + C·R = 700ms", started.Sub(last.created).Round(time.Millisecond))
	}
	proxy.Restore()
	b.stop()
	if err := h.Check(); err != nil {
		t.Errorf("overlap: %v", err)
	}
}

// TestMixedTimingLockersAndSupervisorNeverOverlap: three Lockers with
// different R, F, C and margins and a Supervisor contend on one key for 8s;
// each Locker holds for up to 150ms then either releases or has its link cut
// (its lease must end by itself; the link comes back after a second). Every
// critical section is recorded on one monotonic clock: none may overlap,
// tokens rise.
func TestMixedTimingLockersAndSupervisorNeverOverlap(t *testing.T) {
	url, bucket, key := supervisorEnv(t)
	h := contracttest.NewHistory(1)
	g := newGrants()
	v := watchValidity(t)
	type cfg struct {
		name    string
		R       time.Duration
		F, C    int
		margin  time.Duration
		cutEach int
	}
	cfgs := []cfg{
		{"fast", 30 * time.Millisecond, 2, 1, 10 * time.Millisecond, 3},
		{"slow", 150 * time.Millisecond, 3, 3, 75 * time.Millisecond, 4},
		{"f1", 100 * time.Millisecond, 1, 2, 20 * time.Millisecond, 5},
	}
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Second)
	defer cancel()
	sup := startAgent(t, url, bucket, key, "node-s", h, withClientOptions(natsputex.WithRenewInterval(80*time.Millisecond), natsputex.WithFailureThreshold(2), natsputex.WithConfirmations(2)))
	stopSup := time.AfterFunc(3*time.Second, sup.stop)
	defer stopSup.Stop()
	var wg sync.WaitGroup
	var grantsN atomic.Int32
	for _, c := range cfgs {
		cl, proxy := proxiedClient(t, url, bucket, natsputex.WithHolderID(c.name), natsputex.WithRenewInterval(c.R),
			natsputex.WithFailureThreshold(c.F), natsputex.WithConfirmations(c.C), natsputex.WithSafetyMargin(c.margin))
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ctx.Err() == nil; i++ {
				l, err := cl.Locker().Lock(ctx, key)
				if err != nil {
					if ctx.Err() == nil {
						time.Sleep(20 * time.Millisecond)
					}
					continue
				}
				grantsN.Add(1)
				g.grant(c.name, l)
				v.add(c.name, l)
				exit := sync.OnceFunc(h.Enter(c.name, l.Token()))
				go func() { <-l.Context().Done(); exit() }()
				time.Sleep(time.Duration(20+(i*37)%130) * time.Millisecond)
				if i%c.cutEach == c.cutEach-1 {
					proxy.Cut()
					<-l.Context().Done()
					exit()
					time.Sleep(time.Second)
					proxy.Restore()
					continue
				}
				exit()
				_ = l.Release(context.Background())
			}
		}()
	}
	wg.Wait()
	sup.stop()
	t.Logf("%d Locker grants, %d critical sections, peak %d", grantsN.Load(), h.Len(), h.Peak())
	if grantsN.Load() < 5 {
		t.Errorf("only %d grants in 8s", grantsN.Load())
	}
	if err := h.Check(); err != nil {
		t.Errorf("overlap: %v", err)
	}
	g.check(t)
	v.check(t)
}

// TestMixedTimingSupervisorsKeepBounds: "Supervisors on one key with
// different R, F or C (a rolling change) ... keep these bounds", and "a call
// waits for the longer of its own T and the T its holder's value carries,
// and confirms for the longer of its own C·R and the holder's (a
// Supervisor's value carries it)". Three Supervisors with different timing
// (R/F/C 100ms/3/1, 50ms/4/4, 150ms/2/2), each with a Stop of 60ms, and a
// Locker (R = 60ms, F = 2, C = 0) looping Lock (hold 150ms) on the same key,
// for about 10s; every 1.2s the agent whose service runs is killed (no Stop,
// no blank) or shut down (Stop, blank), alternately, and replaced by a new
// agent with its timing and a new token. No two sections (services or Locker
// leases) may overlap, and each section's fencing token must be above every
// earlier section's.
func TestMixedTimingSupervisorsKeepBounds(t *testing.T) {
	url, bucket, key := localEnv(t)
	writes := watchWrites(t, url, bucket, key)
	h := contracttest.NewHistory(1)
	timings := [][]natsputex.Option{
		{natsputex.WithRenewInterval(100 * time.Millisecond), natsputex.WithFailureThreshold(3), natsputex.WithConfirmations(1)},
		{natsputex.WithRenewInterval(50 * time.Millisecond), natsputex.WithFailureThreshold(4), natsputex.WithConfirmations(4)},
		{natsputex.WithRenewInterval(150 * time.Millisecond), natsputex.WithFailureThreshold(2), natsputex.WithConfirmations(2)},
	}
	var mu sync.Mutex
	var nodes []*node
	gen := 0
	spawn := func(slot int) *node {
		gen++
		name := fmt.Sprintf("node%d-%d", slot, gen)
		n := startNode(t, url, bucket, key, name, h, withClientOptions(timings[slot]...))
		n.stopDelay.Store(int64(60 * time.Millisecond))
		mu.Lock()
		nodes = append(nodes, n)
		mu.Unlock()
		return n
	}
	live := []*node{spawn(0), spawn(1), spawn(2)}
	locker := newTestClient(t, url, bucket, natsputex.WithHolderID("locker"),
		natsputex.WithRenewInterval(60*time.Millisecond), natsputex.WithFailureThreshold(2), natsputex.WithConfirmations(0))
	ctx, cancel := context.WithCancel(context.Background())
	var lockerSpans []serviceCall
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for ctx.Err() == nil {
			lctx, lcancel := context.WithTimeout(ctx, 3*time.Second)
			l, err := locker.Locker().Lock(lctx, key)
			lcancel()
			if err != nil {
				continue
			}
			begin := time.Now()
			exit := sync.OnceFunc(h.Enter("locker", l.Token()))
			stop := context.AfterFunc(l.Context(), exit)
			_ = sleepCtx(l.Context(), 150*time.Millisecond)
			stop()
			exit()
			_ = l.Release(context.Background())
			mu.Lock()
			lockerSpans = append(lockerSpans, serviceCall{token: l.Token(), begin: begin, end: time.Now()})
			mu.Unlock()
			_ = sleepCtx(ctx, 200*time.Millisecond)
		}
	}()
	kills := 0
	for i := 0; i < 8; i++ {
		time.Sleep(1200 * time.Millisecond)
		for slot, n := range live {
			if !n.running() {
				continue
			}
			if i%2 == 0 {
				n.kill()
				kills++
			} else {
				n.cancel()
				n.wait(5 * time.Second)
			}
			time.Sleep(100 * time.Millisecond)
			live[slot] = spawn(slot)
			break
		}
	}
	cancel()
	wg.Wait()
	for _, n := range live {
		n.cancel()
		n.wait(5 * time.Second)
	}
	mu.Lock()
	defer mu.Unlock()
	type sec struct {
		who   string
		token uint64
		at    time.Time
	}
	var secs []sec
	for _, n := range nodes {
		for _, st := range n.getStarts() {
			secs = append(secs, sec{n.name, st.token, st.begin})
		}
	}
	for _, ls := range lockerSpans {
		secs = append(secs, sec{"locker", ls.token, ls.begin})
	}
	slices.SortFunc(secs, func(a, b sec) int { return a.at.Compare(b.at) })
	var maxTok uint64
	var maxWho string
	for _, s := range secs {
		if s.token <= maxTok && !(s.who == maxWho && s.token == maxTok) {
			t.Errorf("%s's section at %v has token %d, not above %s's %d before it", s.who, s.at.Format("15:04:05.000"), s.token, maxWho, maxTok)
		}
		if s.token > maxTok {
			maxTok, maxWho = s.token, s.who
		}
	}
	t.Logf("%d sections (%d of the Locker), %d agents, %d killed, %d writes", len(secs), len(lockerSpans), len(nodes), kills, len(writes.all()))
	if len(secs) < 8 {
		t.Errorf("only %d sections in 10s", len(secs))
	}
	if err := h.Check(); err != nil {
		t.Errorf("sections overlapped: %v", err)
	}
}

// TestLockUsesSupervisorHoldersTiming: "a call waits for the longer of its
// own T and the T its holder's value carries, and confirms for the longer
// of its own C·R and the holder's (a Supervisor's value carries it)".
// node-a, a Supervisor with a long timing (R = 200ms, F = 3, C = 3:
// T = 600ms, C·R = 600ms), is active; a Locker of another client with a
// short one (R = 50ms, F = 6, C = 0: T = 300ms) waits in Lock on the same
// key, and in "with-standby" so does node-b, a Supervisor with a short
// timing too (R = 50ms, F = 6, C = 1). node-a is killed. Whoever wins must
// hold (Lock returns, or Start is called) no sooner than node-a's T + C·R
// = 1.2s after its last write. The Locker holds for 400ms and releases;
// node-b, if it stands by, must then start at once (within its R +
// 150ms of the blank). The Locker's lease and the services, in one
// History, never overlap and their tokens rise.
func TestLockUsesSupervisorHoldersTiming(t *testing.T) {
	const bound = 1200 * time.Millisecond
	// T = 300ms, shorter than node-a's 600ms as the test needs, and long
	// enough for a loaded machine's shared server (a CI run: with F = 2,
	// T = 100ms, the Locker's lease ran out while held).
	short := []natsputex.Option{natsputex.WithRenewInterval(50 * time.Millisecond), natsputex.WithFailureThreshold(6)}
	for _, withStandby := range []bool{false, true} {
		t.Run(map[bool]string{false: "locker-only", true: "with-standby"}[withStandby], func(t *testing.T) {
			url, bucket, key := localEnv(t)
			writes := watchWrites(t, url, bucket, key)
			h := contracttest.NewHistory(1)
			a := startNode(t, url, bucket, key, "node-a", h, withClientOptions(natsputex.WithRenewInterval(200*time.Millisecond), natsputex.WithFailureThreshold(3), natsputex.WithConfirmations(3)))
			waitFor(t, 5*time.Second, "node-a starts its service", a.running)
			var b *node
			if withStandby {
				b = startNode(t, url, bucket, key, "node-b", h, withClientOptions(append(short, natsputex.WithConfirmations(1))...))
				waitFor(t, 5*time.Second, "node-b is standby", func() bool {
					return b.sawEvent(func(e natsputex.Event) bool { return e.Holder == "node-a" })
				})
			}
			locker := newTestClient(t, url, bucket, append(short, natsputex.WithHolderID("locker"), natsputex.WithConfirmations(0))...)
			type lockResult struct {
				l   locks.Lease
				at  time.Time
				err error
			}
			got := make(chan lockResult, 1)
			ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
			defer cancel()
			go func() {
				l, err := locker.Locker().Lock(ctx, key)
				got <- lockResult{l, time.Now(), err}
			}()
			time.Sleep(600 * time.Millisecond)
			select {
			case g := <-got:
				t.Fatalf("the Locker's Lock returned while node-a was active: %v", g.err)
			default:
			}
			a.kill()
			killed := time.Now()
			var g lockResult
			var lockerExit func()
			var firstHold time.Time
			var who string
			waitFor(t, 5*time.Second, "the Locker or node-b holds the key", func() bool {
				select {
				case g = <-got:
					if g.err != nil {
						t.Fatalf("Lock: %v", g.err)
					}
					lockerExit = sync.OnceFunc(h.Enter("locker", g.l.Token()))
					context.AfterFunc(g.l.Context(), lockerExit)
					firstHold, who = g.at, "the Locker"
					return true
				default:
				}
				if b != nil && b.running() {
					firstHold, who = b.getStarts()[0].begin, "node-b"
					return true
				}
				return false
			})
			last, _ := writes.lastBy("node-a", firstHold)
			t.Logf("%s holds the key %v after node-a's last write (rev %d), %v after the kill (node-a's T + C·R = %v)",
				who, firstHold.Sub(last.created).Round(time.Millisecond), last.rev, firstHold.Sub(killed).Round(time.Millisecond), bound)
			if d := firstHold.Sub(last.created); d < bound {
				t.Errorf("%s holds the key %v after node-a's last write, before node-a's T + C·R = %v", who, d.Round(time.Millisecond), bound)
			}
			if g.l == nil {
				// node-b won: the Locker gets the key once node-b is shut down.
				time.Sleep(400 * time.Millisecond)
				b.cancel()
				b.wait(5 * time.Second)
				select {
				case g = <-got:
				case <-time.After(3 * time.Second):
					t.Fatal("the Locker did not get the key within 3s of node-b's shutdown")
				}
				if g.err != nil {
					t.Fatalf("Lock: %v", g.err)
				}
				lockerExit = sync.OnceFunc(h.Enter("locker", g.l.Token()))
				context.AfterFunc(g.l.Context(), lockerExit)
				b = nil
			}
			time.Sleep(400 * time.Millisecond)
			if err := g.l.Context().Err(); err != nil {
				t.Errorf("the Locker's lease ended while held: %v", context.Cause(g.l.Context()))
			}
			lockerExit()
			released := time.Now()
			if err := g.l.Release(context.Background()); err != nil {
				t.Errorf("Release: %v", err)
			}
			if b != nil {
				waitFor(t, 3*time.Second, "node-b starts its service after the Locker released", b.running)
				var st time.Time
				for _, s := range b.getStarts() {
					if s.begin.After(released) {
						st = s.begin
						break
					}
				}
				blank := writes.blanksAfter(released.Add(-5 * time.Millisecond))
				t.Logf("node-b started %v after the Locker's release (blanks seen: %d)", st.Sub(released).Round(time.Millisecond), len(blank))
				if d := st.Sub(released); d > 50*time.Millisecond+150*time.Millisecond {
					t.Errorf("node-b started %v after the Locker released the key, not at once (R + 150ms)", d.Round(time.Millisecond))
				}
				b.cancel()
				b.wait(5 * time.Second)
			}
			if err := h.Check(); err != nil {
				writes.logAll(t, killed)
				t.Errorf("overlap: %v", err)
			}
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

// TestThreeTimingsKeepTakeoverBounds: three agents on one key with different
// timing: a (R = 50ms, F = 2, C = 1: T = 100ms, C·R = 50ms; it renews every
// (T − margin)/2), b (R = 200ms, F = 3, C = 2: T = 600ms, C·R = 400ms) and c
// (R = 100ms, F = 4, C = 1: T = 400ms, C·R = 100ms). "a standby waits for
// the longer of its own T and the holder's, and confirms for the longer
// C·R", "While it confirms, a taker-over writes its token with the longer T
// and C·R of its own and of the value it displaced", "a client with a
// shorter T never takes a live holder's key between two of its renewals". b
// is active first for 1.5s with a and c standing by; then the active agent
// is killed four times (each time started again under a new token with the
// same timing). Every takeover must come at least the T its displaced value
// carries after that write, every Start at least the longer of its agent's
// C·R and the displaced value's after the agent's first write of the run;
// the services never overlap.
func TestThreeTimingsKeepTakeoverBounds(t *testing.T) {
	url, bucket, key := localEnv(t)
	raw := watchRaw(t, url, bucket, key)
	h := contracttest.NewHistory(1)
	specs := map[string]timingSpec{
		"a": {"a", 50 * time.Millisecond, 2, 1},
		"b": {"b", 200 * time.Millisecond, 3, 2},
		"c": {"c", 100 * time.Millisecond, 4, 1},
	}
	var all, live []*node
	spec := map[*node]timingSpec{}
	runs := map[string]int{}
	start := func(s timingSpec) *node {
		runs[s.name]++
		name := fmt.Sprintf("node-%s%d", s.name, runs[s.name])
		n := startNode(t, url, bucket, key, name, h, onConnectOptions(), withClientOptions(s.opts()...))
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
		up := waitActiveNode(t, 5*time.Second, live...)
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
	waitActiveNode(t, 5*time.Second, live...)
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

// TestTryLockWaitsForHolderT: T = F·R is an option of each client. A
// live, healthy holder with R = 400ms, F = 3 (T = 1.2s) renews every
// 400ms; a TryLock client with R = 50ms, F = 2, C = 1 (T = 100ms) finds
// the key silent for its own T between two renewals. "two leases on one
// name are never granted at once": it must not get the key while the
// holder's lease is live. (Failed before commit 753903a: the TryLock got
// the key 190ms in, the holder's lease lived 210ms more; now a Locker's
// token carries its T.)
func TestTryLockWaitsForHolderT(t *testing.T) {
	url, bucket := promiseEnv(t, "mixed")
	holder := newTestClient(t, url, bucket,
		natsputex.WithRenewInterval(400*time.Millisecond), natsputex.WithFailureThreshold(3), natsputex.WithConfirmations(1))
	taker := newTestClient(t, url, bucket,
		natsputex.WithRenewInterval(50*time.Millisecond), natsputex.WithFailureThreshold(2), natsputex.WithConfirmations(1))
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	h := contracttest.NewHistory(1)
	held, err := holder.Locker().TryLock(ctx, "job")
	if err != nil {
		t.Fatal(err)
	}
	exitHolder := h.Enter("holder", held.Token())
	holderEnded := make(chan time.Time, 1)
	go func() { <-held.Context().Done(); exitHolder(); holderEnded <- time.Now() }()
	defer held.Release(context.Background())

	deadline := time.Now().Add(2500 * time.Millisecond)
	for time.Now().Before(deadline) {
		lease, err := taker.Locker().TryLock(ctx, "job")
		if errors.Is(err, locks.ErrNotAcquired) {
			time.Sleep(20 * time.Millisecond)
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		granted := time.Now()
		holderLive := held.Context().Err() == nil
		exit := h.Enter("taker", lease.Token())
		var overlap time.Duration
		select {
		case ended := <-holderEnded:
			if holderLive {
				overlap = ended.Sub(granted)
			}
		case <-time.After(2 * time.Second):
			overlap = -1
		}
		exit()
		_ = lease.Release(context.Background())
		t.Logf("the TryLock client (T = %v) got token %d; the holder (T = %v, token %d) was live then: %t; its lease ended %v later; cause %v",
			taker.TTL(), lease.Token(), holder.TTL(), held.Token(), holderLive, overlap.Round(time.Millisecond), context.Cause(held.Context()))
		if holderLive {
			t.Errorf("a TryLock client with a shorter T took a live holder's key: two leases on one name at once (for %v)", overlap.Round(time.Millisecond))
		}
		if err := h.Check(); err != nil {
			t.Errorf("sections overlapped: %v", err)
		}
		return
	}
	t.Logf("the TryLock client never took the live holder's key in 2.5s")
}

// TestStandbyWaitsForActiveT: the same with two Supervisors on one
// key (natslock nodes started with different -r/-f): the active node-a has
// R = 400ms, F = 3; the standby node-b R = 50ms, F = 2, C = 1. "a rolling
// change of them is safe": node-b must not start its service while
// node-a's runs. (Failed before commit 1afea34: node-b started 190ms in,
// both ran for 207–217ms; now each agent's timing is in the key's value,
// after its token.)
func TestStandbyWaitsForActiveT(t *testing.T) {
	url, bucket, key := supervisorEnv(t)
	h := contracttest.NewHistory(1)
	a := startAgent(t, url, bucket, key, "node-a", h, withClientOptions(natsputex.WithRenewInterval(400*time.Millisecond), natsputex.WithFailureThreshold(3), natsputex.WithConfirmations(1)))
	waitFor(t, 5*time.Second, "node-a starts its service", a.running)
	b := startAgent(t, url, bucket, key, "node-b", h, withClientOptions(natsputex.WithRenewInterval(50*time.Millisecond), natsputex.WithFailureThreshold(2), natsputex.WithConfirmations(1)))
	deadline := time.Now().Add(2500 * time.Millisecond)
	both := false
	for time.Now().Before(deadline) && !both {
		both = a.running() && b.running()
		time.Sleep(time.Millisecond)
	}
	var overlap time.Duration
	if both {
		overlap = waitFor(t, 2*time.Second, "one of the two stops", func() bool { return !a.running() || !b.running() })
	}
	a.stop()
	b.stop()
	t.Logf("node-a (T = 1.2s) started %d time(s), node-b (T = 100ms) %d time(s); seen running at once: %t, for %v", len(a.started), len(b.started), both, overlap.Round(time.Millisecond))
	if err := h.Check(); err != nil {
		t.Errorf("two services ran at once: %v", err)
	}
}

// TestSemaphoreSlotWaitsForHolderT: TestTryLockWaitsForHolderT on a
// Semaphore's slot: a holder of the only slot of "jobs" with R = 400ms,
// F = 3 and a TryAcquire loop with R = 50ms, F = 2 (T = 100ms). "Each
// held by the rules of a lock": the slot is never granted twice at once.
func TestSemaphoreSlotWaitsForHolderT(t *testing.T) {
	url, bucket := promiseEnv(t, "mixedsem")
	holder := newTestClient(t, url, bucket,
		natsputex.WithRenewInterval(400*time.Millisecond), natsputex.WithFailureThreshold(3), natsputex.WithConfirmations(1))
	taker := newTestClient(t, url, bucket,
		natsputex.WithRenewInterval(50*time.Millisecond), natsputex.WithFailureThreshold(2), natsputex.WithConfirmations(1))
	hs, err := holder.Semaphore(1)
	if err != nil {
		t.Fatal(err)
	}
	ts, err := taker.Semaphore(1)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	held, err := hs.TryAcquire(ctx, "jobs")
	if err != nil {
		t.Fatal(err)
	}
	defer held.Release(context.Background())
	deadline := time.Now().Add(2500 * time.Millisecond)
	for time.Now().Before(deadline) {
		l, err := ts.TryAcquire(ctx, "jobs")
		if errors.Is(err, locks.ErrNotAcquired) {
			time.Sleep(10 * time.Millisecond)
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		live := held.Context().Err() == nil
		_ = l.Release(context.Background())
		t.Logf("the TryAcquire client got token %d; the holder (token %d) was live then: %t", l.Token(), held.Token(), live)
		if live {
			t.Errorf("a TryAcquire client with a shorter T took a live holder's slot: two leases on one slot at once")
		}
		return
	}
	t.Logf("the TryAcquire client never took the live holder's slot in 2.5s")
}

// TestShorterTWaitsForHolderT: clients of one name may have different
// timing. A live holder with R = 400ms, F = 3 (T = 1.2s) renews every
// 400ms; a waiting Lock and a TryLock loop with R = 50ms, F = 2 (T =
// 100ms) see its key silent for their own T between two renewals, but
// its token carries its T, and they wait for that: neither gets the key
// while the holder's lease is live; the waiter gets it once it is
// released.
func TestShorterTWaitsForHolderT(t *testing.T) {
	url := natsenv.StartServer(t).URL()
	bucket := uniqueBucket("mixedt")
	prepareBucket(t, url, bucket)
	holder := newTestClient(t, url, bucket, natsputex.WithRenewInterval(400*time.Millisecond), natsputex.WithFailureThreshold(3))
	// T = 300ms, shorter than node-a's 600ms as the test needs, and long
	// enough for a loaded machine's shared server (a CI run: with F = 2,
	// T = 100ms, the Locker's lease ran out while held).
	short := []natsputex.Option{natsputex.WithRenewInterval(50 * time.Millisecond), natsputex.WithFailureThreshold(6)}
	waiter := newTestClient(t, url, bucket, short...).Locker()
	trier := newTestClient(t, url, bucket, short...).Locker()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	lease, err := holder.Locker().TryLock(ctx, "job")
	if err != nil {
		t.Fatal(err)
	}
	got := lockBehind(ctx, waiter, "job", lease)
	for end := time.Now().Add(2 * time.Second); time.Now().Before(end); time.Sleep(20 * time.Millisecond) {
		if l, err := trier.TryLock(ctx, "job"); err == nil {
			live := lease.Context().Err() == nil
			_ = l.Release(ctx)
			t.Fatalf("a TryLock client with T = 100ms took the key of a holder with T = 1.2s (holder live: %t)", live)
		}
		select {
		case g := <-got:
			if g.err == nil {
				_ = g.lease.Release(ctx)
			}
			t.Fatalf("a waiting Lock with T = 100ms returned while a holder with T = 1.2s held the key (holder live: %t, err %v)", g.otherLive, g.err)
		default:
		}
	}
	if err := lease.Context().Err(); err != nil {
		t.Fatalf("the holder's lease ended: %v", context.Cause(lease.Context()))
	}
	if err := lease.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if g := mustGrant(t, got); g.otherLive {
		t.Fatal("double grant")
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
	a := startAgent(t, url, bucket, key, "node-a", h, withClientOptions(slow...))
	waitFor(t, 5*time.Second, "node-a starts its service", a.running)
	b := startAgent(t, url, bucket, key, "node-b", h, withClientOptions(natsputex.WithRenewInterval(50*time.Millisecond), natsputex.WithFailureThreshold(2), natsputex.WithConfirmations(1)))
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
