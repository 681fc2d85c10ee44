package redlockprio_test

import (
	"context"
	"crypto/sha1"
	"encoding/hex"
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
	"github.com/latchkey-go/latchkey/locks"
	"github.com/latchkey-go/latchkey/redlockprio"
	"github.com/latchkey-go/latchkey/redlockprio/internal/scripts"
)

// The ordering of a Client's calls at each master (see the protocol doc,
// Ordering within a Client): within one lease, within one queue member, a
// new acquire after the Client's earlier frees of the name; one arrival
// step of a name admitted at a time, its wait bounded by the Lock's
// context.

// orderingTiming gives the Clients of these tests a call timeout long
// enough that a call held back at one master can be let go well within
// it on a loaded machine, and a TTL that keeps a key left behind (the
// failure these tests look for) in place long after that.
func orderingTiming() clientOption {
	return func(s *clientSetup) {
		withTiming(3*time.Second, 0.01)(s)
		with(redlockprio.WithCallTimeout(time.Second))(s)
	}
}

// runsSource matches a command that runs the Lua script src (EVALSHA or
// EVAL): the queue's scripts, which scriptOf does not name.
func runsSource(src string) func(redis.Cmder) bool {
	sum := sha1.Sum([]byte(src))
	sha := hex.EncodeToString(sum[:])
	return func(cmd redis.Cmder) bool {
		args := cmd.Args()
		if len(args) < 2 {
			return false
		}
		s, _ := args[1].(string)
		switch strings.ToLower(cmd.Name()) {
		case "evalsha":
			return s == sha
		case "eval":
			return s == src
		}
		return false
	}
}

// pingBound measures the slack of a bound of documented on the master at
// addr.
func pingBound(t *testing.T, addr string, documented time.Duration) contracttest.Bound {
	t.Helper()
	rc := newRedis(addr)
	defer rc.Close()
	return contracttest.MeasureBound(t, documented, func() error { return rc.Ping(context.Background()).Err() })
}

