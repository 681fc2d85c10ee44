package redlockprio_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/latchkey-go/latchkey/contracttest"
	"github.com/latchkey-go/latchkey/contracttest/testenv"
	"github.com/latchkey-go/latchkey/locks"
	"github.com/latchkey-go/latchkey/redlockprio"
)

// TestTimedOutTheftKeepsVictimsName: a thief whose context ends before
// the masters' answers arrive has displaced the holder without knowing it
// (so without telling it). Cleaning up, it must not delete the keys it
// took from that holder — "an attempt that does not win a quorum deletes
// whatever it got, except where it displaced a lower priority" — or a
// third client gets the name while the holder still runs. (It did: the
// cleanup deleted them, and a client of the holder's priority got the
// name at once.) Nor may it acknowledge the theft of those kept keys by
// a third client of higher priority: it does not hold them, the holder
// it never told does (it did, and such a client got the name 0.77s
// before the holder's deadline).
func TestTimedOutTheftKeepsVictimsName(t *testing.T) {
	for _, third := range []int{1, 9} {
		t.Run(fmt.Sprintf("third client priority %d", third), func(t *testing.T) {
			testTimedOutTheft(t, third)
		})
	}
}

func testTimedOutTheft(t *testing.T, thirdPriority int) {
	addrs := addrsOf(testenv.StartRedis(t, 3))
	const ttl, renew = 1500 * time.Millisecond, 450 * time.Millisecond
	opts := []redlockprio.Option{redlockprio.WithTTL(ttl), redlockprio.WithRenewInterval(renew)}
	w := mustClient(t, addrs, viaProxies(), with(opts...), withPriority(1))
	thief := mustClient(t, addrs, viaProxies(), with(opts...), withPriority(5))
	z := mustClient(t, addrs, with(opts...), withPriority(thirdPriority))
	warm(t, thief.l)
	warm(t, z.l)
	name := uniqueName(t)
	ctx := ctxFor(t, 10*time.Second)
	victim, err := w.l.TryLock(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	w.cut() // the holder hears nothing and renews nothing: it runs until its deadline
	deadline := victim.(*redlockprio.Lease).Deadline()

	// The thief's requests take 100ms each way; it gives up after 50ms.
	for _, px := range thief.proxies {
		px.Latency(100 * time.Millisecond)
	}
	short, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	lease, err := thief.l.TryLock(short, name)
	cancel()
	if err == nil {
		_ = lease.Release(ctx)
		t.Fatal("the thief got the name within 50ms through 200ms round trips")
	}
	waitForHolder(t, addrs, name, thief.c.ID()) // its requests took the keys all the same
	for _, px := range thief.proxies {
		px.Restore() // the thief hears notices again, at once
	}

	got, err := z.l.Lock(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	at := time.Now()
	defer got.Release(ctx)
	if at.Before(deadline) {
		t.Fatalf("another client (priority %d) got the name %v before the displaced holder's deadline (holder live: %v)",
			thirdPriority, deadline.Sub(at).Round(time.Millisecond), victim.Context().Err() == nil)
	}
	t.Logf("another client (priority %d) got the name %v after the displaced holder's deadline", thirdPriority, at.Sub(deadline).Round(time.Millisecond))
}

func TestTheftFromUnreachableVictimWaitsOutItsValidity(t *testing.T) {
	addrs := addrsOf(testenv.StartRedis(t, 3))
	low := mustClient(t, addrs, viaProxies(), withPriority(1))
	high := mustClient(t, addrs, withPriority(5))
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
	bound := pingBound(t, addrs[0], pttl+testDrift+theftMargin).Watched(t)
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
	bound.Check(t, "the thief's wait for the victim's remaining PTTL plus the drift", got.Sub(read))
	t.Logf("thief got the lock %v after the victim's deadline, %v after its keys' remaining PTTL %v plus the drift; victim ended with %v",
		got.Sub(deadline).Round(time.Millisecond), got.Sub(read.Add(pttl+testDrift)).Round(time.Millisecond), pttl, context.Cause(victim.Context()))
	_ = thief.Release(ctx)
}

// TestChainOfThieves: a victim that cannot answer, a thief of middle
// priority waiting for it, and a higher thief robbing the middle one. The
// highest gets the lock only after the first victim's validity has run
// out, and no two ever consider themselves holders at once.
func TestChainOfThieves(t *testing.T) {
	addrs := addrsOf(testenv.StartRedis(t, 3))
	p1 := mustClient(t, addrs, viaProxies(), withPriority(1))
	p2 := mustClient(t, addrs, withPriority(2))
	p3 := mustClient(t, addrs, withPriority(3))
	// Dialled and subscribed beforehand: on a loaded machine a first
	// contact can outlast the call timeout (p1's TryLock), or p2's and
	// p3's steps p1's remaining validity (the chain would not form).
	for _, c := range []*client{p1, p2, p3} {
		warm(t, c.l)
	}
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
		mu       sync.Mutex
		holders  = map[string]locks.Lease{"p1": v}
		overlap  []string
		p2Leased bool // p2's Lock returned: its wait for p1 was over
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
		p2Leased = p2Leased || who == "p2"
	}
	ctx2, cancel2 := context.WithCancel(ctx)
	defer cancel2()
	done2 := make(chan struct{})
	go func() {
		defer close(done2)
		l, err := p2.l.Lock(ctx2, name)
		if err == nil {
			check("p2", l)
			// A holder lets go when its lease ends, as locks.Do does: one
			// that does not costs a thief its remaining validity.
			select {
			case <-ctx2.Done():
			case <-l.Context().Done():
			}
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
	// p3 waits at most what is left of p1's validity plus the drift,
	// counted from its Lock, which a loaded machine may start late (once
	// p1's validity is over, a holder that lets go costs a round trip).
	start := time.Now()
	bound := pingBound(t, addrs[0], max(read.Add(pttl+testDrift).Sub(start), 0)+theftMargin).Watched(t)
	l3, err := p3.l.Lock(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	got := time.Now()
	check("p3", l3)
	if got.Before(vDeadline) {
		t.Errorf("p3 got the lock %v before p1's validity deadline", vDeadline.Sub(got))
	}
	mu.Lock()
	leased := p2Leased
	mu.Unlock()
	if leased {
		// Under load p2's wait for p1 can end before p3 robs it: p3 then
		// robbed a holder, not a thief waiting, and the chain was not
		// tested this time.
		t.Logf("p2's Lock returned before p3's: no chain of thieves formed")
	}
	// The chain adds no TTL: p3 waits at most p1's remaining PTTL plus the
	// drift, not p2's.
	bound.Check(t, "p3's wait for p1's remaining PTTL plus the drift", got.Sub(start))
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

// TestFailedTheftTellsItsVictim: two thieves, each reaching one master
// only, displace the holder there and fail for want of a quorum. The
// holder must hear of it before anyone else gets the name.
func TestFailedTheftTellsItsVictim(t *testing.T) {
	addrs := addrsOf(testenv.StartRedis(t, 3))
	// A long renewal interval: the holder's renewals must not be what
	// saves it.
	v := mustClient(t, addrs, withPriority(1), with(redlockprio.WithTTL(10*time.Second), redlockprio.WithRenewInterval(3*time.Second)))
	name := uniqueName(t)
	ctx := ctxFor(t, 20*time.Second)
	victim, err := v.l.TryLock(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	for i := range 2 {
		th := mustClient(t, addrs, viaProxies(), withPriority(5))
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
	other := mustClient(t, addrs, withPriority(1))
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

// TestThiefRenewsWhileWaiting: a thief waiting for an unreachable
// victim's validity to run out keeps renewing its own keys. The victim's
// TTL is several of the thief's. The thief's keys start with the
// victim's longer PTTL (they must outlast its validity), which renewals
// never shorten; once that has run down below the thief's own TTL, they
// are renewed. Sampled over the wait on every master where the theft
// landed (a quorum at least), the thief's key
// stays the thief's and never runs out, its PTTL goes back up at (about)
// every renewal once below the thief's TTL; and Lock returns with keys
// that have most of a TTL left.
func TestThiefRenewsWhileWaiting(t *testing.T) {
	addrs := addrsOf(testenv.StartRedis(t, 3))
	const victimTTL = 2 * time.Second
	low := mustClient(t, addrs, viaProxies(), withPriority(1), with(redlockprio.WithTTL(victimTTL), redlockprio.WithRenewInterval(600*time.Millisecond)))
	high := mustClient(t, addrs, withPriority(5))
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
	// The theft is done on a quorum: the wait begins. A master whose step
	// timed out on a loaded machine may hold nothing (the victim's key ran
	// out there); the promise is about the keys the thief holds.
	held := waitForHolderOn(t, addrs, name, high.c.ID(), len(addrs)/2+1)
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
		for _, i := range held {
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
	for _, i := range held {
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

// TestChainOfThievesMixedTTLs: the first victim p1 holds with a TTL of
// 3s and is cut off (alive, hearing nothing); p2 (TTL 600ms, priority 2)
// steals and waits for it. Then either p3 (TTL 600ms, priority 3) steals
// from the waiting p2, or p2's Locker is closed while it waits and a
// priority-0 client locks. Neither may get the name before p1's validity
// has run out: the keys p2 set must outlast p1's validity though p2's own
// TTL is shorter. (They did not: p3 got the name about one of p2's TTLs
// after the theft, 2s before p1's deadline.)
func TestChainOfThievesMixedTTLs(t *testing.T) {
	for _, third := range []string{"higher thief", "closed thief then priority 0"} {
		t.Run(third, func(t *testing.T) {
			addrs := addrsOf(testenv.StartRedis(t, 3))
			p1 := mustClient(t, addrs, viaProxies(), withPriority(1), with(redlockprio.WithTTL(3*time.Second), redlockprio.WithRenewInterval(900*time.Millisecond)))
			p2 := mustClient(t, addrs, withPriority(2))
			var p3 *client
			if third == "higher thief" {
				p3 = mustClient(t, addrs, withPriority(3))
			} else {
				p3 = mustClient(t, addrs)
			}
			warm(t, p2.l)
			warm(t, p3.l)
			name := uniqueName(t)
			ctx := ctxFor(t, 15*time.Second)
			v, err := p1.l.TryLock(ctx, name)
			if err != nil {
				t.Fatal(err)
			}
			p1.cut() // p1 runs on, hearing nothing, until its deadline
			vDeadline := v.(*redlockprio.Lease).Deadline()

			ctx2, cancel2 := context.WithCancel(ctx)
			defer cancel2()
			done2 := make(chan error, 1)
			go func() {
				l, err := p2.l.Lock(ctx2, name)
				if err == nil {
					_ = l.Release(context.Background())
					err = errors.New("p2 got the name")
				}
				done2 <- err
			}()
			waitForHolder(t, addrs, name, p2.c.ID()) // p2 stole every key and waits for p1
			if third != "higher thief" {
				if err := p2.c.Close(context.Background()); err != nil {
					t.Fatal(err)
				}
			}
			l3, err := p3.l.Lock(ctx, name)
			if err != nil {
				t.Fatal(err)
			}
			got := time.Now()
			defer l3.Release(ctx)
			if got.Before(vDeadline) {
				t.Errorf("%s got the name %v before p1's validity deadline (p1 live: %v)",
					third, vDeadline.Sub(got).Round(time.Millisecond), v.Context().Err() == nil)
			} else {
				t.Logf("%s got the name %v after p1's validity deadline", third, got.Sub(vDeadline).Round(time.Millisecond))
			}
			cancel2()
			if err := <-done2; err == nil || strings.Contains(err.Error(), "p2 got") {
				t.Errorf("p2's Lock: %v", err)
			}
		})
	}
}

// TestChainOfFourThievesMixedTTLs: a 3s victim p1 (priority 1, drift 0.01) is
// cut off while it keeps writing under its live context; p2 (400ms, drift
// 0.05, priority 2) steals and waits for it; p3 (1s, drift 0, priority 3)
// steals from the waiting p2; then either p4 (300ms, drift 0.2, priority
// 4) steals from p3, or p2 and p3 give up (their contexts end mid-wait) or
// are closed, and a priority-0 Lock (300ms) waits. The docs: "the highest
// thief never proceeds while the first victim may still run, whatever the
// links' TTLs", and the keys of a thief that gave up or closed are kept
// until its victim acknowledged or ran out.
func TestChainOfFourThievesMixedTTLs(t *testing.T) {
	for _, last := range []string{"p4 steals", "waiters give up then p0", "waiters closed then p0"} {
		t.Run(last, func(t *testing.T) {
			addrs := addrsOf(testenv.StartRedis(t, 3))
			hist := contracttest.NewWriteHistory()
			p1 := mustClient(t, addrs, viaProxies(), withTiming(3*time.Second, 0.01), withPriority(1))
			p2 := mustClient(t, addrs, withTiming(400*time.Millisecond, 0.05), withPriority(2))
			p3 := mustClient(t, addrs, withTiming(time.Second, 0), withPriority(3))
			prio4 := 4
			if last != "p4 steals" {
				prio4 = 0
			}
			p4 := mustClient(t, addrs, withTiming(300*time.Millisecond, 0.2), withPriority(prio4))
			warm(t, p2.l)
			warm(t, p3.l)
			warm(t, p4.l)
			name := uniqueName(t)
			ctx := ctxFor(t, 20*time.Second)

			v, err := p1.l.TryLock(ctx, name)
			if err != nil {
				t.Fatal(err)
			}
			s1 := hist.Begin("p1", v)
			stop := make(chan struct{})
			done1 := make(chan struct{})
			go func() { defer close(done1); s1.WriteWhileLive(stop) }()
			p1.cut()
			cutAt := hist.Now()

			waitCtx := ctx
			if last == "waiters give up then p0" {
				var cancel context.CancelFunc
				waitCtx, cancel = context.WithTimeout(ctx, 600*time.Millisecond)
				defer cancel()
			}
			done2 := lockAsync(waitCtx, hist, "p2", p2.l, name)
			waitForHolder(t, addrs, name, p2.c.ID())
			done3 := lockAsync(waitCtx, hist, "p3", p3.l, name)
			waitForHolder(t, addrs, name, p3.c.ID())
			switch last {
			case "waiters give up then p0":
				t.Logf("p2: %v; p3: %v", <-done2, <-done3)
			case "waiters closed then p0":
				_ = p2.c.Close(context.Background())
				_ = p3.c.Close(context.Background())
			}
			l4, err := p4.l.Lock(ctx, name)
			if err != nil {
				t.Fatal(err)
			}
			s4 := hist.Begin("p4", l4)
			s4.Write(hist.Now())
			s4.LetGo()
			_ = l4.Release(ctx)
			<-done1 // p1's context ends by its deadline at the latest
			s1.LetGo()
			close(stop)
			if last == "p4 steals" {
				t.Logf("p2's Lock: %v; p3's Lock: %v", <-done2, <-done3) // may retry and get it after p4
			}
			x1, x4 := s1.Record(), s4.Record()
			t.Logf("cut at %v; p1 context ended %v (%v), p1 deadline %v; p4 granted %v (token %d > %d)",
				ms(cutAt), ms(x1.ContextEnd), context.Cause(v.Context()), ms(x1.Deadline), ms(x4.Granted), x4.Token, x1.Token)
			t.Logf("sections:\n%v", hist)
			if x4.Granted < x1.Deadline {
				t.Errorf("p4 granted %v before p1's validity deadline (p1 wrote until %v)",
					ms(x1.Deadline-x4.Granted), ms(x1.LastWrite))
			}
			if err := hist.Check(); err != nil {
				t.Logf("sections:\n%v", hist)
				t.Error(err)
			}
		})
	}
}

// TestChainWaitsForVictimIgnoringContext: the first victim p1 (2s, priority 1)
// is reachable but its work ignores its context: it lets go (Release) 800ms
// after its context ended. p2 (400ms, priority 2) steals and waits; then p3
// (300ms, priority 3) steals from the waiting p2, or p2 gives up or is
// closed and a priority-0 Lock waits. The docs: the acknowledgement is sent
// when the victim calls Release, and a robbed waiting thief delays its own
// until its victim acknowledged, so nobody may be granted before p1's
// Release.
func TestChainWaitsForVictimIgnoringContext(t *testing.T) {
	for _, last := range []string{"p3 steals", "p2 gives up then p0", "p2 closed then p0", "p3 steals, p2 gives up after"} {
		t.Run(last, func(t *testing.T) {
			addrs := addrsOf(testenv.StartRedis(t, 3))
			hist := contracttest.NewWriteHistory()
			p1 := mustClient(t, addrs, withTiming(2*time.Second, 0.01), withPriority(1))
			p2 := mustClient(t, addrs, withTiming(400*time.Millisecond, 0.05), withPriority(2))
			prio3 := 3
			if last == "p2 gives up then p0" || last == "p2 closed then p0" {
				prio3 = 0
			}
			p3 := mustClient(t, addrs, withTiming(300*time.Millisecond, 0.1), withPriority(prio3))
			warm(t, p1.l)
			warm(t, p2.l)
			warm(t, p3.l)
			name := uniqueName(t)
			ctx := ctxFor(t, 20*time.Second)

			v, err := p1.l.TryLock(ctx, name)
			if err != nil {
				t.Fatal(err)
			}
			s1 := hist.Begin("p1", v)
			stop := make(chan struct{})
			done1 := make(chan struct{})
			go func() { defer close(done1); s1.WriteUntilDeadline(stop) }()
			released := make(chan struct{})
			go func() {
				defer close(released)
				<-v.Context().Done()
				time.Sleep(800 * time.Millisecond)
				close(stop)
				<-done1
				s1.LetGo()
				_ = v.Release(context.Background())
			}()

			waitCtx := ctx
			if last == "p2 gives up then p0" {
				var cancel context.CancelFunc
				waitCtx, cancel = context.WithTimeout(ctx, 300*time.Millisecond)
				defer cancel()
			}
			ctx2, cancel2 := context.WithCancel(waitCtx)
			defer cancel2()
			done2 := lockAsync(ctx2, hist, "p2", p2.l, name)
			waitForHolder(t, addrs, name, p2.c.ID())
			switch last {
			case "p2 gives up then p0":
				err2 := <-done2
				t.Logf("p2: %v", err2)
				d := make(chan error, 1)
				d <- err2
				done2 = d
			case "p2 closed then p0":
				_ = p2.c.Close(context.Background())
			}
			var l3 locks.Lease
			if last == "p3 steals, p2 gives up after" {
				done3 := make(chan struct{})
				go func() {
					defer close(done3)
					l3, err = p3.l.Lock(ctx, name)
				}()
				waitForHolder(t, addrs, name, p3.c.ID())
				cancel2()
				<-done3
			} else {
				l3, err = p3.l.Lock(ctx, name)
			}
			if err != nil {
				t.Fatal(err)
			}
			s3 := hist.Begin("p3", l3)
			s3.Write(hist.Now())
			s3.LetGo()
			_ = l3.Release(ctx)
			<-released
			x1, x3 := s1.Record(), s3.Record()
			t.Logf("p1 context ended %v (%v), p1 let go %v, deadline %v; p3 granted %v (tokens %d -> %d)",
				ms(x1.ContextEnd), context.Cause(v.Context()), ms(x1.LetGo), ms(x1.Deadline), ms(x3.Granted), x1.Token, x3.Token)
			cancel2()
			<-done2
			t.Logf("sections:\n%v", hist)
			if err := hist.Check(); err != nil {
				t.Error(err)
			}
		})
	}
}

// TestSplitVoteThievesKeepVictimsName: V (priority 1, TTL 3s) holds a
// name on 3 masters. Three thieves A, B, C of priority 2 (TTL 400ms) try
// it at once, each reaching "its" master first (the others' links are
// slowed by 80ms each way), so each displaces V on one master and finds
// the other two held by an equal priority: a split vote, every master
// answered, none granted. Each told V and must keep its key until V
// acknowledged or ran out of validity ("Deleting it at once would let a
// third client take the name while the victim still runs"). Then H
// (priority 3, TTL 300ms) displaces the three leftover keys: H must not
// proceed while V may still run ("the highest thief never proceeds while
// the first victim may still run"). V either ignores its context until it
// calls Release 1.5s after it ended ("V told, slow to let go"), or is cut
// off and writes while its context is live ("V cut off").
func TestSplitVoteThievesKeepVictimsName(t *testing.T) {
	for _, how := range []string{"V told, slow to let go", "V cut off"} {
		t.Run(how, func(t *testing.T) {
			addrs := addrsOf(testenv.StartRedis(t, 3))
			hist := contracttest.NewWriteHistory()
			v := mustClient(t, addrs, viaProxies(), withTiming(3*time.Second, 0.01), withPriority(1))
			var thieves []*client
			for range 3 {
				thieves = append(thieves, mustClient(t, addrs, viaProxies(), withTiming(400*time.Millisecond, 0.01), withPriority(2)))
			}
			h := mustClient(t, addrs, withTiming(300*time.Millisecond, 0.01), withPriority(3))
			warm(t, v.l)
			for _, th := range thieves {
				warm(t, th.l)
			}
			warm(t, h.l)
			name := uniqueName(t)
			ctx := ctxFor(t, 20*time.Second)

			vl, err := v.l.TryLock(ctx, name)
			if err != nil {
				t.Fatal(err)
			}
			s1 := hist.Begin("V", vl)
			stop := make(chan struct{})
			done1 := make(chan struct{})
			released := make(chan struct{})
			if how == "V cut off" {
				go func() { defer close(done1); s1.WriteWhileLive(stop) }()
				v.cut()
				go func() {
					defer close(released)
					<-done1
					s1.LetGo()
				}()
			} else {
				go func() { defer close(done1); s1.WriteUntilDeadline(stop) }()
				go func() {
					defer close(released)
					<-vl.Context().Done()
					time.Sleep(1500 * time.Millisecond)
					close(stop)
					<-done1
					s1.LetGo()
					_ = vl.Release(context.Background())
				}()
			}

			for i, th := range thieves {
				for j, px := range th.proxies {
					if j != i {
						px.Latency(80 * time.Millisecond)
					}
				}
			}
			var wg sync.WaitGroup
			errs := make([]error, 3)
			for i, th := range thieves {
				wg.Go(func() {
					l, err := th.l.TryLock(ctx, name)
					if err == nil {
						s := hist.Begin("thief", l)
						s.Write(hist.Now())
						s.LetGo()
						_ = l.Release(ctx)
					}
					errs[i] = err
				})
			}
			wg.Wait()
			for _, th := range thieves {
				for _, px := range th.proxies {
					px.Restore()
				}
			}
			split := true
			for i := range 3 {
				holder := holderOf(t, addrs[i], name)
				t.Logf("thief %d: %v; master %d held by %q", i, errs[i], i, holder)
				split = split && strings.HasPrefix(holder, thieves[i].c.ID()+":")
			}
			if !split {
				t.Skip("the vote did not split as arranged")
			}
			for i, a := range addrs {
				t.Logf("master %d: PTTL %v", i, maxPTTL(t, []string{a}, name))
			}
			splitAt := hist.Now()
			hl, err := h.l.Lock(ctx, name)
			if err != nil {
				t.Fatal(err)
			}
			sh := hist.Begin("H", hl)
			sh.Write(hist.Now())
			sh.LetGo()
			_ = hl.Release(ctx)
			<-released
			x1, xh := s1.Record(), sh.Record()
			t.Logf("split at %v; V context ended %v (%v), V let go %v, V deadline %v; H granted %v (tokens %d -> %d)",
				ms(splitAt), ms(x1.ContextEnd), context.Cause(vl.Context()), ms(x1.LetGo), ms(x1.Deadline), ms(xh.Granted), x1.Token, xh.Token)
			t.Logf("sections:\n%v", hist)
			if xh.Granted < x1.LetGo && xh.Granted < x1.Deadline {
				t.Errorf("H was granted %v before V let go (V's deadline %v)", ms(x1.LetGo-xh.Granted), ms(x1.Deadline))
			}
			if err := hist.Check(); err != nil {
				t.Logf("sections:\n%v", hist)
				t.Error(err)
			}
			var he *locks.HeldError
			for i, err := range errs {
				if err != nil && !errors.As(err, &he) {
					var qe *redlockprio.QuorumError
					t.Logf("thief %d's TryLock: %v (QuorumError: %v)", i, err, errors.As(err, &qe))
				}
			}
		})
	}
}

// TestLostTheftReplyKeepsVictimsName: V (priority 1, TTL 3s) holds and is cut off,
// writing while its context is live. T (priority 2, TTL 400ms) tries to
// steal, but every reply to T is lost (its scripts run at the masters and
// displace V), so T's Lock ends with its 300ms context, knowing nothing
// of V. Then H (priority 3, TTL 300ms) displaces T's leftover keys. The
// docs: T "keeps every key it took from another holder [...] and does not
// acknowledge a later thief's notice about them — for its TTL or the
// longest PTTL it has seen on another holder's key, whichever is longer"
// — "(A holder whose TTL is longer than any this Locker has seen,
// displaced by an answer that was lost, is the one case this bound does
// not cover [...])". "T saw a 3s key before": T's Locker first stole a
// name from another 3s holder, so V's TTL is covered and H must wait for
// V. (With a fresh T, the documented exception, H also waited for V's
// validity in two runs; not asserted since the docs do not promise it.)
func TestLostTheftReplyKeepsVictimsName(t *testing.T) {
	for _, how := range []string{"T saw a 3s key before"} {
		t.Run(how, func(t *testing.T) {
			addrs := addrsOf(testenv.StartRedis(t, 3))
			hist := contracttest.NewWriteHistory()
			v := mustClient(t, addrs, viaProxies(), withTiming(3*time.Second, 0.01), withPriority(1))
			tc := mustClient(t, addrs, viaProxies(), withTiming(400*time.Millisecond, 0.01), withPriority(2))
			h := mustClient(t, addrs, withTiming(300*time.Millisecond, 0.01), withPriority(3))
			warm(t, v.l)
			warm(t, tc.l)
			warm(t, h.l)
			ctx := ctxFor(t, 20*time.Second)
			if how == "T saw a 3s key before" {
				other := mustClient(t, addrs, withTiming(3*time.Second, 0.01), withPriority(1))
				n := uniqueName(t)
				ol, err := other.l.TryLock(ctx, n)
				if err != nil {
					t.Fatal(err)
				}
				go func() { <-ol.Context().Done(); _ = ol.Release(context.Background()) }()
				tl, err := tc.l.Lock(ctx, n)
				if err != nil {
					t.Fatal(err)
				}
				_ = tl.Release(ctx)
			}
			name := uniqueName(t)
			vl, err := v.l.TryLock(ctx, name)
			if err != nil {
				t.Fatal(err)
			}
			s1 := hist.Begin("V", vl)
			done1 := make(chan struct{})
			go func() { defer close(done1); s1.WriteWhileLive(nil) }()
			v.cut()

			for _, px := range tc.proxies {
				px.DropReplies()
			}
			// T's scripts must reach every master before its 300ms run
			// out; on a loaded machine they did not once (a CI run: no key
			// of T's anywhere), and T locks again.
			for try := 1; ; try++ {
				tctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
				_, err = tc.l.Lock(tctx, name)
				cancel()
				t.Logf("T's Lock: %v", err)
				if heldOn(t, addrs, name, tc.c.ID(), time.Second) == len(addrs) {
					break
				}
				if try == 5 {
					waitForHolder(t, addrs, name, tc.c.ID()) // fails, naming the holders
				}
			}
			for _, px := range tc.proxies {
				px.Restore()
			}
			lostAt := hist.Now()
			t.Logf("keys' PTTL after T's lost theft: %v", maxPTTL(t, addrs, name))

			hl, err := h.l.Lock(ctx, name)
			if err != nil {
				t.Fatal(err)
			}
			sh := hist.Begin("H", hl)
			sh.Write(hist.Now())
			sh.LetGo()
			_ = hl.Release(ctx)
			<-done1
			s1.LetGo()
			x1, xh := s1.Record(), sh.Record()
			t.Logf("T's replies lost at %v; V context ended %v (%v), deadline %v; H granted %v (tokens %d -> %d)",
				ms(lostAt), ms(x1.ContextEnd), context.Cause(vl.Context()), ms(x1.Deadline), ms(xh.Granted), x1.Token, xh.Token)
			t.Logf("sections:\n%v", hist)
			if err := hist.Check(); err != nil {
				t.Error(err)
			}
		})
	}
}

// TestLateTheftAnswersKeepVictimsName: V (priority 1, TTL 3s) holds a name on 3
// masters and is cut off, writing while its lease context is live. H
// (priority 2, TTL 600ms, call timeout 100ms) tries to take it, but its
// replies come 400ms late from masters 1 and 2 (variant "H hears one"),
// or from all three ("H hears none"); its scripts run there at once and
// displace V. H's step fails ("more than N − quorum failed"); the docs:
// "An attempt that does not win a quorum deletes whatever it got, except
// where it displaced a lower priority", it "keeps each such key until its
// victim has acknowledged or run out of validity; [...] Deleting it at
// once would let a third client take the name while the victim still
// runs". Where H heard no answer it cannot know whom it displaced. Then,
// after H's own TTL twice over (past any bound H can set from what it
// saw), C (priority 0, TTL 600ms) Locks: it must not be granted while V
// may still write. Variant "C steals": C has priority 3 instead, and
// displaces H's keys. (A defect found here: H, having forgotten an
// attempt that heard no answer, acknowledged C's notice at once, and C
// ran beside V for up to 150ms.)
func TestLateTheftAnswersKeepVictimsName(t *testing.T) {
	for _, heard := range []string{"H hears one", "H hears none"} {
		for _, variant := range []string{"C waits", "C steals"} {
			t.Run(heard+"/"+variant, func(t *testing.T) {
				lateTheftAnswers(t, heard == "H hears none", variant == "C steals")
			})
		}
	}
}

func lateTheftAnswers(t *testing.T, hearsNone, cSteals bool) {
	addrs := addrsOf(testenv.StartRedis(t, 3))
	hist := contracttest.NewWriteHistory()
	const hTTL = 600 * time.Millisecond
	v := mustClient(t, addrs, viaProxies(), withTiming(3*time.Second, 0.01), withPriority(1))
	h := mustClient(t, addrs, viaProxies(), withTiming(hTTL, 0.01), withPriority(2), with(redlockprio.WithCallTimeout(100*time.Millisecond)))
	pc := 0
	if cSteals {
		pc = 3
	}
	c := mustClient(t, addrs, withTiming(600*time.Millisecond, 0.01), withPriority(pc))
	warm(t, v.l)
	warm(t, h.l)
	warm(t, c.l)
	name := uniqueName(t)
	ctx := ctxFor(t, 20*time.Second)
	vl, err := v.l.TryLock(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	sv := hist.Begin("V", vl)
	done := sv.Hold(false)
	v.cut()
	late := h.proxies[1:]
	if hearsNone {
		late = h.proxies
	}
	testenv.Proxies(late).DelayReplies(400 * time.Millisecond)
	begun := time.Now()
	_, herr := h.l.Lock(ctx, name)
	var qe *redlockprio.QuorumError
	t.Logf("H's Lock at %v: %v (QuorumError %v)", ms(hist.Now()), herr, errors.As(herr, &qe))
	if herr == nil {
		t.Skip("H was granted")
	}
	// C comes once H's own TTL has passed twice over, with the late
	// answers in: a failed attempt's own bounds are over by then.
	time.Sleep(time.Until(begun.Add(2 * hTTL)))
	for i, a := range addrs {
		t.Logf("at %v master %d holder %q PTTL %v", ms(hist.Now()), i, holderOf(t, a, name), maxPTTL(t, []string{a}, name))
	}
	cl, err := c.l.Lock(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	sc := hist.Begin("C", cl)
	sc.Write(hist.Now())
	sc.LetGo()
	_ = cl.Release(ctx)
	<-done
	xv := sv.Record()
	t.Logf("V context ended %v (%v), deadline %v; C granted %v", ms(xv.ContextEnd), context.Cause(vl.Context()), ms(xv.Deadline), ms(sc.Record().Granted))
	if err := hist.Check(); err != nil {
		t.Logf("sections:\n%v", hist)
		t.Error(err)
	}
}

// TestDelayedTheftNoticeNeverOverlaps: V (TTL 1s, priority 0) holds a name
// through proxies whose replies (pub/sub pushes included) are delayed by
// 150ms (variant "V immediate": WithImmediateAck, V writes while its
// context is live; variant "V default": V writes until it calls Release,
// 100ms after its context ended). T (priority 1, TTL 600ms) steals. The
// notice reaches V 150ms late; T must not be granted before V's last
// write, and T's token must be above V's. T's wait is logged.
func TestDelayedTheftNoticeNeverOverlaps(t *testing.T) {
	for _, immediate := range []bool{true, false} {
		t.Run(map[bool]string{true: "V immediate", false: "V default"}[immediate], func(t *testing.T) {
			addrs := addrsOf(testenv.StartRedis(t, 3))
			hist := contracttest.NewWriteHistory()
			var more []redlockprio.Option
			if immediate {
				more = append(more, redlockprio.WithImmediateAck())
			}
			v := mustClient(t, addrs, viaProxies(), withTiming(time.Second, 0.01), withPriority(0), with(more...))
			th := mustClient(t, addrs, withTiming(600*time.Millisecond, 0.01), withPriority(1))
			warm(t, v.l)
			warm(t, th.l)
			ctx := ctxFor(t, 20*time.Second)
			name := uniqueName(t)
			vl, err := v.l.TryLock(ctx, name)
			if err != nil {
				t.Fatal(err)
			}
			sv := hist.Begin("V", vl)
			stop := make(chan struct{})
			vdone := make(chan struct{})
			go func() {
				defer close(vdone)
				if immediate {
					sv.WriteWhileLive(stop)
				} else {
					go func() {
						<-vl.Context().Done()
						time.Sleep(100 * time.Millisecond)
						close(stop)
					}()
					sv.WriteUntilDeadline(stop)
				}
				sv.LetGo()
				_ = vl.Release(context.Background())
			}()
			testenv.Proxies(v.proxies).DelayReplies(150 * time.Millisecond)
			time.Sleep(20 * time.Millisecond)
			begun := time.Now()
			tl, err := th.l.Lock(ctx, name)
			if err != nil {
				t.Fatal(err)
			}
			st := hist.Begin("T", tl)
			st.Write(hist.Now())
			st.LetGo()
			t.Logf("T's Lock took %v", time.Since(begun))
			_ = tl.Release(context.Background())
			if immediate {
				close(stop)
			}
			<-vdone
			testenv.Proxies(v.proxies).Restore()
			if err := hist.Check(); err != nil {
				t.Logf("sections:\n%v", hist)
				t.Error(err)
			}
		})
	}
}

// TestThiefRenewsWhileWaitingForSlowVictim: V (TTL 3s, priority 0, default
// acknowledgement) holds a name and lets go (Release) 1.5s after its
// context ended; T (priority 1, TTL 300ms, so its renewal interval is
// ~97ms) steals and waits, and master 0 is paused for 200ms during the
// wait. Docs: "the thief keeps renewing its keys while it waits". Checked:
// T's Lock returns after V's Release; T's lease is live then, with a
// deadline ahead; it stays live for 1s more (renewed); V's last write
// precedes T's grant; tokens increase.
func TestThiefRenewsWhileWaitingForSlowVictim(t *testing.T) {
	servers := testenv.StartRedis(t, 3)
	addrs := addrsOf(servers)
	hist := contracttest.NewWriteHistory()
	v := mustClient(t, addrs, withTiming(3*time.Second, 0.01))
	th := mustClient(t, addrs, withTiming(300*time.Millisecond, 0.01), withPriority(1))
	warm(t, th.l)
	ctx := ctxFor(t, 20*time.Second)
	name := uniqueName(t)
	vl, err := v.l.TryLock(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	sv := hist.Begin("V", vl)
	stop := make(chan struct{})
	go func() {
		<-vl.Context().Done()
		time.Sleep(1500 * time.Millisecond)
		close(stop)
	}()
	vdone := make(chan struct{})
	go func() {
		defer close(vdone)
		sv.WriteUntilDeadline(stop)
		sv.LetGo()
		_ = vl.Release(context.Background())
	}()
	go func() {
		<-vl.Context().Done()
		time.Sleep(500 * time.Millisecond)
		_ = servers[0].Pause()
		time.Sleep(200 * time.Millisecond)
		_ = servers[0].Resume()
	}()
	begun := time.Now()
	tl, err := th.l.Lock(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	st := hist.Begin("T", tl)
	st.Write(hist.Now())
	waited := time.Since(begun)
	ahead := time.Until(tl.(*redlockprio.Lease).Deadline())
	t.Logf("T waited %v; its deadline is %v ahead at the grant", waited, ahead)
	if tl.Context().Err() != nil || ahead < 50*time.Millisecond {
		t.Errorf("T's lease at its grant: %v, deadline %v ahead", context.Cause(tl.Context()), ahead)
	}
	time.Sleep(time.Second)
	if err := tl.Context().Err(); err != nil {
		t.Errorf("T's lease ended within 1s of its grant: %v", context.Cause(tl.Context()))
	}
	st.Write(hist.Now())
	st.LetGo()
	_ = tl.Release(context.Background())
	<-vdone
	if err := hist.Check(); err != nil {
		t.Logf("sections:\n%v", hist)
		t.Error(err)
	}
}
