package redlockprio_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/latchkey-go/latchkey/contracttest/testenv"
	"github.com/latchkey-go/latchkey/locks"
	"github.com/latchkey-go/latchkey/redlockprio"
)

// atkMixed is one client of runMixedContention: TTL, drift factor, priority.
type atkMixed struct {
	ttl   time.Duration
	drift float64
	prio  int
}

// runMixedContention runs the clients on one name for d: each loops Lock
// (context 0.2–2s) or, 3 times in 10, TryLock; holds 5–155ms; releases;
// pauses 0–20ms. It returns the grants, QuorumErrors, the longest time
// without a holder, and how many times the name had no holder for a
// stall or longer.
func runMixedContention(t *testing.T, addrs []string, cfg []atkMixed, d time.Duration, variant ...string) (grants, quorumErrs int, gap time.Duration, stalls int) {
	has := func(v string) bool {
		for _, x := range variant {
			if x == v {
				return true
			}
		}
		return false
	}
	name := uniqueName(t)
	clk := newAtkClock()
	var mu sync.Mutex
	var spans [][2]time.Duration
	var wg sync.WaitGroup
	end := time.Now().Add(d)
	for i, c := range cfg {
		cl := mustClient(t, addrs, atkOpts(c.ttl, c.drift, c.prio)...)
		if has("fast refusal") {
			// As TestRefusingMinorityIsContention's contender: go-redis
			// does not retry a refused dial.
			var ms []redis.UniversalClient
			for _, addr := range addrs {
				o := clientOptions(addr).Simple()
				o.DialerRetries = 1
				rc := redis.NewClient(o)
				t.Cleanup(func() { _ = rc.Close() })
				ms = append(ms, rc)
			}
			lc, err := redlockprio.New(ms, atkOpts(c.ttl, c.drift, c.prio)...)
			if err != nil {
				t.Fatal(err)
			}
			l := lc.Locker()
			t.Cleanup(func() { _ = lc.Close(context.Background()) })
			cl = &client{c: lc, l: l}
		}
		warm(t, cl.l)
		r := rand.New(rand.NewPCG(uint64(i), 7))
		wg.Go(func() {
			for time.Now().Before(end) {
				cd := time.Duration(200+r.IntN(1800)) * time.Millisecond
				if has("long Locks") {
					cd = 10 * time.Second
				}
				ctx, cancel := context.WithTimeout(context.Background(), cd)
				var (
					l   locks.Lease
					err error
				)
				if r.IntN(10) < 3 && !has("long Locks") {
					l, err = cl.l.TryLock(ctx, name)
				} else {
					l, err = cl.l.Lock(ctx, name)
				}
				if err != nil {
					cancel()
					var qe *redlockprio.QuorumError
					if errors.As(err, &qe) {
						mu.Lock()
						quorumErrs++
						mu.Unlock()
					}
					time.Sleep(time.Duration(r.IntN(20)) * time.Millisecond)
					continue
				}
				s := clk.begin(fmt.Sprintf("c%d", i), l)
				stop := make(chan struct{})
				time.AfterFunc(time.Duration(5+r.IntN(150))*time.Millisecond, func() { close(stop) })
				clk.workWhileLive(s, l, stop)
				clk.end(s, l)
				mu.Lock()
				grants++
				spans = append(spans, [2]time.Duration{s.granted, s.ended})
				mu.Unlock()
				_ = l.Release(context.Background())
				cancel()
				time.Sleep(time.Duration(r.IntN(20)) * time.Millisecond)
			}
		})
	}
	wg.Wait()
	clk.check(t)
	sort.Slice(spans, func(i, j int) bool { return spans[i][0] < spans[j][0] })
	last := time.Duration(0)
	note := func(g time.Duration) {
		gap = max(gap, g)
		if g >= stall {
			stalls++
		}
	}
	for _, s := range spans {
		note(s[0] - last)
		last = max(last, s[1])
	}
	note(d - last)
	return grants, quorumErrs, gap, stalls
}

// stall is how long a time without a holder counts as a stall in
// runMixedContention's count.
const stall = time.Second