// pollUntil polls cond until it holds or the bound's limit has passed
// since start; it returns how long that took, and whether cond held. It
// watches the scheduler meanwhile (see [contracttest.Bound.Watch]): a
// stall of the loaded machine during the wait widens b.
func pollUntil(start time.Time, b *contracttest.Bound, cond func() bool) (time.Duration, bool) {
	stop := b.Watch()
	for {
		if cond() {
			stop()
			return time.Since(start), true
		}
		if time.Since(start) > b.Limit() {
			stop() // b now counts the stalls seen so far
			if time.Since(start) > b.Limit() {
				return time.Since(start), cond()
			}
			stop = b.Watch()
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// TestNewAcquireAfterStragglingFree: a Client's free of a name at one
// master (a lease's release, or the deletion of what a failed TryLock
// got) is held back there after a quorum answered; the same Client's next
// Lock of the name returns on the other masters. Its acquire at the held
// master must run after the free (see the protocol doc, Ordering within a
// Client: a new acquire comes after the Client's earlier releases and
// deletions), so that once the free is let go the new lease's key lands
// there too, within a few round trips: had it run first, it would have
// found the old key, and the new lease would sit on a bare quorum for its
// whole life. The frees: a lease's release, and the deletion of a failed
// TryLock's grant that answered after it returned (lateAnswers.check:
// that deletion fails now, as it is not ordered before the Client's
// next acquire of the name).
func TestNewAcquireAfterStragglingFree(t *testing.T) {
	for _, free := range []string{"release", "late-grant-deletion"} {
		t.Run(free, func(t *testing.T) {
			servers := testenv.StartRedis(t, 3)
			addrs := addrsOf(servers)
			c := mustClient(t, addrs, orderingTiming())
			warm(t, c.l)
			gate := newCmdGate(runsScript("release"))
			c.rcs[2].AddHook(gate)
			defer gate.open()
			ctx := ctxFor(t, 30*time.Second)
			name := uniqueName(t)
			oldID := ""
			switch free {
			case "release":
				old, err := c.l.Lock(ctx, name)
				if err != nil {
					t.Fatal(err)
				}
				oldID = old.(*redlockprio.Lease).HolderID()
				waitForHolder(t, addrs, name, c.c.ID())
				gate.armed.Store(true)
				if err := old.Release(ctx); err != nil {
					t.Fatalf("Release: %v", err)
				}
			case "late-grant-deletion":
				// Another holder on the first two masters: the TryLock is
				// refused there and returns, while its acquire at the third
				// master, which grants, answers late; the late grant is then
				// deleted in the background.
				plant(t, addrs[0], name, 1, "other:1", 0)
				plant(t, addrs[1], name, 1, "other:1", 0)
				late := newReplyGate(runsScript("acquire"))
				c.rcs[2].AddHook(late)
				defer late.open()
				late.armed.Store(true)
				gate.armed.Store(true)
				_, err := c.l.TryLock(ctx, name)
				var he *locks.HeldError
				if !errors.As(err, &he) {
					t.Fatalf("TryLock of a name held on two masters: %v, want a HeldError", err)
				}
				waitSeen(t, late.seen, "the TryLock's acquire at the third master")
				oldID = holderOf(t, addrs[2], name)
				if oldID == "" {
					t.Fatal("the TryLock's acquire at the third master granted nothing")
				}
				unplant(t, addrs[0], name, 1)
				unplant(t, addrs[1], name, 1)
				late.armed.Store(false)
				late.open()
			}
			waitSeen(t, gate.seen, "the free at the third master")
			gate.armed.Store(false)
			lease, err := c.l.Lock(ctx, name)
			if err != nil {
				t.Fatalf("Lock after the free: %v", err)
			}
			defer lease.Release(context.Background())
			id := lease.(*redlockprio.Lease).HolderID()
			if got := holderOf(t, addrs[2], name); got == id {
				t.Fatalf("the new lease holds the third master while the Client's free there is still held back")
			}
			b := pingBound(t, addrs[2], 0)
			opened := time.Now()
			gate.open()
			took, ok := pollUntil(opened, &b, func() bool { return holderOf(t, addrs[2], name) == id })
			if !ok {
				t.Fatalf("the new lease's key is not on the third master %v after the free there was let go (holder there %q, old lease %q); bound %v",
					took, holderOf(t, addrs[2], name), oldID, b)
			}
			t.Logf("the new lease reached the third master %v after the free was let go", took.Round(time.Microsecond))
		})
	}
}

// replyGate holds, on one go-redis client, the replies of the commands
// it matches while it is armed (the command has run at the master),
// until it is opened or the call's context ends, and says on seen when
// the first one comes.
type replyGate struct{ *cmdGate }

func newReplyGate(match func(redis.Cmder) bool) *replyGate {
	return &replyGate{newCmdGate(match)}
}

func (g *replyGate) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		if g.armed.Load() && g.match(cmd) {
			g.seenOnce.Do(func() { close(g.seen) })
			select {
			case <-g.opened:
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		return err
	}
}

// TestLeaveAfterStragglingEnqueue: a waiter's join is held back at one
// master after a quorum answered; the Lock's context ends, and it leaves
// the queue. Its leave there must run after its enqueue (see the protocol
// doc, Ordering within a Client: within one queue member, its enqueues,
// then its leave), so that once the enqueue is let go no entry of the
// waiter stays there: had the leave run first, the enqueue would put the
// entry back, to block the queue there for a TTL.
func TestLeaveAfterStragglingEnqueue(t *testing.T) {
	addrs := addrsOf(testenv.StartRedis(t, 3))
	holder := mustClient(t, addrs, orderingTiming())
	waiter := mustClient(t, addrs, orderingTiming())
	warm(t, waiter.l)
	ctx := ctxFor(t, 30*time.Second)
	name := uniqueName(t)
	held, err := holder.l.Lock(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	defer held.Release(context.Background())
	gate := newCmdGate(runsSource(scripts.Enqueue))
	waiter.rcs[2].AddHook(gate)
	defer gate.open()
	gate.armed.Store(true)
	wctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		l, err := waiter.l.Lock(wctx, name)
		if l != nil {
			_ = l.Release(context.Background())
		}
		done <- err
	}()
	waitSeen(t, gate.seen, "the waiter's enqueue at the third master")
	waitQueued(t, addrs[:2], name, 1, 5*time.Second)
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("the cancelled Lock: %v, want context.Canceled", err)
	}
	for i, a := range addrs[:2] {
		if ms := queueMembers(t, a, name); len(ms) != 0 {
			t.Errorf("master %d still queues %q after the cancelled Lock returned", i, ms)
		}
	}
	b := pingBound(t, addrs[2], 0)
	opened := time.Now()
	gate.open()
	// The held enqueue runs now, then the leave. Wait for the enqueue to
	// have run (the ticket counter it raises) before judging the queue.
	took, ok := pollUntil(opened, &b, func() bool {
		return len(queueMembers(t, addrs[2], name)) == 0 && enqueueRan(t, addrs[2], name)
	})
	if !ok {
		t.Fatalf("the third master queues %q %v after the waiter's held enqueue was let go (it left the queue before); bound %v",
			queueMembers(t, addrs[2], name), took, b)
	}
}

// enqueueRan says whether an enqueue of name has reached the master at
// addr: it raises the ticket counter there (the ticket was taken on the
// other masters, or this one).
func enqueueRan(t testing.TB, addr, name string) bool {
	t.Helper()
	rc := newRedis(addr)
	defer rc.Close()
	n, err := rc.Exists(context.Background(), "latchkey:{"+name+"}:qn").Result()
	if err != nil {
		t.Fatal(err)
	}
	return n == 1
}

// heldAdmission starts a Lock of a fresh name through c whose acquire is
// held back at every master until the returned function is called (or
// its call timeout passes), so that it keeps the name's admission; it
// returns the name and a channel with that Lock's outcome.
func heldAdmission(t *testing.T, c *client, ctx context.Context) (name string, open func(), first <-chan error) {
	t.Helper()
	var gates []*cmdGate
	for _, rc := range c.rcs {
		g := newCmdGate(runsScript("acquire"))
		g.armed.Store(true)
		rc.AddHook(g)
		gates = append(gates, g)
	}
	open = func() {
		for _, g := range gates {
			g.armed.Store(false)
			g.open()
		}
	}
	t.Cleanup(open)
	name = uniqueName(t)
	done := make(chan error, 1)
	go func() {
		l, err := c.l.Lock(ctx, name)
		if l != nil {
			_ = l.Release(context.Background())
		}
		done <- err
	}()
	for i, g := range gates {
		waitSeen(t, g.seen, fmt.Sprintf("the first Lock's acquire at master %d", i))
		g.armed.Store(false) // later calls pass: only the first Lock's are held
	}
	return name, open, done
}

// TestLockEndsWhileWaitingForAdmission: while one Lock's step keeps a
// name's admission (its calls held at the masters), other Locks of the
// name through the same Client wait for admission on their own contexts
// (see the protocol doc, Ordering within a Client): those whose context
// ends return its error within the context's time plus slack, not after
// the admitted step's call timeout, and hold nothing and queue nothing.
func TestLockEndsWhileWaitingForAdmission(t *testing.T) {
	addrs := addrsOf(testenv.StartRedis(t, 3))
	c := mustClient(t, addrs, orderingTiming())
	warm(t, c.l)
	ctx := ctxFor(t, 30*time.Second)
	name, open, first := heldAdmission(t, c, ctx)
	const waiters = 20
	const patience = 100 * time.Millisecond
	b := pingBound(t, addrs[0], patience)
	var wg sync.WaitGroup
	results := make([]error, waiters)
	took := make([]time.Duration, waiters)
	for i := range waiters {
		wg.Go(func() {
			wctx, cancel := context.WithTimeout(ctx, patience)
			defer cancel()
			start := time.Now()
			lock := c.l.Lock
			if i%2 == 1 {
				lock = c.l.TryLock
			}
			l, err := lock(wctx, name)
			took[i] = time.Since(start)
			if l != nil {
				_ = l.Release(context.Background())
			}
			results[i] = err
		})
	}
	wg.Wait()
	for i, err := range results {
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("call %d waiting for admission: %v, want context.DeadlineExceeded", i, err)
		}
		b.Check(t, fmt.Sprintf("call %d waiting for admission", i), took[i])
	}
	for i, a := range addrs {
		if ms := queueMembers(t, a, name); len(ms) != 0 {
			t.Errorf("master %d queues %q for the calls that never got admitted", i, ms)
		}
		if h := holderOf(t, a, name); h != "" {
			t.Errorf("master %d holds the name for %q while the first Lock's calls are still held", i, h)
		}
	}
	open()
	if err := <-first; err != nil {
		t.Logf("the admitted Lock: %v", err)
	}
}

// waitingForAdmission polls until n goroutines wait in a Client's
// admission, or fails the test after d.
func waitingForAdmission(t *testing.T, n int, d time.Duration) {
	t.Helper()
	deadline := time.Now().Add(d)
	for {
		got := contracttest.GoroutinesIn("github.com/latchkey-go/latchkey/redlockprio.(*Client).admit(")
		if got >= n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d goroutines wait for admission after %v, want %d", got, d, n)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestCloseWhileLocksWaitForAdmission: Close, while many Locks of a name
// through the Client wait for its admission behind one Lock whose calls
// are held at the masters, makes every waiting Lock return an error
// matching locks.ErrClosed, and returns within the call timeout twice
// over (see Client.Close: a master that does not answer holds Close
// about the call timeout, twice it when a waiting Lock must also leave
// the queue), plus slack.
func TestCloseWhileLocksWaitForAdmission(t *testing.T) {
	addrs := addrsOf(testenv.StartRedis(t, 3))
	c := mustClient(t, addrs, orderingTiming())
	warm(t, c.l)
	ctx := ctxFor(t, 30*time.Second)
	name, _, first := heldAdmission(t, c, ctx)
	const waiters = 50
	var wg sync.WaitGroup
	results := make([]error, waiters)
	returned := make([]time.Time, waiters)
	started := make(chan struct{}, waiters)
	for i := range waiters {
		wg.Go(func() {
			started <- struct{}{}
			l, err := c.l.Lock(ctx, name)
			returned[i] = time.Now()
			if l != nil {
				_ = l.Release(context.Background())
			}
			results[i] = err
		})
	}
	for range waiters {
		<-started
	}
	waitingForAdmission(t, waiters, 10*time.Second)
	b := pingBound(t, addrs[0], 2*time.Second)
	closing := time.Now()
	if err := c.Close(ctx); err != nil {
		t.Errorf("Close: %v", err)
	}
	b.Check(t, "Close with Locks waiting for admission", time.Since(closing))
	wg.Wait()
	for i, err := range results {
		if !errors.Is(err, locks.ErrClosed) {
			t.Errorf("Lock %d waiting for admission at Close: %v, want ErrClosed", i, err)
		}
		b.Check(t, fmt.Sprintf("Lock %d's return after Close began", i), returned[i].Sub(closing))
	}
	if err := <-first; !errors.Is(err, locks.ErrClosed) {
		t.Logf("the admitted Lock: %v", err)
	}
}

// lockOutcome tallies what calls returned, by kind.
type lockOutcome struct {
	mu     sync.Mutex
	by     map[string]int
	bad    []string
	quorum []string // the QuorumErrors, counted as the starved-CPU limit
}

func (o *lockOutcome) add(kind string) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.by == nil {
		o.by = map[string]int{}
	}
	o.by[kind]++
}

func (o *lockOutcome) wrong(format string, args ...any) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.bad = append(o.bad, fmt.Sprintf(format, args...))
}

// classify checks one call's error against the error contract: nil, a
// HeldError from TryLock (also when ctx ended as it returned: the outcome
// was decided first), ctx's error once ctx ended, a QuorumError (the
// documented starved-CPU limit, counted), nothing else.
func (o *lockOutcome) classify(op string, ctx context.Context, err error) {
	var he *locks.HeldError
	var qe *redlockprio.QuorumError
	switch {
	case err == nil:
		o.add(op + " ok")
	case ctx.Err() != nil && errors.Is(err, ctx.Err()):
		o.add(op + " ctx")
	case op == "trylock" && errors.As(err, &he):
		o.add(op + " held")
	case errors.As(err, &qe):
		o.add(op + " quorum")
		o.mu.Lock()
		o.quorum = append(o.quorum, fmt.Sprintf("%s: %v", op, err))
		o.mu.Unlock()
	default:
		o.wrong("%s returned %v", op, err)
	}
}

// TestOneClientMixedCallsUnderStragglers: two Clients of one priority and
// a Client of a higher one each run many goroutines on one name, mixing
// Lock, TryLock and Locks whose context ends at random, while one
// master's replies come late at times (the Clients' calls there straggle
// past the quorum). Every section runs from the grant until its holder
// calls Release (a preempted holder too: the thief waits for its
// Release); no two may overlap, tokens must increase in grant order, and
// every error must be one the contract allows.
func TestOneClientMixedCallsUnderStragglers(t *testing.T) {
	addrs := addrsOf(testenv.StartRedis(t, 3))
	low1 := mustClient(t, addrs, viaProxies())
	low2 := mustClient(t, addrs, viaProxies())
	high := mustClient(t, addrs, viaProxies(), withPriority(1))
	for _, c := range []*client{low1, low2, high} {
		warm(t, c.l)
	}
	name := uniqueName(t)
	h := contracttest.NewHistory(1)
	var fenced contracttest.FencedResource
	var out lockOutcome
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var seq sync.Mutex
	nextWho := 0
	who := func(c string) string {
		seq.Lock()
		defer seq.Unlock()
		nextWho++
		return fmt.Sprintf("%s#%d", c, nextWho)
	}
	worker := func(label string, c *client, seed uint64) {
		r := rand.New(rand.NewPCG(seed, 7))
		for {
			select {
			case <-stop:
				return
			default:
			}
			op := "lock"
			call := c.l.Lock
			if r.IntN(3) == 0 {
				op, call = "trylock", c.l.TryLock
			}
			patience := 2 * time.Second
			if r.IntN(3) == 0 {
				patience = time.Duration(r.IntN(40)) * time.Millisecond
			}
			ctx, cancel := context.WithTimeout(context.Background(), patience)
			l, err := call(ctx, name)
			out.classify(op, ctx, err)
			cancel()
			if err != nil {
				continue
			}
			w := who(label)
			exit := h.Enter(w, l.Token())
			if err := fenced.Write(w, l.Token()); err != nil {
				out.wrong("fencing: %v", err)
			}
			time.Sleep(time.Duration(r.IntN(3)) * time.Millisecond)
			exit()
			if err := l.Release(context.Background()); err != nil {
				// A preempted lease's Release says so; a QuorumError is
				// the starved-CPU limit.
				var qe *redlockprio.QuorumError
				if !errors.Is(err, locks.ErrPreempted) && !errors.As(err, &qe) {
					out.wrong("Release: %v", err)
				}
			}
		}
	}
	for i := range 8 {
		wg.Go(func() { worker("low1", low1, uint64(i)) })
		wg.Go(func() { worker("low2", low2, uint64(100+i)) })
	}
	for i := range 3 {
		wg.Go(func() { worker("high", high, uint64(200+i)) })
	}
	// One master's replies come late at times, to every Client: its
	// calls straggle past the quorum and run on in the background.
	deadline := time.Now().Add(6 * time.Second)
	r := rand.New(rand.NewPCG(1, 2))
	for time.Now().Before(deadline) {
		m := r.IntN(3)
		for _, c := range []*client{low1, low2, high} {
			c.proxies[m].DelayReplies(time.Duration(20+r.IntN(60)) * time.Millisecond)
		}
		time.Sleep(300 * time.Millisecond)
		for _, c := range []*client{low1, low2, high} {
			c.proxies[m].Restore()
		}
		time.Sleep(200 * time.Millisecond)
	}
	close(stop)
	wg.Wait()
	t.Logf("outcomes: %v; %d sections, %d fenced writes; QuorumErrors: %q", out.by, h.Len(), fenced.Accepted(), out.quorum)
	for _, s := range out.bad {
		t.Error(s)
	}
	if err := h.Check(); err != nil {
		t.Error(err)
	}
	if h.Len() == 0 {
		t.Fatal("no Lock got the name")
	}
	// Nothing left behind: cancelled waiters left the queue, released
	// leases their keys; what a call starved of CPU could not clean up
	// expires within the queue's bound for a dead waiter (a TTL and a
	// half).
	b := pingBound(t, addrs[0], testTTL+testTTL/2)
	took, ok := pollUntil(time.Now(), &b, func() bool {
		for _, a := range addrs {
			if holderOf(t, a, name) != "" || len(liveQueueMembers(t, a, name)) != 0 {
				return false
			}
		}
		return true
	})
	if !ok {
		for i, a := range addrs {
			t.Logf("master %d: holder %q, live queue entries %q", i, holderOf(t, a, name), liveQueueMembers(t, a, name))
		}
		t.Fatalf("the name is not free %v after the run; bound %v", took, b)
	}
}

// liveQueueMembers returns the members of name's waiter queue on the
// master at addr whose entries have not expired by that master's clock
// (expired ones stay until a script reads the queue).
func liveQueueMembers(t testing.TB, addr, name string) []string {
	t.Helper()
	rc := newRedis(addr)
	defer rc.Close()
	ctx := context.Background()
	now, err := rc.Time(ctx).Result()
	if err != nil {
		t.Fatalf("TIME at %s: %v", addr, err)
	}
	ms, err := rc.ZRangeArgs(ctx, redis.ZRangeArgs{
		Key: "latchkey:{" + name + "}:qt", ByScore: true,
		Start: fmt.Sprintf("(%d", now.UnixMilli()), Stop: "+inf",
	}).Result()
	if err != nil {
		t.Fatalf("ZRANGEBYSCORE of the queue's expiries at %s: %v", addr, err)
	}
	return ms
}

// TestSemaphoreThroughOneClientMixedCalls: many goroutines share one
// Client's Semaphore of two slots, mixing Acquire, TryAcquire and calls
// whose context ends at random; at most two sections overlap, and every
// error is ctx's or, for TryAcquire, ErrNotAcquired.
func TestSemaphoreThroughOneClientMixedCalls(t *testing.T) {
	addrs := addrsOf(testenv.StartRedis(t, 3))
	c := mustClient(t, addrs)
	warm(t, c.l)
	sem, err := c.c.Semaphore(2)
	if err != nil {
		t.Fatal(err)
	}
	name := uniqueName(t)
	h := contracttest.NewHistory(2)
	var out lockOutcome
	var wg sync.WaitGroup
	stopAt := time.Now().Add(4 * time.Second)
	for i := range 16 {
		wg.Go(func() {
			r := rand.New(rand.NewPCG(uint64(i), 11))
			for time.Now().Before(stopAt) {
				op, call := "lock", sem.Acquire
				if r.IntN(3) == 0 {
					op, call = "trylock", sem.TryAcquire
				}
				patience := 2 * time.Second
				if r.IntN(3) == 0 {
					patience = time.Duration(r.IntN(30)) * time.Millisecond
				}
				ctx, cancel := context.WithTimeout(context.Background(), patience)
				l, err := call(ctx, name)
				out.classify(op, ctx, err)
				cancel()
				if err != nil {
					continue
				}
				exit := h.EnterLease(fmt.Sprintf("g%d", i), l)
				time.Sleep(time.Duration(r.IntN(3)) * time.Millisecond)
				exit()
				_ = l.Release(context.Background())
			}
		})
	}
	wg.Wait()
	t.Logf("outcomes: %v; %d sections, peak %d", out.by, h.Len(), h.Peak())
	for _, s := range out.bad {
		t.Error(s)
	}
	if err := h.Check(); err != nil {
		t.Error(err)
	}
}
