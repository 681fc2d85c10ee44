package redlockprio_test

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/latchkey-go/latchkey/contracttest"
	"github.com/latchkey-go/latchkey/contracttest/testenv"
	"github.com/latchkey-go/latchkey/locks"
	"github.com/latchkey-go/latchkey/redlockprio"
)

// The waiter queue of a name (see the package doc, Waiting), in sections:
// wake-ups, liveness, order, faults, and clients of mixed options.

// TestWaiterWokenByRelease: a waiting Lock is woken by the release notices
// the masters publish, not by polling: with a 5s backoff it still gets the
// name within a fraction of a second of the Release.
func TestWaiterWokenByRelease(t *testing.T) {
	addrs := addrsOf(testenv.StartRedis(t, 3))
	slow := locks.Backoff{Min: 5 * time.Second, Max: 5 * time.Second}
	holder := mustClient(t, addrs)
	waiter := mustClient(t, addrs, with(redlockprio.WithBackoff(slow)))
	ctx := ctxFor(t, 10*time.Second)
	name := uniqueName(t)
	lease, err := holder.l.TryLock(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	got := make(chan error, 1)
	go func() {
		l, err := waiter.l.Lock(ctx, name)
		if err == nil {
			defer l.Release(ctx)
		}
		got <- err
	}()
	time.Sleep(300 * time.Millisecond) // the waiter has tried once and listens
	released := time.Now()
	if err := lease.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-got; err != nil {
		t.Fatalf("the waiter's Lock: %v", err)
	}
	took := time.Since(released)
	t.Logf("the waiter got the name %v after the Release (backoff %v)", took.Round(time.Microsecond), slow.Min)
	if took > time.Second {
		t.Errorf("the waiter got the name %v after the Release: not woken (its backoff is %v)", took, slow.Min)
	}
}

// The waiter queue's liveness (see the package doc, Waiting): a waiter
// that dies blocks the queue at most its entry's lifetime, the TTL after
// its last refresh (plus TTL/2 at worst, when the waiter behind it learns
// it is next only at its own refresh); one that gives up leaves no entry
// behind.

// TestKilledHeadWaiterBlocksAtMostItsEntry: the head of the queue is cut
// off from every master (its Client's connections closed, as a crash)
// while the name is held; at the release the wake-up goes to it. The
// next waiter, which joined next in line, tries again when the dead
// waiter's entry expires (TTL after its last refresh, which came before
// the kill): it must get the name within the TTL of the kill, plus slack
// measured here.
func TestKilledHeadWaiterBlocksAtMostItsEntry(t *testing.T) {
	const ttl = 600 * time.Millisecond
	for _, n := range []int{1, 3} {
		t.Run(map[int]string{1: "N1", 3: "N3"}[n], func(t *testing.T) {
			addrs := addrsOf(testenv.StartRedis(t, n))
			ctx := ctxFor(t, 20*time.Second)
			name := uniqueName(t)
			holder := mustClient(t, addrs, with(redlockprio.WithTTL(ttl)))
			dead := mustClient(t, addrs, with(redlockprio.WithTTL(ttl)))
			next := mustClient(t, addrs, with(redlockprio.WithTTL(ttl)))
			warm(t, dead.l)
			slack := max(4*cycleTime(t, next.l), 50*time.Millisecond)
			lease, err := holder.l.TryLock(ctx, name)
			if err != nil {
				t.Fatal(err)
			}
			deadCtx, cancelDead := context.WithCancel(ctx)
			defer cancelDead()
			go func() { _, _ = dead.l.Lock(deadCtx, name) }()
			waitQueued(t, addrs, name, 1, 5*time.Second)
			killed := time.Now()
			for _, rc := range dead.rcs {
				_ = rc.Close()
			}
			got := make(chan time.Time, 1)
			go func() {
				l, err := next.l.Lock(ctx, name)
				if err != nil {
					t.Errorf("the next waiter's Lock: %v", err)
					close(got)
					return
				}
				got <- time.Now()
				_ = l.Release(ctx)
			}()
			waitQueued(t, addrs, name, 2, 5*time.Second)
			if err := lease.Release(ctx); err != nil {
				t.Fatal(err)
			}
			at, ok := <-got
			if !ok {
				return
			}
			took := at.Sub(killed)
			bound := ttl + slack
			t.Logf("the next waiter got the name %v after the head waiter was killed (bound TTL %v + slack %v = %v)", took.Round(time.Millisecond), ttl, slack.Round(time.Millisecond), bound.Round(time.Millisecond))
			if took > bound {
				t.Fatalf("a killed head waiter blocked the next for %v, over the bound %v", took, bound)
			}
		})
	}
}

// TestCancelledWaiterLeavesNoEntry: a Lock whose context ends while it
// waits in the queue has left it on every master when it returns, and a
// Lock behind it is woken at once by its leaving, not by a refresh.
func TestCancelledWaiterLeavesNoEntry(t *testing.T) {
	addrs := addrsOf(testenv.StartRedis(t, 3))
	ctx := ctxFor(t, 20*time.Second)
	name := uniqueName(t)
	holder := mustClient(t, addrs, with(redlockprio.WithTTL(3*time.Second)))
	waiter := mustClient(t, addrs, with(redlockprio.WithTTL(3*time.Second)))
	lease, err := holder.l.TryLock(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	wctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		l, err := waiter.l.Lock(wctx, name)
		if l != nil {
			_ = l.Release(ctx)
		}
		done <- err
	}()
	waitQueued(t, addrs, name, 1, 5*time.Second)
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("the cancelled Lock: %v, want context.Canceled", err)
	}
	for i, a := range addrs {
		if ms := queueMembers(t, a, name); len(ms) != 0 {
			t.Errorf("master %d still queues %q after the cancelled Lock returned", i, ms)
		}
	}
	if err := lease.Release(ctx); err != nil {
		t.Fatal(err)
	}
	// The name is free and nobody waits: TryLock gets it.
	l, err := waiter.l.TryLock(ctx, name)
	if err != nil {
		t.Fatalf("TryLock after the only waiter left: %v", err)
	}
	_ = l.Release(ctx)
}

// The waiter queue of a Locker's name (see the package doc, Waiting):
// FIFO among equal priorities, a higher priority first, a holder that
// locks again behind those already waiting.

// queueMembers returns the members of name's waiter queue on the master
// at addr, head first.
func queueMembers(t testing.TB, addr, name string) []string {
	t.Helper()
	rc := newRedis(addr)
	defer rc.Close()
	ms, err := rc.ZRange(context.Background(), "latchkey:{"+name+"}:q", 0, -1).Result()
	if err != nil {
		t.Fatalf("ZRANGE of the queue at %s: %v", addr, err)
	}
	return ms
}

// waitQueued polls until n waiters have joined name's queue on a quorum
// of the masters at addrs (their joins have completed), or fails the
// test after d.
func waitQueued(t testing.TB, addrs []string, name string, n int, d time.Duration) {
	t.Helper()
	waitUntil(t, d, fmt.Sprintf("%d waiters queued on a quorum of masters", n), func() string {
		var short []string
		for i, a := range addrs {
			if q := queueMembers(t, a, name); len(q) < n {
				short = append(short, fmt.Sprintf("master %d: %d", i, len(q)))
			}
		}
		if len(addrs)-len(short) >= len(addrs)/2+1 {
			return ""
		}
		return strings.Join(short, ", ")
	})
}

