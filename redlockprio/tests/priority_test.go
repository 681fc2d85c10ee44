package redlockprio_test

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/latchkey-go/latchkey/contracttest/testenv"
	"github.com/latchkey-go/latchkey/locks"
	"github.com/latchkey-go/latchkey/redlockprio"
)

// proxied is a client whose connections to each master go through its own
// proxy, so that a test can cut it off (as a partition or a hung process
// would) while the masters stay up.
type proxied struct {
	*client
	proxies []*testenv.Proxy
}

func mustProxied(t testing.TB, addrs []string, opts ...redlockprio.Option) *proxied {
	t.Helper()
	p := &proxied{}
	var via []string
	for _, a := range addrs {
		px := testenv.NewProxy(t, a)
		p.proxies = append(p.proxies, px)
		via = append(via, px.Addr())
	}
	p.client = mustClient(t, via, opts...)
	return p
}

func (p *proxied) cut() {
	for _, px := range p.proxies {
		px.Cut()
	}
}

func holderOf(t testing.TB, addr, name string) string {
	t.Helper()
	rc := newRedis(addr)
	defer rc.Close()
	id, _ := rc.HGet(context.Background(), "latchkey:{"+name+"}:1", "id").Result()
	return id
}

// waitForHolder waits until the name's key (slot 1) is held on every
// master by a lease of the Locker with id lockerID.
func waitForHolder(t testing.TB, addrs []string, name, lockerID string) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		all := true
		for _, a := range addrs {
			all = all && strings.HasPrefix(holderOf(t, a, name), lockerID+":")
		}
		if all {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the Locker %s does not hold %q on every master", lockerID, name)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// plant sets a slot key on one master as a holder of another process
// would, for ten seconds.
func plant(t testing.TB, addr, name string, slot int, id string, prio int) {
	t.Helper()
	rc := newRedis(addr)
	defer rc.Close()
	key := "latchkey:{" + name + "}:" + strconv.Itoa(slot)
	ctx := context.Background()
	if err := rc.HSet(ctx, key, "id", id, "p", prio, "ch", "nobody").Err(); err != nil {
		t.Fatal(err)
	}
	if err := rc.PExpire(ctx, key, 10*time.Second).Err(); err != nil {
		t.Fatal(err)
	}
}

// maxPTTL returns the largest remaining TTL of name's key (slot 1) on the
// masters at addrs.
func maxPTTL(t testing.TB, addrs []string, name string) time.Duration {
	t.Helper()
	var largest time.Duration
	for _, a := range addrs {
		rc := newRedis(a)
		d, err := rc.PTTL(context.Background(), "latchkey:{"+name+"}:1").Result()
		_ = rc.Close()
		if err != nil {
			t.Fatalf("PTTL on %s: %v", a, err)
		}
		largest = max(largest, d)
	}
	return largest
}

// testDrift is the drift allowance of the tests' Lockers (testTTL, the
// default drift factor).
const testDrift = testTTL/100 + 2*time.Millisecond

// theftMargin is the scheduling margin of the upper bounds on a thief's
// wait: generous, not a performance claim.
const theftMargin = 200 * time.Millisecond

func unplant(t testing.TB, addr, name string, slot int) {
	t.Helper()
	rc := newRedis(addr)
	defer rc.Close()
	if err := rc.Del(context.Background(), "latchkey:{"+name+"}:"+strconv.Itoa(slot)).Err(); err != nil {
		t.Fatal(err)
	}
}

func TestTheftWithAcknowledgement(t *testing.T) {
	addrs := addrsOf(testenv.StartRedis(t, 3))
	low := mustClient(t, addrs, redlockprio.WithPriority(1))
	high := mustClient(t, addrs, redlockprio.WithPriority(5))
	high2 := mustClient(t, addrs, redlockprio.WithPriority(5))
	name := uniqueName(t)
	ctx := ctxFor(t, 10*time.Second)
	victim, err := low.l.TryLock(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	// The victim lets go as soon as it hears: its Release is the
	// acknowledgement.
	go func() {
		<-victim.Context().Done()
		_ = victim.Release(context.Background())
	}()
	start := time.Now()
	thief, err := high.l.Lock(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	took := time.Since(start)
	if victim.Context().Err() == nil {
		t.Fatal("the thief's Lock returned while the victim's lease was live")
	}
	if cause := context.Cause(victim.Context()); !errors.Is(cause, locks.ErrPreempted) {
		t.Errorf("victim's cause = %v, want ErrPreempted", cause)
	}
	// With the acknowledgement, the thief does not wait out the TTL.
	if took > testTTL/2 {
		t.Errorf("the theft took %v: the acknowledgement did not arrive (TTL %v)", took, testTTL)
	}
	if thief.Token() <= victim.Token() {
		t.Errorf("thief's token %d not above the victim's %d", thief.Token(), victim.Token())
	}
	if _, err := high2.l.TryLock(ctx, name); !errors.Is(err, locks.ErrNotAcquired) {
		t.Errorf("an equal priority took the name from the thief: %v", err)
	}
	// The victim's stale release and renewals must not touch the thief's keys.
	if err := victim.Release(ctx); !errors.Is(err, locks.ErrPreempted) {
		t.Errorf("the victim's Release after the theft = %v, want an error matching ErrPreempted", err)
	}
	time.Sleep(2 * testRenew)
	id := thief.(*redlockprio.Lease).HolderID()
	for _, a := range addrs {
		if got := holderOf(t, a, name); got != id {
			t.Errorf("master %s: key held by %q, want the thief %q", a, got, id)
		}
	}
	if err := context.Cause(thief.Context()); err != nil {
		t.Fatalf("the thief's lease ended: %v", err)
	}
	t.Logf("theft with acknowledgement took %v", took.Round(time.Millisecond))
	_ = thief.Release(ctx)
}

func TestTheftFromUnreachableVictimWaitsOutItsValidity(t *testing.T) {
	addrs := addrsOf(testenv.StartRedis(t, 3))
	low := mustProxied(t, addrs, redlockprio.WithPriority(1))
	high := mustClient(t, addrs, redlockprio.WithPriority(5))
	name := uniqueName(t)
	ctx := ctxFor(t, 10*time.Second)
	victim, err := low.l.TryLock(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	low.cut() // the victim hears nothing from now on, and renews nothing
	deadline := victim.(*redlockprio.Lease).Deadline()
	// Let half the victim's TTL pass, so that a thief waiting a whole TTL
	// rather than what is left of the victim's would be seen.
	time.Sleep(testTTL / 2)
	read := time.Now()
	pttl := maxPTTL(t, addrs, name) // the victim can no longer extend it
	thief, err := high.l.Lock(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	got := time.Now()
	if got.Before(deadline) {
		t.Fatalf("the thief got the lock %v before the unreachable victim's validity deadline", deadline.Sub(got))
	}
	if victim.Context().Err() == nil {
		t.Fatalf("the victim still believes it holds the name after the thief got it")
	}
	// And it waits at most the victim's remaining PTTL plus the drift.
	if limit := read.Add(pttl + testDrift + theftMargin); got.After(limit) {
		t.Errorf("the thief waited %v past the victim's remaining PTTL %v plus the drift %v (margin %v)",
			got.Sub(read.Add(pttl+testDrift)).Round(time.Millisecond), pttl, testDrift, theftMargin)
	}
	t.Logf("thief got the lock %v after the victim's deadline, %v after its keys' remaining PTTL %v plus the drift; victim ended with %v",
		got.Sub(deadline).Round(time.Millisecond), got.Sub(read.Add(pttl+testDrift)).Round(time.Millisecond), pttl, context.Cause(victim.Context()))
	_ = thief.Release(ctx)
}

func TestUnsafeStolenConsistencyFactor(t *testing.T) {
	addrs := addrsOf(testenv.StartRedis(t, 3))
	low := mustProxied(t, addrs, redlockprio.WithPriority(1))
	high := mustClient(t, addrs, redlockprio.WithPriority(5), redlockprio.WithUnsafeStolenConsistencyFactor(0.1))
	name := uniqueName(t)
	ctx := ctxFor(t, 10*time.Second)
	victim, err := low.l.TryLock(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	low.cut()
	deadline := victim.(*redlockprio.Lease).Deadline()
	start := time.Now()
	thief, err := high.l.Lock(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	took := time.Since(start)
	// As documented: the thief stops waiting after 0.1·TTL, while the
	// unreachable victim may still believe it holds the name.
	if !time.Now().Before(deadline) {
		t.Fatalf("with the unsafe factor the thief still waited out the victim's validity (%v)", took)
	}
	if took < testTTL/10-10*time.Millisecond {
		t.Errorf("the thief waited %v, less than 0.1·TTL", took)
	}
	_ = thief.Release(ctx)
}

// TestChainOfThieves: a victim that cannot answer, a thief of middle
// priority waiting for it, and a higher thief robbing the middle one. The
// highest gets the lock only after the first victim's validity has run
// out, and no two ever consider themselves holders at once.
func TestChainOfThieves(t *testing.T) {
	addrs := addrsOf(testenv.StartRedis(t, 3))
	p1 := mustProxied(t, addrs, redlockprio.WithPriority(1))
	p2 := mustClient(t, addrs, redlockprio.WithPriority(2))
	p3 := mustClient(t, addrs, redlockprio.WithPriority(3))
	name := uniqueName(t)
	ctx := ctxFor(t, 10*time.Second)
	v, err := p1.l.TryLock(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	p1.cut()
	vDeadline := v.(*redlockprio.Lease).Deadline()
	// Let half p1's TTL pass, so that a wait of one link longer than what
	// is left of p1's validity would be seen.
	time.Sleep(testTTL / 2)
	read := time.Now()
	pttl := maxPTTL(t, addrs, name)

	var (
		mu      sync.Mutex
		holders = map[string]locks.Lease{"p1": v}
		overlap []string
	)
	check := func(who string, lease locks.Lease) {
		mu.Lock()
		defer mu.Unlock()
		for other, l := range holders {
			if other != who && l.Context().Err() == nil {
				overlap = append(overlap, who+" got the lock while "+other+" held it")
			}
		}
		holders[who] = lease
	}
	ctx2, cancel2 := context.WithCancel(ctx)
	defer cancel2()
	done2 := make(chan struct{})
	go func() {
		defer close(done2)
		l, err := p2.l.Lock(ctx2, name)
		if err == nil {
			check("p2", l)
			<-ctx2.Done()
			_ = l.Release(context.Background())
		}
	}()
	// p2 has stolen the keys of every master and waits for p1.
	waitForHolder(t, addrs, name, p2.c.ID())
	select {
	case <-done2:
		t.Fatal("p2's Lock returned before p1's validity ran out")
	default:
	}
	l3, err := p3.l.Lock(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	got := time.Now()
	check("p3", l3)
	if got.Before(vDeadline) {
		t.Errorf("p3 got the lock %v before p1's validity deadline", vDeadline.Sub(got))
	}
	// The chain adds no TTL: p3 waits at most p1's remaining PTTL plus the
	// drift, not p2's.
	if limit := read.Add(pttl + testDrift + theftMargin); got.After(limit) {
		t.Errorf("p3 got the lock %v past p1's remaining PTTL %v plus the drift %v (margin %v)",
			got.Sub(read.Add(pttl+testDrift)).Round(time.Millisecond), pttl, testDrift, theftMargin)
	}
	t.Logf("p3 got the lock %v after p1's deadline, %v after p1's remaining PTTL %v plus the drift", got.Sub(vDeadline).Round(time.Millisecond),
		got.Sub(read.Add(pttl+testDrift)).Round(time.Millisecond), pttl)
	time.Sleep(2 * testRenew) // p2 retries meanwhile and must keep waiting
	cancel2()
	<-done2
	mu.Lock()
	for _, o := range overlap {
		t.Error(o)
	}
	mu.Unlock()
	if err := context.Cause(l3.Context()); err != nil {
		t.Errorf("p3's lease ended: %v", err)
	}
	_ = l3.Release(ctx)
}

func TestEqualPriorityLockWaitsForRelease(t *testing.T) {
	addrs := addrsOf(testenv.StartRedis(t, 3))
	a := mustClient(t, addrs, redlockprio.WithPriority(3))
	b := mustClient(t, addrs, redlockprio.WithPriority(3))
	name := uniqueName(t)
	ctx := ctxFor(t, 10*time.Second)
	first, err := a.l.TryLock(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	got := make(chan locks.Lease, 1)
	go func() {
		l, err := b.l.Lock(ctx, name)
		if err != nil {
			t.Error(err)
		}
		got <- l
	}()
	// Over several renewals and what would have been expiries.
	select {
	case l := <-got:
		if l != nil {
			_ = l.Release(ctx)
		}
		t.Fatal("an equal priority's Lock returned while the name was held")
	case <-time.After(2 * testTTL):
	}
	if err := context.Cause(first.Context()); err != nil {
		t.Fatalf("the holder's lease ended under an equal priority: %v", err)
	}
	if err := first.Release(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case l := <-got:
		if l == nil {
			return
		}
		if l.Token() <= first.Token() {
			t.Errorf("token %d after %d", l.Token(), first.Token())
		}
		_ = l.Release(ctx)
	case <-time.After(5 * time.Second):
		t.Fatal("the waiting Lock did not get the name after its release")
	}
}

// warm subscribes a Locker's inbox while every master is reachable.
func warm(t testing.TB, l *redlockprio.Locker) {
	t.Helper()
	lease, err := l.TryLock(ctxFor(t, 5*time.Second), uniqueName(t))
	if err != nil {
		t.Fatal(err)
	}
	_ = lease.Release(context.Background())
}

// TestFailedTheftTellsItsVictim: two thieves, each reaching one master
// only, displace the holder there and fail for want of a quorum. The
// holder must hear of it before anyone else gets the name.
func TestFailedTheftTellsItsVictim(t *testing.T) {
	addrs := addrsOf(testenv.StartRedis(t, 3))
	// A long renewal interval: the holder's renewals must not be what
	// saves it.
	v := mustClient(t, addrs, redlockprio.WithPriority(1), redlockprio.WithTTL(10*time.Second), redlockprio.WithRenewInterval(3*time.Second))
	name := uniqueName(t)
	ctx := ctxFor(t, 20*time.Second)
	victim, err := v.l.TryLock(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	for i := range 2 {
		th := mustProxied(t, addrs, redlockprio.WithPriority(5))
		warm(t, th.l)
		for j, px := range th.proxies {
			if j != i {
				px.Cut()
			}
		}
		if l, err := th.l.TryLock(ctx, name); err == nil {
			_ = l.Release(ctx)
			t.Fatalf("thief %d won the name through one master", i)
		}
	}
	other := mustClient(t, addrs, redlockprio.WithPriority(1))
	lease, err := other.l.Lock(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	defer lease.Release(ctx)
	if victim.Context().Err() == nil {
		t.Fatal("another client got the name while the displaced holder still believed it held it")
	}
	if cause := context.Cause(victim.Context()); !errors.Is(cause, locks.ErrPreempted) {
		t.Errorf("the displaced holder's cause = %v, want ErrPreempted", cause)
	}
}

// TestCloseKeepsWaitingThiefKeys: closing a Locker whose thief still
// waits for an unreachable victim must not free the name before the
// victim's validity has run out.
func TestCloseKeepsWaitingThiefKeys(t *testing.T) {
	addrs := addrsOf(testenv.StartRedis(t, 3))
	low := mustProxied(t, addrs, redlockprio.WithPriority(1))
	high := mustClient(t, addrs, redlockprio.WithPriority(5))
	other := mustClient(t, addrs, redlockprio.WithPriority(1))
	name := uniqueName(t)
	ctx := ctxFor(t, 10*time.Second)
	victim, err := low.l.TryLock(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	low.cut()
	deadline := victim.(*redlockprio.Lease).Deadline()
	errc := make(chan error, 1)
	go func() {
		l, err := high.l.Lock(ctx, name)
		if err == nil {
			_ = l.Release(ctx)
			err = errors.New("the thief got the name")
		}
		errc <- err
	}()
	waitForHolder(t, addrs, name, high.c.ID())
	if err := high.c.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := <-errc; !errors.Is(err, locks.ErrClosed) {
		t.Errorf("the thief's Lock after Close = %v, want ErrClosed", err)
	}
	lease, err := other.l.Lock(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	got := time.Now()
	defer lease.Release(ctx)
	if victim.Context().Err() == nil {
		t.Fatal("another client got the name while the unreachable victim still held it")
	}
	if got.Before(deadline) {
		t.Errorf("another client got the name %v before the victim's validity deadline", deadline.Sub(got))
	}
}

// TestSemaphoreTheftInLosingSlotTellsVictim: a semaphore acquisition
// wins slot 2 and, on one master, displaced the holder of slot 1, a slot
// it does not keep. That holder must hear of it before anyone else gets
// slot 1.
func TestSemaphoreTheftInLosingSlotTellsVictim(t *testing.T) {
	addrs := addrsOf(testenv.StartRedis(t, 3))
	name := uniqueName(t)
	ctx := ctxFor(t, 10*time.Second)
	// The victim holds slot 1 (a lock's key) on masters 0 and 1 only.
	v := mustProxied(t, addrs, redlockprio.WithPriority(1), redlockprio.WithTTL(3*time.Second), redlockprio.WithRenewInterval(900*time.Millisecond))
	v.proxies[2].Cut()
	victim, err := v.l.Lock(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	// Higher priorities hold slot 2 on master 0 and slot 1 on master 2.
	plant(t, addrs[0], name, 2, "h", 9)
	plant(t, addrs[2], name, 1, "x", 9)
	thief := mustClient(t, addrs, redlockprio.WithPriority(5))
	sem, err := thief.c.Semaphore(2)
	if err != nil {
		t.Fatal(err)
	}
	// Slot 2 on masters 1 and 2 (free), slot 1 on master 0 (the victim's).
	lease, err := sem.TryAcquire(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	defer lease.Release(ctx)
	if s := lease.(*redlockprio.Lease).Slot(); s != 2 {
		t.Fatalf("the thief got slot %d, want 2", s)
	}
	unplant(t, addrs[2], name, 1)
	other := mustClient(t, addrs, redlockprio.WithPriority(1))
	l2, err := other.l.Lock(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	defer l2.Release(ctx)
	if victim.Context().Err() == nil {
		t.Fatal("another client got slot 1 while its displaced holder still believed it held it")
	}
}

// TestThiefRenewsWhileWaiting: a thief waiting for an unreachable
// victim's validity to run out keeps renewing its own keys. The victim's
// TTL is several of the thief's. The thief's keys start with the
// victim's longer PTTL (they must outlast its validity), which renewals
// never shorten; once that has run down below the thief's own TTL, they
// are renewed. Sampled on every master over the wait, the thief's key
// stays the thief's and never runs out, its PTTL goes back up at (about)
// every renewal once below the thief's TTL; and Lock returns with keys
// that have most of a TTL left.
func TestThiefRenewsWhileWaiting(t *testing.T) {
	addrs := addrsOf(testenv.StartRedis(t, 3))
	const victimTTL = 2 * time.Second
	low := mustProxied(t, addrs, redlockprio.WithPriority(1),
		redlockprio.WithTTL(victimTTL), redlockprio.WithRenewInterval(600*time.Millisecond))
	high := mustClient(t, addrs, redlockprio.WithPriority(5))
	name := uniqueName(t)
	key := "latchkey:{" + name + "}:1"
	ctx := ctxFor(t, 10*time.Second)
	victim, err := low.l.TryLock(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	low.cut() // the victim cannot acknowledge: the thief waits out its validity
	vDeadline := victim.(*redlockprio.Lease).Deadline()
	rcs := make([]*redis.Client, len(addrs))
	for i, a := range addrs {
		rcs[i] = newRedis(a)
		t.Cleanup(func() { _ = rcs[i].Close() })
	}
	type outcome struct {
		lease locks.Lease
		err   error
	}
	done := make(chan outcome, 1)
	go func() {
		l, err := high.l.Lock(ctx, name)
		done <- outcome{l, err}
	}()
	waitForHolder(t, addrs, name, high.c.ID()) // the theft is done: the wait begins
	waitStart := time.Now()
	thiefOf := func(id string) bool { return strings.HasPrefix(id, high.c.ID()+":") }
	var (
		prev   = make([]time.Duration, len(addrs))
		lowest = make([]time.Duration, len(addrs))
		rises  = make([]int, len(addrs))
		below  = make([]time.Time, len(addrs)) // when the PTTL first fell under the thief's TTL
		broken = make([]string, len(addrs))    // the first sample that broke the promise
		res    outcome
	)
	for i := range addrs {
		prev[i], lowest[i] = victimTTL, victimTTL
	}
	sample := func(i int) (string, time.Duration) {
		pipe := rcs[i].Pipeline()
		id := pipe.HGet(ctx, key, "id")
		pttl := pipe.PTTL(ctx, key)
		_, _ = pipe.Exec(ctx)
		if err := pttl.Err(); err != nil {
			t.Fatalf("PTTL on master %d: %v", i, err)
		}
		return id.Val(), pttl.Val() // PTTL -2 when the key is gone
	}
	for waiting := true; waiting; {
		select {
		case res = <-done:
			waiting = false
			continue
		default:
		}
		for i := range addrs {
			id, d := sample(i)
			if broken[i] == "" && (!thiefOf(id) || d <= 0) {
				broken[i] = fmt.Sprintf("%v into the wait: key held by %q, PTTL %v", time.Since(waitStart).Round(time.Millisecond), id, d)
			}
			if below[i].IsZero() && d < testTTL {
				below[i] = time.Now()
			}
			if d > prev[i] && !below[i].IsZero() {
				rises[i]++
			}
			prev[i], lowest[i] = d, min(lowest[i], d)
		}
		time.Sleep(20 * time.Millisecond)
	}
	waited := time.Since(waitStart)
	if res.err != nil {
		t.Fatalf("the thief's Lock: %v", res.err)
	}
	defer res.lease.Release(ctx)
	if time.Now().Before(vDeadline) {
		t.Fatalf("the thief got the lock %v before the unreachable victim's validity deadline", time.Until(vDeadline))
	}
	// A key the thief stopped renewing would run out within one TTL, so a
	// wait of two shows it. (The wait is about the victim's TTL, 2s, less
	// the time the theft took to be seen: 3 TTLs or so, a little less on
	// a loaded machine.)
	if waited < 2*testTTL {
		t.Fatalf("the thief waited %v only: too short to tell whether it renewed (TTL %v)", waited, testTTL)
	}
	for i := range addrs {
		if below[i].IsZero() {
			t.Fatalf("master %d: the thief's PTTL never fell under its TTL in a wait of %v", i, waited)
		}
		// About one renewal per interval once below the thief's TTL
		// (the first renewal comes within an interval): half as many
		// is a generous bound.
		want := int(time.Since(below[i])/testRenew) / 2
		t.Logf("master %d: over a wait of %v, PTTL went up %d times, lowest %v", i, waited.Round(time.Millisecond), rises[i], lowest[i])
		if broken[i] != "" {
			t.Errorf("master %d: the waiting thief's key ran out: %s", i, broken[i])
		}
		if rises[i] < want {
			t.Errorf("master %d: the thief's PTTL went up %d times in a wait of %v, want at least %d (renewal interval %v)",
				i, rises[i], waited.Round(time.Millisecond), want, testRenew)
		}
		// Lock returns holding keys renewed within about one interval.
		if id, d := sample(i); id != res.lease.(*redlockprio.Lease).HolderID() || d < testTTL-testRenew-theftMargin {
			t.Errorf("master %d: after Lock returned, key held by %q with PTTL %v, want the thief %q with at least %v",
				i, id, d, res.lease.(*redlockprio.Lease).HolderID(), testTTL-testRenew-theftMargin)
		}
	}
	if err := context.Cause(res.lease.Context()); err != nil {
		t.Errorf("the thief's lease ended: %v", err)
	}
}
