package redlockprio_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/latchkey-go/latchkey/contracttest"
	"github.com/latchkey-go/latchkey/contracttest/testenv"
	"github.com/latchkey-go/latchkey/fence"
	"github.com/latchkey-go/latchkey/fence/redisfence"
	"github.com/latchkey-go/latchkey/locks"
	"github.com/latchkey-go/latchkey/redlockprio"
)

// raiseHook delays or fails, on one go-redis client, the calls of the
// script that raises a fence counter (raiseScript, by its SHA1; see
// scriptOf). The delay applies
// to the EVALSHA only, so that a call that falls back to EVAL (NOSCRIPT)
// is delayed once.
type raiseHook struct {
	delay time.Duration
	fail  bool
}

func isRaise(cmd redis.Cmder) bool {
	return scriptOf(cmd) == "raise"
}

func (h *raiseHook) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h *raiseHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if isRaise(cmd) {
			if h.fail {
				err := errors.New("raiseHook: refused")
				cmd.SetErr(err)
				return err
			}
			if strings.EqualFold(cmd.Name(), "evalsha") { // once per call: not again for the EVAL after NOSCRIPT
				select {
				case <-time.After(h.delay):
				case <-ctx.Done():
					return ctx.Err()
				}
			}
		}
		return next(ctx, cmd)
	}
}