// lockInOrder starts a Lock of name on each locker in turn, each once the
// one before has joined the queue, after holder took name; it then
// releases holder's lease and returns the order in which the Locks got
// the name (each holds it 5ms).
func lockInOrder(t *testing.T, addrs []string, name string, holder locks.Locker, lockers []locks.Locker, queuedBefore int) []int {
	t.Helper()
	ctx := ctxFor(t, 20*time.Second)
	first, err := holder.TryLock(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	var (
		mu    sync.Mutex
		order []int
		wg    sync.WaitGroup
	)
	for i, l := range lockers {
		wg.Go(func() {
			lease, err := l.Lock(ctx, name)
			if err != nil {
				t.Errorf("Lock %d: %v", i, err)
				return
			}
			mu.Lock()
			order = append(order, i)
			mu.Unlock()
			time.Sleep(5 * time.Millisecond)
			_ = lease.Release(ctx)
		})
		waitQueued(t, addrs, name, queuedBefore+i+1, 5*time.Second)
	}
	if err := first.Release(ctx); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	return order
}

// TestFIFOAmongEqualPriorities: Locks of equal priority get a held name
// in the order in which they joined its queue, on one master and on
// three.
func TestFIFOAmongEqualPriorities(t *testing.T) {
	for _, n := range []int{1, 3} {
		t.Run(fmt.Sprintf("N%d", n), func(t *testing.T) {
			addrs := addrsOf(testenv.StartRedis(t, n))
			holder := mustClient(t, addrs)
			var lockers []locks.Locker
			for range 6 {
				lockers = append(lockers, mustClient(t, addrs).l)
			}
			order := lockInOrder(t, addrs, uniqueName(t), holder.l, lockers, 0)
			if want := []int{0, 1, 2, 3, 4, 5}; !slices.Equal(order, want) {
				t.Fatalf("grant order %v, want the arrival order %v", order, want)
			}
		})
	}
}

// TestHigherPriorityJumpsQueue: a Lock of a higher priority that arrives
// last gets the name before the equal-priority waiters queued before it.
func TestHigherPriorityJumpsQueue(t *testing.T) {
	addrs := addrsOf(testenv.StartRedis(t, 3))
	holder := mustClient(t, addrs, withPriority(5))
	var lockers []locks.Locker
	for range 3 {
		lockers = append(lockers, mustClient(t, addrs).l)
	}
	lockers = append(lockers, mustClient(t, addrs, withPriority(1)).l)
	order := lockInOrder(t, addrs, uniqueName(t), holder.l, lockers, 0)
	if want := []int{3, 0, 1, 2}; !slices.Equal(order, want) {
		t.Fatalf("grant order %v, want the priority-1 Lock first, then the arrival order: %v", order, want)
	}
}

// TestRelockGoesToBack: a holder that releases and locks again gets the
// name after the Locks that were waiting, and TryLock on the name freed
// for a queued waiter fails as held.
func TestRelockGoesToBack(t *testing.T) {
	addrs := addrsOf(testenv.StartRedis(t, 3))
	ctx := ctxFor(t, 20*time.Second)
	name := uniqueName(t)
	a := mustClient(t, addrs)
	b := mustClient(t, addrs)
	c := mustClient(t, addrs)
	lease, err := a.l.TryLock(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	got := make(chan string, 3)
	var wg sync.WaitGroup
	lockAs := func(who string, l locks.Locker, hold time.Duration) {
		wg.Go(func() {
			lease, err := l.Lock(ctx, name)
			if err != nil {
				t.Errorf("%s: Lock: %v", who, err)
				return
			}
			got <- who
			time.Sleep(hold)
			_ = lease.Release(ctx)
		})
	}
	lockAs("b", b.l, 300*time.Millisecond)
	waitQueued(t, addrs, name, 1, 5*time.Second)
	lockAs("c", c.l, 5*time.Millisecond)
	waitQueued(t, addrs, name, 2, 5*time.Second)
	if err := lease.Release(ctx); err != nil {
		t.Fatal(err)
	}
	lockAs("a", a.l, 5*time.Millisecond) // at once after its release
	wg.Wait()
	close(got)
	var order []string
	for w := range got {
		order = append(order, w)
	}
	if want := []string{"b", "c", "a"}; !slices.Equal(order, want) {
		t.Fatalf("grant order %v, want %v: the releasing holder behind those waiting", order, want)
	}

	// A queued waiter's name just released: TryLock of an equal priority
	// fails, whether the waiter already holds it or is only queued for it
	// (TryLock does not jump the queue).
	lease, err = a.l.TryLock(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	waiting := make(chan locks.Lease, 1)
	go func() {
		l, err := b.l.Lock(ctx, name)
		if err != nil {
			t.Errorf("the waiter's Lock: %v", err)
		}
		waiting <- l
	}()
	waitQueued(t, addrs, name, 1, 5*time.Second)
	if err := lease.Release(ctx); err != nil {
		t.Fatal(err)
	}
	l, err := c.l.TryLock(ctx, name)
	if err == nil {
		_ = l.Release(ctx)
		t.Fatal("TryLock took the name released to a queued Lock of equal priority")
	}
	if !errors.Is(err, locks.ErrNotAcquired) {
		t.Fatalf("TryLock: %v, want ErrNotAcquired", err)
	}
	t.Logf("TryLock: %v", err)
	if l := <-waiting; l != nil {
		_ = l.Release(ctx)
	}
}

// The waiter queue under faults (see the package doc, Waiting): a waiter
// that dies or is cut off, anywhere in the queue, blocks it at most a TTL
// and a half; a master that restarts empty forgets the queue there, which
// costs order at most, never exclusion nor liveness; a lost wake-up costs
// at most a refresh (TTL/2).

// queueBound measures the queue tests' slack for a Locker of TTL ttl
// (see queueTiming).
func queueBound(t *testing.T, l *redlockprio.Locker, ttl time.Duration) *queueTiming {
	t.Helper()
	return &queueTiming{
		ttl:   ttl,
		base:  max(4*cycleTime(t, l), 100*time.Millisecond),
		stall: contracttest.Bound{}.Watched(t),
	}
}

// queueTiming is the documented bound for a dead or cut-off waiter, TTL +
// TTL/2, and its slack: four uncontended Lock + Release cycles measured at
// the start (at least 100ms), plus four times the longest scheduler stall
// seen from then until the check (a CI run: a lost wake-up cost 432ms
// against a 400ms bound whose slack was measured before a stall).
type queueTiming struct {
	ttl, base time.Duration
	stall     *contracttest.WatchedBound
}

// slack is the slack so far.
func (q *queueTiming) slack() time.Duration { return q.base + 4*q.stall.Bound().Scheduler }

// bound is TTL + TTL/2 plus the slack so far.
func (q *queueTiming) bound() time.Duration { return q.ttl + q.ttl/2 + q.slack() }

// grant is what a recorded Lock got: when, and its error.
type grant struct {
	who string
	at  time.Time
	err error
}

// lockRecorded runs Lock of name in the background, records the critical
// section (held for hold) in h and sends what it got on out.
func lockRecorded(ctx context.Context, h *contracttest.History, who string, l *redlockprio.Locker, name string, hold time.Duration, out chan<- grant) {
	go func() {
		lease, err := l.Lock(ctx, name)
		if err != nil {
			out <- grant{who: who, at: time.Now(), err: err}
			return
		}
		at := time.Now()
		exit := h.Enter(who, lease.Token())
		time.Sleep(hold)
		exit()
		_ = lease.Release(context.WithoutCancel(ctx))
		out <- grant{who: who, at: at}
	}()
}

// TestKilledMidQueueWaiterBlocksAtMostItsEntry: the second of three
// waiters is killed (its Client's connections closed) while the name is
// held. The first gets the name at the release; the third, behind the
// dead one, must get it within TTL + TTL/2 (plus slack) of the kill, and
// no two sections overlap.
func TestKilledMidQueueWaiterBlocksAtMostItsEntry(t *testing.T) {
	const ttl = 600 * time.Millisecond
	for _, n := range []int{1, 3} {
		t.Run(fmt.Sprintf("N%d", n), func(t *testing.T) {
			addrs := addrsOf(testenv.StartRedis(t, n))
			ctx := ctxFor(t, 20*time.Second)
			name := uniqueName(t)
			opts := []redlockprio.Option{redlockprio.WithTTL(ttl)}
			holder := mustClient(t, addrs, with(opts...))
			first := mustClient(t, addrs, with(opts...))
			dead := mustClient(t, addrs, with(opts...))
			third := mustClient(t, addrs, with(opts...))
			warm(t, dead.l)
			qt := queueBound(t, third.l, ttl)
			h := contracttest.NewHistory(1)
			lease, err := holder.l.TryLock(ctx, name)
			if err != nil {
				t.Fatal(err)
			}
			got := make(chan grant, 2)
			lockRecorded(ctx, h, "first", first.l, name, 5*time.Millisecond, got)
			waitQueued(t, addrs, name, 1, 5*time.Second)
			deadCtx, cancelDead := context.WithCancel(ctx)
			defer cancelDead()
			go func() { _, _ = dead.l.Lock(deadCtx, name) }()
			waitQueued(t, addrs, name, 2, 5*time.Second)
			lockRecorded(ctx, h, "third", third.l, name, 5*time.Millisecond, got)
			waitQueued(t, addrs, name, 3, 5*time.Second)
			killed := time.Now()
			for _, rc := range dead.rcs {
				_ = rc.Close()
			}
			if err := lease.Release(ctx); err != nil {
				t.Fatal(err)
			}
			var order []string
			for range 2 {
				g := <-got
				if g.err != nil {
					t.Fatalf("%s: Lock: %v", g.who, g.err)
				}
				order = append(order, g.who)
				if g.who == "third" {
					bound, slack := qt.bound(), qt.slack()
					took := g.at.Sub(killed)
					t.Logf("the waiter behind the killed one got the name %v after the kill (bound TTL+TTL/2 %v + slack %v = %v)", took.Round(time.Millisecond), ttl+ttl/2, slack.Round(time.Millisecond), bound.Round(time.Millisecond))
					if took > bound {
						t.Errorf("a killed mid-queue waiter blocked the one behind it %v, over the bound %v", took, bound)
					}
				}
			}
			if order[0] != "first" {
				t.Errorf("grant order %v, want first before third", order)
			}
			if err := h.Check(); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// TestCutOffHeadWaiterAtRelease: the queue's head is cut off (its links
// black-holed: a partition, or its process paused) just before the
// holder releases, so the wake-up goes to a waiter that cannot act. The
// waiter behind it must get the name within TTL + TTL/2 (plus slack) of
// the cut. Once its link is restored, the cut-off waiter's Lock ends
// (with the name, or an error) within a further TTL + TTL/2 after the
// other's release, and no two sections overlap.
func TestCutOffHeadWaiterAtRelease(t *testing.T) {
	const ttl = 600 * time.Millisecond
	addrs := addrsOf(testenv.StartRedis(t, 3))
	ctx := ctxFor(t, 30*time.Second)
	name := uniqueName(t)
	opts := []redlockprio.Option{redlockprio.WithTTL(ttl)}
	holder := mustClient(t, addrs, with(opts...))
	cut := mustClient(t, addrs, viaProxies(), with(opts...))
	link := cut.proxies
	next := mustClient(t, addrs, with(opts...))
	warm(t, cut.l)
	qt := queueBound(t, next.l, ttl)
	h := contracttest.NewHistory(1)
	lease, err := holder.l.TryLock(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	got := make(chan grant, 2)
	lockRecorded(ctx, h, "cut", cut.l, name, 5*time.Millisecond, got)
	waitQueued(t, addrs, name, 1, 5*time.Second)
	lockRecorded(ctx, h, "next", next.l, name, 50*time.Millisecond, got)
	waitQueued(t, addrs, name, 2, 5*time.Second)
	link.BlackHole()
	cutAt := time.Now()
	if err := lease.Release(ctx); err != nil {
		t.Fatal(err)
	}
	g := <-got
	if g.who != "next" || g.err != nil {
		link.Restore()
		t.Fatalf("first to end: %s (err %v), want next with the name", g.who, g.err)
	}
	bound, slack := qt.bound(), qt.slack()
	took := g.at.Sub(cutAt)
	t.Logf("the waiter behind the cut-off head got the name %v after the cut (bound %v, slack %v)", took.Round(time.Millisecond), bound.Round(time.Millisecond), slack.Round(time.Millisecond))
	if took > bound {
		t.Errorf("a cut-off head waiter blocked the queue %v, over the bound %v", took, bound)
	}
	link.Restore()
	restored := time.Now()
	select {
	case g := <-got:
		t.Logf("the cut-off waiter's Lock ended %v after its link came back: err %v", g.at.Sub(restored).Round(time.Millisecond), g.err)
	case <-time.After(bound + 50*time.Millisecond):
		t.Errorf("the cut-off waiter's Lock still waits %v after its link came back on a free name", bound+50*time.Millisecond)
		<-got
	}
	if err := h.Check(); err != nil {
		t.Fatal(err)
	}
}

// TestQueuedWaiterCutOffLongerThanItsEntry: a waiter in the middle of the
// queue is cut off for two TTLs (its entry expires), then comes back.
// The waiters behind it must not wait for it, and it must still get the
// name once its link is back; no two sections overlap.
func TestQueuedWaiterCutOffLongerThanItsEntry(t *testing.T) {
	const ttl = 600 * time.Millisecond
	addrs := addrsOf(testenv.StartRedis(t, 3))
	ctx := ctxFor(t, 30*time.Second)
	name := uniqueName(t)
	opts := []redlockprio.Option{redlockprio.WithTTL(ttl)}
	holder := mustClient(t, addrs, with(opts...))
	first := mustClient(t, addrs, with(opts...))
	cut := mustClient(t, addrs, viaProxies(), with(opts...))
	link := cut.proxies
	third := mustClient(t, addrs, with(opts...))
	warm(t, cut.l)
	qt := queueBound(t, third.l, ttl)
	h := contracttest.NewHistory(1)
	lease, err := holder.l.TryLock(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	got := make(chan grant, 3)
	lockRecorded(ctx, h, "first", first.l, name, 5*time.Millisecond, got)
	waitQueued(t, addrs, name, 1, 5*time.Second)
	lockRecorded(ctx, h, "cut", cut.l, name, 5*time.Millisecond, got)
	waitQueued(t, addrs, name, 2, 5*time.Second)
	lockRecorded(ctx, h, "third", third.l, name, 5*time.Millisecond, got)
	waitQueued(t, addrs, name, 3, 5*time.Second)
	link.BlackHole()
	cutAt := time.Now()
	if err := lease.Release(ctx); err != nil {
		t.Fatal(err)
	}
	ended := map[string]grant{}
	for len(ended) < 2 {
		g := <-got
		ended[g.who] = g
		if g.who == "cut" {
			break
		}
	}
	for _, who := range []string{"first", "third"} {
		g, ok := ended[who]
		if !ok || g.err != nil {
			link.Restore()
			t.Fatalf("%s: ended %v (err %v) while the cut-off waiter was away", who, ok, g.err)
		}
	}
	bound, slack := qt.bound(), qt.slack()
	took := ended["third"].at.Sub(cutAt)
	t.Logf("the waiter behind the cut-off one got the name %v after the cut (bound %v, slack %v)", took.Round(time.Millisecond), bound.Round(time.Millisecond), slack.Round(time.Millisecond))
	if took > bound {
		t.Errorf("a cut-off mid-queue waiter blocked the queue %v, over the bound %v", took, bound)
	}
	// Keep it away past its entry's expiry, then bring it back.
	time.Sleep(time.Until(cutAt.Add(2 * ttl)))
	link.Restore()
	restored := time.Now()
	select {
	case g := <-got:
		t.Logf("the cut-off waiter's Lock ended %v after its link came back: err %v", g.at.Sub(restored).Round(time.Millisecond), g.err)
		if g.err != nil {
			t.Logf("(Lock may fail with a QuorumError met while cut off)")
		}
	case <-time.After(bound + 50*time.Millisecond):
		t.Errorf("the cut-off waiter's Lock still waits %v after its link came back on a free name", bound+50*time.Millisecond)
		<-got
	}
	if err := h.Check(); err != nil {
		t.Fatal(err)
	}
}

// TestMasterRestartedEmptyUnderQueue: with five waiters queued on three
// masters, one master restarts empty (its queue, ticket counter and keys
// gone); two more Locks join after it. Every Lock must get the name, each
// within its share of the holds plus TTL + TTL/2 (plus slack) after the
// restart, and no two sections overlap.
func TestMasterRestartedEmptyUnderQueue(t *testing.T) {
	const ttl = 600 * time.Millisecond
	servers := testenv.StartRedis(t, 3)
	addrs := addrsOf(servers)
	ctx := ctxFor(t, 30*time.Second)
	name := uniqueName(t)
	opts := []redlockprio.Option{redlockprio.WithTTL(ttl)}
	holder := mustClient(t, addrs, with(opts...))
	qt := queueBound(t, holder.l, ttl)
	h := contracttest.NewHistory(1)
	lease, err := holder.l.TryLock(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	const hold = 10 * time.Millisecond
	got := make(chan grant, 7)
	for i := range 5 {
		c := mustClient(t, addrs, with(opts...))
		lockRecorded(ctx, h, fmt.Sprintf("w%d", i), c.l, name, hold, got)
		waitQueued(t, addrs, name, i+1, 5*time.Second)
	}
	if err := servers[0].Restart(); err != nil {
		t.Fatal(err)
	}
	restarted := time.Now()
	for i := 5; i < 7; i++ {
		c := mustClient(t, addrs, with(opts...))
		lockRecorded(ctx, h, fmt.Sprintf("w%d", i), c.l, name, hold, got)
	}
	if err := lease.Release(ctx); err != nil {
		t.Fatal(err)
	}
	var order []string
	for range 7 {
		g := <-got
		if g.err != nil {
			t.Errorf("%s: Lock: %v", g.who, g.err)
			continue
		}
		order = append(order, g.who)
	}
	last := time.Since(restarted)
	bound, slack := qt.bound(), qt.slack()
	limit := 7*(hold+slack) + bound
	t.Logf("grant order %v; the last grant came %v after the restart (bound 7×(hold+slack) + TTL+TTL/2 = %v, slack %v)", order, last.Round(time.Millisecond), limit.Round(time.Millisecond), slack.Round(time.Millisecond))
	if last > limit {
		t.Errorf("the queue took %v to drain after a master restarted empty, over %v", last, limit)
	}
	if err := h.Check(); err != nil {
		t.Fatal(err)
	}
}

// TestLostWakeUpCostsAtMostARefresh: the head waiter's connections
// (its inbox subscription among them) are cut at the moment of the
// release, so the wake-up published to it is lost, and restored at once.
// It must get the name within a refresh interval (TTL/2) plus slack of
// the release, and must not overlap the holder.
func TestLostWakeUpCostsAtMostARefresh(t *testing.T) {
	const ttl = 600 * time.Millisecond
	for _, n := range []int{1, 3} {
		t.Run(fmt.Sprintf("N%d", n), func(t *testing.T) {
			addrs := addrsOf(testenv.StartRedis(t, n))
			ctx := ctxFor(t, 20*time.Second)
			name := uniqueName(t)
			opts := []redlockprio.Option{redlockprio.WithTTL(ttl)}
			holder := mustClient(t, addrs, with(opts...))
			head := mustClient(t, addrs, viaProxies(), with(opts...))
			link := head.proxies
			warm(t, head.l)
			qt := queueBound(t, head.l, ttl)
			h := contracttest.NewHistory(1)
			lease, err := holder.l.TryLock(ctx, name)
			if err != nil {
				t.Fatal(err)
			}
			exit := h.Enter("holder", lease.Token())
			got := make(chan grant, 1)
			lockRecorded(ctx, h, "head", head.l, name, 5*time.Millisecond, got)
			waitQueued(t, addrs, name, 1, 5*time.Second)
			link.Cut()
			exit()
			released := time.Now()
			if err := lease.Release(ctx); err != nil {
				t.Fatal(err)
			}
			link.Restore()
			g := <-got
			if g.err != nil {
				t.Fatalf("the head's Lock: %v", g.err)
			}
			took := g.at.Sub(released)
			slack := qt.slack()
			bound := ttl/2 + slack
			t.Logf("the head whose wake-up was lost got the name %v after the release (bound TTL/2 %v + slack %v = %v)", took.Round(time.Millisecond), ttl/2, slack.Round(time.Millisecond), bound.Round(time.Millisecond))
			if took > bound {
				t.Errorf("a lost wake-up cost %v, over the bound %v", took, bound)
			}
			if err := h.Check(); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// TestKilledHeadWaiterMixedTTLs: the head waiter and the one behind it
// have different TTLs (300ms and 3s, both ways round). The head is killed
// while the name is held; at the release its wake-up is lost with it. The
// one behind must get the name within the dead waiter's TTL (its entry's
// life) plus half its own (its refresh, when it learns it is next), plus
// slack, after the release.
func TestKilledHeadWaiterMixedTTLs(t *testing.T) {
	for _, c := range []struct{ dead, next time.Duration }{
		{300 * time.Millisecond, 3 * time.Second},
		{3 * time.Second, 300 * time.Millisecond},
	} {
		t.Run(fmt.Sprintf("dead%v-next%v", c.dead, c.next), func(t *testing.T) {
			addrs := addrsOf(testenv.StartRedis(t, 3))
			ctx := ctxFor(t, 30*time.Second)
			name := uniqueName(t)
			ttl := func(d time.Duration) clientOption {
				return with(redlockprio.WithTTL(d), redlockprio.WithRenewInterval(d/4))
			}
			holder := mustClient(t, addrs, ttl(3*time.Second))
			dead := mustClient(t, addrs, ttl(c.dead))
			next := mustClient(t, addrs, ttl(c.next))
			warm(t, dead.l)
			qt := queueBound(t, next.l, c.next)
			h := contracttest.NewHistory(1)
			lease, err := holder.l.TryLock(ctx, name)
			if err != nil {
				t.Fatal(err)
			}
			deadCtx, cancelDead := context.WithCancel(ctx)
			defer cancelDead()
			go func() { _, _ = dead.l.Lock(deadCtx, name) }()
			waitQueued(t, addrs, name, 1, 5*time.Second)
			got := make(chan grant, 1)
			lockRecorded(ctx, h, "next", next.l, name, time.Millisecond, got)
			waitQueued(t, addrs, name, 2, 5*time.Second)
			for _, rc := range dead.rcs {
				_ = rc.Close()
			}
			exit := h.Enter("holder", lease.Token())
			exit()
			released := time.Now()
			if err := lease.Release(ctx); err != nil {
				t.Fatal(err)
			}
			g := <-got
			if g.err != nil {
				t.Fatalf("the next waiter's Lock: %v", g.err)
			}
			took := g.at.Sub(released)
			slack := qt.slack()
			bound := c.dead + c.next/2 + slack
			t.Logf("the next waiter (TTL %v) got the name %v after the release, behind a killed head (TTL %v) (bound %v + %v/2 + slack %v = %v)", c.next, took.Round(time.Millisecond), c.dead, c.dead, c.next, slack.Round(time.Millisecond), bound.Round(time.Millisecond))
			if took > bound {
				t.Errorf("the next waiter waited %v, over the bound %v", took, bound)
			}
			if err := h.Check(); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// TestClosedWaiterClientLeavesQueue: a queued Lock whose Client is
// closed returns ErrClosed; the waiter behind it must then get the name
// at the holder's release within slack, not after the closed waiter's
// entry expires.
func TestClosedWaiterClientLeavesQueue(t *testing.T) {
	const ttl = 3 * time.Second
	addrs := addrsOf(testenv.StartRedis(t, 3))
	ctx := ctxFor(t, 30*time.Second)
	name := uniqueName(t)
	opts := []redlockprio.Option{redlockprio.WithTTL(ttl), redlockprio.WithRenewInterval(ttl / 4)}
	holder := mustClient(t, addrs, with(opts...))
	closing := mustClient(t, addrs, with(opts...))
	next := mustClient(t, addrs, with(opts...))
	warm(t, closing.l)
	qt := queueBound(t, next.l, ttl)
	h := contracttest.NewHistory(1)
	lease, err := holder.l.TryLock(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	closedDone := make(chan error, 1)
	go func() {
		l, err := closing.l.Lock(ctx, name)
		if err == nil {
			_ = l.Release(ctx)
		}
		closedDone <- err
	}()
	waitQueued(t, addrs, name, 1, 5*time.Second)
	got := make(chan grant, 1)
	lockRecorded(ctx, h, "next", next.l, name, time.Millisecond, got)
	waitQueued(t, addrs, name, 2, 5*time.Second)
	if err := closing.c.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-closedDone; !errors.Is(err, locks.ErrClosed) {
		t.Fatalf("the closed Client's Lock: %v, want ErrClosed", err)
	}
	exit := h.Enter("holder", lease.Token())
	exit()
	released := time.Now()
	if err := lease.Release(ctx); err != nil {
		t.Fatal(err)
	}
	g := <-got
	if g.err != nil {
		t.Fatalf("the next waiter's Lock: %v", g.err)
	}
	took := g.at.Sub(released)
	slack := qt.slack()
	t.Logf("the waiter behind a closed Client's Lock got the name %v after the release (bound slack %v)", took.Round(time.Millisecond), slack.Round(time.Millisecond))
	if took > slack {
		t.Errorf("the waiter behind a closed Client's Lock waited %v after the release, over slack %v: the closed Lock's entry stayed", took, slack)
	}
	if err := h.Check(); err != nil {
		t.Fatal(err)
	}
}

// TestManyKilledWaitersBlockAtMostTheirEntries: 200 waiters (100 on
// three masters), from several Clients, queue ahead of one live waiter and are all killed at once
// while the name is held. Their entries expire together, a TTL after
// their last refresh: the live waiter must get the name within TTL +
// TTL/2 (plus slack) of the kill, however many dead entries there are.
func TestManyKilledWaitersBlockAtMostTheirEntries(t *testing.T) {
	const ttl = 600 * time.Millisecond
	// More than the 64 expired entries a script drops in one batch (a
	// head that was itself expired then cost a refresh per batch). On
	// three masters fewer, spread over more Clients.
	for _, c := range []struct{ n, clients, waiters int }{{1, 4, 200}, {3, 10, 100}} {
		t.Run(fmt.Sprintf("N%d", c.n), func(t *testing.T) {
			addrs := addrsOf(testenv.StartRedis(t, c.n))
			ctx := ctxFor(t, 60*time.Second)
			name := uniqueName(t)
			opts := []redlockprio.Option{redlockprio.WithTTL(ttl)}
			// The holder's lease must outlive the burst of 200 waiters
			// on a loaded machine: a longer TTL for it alone.
			holder := mustClient(t, addrs, with(redlockprio.WithTTL(3*time.Second), redlockprio.WithRenewInterval(900*time.Millisecond)))
			next := mustClient(t, addrs, with(opts...))
			var dead []*client
			for range c.clients {
				c := mustClient(t, addrs, with(opts...))
				warm(t, c.l)
				dead = append(dead, c)
			}
			qt := queueBound(t, next.l, ttl)
			h := contracttest.NewHistory(1)
			lease, err := holder.l.TryLock(ctx, name)
			if err != nil {
				t.Fatal(err)
			}
			deadCtx, cancelDead := context.WithCancel(ctx)
			defer cancelDead()
			waiters := c.waiters
			for i := range waiters {
				go func() { _, _ = dead[i%len(dead)].l.Lock(deadCtx, name) }()
			}
			waitQueued(t, addrs, name, waiters, 30*time.Second)
			got := make(chan grant, 1)
			lockRecorded(ctx, h, "next", next.l, name, time.Millisecond, got)
			waitQueued(t, addrs, name, waiters+1, 10*time.Second)
			killed := time.Now()
			for _, c := range dead {
				for _, rc := range c.rcs {
					_ = rc.Close()
				}
			}
			exit := h.Enter("holder", lease.Token())
			exit()
			if err := lease.Release(ctx); err != nil {
				t.Fatal(err)
			}
			// The killed Locks fail all at once: the Release's own time,
			// under that burst, is slack too.
			releaseTook := time.Since(killed)
			g := <-got
			if g.err != nil {
				t.Fatalf("the live waiter's Lock: %v", g.err)
			}
			slack := qt.slack() + releaseTook
			bound := ttl + ttl/2 + slack
			took := g.at.Sub(killed)
			t.Logf("the live waiter behind %d killed ones got the name %v after the kill (bound TTL+TTL/2 %v + slack %v = %v)", waiters, took.Round(time.Millisecond), ttl+ttl/2, slack.Round(time.Millisecond), bound.Round(time.Millisecond))
			if took > bound {
				t.Errorf("%d killed waiters blocked the live one %v, over the bound %v", waiters, took, bound)
			}
			if err := h.Check(); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// The waiter queue with clients of different options, cancellations
// racing grants, TryLock among queued waiters, and a holder that locks
// again at once (see the package doc, Waiting).

// TestMixedOptionsWaitersWithHungMaster: Clients with TTLs of 300ms and
// 3s and priorities 0 to 2 share one name on three masters, one of them
// hung (paused) for the whole run; 96 goroutines (4 per Client) each
// lock the name twice. Every goroutine must get it (none waits forever),
// and no two sections overlap. A Lock whose attempt meets fewer than a
// quorum of answers within the call timeout fails with a QuorumError, as
// documented, and is retried: the burst of first attempts on a loaded
// 2-core machine does that to some 300ms-TTL Clients (200ms calls).
func TestMixedOptionsWaitersWithHungMaster(t *testing.T) {
	servers := testenv.StartRedis(t, 3)
	addrs := addrsOf(servers)
	ctx := ctxFor(t, 90*time.Second)
	name := uniqueName(t)
	type kind struct {
		ttl   time.Duration
		renew time.Duration
		prio  int
	}
	var kinds []kind
	for _, p := range []int{0, 1, 2} {
		kinds = append(kinds, kind{300 * time.Millisecond, 90 * time.Millisecond, p}, kind{3 * time.Second, 900 * time.Millisecond, p})
	}
	var clients []*client
	var prios []int
	for i := range 24 {
		k := kinds[i%len(kinds)]
		c := mustClient(t, addrs, with(redlockprio.WithTTL(k.ttl), redlockprio.WithRenewInterval(k.renew), redlockprio.WithPriority(k.prio)))
		warm(t, c.l)
		clients = append(clients, c)
		prios = append(prios, k.prio)
	}
	if err := servers[2].Pause(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = servers[2].Resume() })
	h := contracttest.NewHistory(1)
	var (
		wg     sync.WaitGroup
		grants atomic.Int64
		// Locks that failed with a QuorumError and were retried
		quorumErrs atomic.Int64
		mu         sync.Mutex
		fails      []string
		worst      [3]time.Duration // longest wait per priority
	)
	start := time.Now()
	for i, c := range clients {
		for g := range 4 {
			wg.Go(func() {
				for r := range 2 {
					asked := time.Now()
					lease, err := c.l.Lock(ctx, name)
					for errors.As(err, new(*redlockprio.QuorumError)) && ctx.Err() == nil {
						// Documented: fewer than a quorum answered within
						// the call timeout (under load); the caller retries.
						quorumErrs.Add(1)
						lease, err = c.l.Lock(ctx, name)
					}
					if err != nil {
						mu.Lock()
						fails = append(fails, fmt.Sprintf("client %d (prio %d) goroutine %d round %d: %v", i, prios[i], g, r, err))
						mu.Unlock()
						return
					}
					waited := time.Since(asked)
					exit := h.Enter(fmt.Sprintf("c%d.%d", i, g), lease.Token())
					time.Sleep(time.Millisecond)
					exit()
					_ = lease.Release(ctx)
					grants.Add(1)
					mu.Lock()
					worst[prios[i]] = max(worst[prios[i]], waited)
					mu.Unlock()
				}
			})
		}
	}
	wg.Wait()
	t.Logf("%d grants (%d Locks failed with a QuorumError and were retried) in %v with one master of three hung; longest wait by priority 0/1/2: %v/%v/%v",
		grants.Load(), quorumErrs.Load(), time.Since(start).Round(time.Millisecond), worst[0].Round(time.Millisecond), worst[1].Round(time.Millisecond), worst[2].Round(time.Millisecond))
	for _, f := range fails {
		t.Error(f)
	}
	if err := h.Check(); err != nil {
		t.Fatal(err)
	}
	if got := grants.Load(); got != 24*4*2 {
		t.Fatalf("%d grants, want %d", got, 24*4*2)
	}
}

// TestCancelledLockRacingItsGrant: a queued Lock's context is cancelled
// around the moment the holder releases to it (spread over a few
// milliseconds either side). Either it got the name, or it returned
// ctx's error holding nothing and having left the queue on every master:
// then another Client's TryLock gets the name at once.
func TestCancelledLockRacingItsGrant(t *testing.T) {
	addrs := addrsOf(testenv.StartRedis(t, 3))
	ctx := ctxFor(t, 60*time.Second)
	holder := mustClient(t, addrs)
	waiter := mustClient(t, addrs)
	other := mustClient(t, addrs)
	warm(t, waiter.l)
	rng := rand.New(rand.NewPCG(1, uint64(time.Now().UnixNano())))
	var got, cancelled int
	for i := range 30 {
		name := uniqueName(t)
		lease, err := holder.l.TryLock(ctx, name)
		if err != nil {
			t.Fatal(err)
		}
		wctx, cancel := context.WithCancel(ctx)
		done := make(chan error, 1)
		go func() {
			l, err := waiter.l.Lock(wctx, name)
			if err == nil {
				_ = l.Release(ctx)
			}
			done <- err
		}()
		waitQueued(t, addrs, name, 1, 5*time.Second)
		d := time.Duration(rng.IntN(4000)) * time.Microsecond
		if i%2 == 0 {
			go func() { time.Sleep(d); cancel() }()
			_ = lease.Release(ctx)
		} else {
			go func() { time.Sleep(d); _ = lease.Release(ctx) }()
			cancel()
		}
		err = <-done
		if err == nil {
			got++
			continue
		}
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("round %d: the cancelled Lock: %v, want context.Canceled or the name", i, err)
		}
		cancelled++
		for j, a := range addrs {
			if ms := queueMembers(t, a, name); len(ms) != 0 {
				t.Errorf("round %d: master %d still queues %q after the cancelled Lock returned", i, j, ms)
			}
		}
		// The holder's release may still be on its way (odd rounds).
		var l locks.Lease
		deadline := time.Now().Add(2 * time.Second)
		for {
			l, err = other.l.TryLock(ctx, name)
			if err == nil || !errors.Is(err, locks.ErrNotAcquired) || time.Now().After(deadline) {
				break
			}
			var he *locks.HeldError
			if errors.As(err, &he) && !strings.HasPrefix(he.Holder, holder.c.ID()+":") {
				t.Fatalf("round %d: after the cancelled Lock returned the name is held by %q, not by a lease of the holder %q", i, he.Holder, holder.c.ID())
			}
			time.Sleep(time.Millisecond)
		}
		if err != nil {
			t.Fatalf("round %d: TryLock after the cancelled Lock returned: %v", i, err)
		}
		_ = l.Release(ctx)
	}
	t.Logf("30 races: %d got the name, %d cancelled holding nothing", got, cancelled)
}

// TestRelockLoopAndTryLockKeepFIFO: four Clients of equal priority each
// lock, hold 1ms and release the name in a tight loop while a fifth
// calls TryLock over and over. With waiters always queued, TryLock must
// never get the name (it does not jump the queue), and the loopers must
// share the name about evenly: a holder that locks again goes to the
// back, so the busiest gets at most 40% of the grants (25% is fair).
func TestRelockLoopAndTryLockKeepFIFO(t *testing.T) {
	for _, n := range []int{1, 3} {
		t.Run(fmt.Sprintf("N%d", n), func(t *testing.T) {
			addrs := addrsOf(testenv.StartRedis(t, n))
			ctx := ctxFor(t, 30*time.Second)
			name := uniqueName(t)
			h := contracttest.NewHistory(1)
			const k = 4
			var (
				counts [k]atomic.Int64
				stop   atomic.Bool
				wg     sync.WaitGroup
			)
			for i := range k {
				c := mustClient(t, addrs)
				warm(t, c.l)
				wg.Go(func() {
					for !stop.Load() {
						lease, err := c.l.Lock(ctx, name)
						if err != nil {
							t.Errorf("looper %d: Lock: %v", i, err)
							return
						}
						exit := h.Enter(fmt.Sprintf("looper%d", i), lease.Token())
						time.Sleep(time.Millisecond)
						exit()
						counts[i].Add(1)
						_ = lease.Release(ctx)
					}
				})
			}
			// Steady state: every looper has held the name once.
			deadline := time.Now().Add(10 * time.Second)
			for {
				all := true
				for i := range k {
					all = all && counts[i].Load() > 0
				}
				if all {
					break
				}
				if time.Now().After(deadline) {
					stop.Store(true)
					wg.Wait()
					t.Fatalf("not every looper got the name within 10s: %d %d %d %d", counts[0].Load(), counts[1].Load(), counts[2].Load(), counts[3].Load())
				}
				time.Sleep(time.Millisecond)
			}
			var base [k]int64
			for i := range k {
				base[i] = counts[i].Load()
			}
			try := mustClient(t, addrs)
			var tries, took int
			end := time.Now().Add(2 * time.Second)
			for time.Now().Before(end) {
				tries++
				l, err := try.l.TryLock(ctx, name)
				if err == nil {
					took++
					exit := h.Enter("trylock", l.Token())
					exit()
					_ = l.Release(ctx)
				} else if !errors.Is(err, locks.ErrNotAcquired) {
					t.Errorf("TryLock: %v", err)
				}
				time.Sleep(time.Millisecond)
			}
			var share [k]int64
			var total, busiest int64
			for i := range k {
				share[i] = counts[i].Load() - base[i]
				total += share[i]
				busiest = max(busiest, share[i])
			}
			stop.Store(true)
			wg.Wait()
			t.Logf("in 2s: grants per looper %v (busiest %.0f%% of %d); TryLock got the name %d of %d times", share, 100*float64(busiest)/float64(max(total, 1)), total, took, tries)
			if err := h.Check(); err != nil {
				t.Fatal(err)
			}
			if took > 0 {
				t.Errorf("TryLock got the name %d times while equal-priority Locks were queued", took)
			}
			if total < 20 {
				t.Fatalf("only %d grants in 2s", total)
			}
			if float64(busiest) > 0.4*float64(total) {
				t.Errorf("busiest looper had %d of %d grants, over 40%%", busiest, total)
			}
		})
	}
}

// TestManyWaitersMixedPrioritiesGoByPriority: 120 Locks of priorities 0
// to 2 from 24 Clients all queue for a held name (on one master and on
// three); after the release they must get it in order of priority, the
// highest first (a higher priority goes ahead of lower ones), every one
// of them, with no two sections overlapping.
func TestManyWaitersMixedPrioritiesGoByPriority(t *testing.T) {
	for _, n := range []int{1, 3} {
		t.Run(fmt.Sprintf("N%d", n), func(t *testing.T) {
			addrs := addrsOf(testenv.StartRedis(t, n))
			ctx := ctxFor(t, 90*time.Second)
			name := uniqueName(t)
			// The holder's priority is above every waiter's: none steals.
			holder := mustClient(t, addrs, with(redlockprio.WithTTL(3*time.Second), redlockprio.WithPriority(9)))
			var clients []*client
			for i := range 24 {
				c := mustClient(t, addrs, with(redlockprio.WithTTL(3*time.Second), redlockprio.WithPriority(i%3)))
				warm(t, c.l)
				clients = append(clients, c)
			}
			lease, err := holder.l.TryLock(ctx, name)
			if err != nil {
				t.Fatal(err)
			}
			h := contracttest.NewHistory(1)
			const waiters = 120
			var (
				mu    sync.Mutex
				order []int // priorities in grant order
				wg    sync.WaitGroup
			)
			for i := range waiters {
				c := clients[i%len(clients)]
				prio := (i % len(clients)) % 3
				wg.Go(func() {
					l, err := c.l.Lock(ctx, name)
					for errors.As(err, new(*redlockprio.QuorumError)) && ctx.Err() == nil {
						t.Logf("waiter %d: %v (retried)", i, err)
						l, err = c.l.Lock(ctx, name)
					}
					if err != nil {
						t.Errorf("waiter %d: Lock: %v", i, err)
						return
					}
					exit := h.Enter(fmt.Sprintf("w%d", i), l.Token())
					mu.Lock()
					order = append(order, prio)
					mu.Unlock()
					exit()
					_ = l.Release(ctx)
				})
			}
			waitQueued(t, addrs, name, waiters, 30*time.Second)
			released := time.Now()
			if err := lease.Release(ctx); err != nil {
				t.Fatal(err)
			}
			wg.Wait()
			t.Logf("%d grants in %v after the release", len(order), time.Since(released).Round(time.Millisecond))
			if err := h.Check(); err != nil {
				t.Fatal(err)
			}
			if len(order) != waiters {
				t.Fatalf("%d of %d waiters got the name", len(order), waiters)
			}
			for i := 1; i < len(order); i++ {
				if order[i] > order[i-1] {
					t.Fatalf("grant %d went to priority %d after priority %d: order %v", i, order[i], order[i-1], order)
				}
			}
		})
	}
}

// TestCancelledHeadRacingReleaseWakesNext: the head waiter's context is
// cancelled around the holder's release (a few milliseconds either
// side), with a second waiter behind it. Whether the head got the name
// (and released it at once) or left, the waiter behind must get the name
// within a refresh interval (TTL/2) plus slack of the later of the
// release and the head's return: the head's leaving wakes it.
func TestCancelledHeadRacingReleaseWakesNext(t *testing.T) {
	const ttl = 600 * time.Millisecond
	addrs := addrsOf(testenv.StartRedis(t, 3))
	ctx := ctxFor(t, 60*time.Second)
	opts := []redlockprio.Option{redlockprio.WithTTL(ttl)}
	holder := mustClient(t, addrs, with(opts...))
	head := mustClient(t, addrs, with(opts...))
	next := mustClient(t, addrs, with(opts...))
	warm(t, head.l)
	qt := queueBound(t, next.l, ttl)
	rng := rand.New(rand.NewPCG(2, uint64(time.Now().UnixNano())))
	h := contracttest.NewHistory(1)
	var worst time.Duration
	for i := range 20 {
		name := uniqueName(t)
		lease, err := holder.l.TryLock(ctx, name)
		if err != nil {
			t.Fatal(err)
		}
		hctx, cancel := context.WithCancel(ctx)
		headDone := make(chan time.Time, 1)
		go func() {
			l, err := head.l.Lock(hctx, name)
			if err == nil {
				exit := h.Enter("head", l.Token())
				exit()
				_ = l.Release(ctx)
			}
			headDone <- time.Now()
		}()
		waitQueued(t, addrs, name, 1, 5*time.Second)
		got := make(chan grant, 1)
		lockRecorded(ctx, h, "next", next.l, name, time.Millisecond, got)
		waitQueued(t, addrs, name, 2, 5*time.Second)
		d := time.Duration(rng.IntN(4000)) * time.Microsecond
		go func() { time.Sleep(d); cancel() }()
		exit := h.Enter("holder", lease.Token())
		exit()
		_ = lease.Release(ctx)
		released := time.Now()
		headAt := <-headDone
		g := <-got
		if g.err != nil {
			t.Fatalf("round %d: the next waiter's Lock: %v", i, g.err)
		}
		from := released
		if headAt.After(from) {
			from = headAt
		}
		took := g.at.Sub(from)
		worst = max(worst, took)
		if slack := qt.slack(); took > ttl/2+slack {
			t.Errorf("round %d (cancel %v after the release began): the next waiter got the name %v after the head let go, over TTL/2 %v + slack %v", i, d, took.Round(time.Millisecond), ttl/2, slack.Round(time.Millisecond))
		}
	}
	t.Logf("20 races: the next waiter's longest wait after the head let go: %v (bound TTL/2 %v + slack %v)", worst.Round(time.Millisecond), ttl/2, qt.slack().Round(time.Millisecond))
	if err := h.Check(); err != nil {
		t.Fatal(err)
	}
}

// TestHigherPriorityTryLockAmongQueuedWaiters: while Locks of priority 0
// hand a name from one to the next, a Client of priority 1 calls TryLock
// over and over: it must get the name (from the free name or by taking
// it from a priority-0 holder, which it waits out), and never overlap a
// holder: the victim's section ends before the thief's begins.
func TestHigherPriorityTryLockAmongQueuedWaiters(t *testing.T) {
	addrs := addrsOf(testenv.StartRedis(t, 3))
	ctx := ctxFor(t, 30*time.Second)
	name := uniqueName(t)
	h := contracttest.NewHistory(1)
	var (
		stop atomic.Bool
		wg   sync.WaitGroup
	)
	for i := range 4 {
		c := mustClient(t, addrs)
		warm(t, c.l)
		wg.Go(func() {
			for !stop.Load() {
				lease, err := c.l.Lock(ctx, name)
				if err != nil {
					t.Errorf("looper %d: Lock: %v", i, err)
					return
				}
				// Works until it lets go, as a holder that does not
				// watch its context: a thief must wait for the Release.
				exit := h.Enter(fmt.Sprintf("looper%d", i), lease.Token())
				time.Sleep(2 * time.Millisecond)
				exit()
				_ = lease.Release(ctx)
			}
		})
	}
	waitQueued(t, addrs, name, 3, 10*time.Second)
	high := mustClient(t, addrs, withPriority(1))
	var took, tries int
	end := time.Now().Add(2 * time.Second)
	for time.Now().Before(end) {
		tries++
		l, err := high.l.TryLock(ctx, name)
		if err != nil {
			if !errors.Is(err, locks.ErrNotAcquired) {
				t.Errorf("TryLock: %v", err)
			}
			continue
		}
		took++
		exit := h.Enter("high", l.Token())
		time.Sleep(time.Millisecond)
		exit()
		_ = l.Release(ctx)
		time.Sleep(5 * time.Millisecond)
	}
	stop.Store(true)
	wg.Wait()
	t.Logf("the priority-1 TryLock got the name %d of %d times among 4 looping priority-0 Locks; %d sections", took, tries, h.Len())
	if err := h.Check(); err != nil {
		t.Fatal(err)
	}
	if took == 0 {
		t.Fatal("a higher-priority TryLock never got the name among queued lower-priority waiters")
	}
}

// TestMasterRestartedUnderOneClientsWaiters: ten Locks of a held name
// wait through one Client (their entries refreshed together, in one
// pipeline per master); one master restarts, empty ("empty") or with
// its data but not its scripts (append-only file, "aof"). Within a
// refresh interval (TTL/2) plus slack of the restart, every waiter's
// entry is back on it, in the same order (see the protocol doc's queue
// limits: the waiters put their entries back at their next refresh, with
// their old tickets; a refresh answered NOSCRIPT loads the script and is
// sent again), and at the release they get the name in the order they
// joined, without overlap.
func TestMasterRestartedUnderOneClientsWaiters(t *testing.T) {
	for _, variant := range []string{"empty", "aof"} {
		t.Run(variant, func(t *testing.T) {
			var cfg testenv.RedisConfig
			if variant == "aof" {
				cfg.Args = []string{"--appendonly", "yes", "--appendfsync", "always"}
			}
			servers := testenv.StartRedisWith(t, 3, cfg)
			addrs := addrsOf(servers)
			holder := mustClient(t, addrs, withTiming(10*time.Second, 0.01))
			c := mustClient(t, addrs)
			warm(t, c.l)
			ctx := ctxFor(t, 20*time.Second)
			name := uniqueName(t)
			lease, err := holder.l.TryLock(ctx, name)
			if err != nil {
				t.Fatal(err)
			}
			h := contracttest.NewHistory(1)
			var (
				mu    sync.Mutex
				order []int
				wg    sync.WaitGroup
			)
			const waiters = 10
			for i := range waiters {
				wg.Go(func() {
					l, err := c.l.Lock(ctx, name)
					if err != nil {
						t.Errorf("Lock %d: %v", i, err)
						return
					}
					exit := h.EnterLease(fmt.Sprint(i), l)
					mu.Lock()
					order = append(order, i)
					mu.Unlock()
					time.Sleep(2 * time.Millisecond)
					exit()
					_ = l.Release(context.WithoutCancel(ctx))
				})
				waitQueued(t, addrs, name, i+1, 5*time.Second)
			}
			before := queueMembers(t, addrs[0], name)
			b := pingBound(t, addrs[1], testTTL/2)
			if err := servers[0].Restart(); err != nil {
				t.Fatal(err)
			}
			restarted := time.Now()
			took, ok := pollUntil(restarted, &b, func() bool { return len(liveQueueMembers(t, addrs[0], name)) == waiters })
			if !ok {
				t.Fatalf("%d of %d entries are back on the restarted master %v after the restart; bound %v",
					len(liveQueueMembers(t, addrs[0], name)), waiters, took, b)
			}
			if after := queueMembers(t, addrs[0], name); !slices.Equal(before, after) {
				t.Errorf("the restarted master queues %q, want %q as before", after, before)
			}
			t.Logf("every entry back on the restarted master %v after the restart (bound %v)", took.Round(time.Millisecond), b)
			if err := lease.Release(ctx); err != nil {
				t.Fatal(err)
			}
			wg.Wait()
			if !slices.IsSorted(order) {
				t.Errorf("grant order %v, want the order of the joins", order)
			}
			if err := h.Check(); err != nil {
				t.Error(err)
			}
		})
	}
}

// TestManyWaitersWithCancels: 72 Locks loop on one name through 8
// Clients of mixed TTLs (600ms, 1s, 2s; one priority), a quarter of them
// with a context that ends while they wait (20–420ms), on 3 and on 5
// masters, for 5s. No two sections overlap and tokens increase in grant
// order; no time between one holder's release and the next grant is
// longer than a lost wake-up may cost (the longest TTL/2, see the package
// doc, Waiting) plus slack: a cancelled waiter leaves the queue and wakes
// the next; every error is ctx's; once all have returned, the name is
// free and queues nothing within a call timeout twice over plus slack
// (cancelled Locks left, released leases deleted their keys, stragglers
// end at the call timeout); and no goroutine outlives the Clients'
// Close.
func TestManyWaitersWithCancels(t *testing.T) {
	ttls := []time.Duration{600 * time.Millisecond, time.Second, 2 * time.Second}
	const (
		clients = 8
		each    = 9
		runFor  = 5 * time.Second
	)
	for _, n := range []int{3, 5} {
		t.Run(fmt.Sprintf("N%d", n), func(t *testing.T) {
			addrs := addrsOf(testenv.StartRedis(t, n))
			ignore := goleak.IgnoreCurrent()
			var cs []*client
			for i := range clients {
				c := mustClient(t, addrs, withTiming(ttls[i%len(ttls)], 0.01))
				warm(t, c.l)
				cs = append(cs, c)
			}
			// A lost wake-up costs the waiter its refresh interval:
			// TTL/2 of the longest TTL. Slack: four Lock + Release
			// cycles.
			qt := queueBound(t, cs[0].l, 0)
			name := uniqueName(t)
			h := contracttest.NewHistory(1)
			var out lockOutcome
			stop := time.Now().Add(runFor)
			var wg sync.WaitGroup
			for ci, c := range cs {
				for g := range each {
					wg.Go(func() {
						r := rand.New(rand.NewPCG(uint64(ci), uint64(g)))
						for time.Now().Before(stop) {
							patience := 10 * time.Second
							if r.IntN(4) == 0 {
								patience = time.Duration(20+r.IntN(400)) * time.Millisecond
							}
							ctx, cancel := context.WithTimeout(context.Background(), patience)
							l, err := c.l.Lock(ctx, name)
							out.classify("lock", ctx, err)
							cancel()
							if err != nil {
								continue
							}
							exit := h.EnterLease(fmt.Sprintf("c%d/%d", ci, g), l)
							time.Sleep(time.Duration(1+r.IntN(3)) * time.Millisecond)
							exit()
							if err := l.Release(context.Background()); err != nil {
								out.wrong("Release: %v", err)
							}
						}
					})
				}
			}
			wg.Wait()
			left := time.Now()
			spans := h.Spans()
			slices.SortFunc(spans, func(a, b contracttest.Span) int { return cmp.Compare(a.Enter, b.Enter) })
			slack := qt.slack()
			gapBound := ttls[len(ttls)-1]/2 + slack
			var worst time.Duration
			for i := 1; i < len(spans); i++ {
				if spans[i].Token <= spans[i-1].Token {
					t.Errorf("TOKEN: %s got %d after %s's %d", spans[i].Who, spans[i].Token, spans[i-1].Who, spans[i-1].Token)
				}
				worst = max(worst, spans[i].Enter-spans[i-1].Exit)
			}
			t.Logf("N%d: %d sections, outcomes %v; longest time between a release and the next grant %v (bound %v: TTL/2 %v + slack %v)",
				n, len(spans), out.by, worst.Round(time.Millisecond), gapBound.Round(time.Millisecond), ttls[len(ttls)-1]/2, slack.Round(time.Millisecond))
			for _, s := range out.bad {
				t.Error(s)
			}
			if len(out.quorum) > 0 {
				t.Errorf("%d QuorumErrors with every master up, the first: %s", len(out.quorum), out.quorum[0])
			}
			if err := h.Check(); err != nil {
				t.Error(err)
			}
			if worst > gapBound {
				t.Errorf("the name went %v without a holder while Locks waited, over the bound %v", worst, gapBound)
			}
			b := pingBound(t, addrs[0], 2*200*time.Millisecond) // the call timeout of these TTLs: 200ms
			took, ok := pollUntil(left, &b, func() bool {
				for _, a := range addrs {
					if holderOf(t, a, name) != "" || len(liveQueueMembers(t, a, name)) != 0 {
						return false
					}
				}
				return true
			})
			if !ok {
				for i, a := range addrs {
					t.Errorf("master %d still holds %q and queues %q %v after every Lock returned; bound %v",
						i, holderOf(t, a, name), liveQueueMembers(t, a, name), took, b)
				}
			}
			for _, c := range cs {
				_ = c.Close(context.Background())
			}
			checkNoLeaks(t, ignore)
		})
	}
}