// TestAttackRefusingMinorityStallsMixedContention: five clients with
// mixed TTLs, drift factors and priorities (300ms/0.01/p2, 300ms/0.1/p1,
// 2s/0.1/p0, 600ms/0.1/p0, 2s/0.01/p0) contend for one name for 8s on 5
// masters, all up, then with one of the 5 refusing connections. The docs
// (docs/promises.md): "Held on a quorum of independent masters; a minority
// down changes nothing"; "A minority down or refusing is contention, not
// failure"; "a paused master does not stall hand-offs"; doc.go: a failed
// attempt acknowledges at once "so a higher priority does not wait for
// it". Measured (6 runs): all up 143–211 grants, longest time without a
// holder 19–39ms (once 2.03s); 1 of 5 refusing 24–55 grants, longest gap
// 2.0–8.1s. Diagnostics, 1 of 5 refusing: all priority 0 → 103–112
// grants, gap ≤ 46ms (so priorities are needed); only Locks with 10s
// contexts (no attempt cancelled mid-step) → 45–56 grants, gap 2.0–2.2s; go-redis
// not retrying refused dials → 23–46 grants, gap 2.0–2.6s. The gaps match
// the 2s clients' TTL: a failed lower attempt counted the refused master
// as "may have granted" and so never acknowledged a thief's notice about
// its leftover keys, which the thief waited out (their PTTL, up to 2s).
// With refused calls counted as never sent (3 runs): 194–209 grants, gap
// 27–29ms, against 196–199 and 19–24ms all up. A single stall of about
// the 2s TTL still comes now and then, all up as well as with a master
// refusing (a CI run: 2.031s all up, 2.029s refusing, 153 and 92
// grants): the test fails on more than one stall of 1s or more, or on a
// third of the grants, which the bug gave (several 2s stalls in 8s).
func TestAttackRefusingMinorityStallsMixedContention(t *testing.T) {
	cfg := []atkMixed{
		{300 * time.Millisecond, 0.01, 2}, {300 * time.Millisecond, 0.1, 1},
		{2 * time.Second, 0.1, 0}, {600 * time.Millisecond, 0.1, 0}, {2 * time.Second, 0.01, 0},
	}
	const d = 8 * time.Second
	servers := testenv.StartRedis(t, 5)
	addrs := addrsOf(servers)
	g0, q0, gap0, st0 := runMixedContention(t, addrs, cfg, d)
	t.Logf("5 masters up: %d grants, %d QuorumErrors, longest time without a holder %v, %d stall(s) of %v or more", g0, q0, gap0.Round(time.Millisecond), st0, stall)
	addrs1 := append(addrs[:4:4], deadAddr(t))
	g1, q1, gap1, st1 := runMixedContention(t, addrs1, cfg, d)
	t.Logf("1 of 5 refusing: %d grants, %d QuorumErrors, longest time without a holder %v, %d stall(s) of %v or more", g1, q1, gap1.Round(time.Millisecond), st1, stall)
	eq := append([]atkMixed(nil), cfg...)
	for i := range eq {
		eq[i].prio = 0
	}
	g2, q2, gap2, _ := runMixedContention(t, addrs1, eq, d)
	t.Logf("1 of 5 refusing, all priority 0 (diagnostic): %d grants, %d QuorumErrors, longest time without a holder %v", g2, q2, gap2.Round(time.Millisecond))
	g3, q3, gap3, _ := runMixedContention(t, addrs1, cfg, d, "long Locks")
	t.Logf("1 of 5 refusing, only Locks with 10s contexts (diagnostic): %d grants, %d QuorumErrors, longest time without a holder %v", g3, q3, gap3.Round(time.Millisecond))
	g4, q4, gap4, _ := runMixedContention(t, addrs1, cfg, d, "fast refusal")
	t.Logf("1 of 5 refusing, clients that fail a refused dial at once (diagnostic): %d grants, %d QuorumErrors, longest time without a holder %v", g4, q4, gap4.Round(time.Millisecond))
	if q1 > 0 {
		t.Errorf("%d QuorumErrors with 4 of 5 masters up", q1)
	}
	if g1*3 < g0 || st1 > 1 {
		t.Errorf("one refusing master of 5 cut the hand-offs from %d to %d in %v; %d stall(s) of %v or more, longest time without a holder %v (%v with all up)",
			g0, g1, d, st1, stall, gap1.Round(time.Millisecond), gap0.Round(time.Millisecond))
	}
}

// TestAttackFailedAttemptWithRefusingMasterDoesNotStallThief: as
// TestFailedAttemptDoesNotStallThief, with 5 masters of which one refuses
// connections. A low-priority attempt (priority 1, TTL 3s) fails (the name
// is held at priority 5 on masters 0, 1 and 3); it got master 2's free key
// and cleans it up slowly. Masters 0 and 1 are then freed; a priority-2
// Lock needs master 2 for its quorum and displaces the leftover key. The
// docs: an attempt that never held the name "acknowledges a notice about
// its leftover keys at once, so a higher priority does not wait for it";
// promises.md: "a minority down changes nothing".
func TestAttackFailedAttemptWithRefusingMasterDoesNotStallThief(t *testing.T) {
	servers := testenv.StartRedis(t, 4)
	addrs := append(addrsOf(servers), deadAddr(t))
	ctx := ctxFor(t, 15*time.Second)
	delay := &releaseDelay{delay: 2 * time.Second, seen: make(chan struct{})}
	var rcs []*redis.Client
	var ms []redis.UniversalClient
	for i, a := range addrs {
		rc := newRedis(a)
		if i == 2 {
			rc.AddHook(delay)
		}
		rcs = append(rcs, rc)
		ms = append(ms, rc)
	}
	lowC, err := redlockprio.New(ms, redlockprio.WithPriority(1),
		redlockprio.WithTTL(3*time.Second), redlockprio.WithRenewInterval(900*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	low := lowC.Locker()
	t.Cleanup(func() {
		_ = lowC.Close(context.Background())
		for _, rc := range rcs {
			_ = rc.Close()
		}
	})
	high := mustClient(t, addrs, redlockprio.WithPriority(2))
	warm(t, high.l)
	name := uniqueName(t)
	for _, i := range []int{0, 1, 3} {
		plant(t, addrs[i], name, 1, "other", 5)
	}
	tried := make(chan error, 1)
	go func() {
		l, err := low.TryLock(ctx, name)
		if err == nil {
			_ = l.Release(ctx)
		}
		tried <- err
	}()
	select { // the attempt may return before master 2 answers: its cleanup comes then
	case <-delay.seen:
	case <-ctx.Done():
		t.Fatal("the low attempt never cleaned up")
	}
	if got := holderOf(t, addrs[2], name); !strings.HasPrefix(got, lowC.ID()+":") {
		t.Fatalf("master 2's key is %q's, want the failed attempt's", got)
	}
	unplant(t, addrs[0], name, 1)
	unplant(t, addrs[1], name, 1)
	start := time.Now()
	lease, err := high.l.Lock(ctx, name)
	took := time.Since(start)
	if err != nil {
		t.Fatal(err)
	}
	defer lease.Release(ctx)
	t.Logf("the higher priority got the name in %v; the low attempt: %v", took.Round(time.Millisecond), <-tried)
	if took > time.Second {
		t.Errorf("the higher priority waited %v for an attempt that never held the name (its TTL 3s), with 1 of 5 masters refusing",
			took.Round(time.Millisecond))
	}
}