func (h *raiseHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// lockerWith makes a Locker over three clients: master 0 direct, master
// 1 with hook, master 2 through px (which the caller may cut). Its call
// timeout, 250ms, leaves room for the hooks' delays.
func lockerWith(t testing.TB, addrs []string, hook redis.Hook, px *testenv.Proxy) *redlockprio.Locker {
	t.Helper()
	rcs := []*redis.Client{newRedis(addrs[0]), newRedis(addrs[1]), newRedis(px.Addr())}
	rcs[1].AddHook(hook)
	lc, err := redlockprio.New([]redis.UniversalClient{rcs[0], rcs[1], rcs[2]},
		redlockprio.WithTTL(testTTL), redlockprio.WithRenewInterval(testRenew), redlockprio.WithCallTimeout(250*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	l := lc.Locker()
	t.Cleanup(func() {
		_ = lc.Close(context.Background())
		for _, rc := range rcs {
			_ = rc.Close()
		}
	})
	return l
}

// TestTokenRecordedOnQuorumBeforeLockReturns: the token is the largest
// counter among the granting masters, and it is on a quorum of masters
// before Lock returns; then it spreads to the others. Master 0 has a high
// counter (it kept counters another master lost), master 2 is cut off, so
// the quorum is masters 0 and 1 and master 1's counter must be raised
// before Lock returns. The raise is slowed down on master 1 so that one
// made in the background, after Lock returned, would be seen missing; and
// when it fails, Lock must fail.
func TestTokenRecordedOnQuorumBeforeLockReturns(t *testing.T) {
	addrs := addrsOf(testenv.StartRedis(t, 3))
	const planted = 1000
	ctx := ctxFor(t, 20*time.Second)

	t.Run("written back", func(t *testing.T) {
		name := uniqueName(t)
		setFence(t, addrs[0], name, planted)
		px := testenv.NewProxy(t, addrs[2])
		hook := &raiseHook{delay: 100 * time.Millisecond}
		l := lockerWith(t, addrs, hook, px)
		warm(t, l)
		px.Cut()
		start := time.Now()
		lease, err := l.Lock(ctx, name)
		if err != nil {
			t.Fatal(err)
		}
		took := time.Since(start)
		defer lease.Release(ctx)
		token := lease.Token()
		if token <= planted {
			t.Fatalf("token %d, not above the counter %d a granting master had", token, planted)
		}
		// Read at once: the quorum {0, 1} must hold the token already.
		for i, addr := range addrs[:2] {
			if got := fenceOf(t, addr, name); got < token {
				t.Errorf("when Lock returned, master %d's counter was %d, below the token %d: the token was not on a quorum", i, got, token)
			}
		}
		t.Logf("token %d (planted %d); Lock took %v with a raise delayed by %v", token, planted, took.Round(time.Millisecond), hook.delay)
		// Then it spreads: master 2, reachable again, gets it from the
		// renewals.
		px.Restore()
		for deadline := time.Now().Add(5 * time.Second); fenceOf(t, addrs[2], name) < token; {
			if time.Now().After(deadline) {
				t.Fatalf("master 2's counter is %d, still below the token %d, 5s after it came back", fenceOf(t, addrs[2], name), token)
			}
			time.Sleep(20 * time.Millisecond)
		}
		if err := context.Cause(lease.Context()); err != nil {
			t.Fatalf("the lease ended: %v", err)
		}
	})

	t.Run("write-back fails", func(t *testing.T) {
		name := uniqueName(t)
		setFence(t, addrs[0], name, planted)
		px := testenv.NewProxy(t, addrs[2])
		l := lockerWith(t, addrs, &raiseHook{fail: true}, px)
		warm(t, l)
		px.Cut()
		lease, err := l.TryLock(ctx, name)
		if err == nil {
			defer lease.Release(ctx)
			t.Fatalf("Lock returned token %d, which only master 0 holds (master 1's counter %d)", lease.Token(), fenceOf(t, addrs[1], name))
		}
		var qe *redlockprio.QuorumError
		if !errors.As(err, &qe) {
			t.Errorf("TryLock = %v, want a *QuorumError", err)
		}
		t.Logf("TryLock failed as it should: %v", err)
		for i, addr := range addrs[:2] {
			if keyExists(t, addr, "latchkey:{"+name+"}:1") {
				t.Errorf("the failed attempt left its key on master %d", i)
			}
		}
	})
}

// TestFencedWrites runs the contract suite's fencing checks with
// redlockprio leases on 3 masters writing to a separate Redis through
// redisfence: a holder cut off past its validity is refused once its
// successor wrote, racing first writes keep the successor's data.
func TestFencedWrites(t *testing.T) {
	masters := addrsOf(testenv.StartRedis(t, 3))
	data := testenv.StartRedis(t, 1)[0].Addr()
	contracttest.RunFencingTests(t, harnessOn(masters), func(ctx context.Context, t testing.TB) (contracttest.GuardedStore, error) {
		rc := redis.NewClient(&redis.Options{Addr: data, ContextTimeoutEnabled: true})
		g, err := redisfence.New(rc)
		if err != nil {
			return nil, errors.Join(err, rc.Close())
		}
		return &fencedRedis{rc: rc, guard: g}, nil
	})
}

// fencedRedis is a contracttest.GuardedStore on Redis strings behind a
// redisfence.Guard.
type fencedRedis struct {
	rc    *redis.Client
	guard *redisfence.Guard
}

func (s *fencedRedis) Write(ctx context.Context, lease locks.Lease, key, value string, inside func()) error {
	if inside != nil {
		inside()
	}
	return s.guard.Set(ctx, lease, key, value)
}

func (s *fencedRedis) Read(ctx context.Context, key string) (string, error) {
	v, err := s.rc.Get(ctx, key).Result()
	if errors.Is(err, redis.Nil) {
		return "", nil
	}
	return v, err
}

func (s *fencedRedis) IsStale(err error) bool { return errors.Is(err, fence.ErrStale) }

func (s *fencedRedis) Close() error { return s.rc.Close() }

// holdings records, in order, who held a name with which token.
type holdings struct {
	t     *testing.T
	name  string
	mu    sync.Mutex
	order []holding
}

type holding struct {
	who   string
	token uint64
}

func (h *holdings) add(who string, l locks.Lease) {
	h.mu.Lock()
	h.order = append(h.order, holding{who, l.Token()})
	h.mu.Unlock()
	h.t.Logf("%s holds %q with token %d", who, h.name, l.Token())
}

// check fails the test unless every holder's token is greater than the
// one before.
func (h *holdings) check() {
	h.mu.Lock()
	defer h.mu.Unlock()
	var seq []string
	for _, x := range h.order {
		seq = append(seq, fmt.Sprintf("%s: %d", x.who, x.token))
	}
	h.t.Logf("holders in order: %s", strings.Join(seq, ", "))
	for i := 1; i < len(h.order); i++ {
		if h.order[i].token <= h.order[i-1].token {
			h.t.Errorf("%s got token %d after %s held %d: a later holder's token must be greater",
				h.order[i].who, h.order[i].token, h.order[i-1].who, h.order[i-1].token)
		}
	}
}

// theftRace is a priority-0 Locker A and a priority-2 Locker B on three
// masters, with gates on their calls: A's acquire on master 2, A's
// token write-backs (raise), B's acquires on masters 0 and 1, B's theft
// notices; and a gate, always open, that tells when A cleans up a failed
// attempt (release).
type theftRace struct {
	t                         *testing.T
	addrs                     []string
	name                      string
	a, b                      *client
	aAcquire2, aRaise, aClean *cmdGate
	bAcquire0, bAcquire1      *cmdGate
	bNotice                   *cmdGate
	held                      *holdings
}

// newTheftRace starts the masters and the Lockers and sets the name's
// fence counters on the masters to counters.
func newTheftRace(t *testing.T, ctx context.Context, counters [3]int64) *theftRace {
	addrs := addrsOf(testenv.StartRedis(t, 3))
	opts := []redlockprio.Option{
		redlockprio.WithTTL(4 * time.Second), redlockprio.WithRenewInterval(1200 * time.Millisecond),
		// Room for the gates: a call held past it fails.
		redlockprio.WithCallTimeout(1900 * time.Millisecond),
	}
	r := &theftRace{
		t: t, addrs: addrs, name: uniqueName(t),
		a:         mustClient(t, addrs, with(opts...)),
		b:         mustClient(t, addrs, with(opts...), withPriority(2)),
		aAcquire2: newCmdGate(runsScript("acquire")),
		aRaise:    newCmdGate(runsScript("raise")),
		aClean:    newCmdGate(runsScript("release")),
		bAcquire0: newCmdGate(runsScript("acquire")),
		bAcquire1: newCmdGate(runsScript("acquire")),
		bNotice:   newCmdGate(isTheftNotice),
	}
	r.held = &holdings{t: t, name: r.name}
	warm(t, r.a.l)
	warm(t, r.b.l)
	r.aClean.open() // only seen, never held
	r.aClean.armed.Store(true)
	t.Cleanup(func() {
		for _, g := range r.gates() {
			g.open()
		}
	})
	r.a.rcs[2].AddHook(r.aAcquire2)
	for _, rc := range r.a.rcs {
		rc.AddHook(r.aRaise)
		rc.AddHook(r.aClean)
	}
	r.b.rcs[0].AddHook(r.bAcquire0)
	r.b.rcs[1].AddHook(r.bAcquire1)
	for _, rc := range r.b.rcs {
		rc.AddHook(r.bNotice)
	}
	for i, c := range counters {
		rc := newRedis(addrs[i])
		err := rc.Set(ctx, "latchkey:{"+r.name+"}:fence", c, 0).Err()
		_ = rc.Close()
		if err != nil {
			t.Fatal(err)
		}
	}
	return r
}

func (r *theftRace) gates() []*cmdGate {
	return []*cmdGate{r.aAcquire2, r.aRaise, r.aClean, r.bAcquire0, r.bAcquire1, r.bNotice}
}

// lock runs l.Lock in the background; the lease, once held, is released
// when its context ends (a theft) or when letGo closes. done says the
// Lock's error (nil once released); returned closes when Lock returns.
func (r *theftRace) lock(ctx context.Context, who string, c *client, letGo <-chan struct{}) (done <-chan error, returned <-chan struct{}) {
	d := make(chan error, 1)
	ret := make(chan struct{})
	go func() {
		l, err := c.l.Lock(ctx, r.name)
		close(ret)
		if err != nil {
			d <- err
			return
		}
		r.held.add(who, l)
		select {
		case <-l.Context().Done():
		case <-letGo:
		}
		_ = l.Release(context.Background()) // an error once preempted
		d <- nil
	}()
	return d, ret
}

// finish lets A's write-back and the held acquires go on, then B's
// notice once A's Lock has returned or A has given its attempt up
// (which a fixed A does), waits for both Locks and checks the tokens.
func (r *theftRace) finish(aDone, bDone <-chan error, aReturned, bReturned <-chan struct{}, letGo chan struct{}) {
	t := r.t
	for _, g := range []*cmdGate{r.aRaise, r.aAcquire2, r.bAcquire0, r.bAcquire1} {
		g.armed.Store(false)
		g.open()
	}
	select {
	case <-aReturned:
	case <-r.aClean.seen:
	case <-time.After(10 * time.Second):
		t.Fatal("A's Lock neither returned nor gave its attempt up")
	}
	r.bNotice.open()
	// B holds the name until A's Lock has returned (and, if A held it
	// with the lower token, released it on B's notice); then both let go.
	select {
	case <-bReturned:
	case <-time.After(15 * time.Second):
		t.Fatal("B's Lock did not return")
	}
	close(letGo)
	for who, done := range map[string]<-chan error{"A": aDone, "B": bDone} {
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("%s's Lock: %v", who, err)
			}
		case <-time.After(15 * time.Second):
			t.Fatalf("%s's Lock did not return", who)
		}
	}
	r.held.check()
}

// TestTheftBeforeTokenWriteBackKeepsTokensIncreasing: a priority-0
// attempt A wins masters 0 and 1, whose counters differ (34 and 21), so
// its token 34 must be written back to master 1 before Lock returns. A
// priority-2 thief B takes the name on masters 1 and 2 in between (its
// call to master 0, where A's counter is 34, answers late), and B's
// notice reaches A only after A's Lock has returned. A must not hold the
// name with a token at least B's: B, the later holder, got token 22 on
// counters that A's write-back had not reached. (It did: A held token 34,
// then B held 22 — the chaos run's "theft repeats or lowers the token",
// seeds 11, 12 and 63.)
func TestTheftBeforeTokenWriteBackKeepsTokensIncreasing(t *testing.T) {
	ctx := ctxFor(t, 25*time.Second)
	r := newTheftRace(t, ctx, [3]int64{33, 20, 20})
	for _, g := range []*cmdGate{r.aAcquire2, r.aRaise, r.bAcquire0, r.bNotice} {
		g.armed.Store(true)
	}
	letGo := make(chan struct{})
	// A wins masters 0 (counter 34) and 1 (21); its call to master 2 is
	// held, so the token 34 must be written back to master 1.
	aDone, aReturned := r.lock(ctx, "A (priority 0)", r.a, letGo)
	waitSeen(t, r.aRaise.seen, "A's token write-back")
	// B takes master 1 from A and master 2 (free), and wins on them
	// before its call to master 0 (A's key, counter 34) answers.
	bDone, bReturned := r.lock(ctx, "B (priority 2)", r.b, letGo)
	waitSeen(t, r.bNotice.seen, "B's theft notice")
	r.finish(aDone, bDone, aReturned, bReturned, letGo)
}

// TestHeldAnswerDoesNotRecordToken: the thief B got master 2 first (its
// counter 34), so A, winning masters 0 (34) and 1 (21), saw master 2
// "held" with counter 34. That counter does not record A's token for A:
// B then takes master 1 from A, where the counter is still 21, and
// wins with token 34, as a later holder than A. (It did: A counted
// master 2 as holding its token, returned at once with token 34 and
// left master 1's write-back to the background; B then held 34 too.)
func TestHeldAnswerDoesNotRecordToken(t *testing.T) {
	ctx := ctxFor(t, 25*time.Second)
	r := newTheftRace(t, ctx, [3]int64{33, 20, 33})
	for _, g := range []*cmdGate{r.aRaise, r.bAcquire0, r.bAcquire1, r.bNotice} {
		g.armed.Store(true)
	}
	letGo := make(chan struct{})
	// B takes master 2 (counter 34); its calls to masters 0 and 1 are held.
	bDone, bReturned := r.lock(ctx, "B (priority 2)", r.b, letGo)
	deadline := time.Now().Add(10 * time.Second)
	for !strings.HasPrefix(holderOf(t, r.addrs[2], r.name), r.b.c.ID()+":") {
		if time.Now().After(deadline) {
			t.Fatal("B did not take master 2")
		}
		time.Sleep(2 * time.Millisecond)
	}
	// A wins masters 0 (34) and 1 (21) and sees master 2 held (34).
	aDone, aReturned := r.lock(ctx, "A (priority 0)", r.a, letGo)
	select {
	case <-aReturned:
	case <-r.aRaise.seen:
	case <-time.After(10 * time.Second):
		t.Fatal("A's Lock neither returned nor wrote its token back")
	}
	// B takes master 1 from A before A's write-back there, and wins.
	r.bAcquire1.armed.Store(false)
	r.bAcquire1.open()
	waitSeen(t, r.bNotice.seen, "B's theft notice")
	r.finish(aDone, bDone, aReturned, bReturned, letGo)
}

// stormWorker describes one contender of the storms.
type stormWorker struct {
	name      string
	prio      int
	ttl       time.Duration
	retries   bool // go-redis default MaxRetries
	immediate bool // WithImmediateAck
	slow2     time.Duration
	delay2    bool // slow2 is DelayReplies (past the call timeout), else Latency
}

// TestTokensIncreaseWhileTheftsRaceSlowWriteBacks: 3 masters, five Lockers of
// priorities 0–3, TTLs 600ms–1s, some with go-redis's retrying clients and
// some with MaxRetries -1, some WithImmediateAck (their work stops the
// moment the context ends, as that option requires). Each Locker's link
// to master 2 is slow: 25ms each way (token write-backs and raises land
// late, under the call timeout) or replies delayed 300ms (past the 200ms
// call timeout: late grants). Every 150ms one master's fence counter is
// raised by 1000, so the token comes from one master and must be written
// back to the others ("When fewer than a quorum did [...] a second step
// raises the other masters' counters to T"). Thefts race those
// write-backs all the time. Checked on one clock: no holder writes (while
// its lease context is live) after a later holder was granted, and
// "Lease.Token is strictly greater for every later holder of a name".
// Variant "m2 refusing after first contact": every Locker's link to
// master 2 refuses connections from 0.5s to 2s (retrying clients then see
// unknown errors, the others refused dials).
// Variant "m1 restarted empty": master 1 is killed and restarted empty
// once, mid-run (a single master: inside the documented limits, since no
// holder crashes).
func TestTokensIncreaseWhileTheftsRaceSlowWriteBacks(t *testing.T) {
	for _, variant := range []string{"no restart", "m1 restarted empty", "m2 refusing after first contact"} {
		t.Run(variant, func(t *testing.T) {
			servers := testenv.StartRedis(t, 3)
			addrs := addrsOf(servers)
			workers := []stormWorker{
				{"w0p0", 0, 600 * time.Millisecond, false, false, 25 * time.Millisecond, false},
				{"w1p0r", 0, time.Second, true, false, 300 * time.Millisecond, true},
				{"w2p1ri", 1, 600 * time.Millisecond, true, true, 25 * time.Millisecond, false},
				{"w3p2", 2, 800 * time.Millisecond, false, false, 300 * time.Millisecond, true},
				{"w4p3ri", 3, 600 * time.Millisecond, true, true, 25 * time.Millisecond, false},
			}
			name := uniqueName(t)
			hist := contracttest.NewWriteHistory()
			var lockers []*client
			for _, w := range workers {
				var more []redlockprio.Option
				if w.immediate {
					more = append(more, redlockprio.WithImmediateAck())
				}
				opts := []clientOption{viaProxies(), withTiming(w.ttl, 0.01), withPriority(w.prio), with(more...)}
				if w.retries {
					opts = append(opts, retrying())
				}
				a := mustClient(t, addrs, opts...)
				warm(t, a.l)
				if w.delay2 {
					a.proxies[2].DelayReplies(w.slow2)
				} else {
					a.proxies[2].Latency(w.slow2)
				}
				lockers = append(lockers, a)
			}
			setFence(t, addrs[0], name, 500)
			runFor := 2500 * time.Millisecond
			end := time.Now().Add(runFor)
			var wg sync.WaitGroup
			var mu sync.Mutex
			errCount := map[string]int{}
			grants := map[string]int{}
			for i, w := range workers {
				wg.Go(func() {
					r := rand.New(rand.NewPCG(uint64(i), 7))
					for time.Now().Before(end) {
						ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
						l, err := lockers[i].l.Lock(ctx, name)
						cancel()
						if err != nil {
							mu.Lock()
							errCount[fmt.Sprintf("%s: %T %v", w.name, err, shortErr(err))]++
							mu.Unlock()
							time.Sleep(5 * time.Millisecond)
							continue
						}
						s := hist.Begin(w.name, l)
						stop := make(chan struct{})
						tm := time.AfterFunc(time.Duration(3+r.IntN(20))*time.Millisecond, func() { close(stop) })
						s.WriteWhileLive(stop)
						tm.Stop()
						s.LetGo()
						preempted := errors.Is(context.Cause(l.Context()), locks.ErrPreempted)
						_ = l.Release(context.Background())
						mu.Lock()
						if preempted {
							grants["preempted"]++
						}
						grants[w.name]++
						mu.Unlock()
						time.Sleep(time.Duration(r.IntN(8)) * time.Millisecond)
					}
				})
			}
			stopBump := make(chan struct{})
			bumped := make(chan struct{})
			go func() {
				defer close(bumped)
				tk := time.NewTicker(150 * time.Millisecond)
				defer tk.Stop()
				for k := 1; ; k++ {
					select {
					case <-stopBump:
						return
					case <-tk.C:
						bumpFence(addrs[k%3], name, 1000)
					}
				}
			}()
			if variant == "m1 restarted empty" {
				time.Sleep(1000 * time.Millisecond)
				if err := servers[1].Restart(); err != nil {
					t.Fatal(err)
				}
				t.Logf("master 1 restarted empty at %v", ms(hist.Now()))
			}
			if variant == "m2 refusing after first contact" {
				time.Sleep(500 * time.Millisecond)
				for _, a := range lockers {
					a.proxies[2].Cut()
				}
				t.Logf("master 2 refusing from %v", ms(hist.Now()))
				time.Sleep(1500 * time.Millisecond)
				for i, a := range lockers {
					a.proxies[2].Restore()
					if workers[i].delay2 { // the slow link again
						a.proxies[2].DelayReplies(workers[i].slow2)
					} else {
						a.proxies[2].Latency(workers[i].slow2)
					}
				}
				t.Logf("master 2 back at %v", ms(hist.Now()))
			}
			wg.Wait()
			close(stopBump)
			<-bumped
			t.Logf("grants: %v", grants)
			t.Logf("errors: %v", errCount)
			if err := hist.Check(); err != nil {
				t.Logf("sections:\n%v", hist)
				t.Error(err)
			}
			if c, at := hist.Peak(); c > 1 {
				t.Logf("max concurrent sections %d at %v", c, ms(at))
			}
		})
	}
}
