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

	"github.com/latchkey-go/latchkey/contracttest"
	"github.com/latchkey-go/latchkey/contracttest/testenv"
	"github.com/latchkey-go/latchkey/locks"
	"github.com/latchkey-go/latchkey/redlockprio"
)

func TestKilledMinorityChangesNothing(t *testing.T) {
	servers := testenv.StartRedis(t, 3)
	addrs := addrsOf(servers)
	a, b := mustClient(t, addrs), mustClient(t, addrs)
	name := uniqueName(t)
	ctx := ctxFor(t, 10*time.Second)
	first, err := a.l.TryLock(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	if err := servers[0].Kill(); err != nil {
		t.Fatal(err)
	}
	if _, err := b.l.TryLock(ctx, name); !errors.Is(err, locks.ErrNotAcquired) {
		t.Fatalf("TryLock of a held name with one master down = %v, want ErrNotAcquired", err)
	}
	time.Sleep(2 * testTTL) // several renewals with one master down
	if err := context.Cause(first.Context()); err != nil {
		t.Fatalf("the lease ended with one of three masters down: %v", err)
	}
	if err := first.Release(ctx); err != nil {
		t.Fatalf("Release with one master down: %v", err)
	}
	second, err := b.l.Lock(ctx, name)
	if err != nil {
		t.Fatalf("Lock with one master down: %v", err)
	}
	if second.Token() <= first.Token() {
		t.Errorf("token %d after %d", second.Token(), first.Token())
	}
	_ = second.Release(ctx)
}

func TestKilledMajorityFailsWithQuorumError(t *testing.T) {
	servers := testenv.StartRedis(t, 3)
	addrs := addrsOf(servers)
	c := mustClient(t, addrs)
	name := uniqueName(t)
	for _, s := range servers[:2] {
		if err := s.Kill(); err != nil {
			t.Fatal(err)
		}
	}
	ctx := ctxFor(t, 10*time.Second)
	for _, call := range []struct {
		what string
		f    func(context.Context, string) (locks.Lease, error)
	}{{"TryLock", c.l.TryLock}, {"Lock", c.l.Lock}} {
		lease, err := call.f(ctx, name)
		if err == nil {
			_ = lease.Release(ctx)
			t.Fatalf("%s granted with two of three masters dead", call.what)
		}
		var qe *redlockprio.QuorumError
		if !errors.As(err, &qe) {
			t.Fatalf("%s = %v, want a *QuorumError", call.what, err)
		}
		if qe.Got != 1 || qe.Need != 2 || len(qe.Errs) != 2 {
			t.Errorf("%s: QuorumError{Got: %d, Need: %d, %d errors}, want 1, 2, 2: %v", call.what, qe.Got, qe.Need, len(qe.Errs), qe)
		}
		if errors.Is(err, locks.ErrNotAcquired) {
			t.Errorf("%s: a quorum failure must not read as 'held': %v", call.what, err)
		}
	}
	if keyExists(t, addrs[2], "latchkey:{"+name+"}:1") {
		t.Errorf("the failed attempts left their key on the surviving master")
	}
}

func TestPausedMajorityEndsLeaseBeforeDeadline(t *testing.T) {
	servers := testenv.StartRedis(t, 3)
	c := mustClient(t, addrsOf(servers))
	ctx := ctxFor(t, 10*time.Second)
	lease, err := c.l.TryLock(ctx, uniqueName(t))
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range servers[:2] {
		if err := s.Pause(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = s.Resume() })
	}
	// No renewal can complete from now on: this is the last deadline the
	// lease could prove.
	deadline := lease.(*redlockprio.Lease).Deadline()
	select {
	case <-lease.Context().Done():
	case <-time.After(3 * testTTL):
		t.Fatalf("the lease is still live %v after a majority was paused", 3*testTTL)
	}
	ended := time.Now()
	if cause := context.Cause(lease.Context()); !errors.Is(cause, locks.ErrLost) {
		t.Errorf("cause = %v, want ErrLost", cause)
	}
	if !ended.Before(deadline) {
		t.Errorf("the lease ended at %v, not before its validity deadline %v", ended.Format("15:04:05.000"), deadline.Format("15:04:05.000"))
	}
	t.Logf("lease ended %v before its deadline: %v", deadline.Sub(ended).Round(time.Millisecond), context.Cause(lease.Context()))
	for _, s := range servers[:2] {
		_ = s.Resume()
	}
}

func TestTokensMonotonicAcrossRestartedMaster(t *testing.T) {
	servers := testenv.StartRedis(t, 3)
	addrs := addrsOf(servers)
	name := uniqueName(t)
	ctx := ctxFor(t, 20*time.Second)
	var last uint64
	for i := range 6 {
		c := mustClient(t, addrs)
		lease, err := c.l.Lock(ctx, name)
		if err != nil {
			t.Fatalf("round %d: %v", i, err)
		}
		if lease.Token() <= last {
			t.Fatalf("round %d: token %d after %d", i, lease.Token(), last)
		}
		last = lease.Token()
		if i%2 == 0 {
			_ = lease.Release(ctx)
		} else {
			// Crash instead, after the token has spread (see the package
			// doc for the window before that): the holder neither renews
			// nor releases.
			time.Sleep(testRenew + 50*time.Millisecond)
			for _, rc := range c.rcs {
				_ = rc.Close()
			}
		}
		// One master (a minority) loses everything.
		if err := servers[i%3].Restart(); err != nil {
			t.Fatal(err)
		}
	}
}

// TestMajorityRestartedEmptyAllowsDoubleGrant shows the documented limit:
// when a majority of the masters restart empty inside the TTL, a second
// holder gets the name while the first still holds it. The mitigation —
// keeping a crashed master down for a TTL before it rejoins — prevents it.
func TestMajorityRestartedEmptyAllowsDoubleGrant(t *testing.T) {
	servers := testenv.StartRedis(t, 3)
	addrs := addrsOf(servers)
	a, b := mustClient(t, addrs), mustClient(t, addrs)
	ctx := ctxFor(t, 20*time.Second)

	t.Run("immediate restart", func(t *testing.T) {
		// The first holder renews every 3.3s: its renewal, which finds the
		// restarted majority empty and ends its lease, comes after the
		// restarts and the second TryLock however slow the machine (a CI
		// run: with the tests' 600ms TTL, it came first).
		long := mustClient(t, addrs, withTiming(10*time.Second, 0.01))
		name := uniqueName(t)
		first, err := long.l.TryLock(ctx, name)
		if err != nil {
			t.Fatal(err)
		}
		defer first.Release(ctx)
		for _, s := range servers[:2] {
			if err := s.Restart(); err != nil {
				t.Fatal(err)
			}
		}
		// A restarted master's first call may go out on a connection the
		// restart broke and miss the grace (its answer then counts as
		// unknown, and the one master still holding the key refuses):
		// try again while the first lease lives.
		var second locks.Lease
		deadline := time.Now().Add(2 * time.Second)
		for second == nil {
			l, err := b.l.TryLock(ctx, name)
			switch {
			case err == nil:
				second = l
			case time.Now().After(deadline):
				t.Fatalf("expected the documented double grant within 2s of the restarts, got %v", err)
			default:
				time.Sleep(20 * time.Millisecond)
			}
		}
		defer second.Release(ctx)
		if first.Context().Err() != nil {
			t.Fatalf("the first lease ended before the second was granted: the limit did not show")
		}
		t.Logf("double grant: tokens %d and %d both live", first.Token(), second.Token())
	})

	t.Run("delayed restart", func(t *testing.T) {
		name := uniqueName(t)
		first, err := a.l.TryLock(ctx, name)
		if err != nil {
			t.Fatal(err)
		}
		defer first.Release(ctx)
		for _, s := range servers[:2] {
			if err := s.Kill(); err != nil {
				t.Fatal(err)
			}
		}
		time.Sleep(testTTL) // the mitigation: stay down for a TTL
		for _, s := range servers[:2] {
			if err := s.Restart(); err != nil {
				t.Fatal(err)
			}
		}
		if first.Context().Err() == nil {
			t.Fatalf("the first lease is still live a TTL after a majority went down")
		}
		second, err := b.l.Lock(ctx, name)
		if err != nil {
			t.Fatal(err)
		}
		_ = second.Release(ctx)
	})
}

// TestRefusingMinorityIsContention: with a minority of the masters
// refusing connections (1 of 3, 2 of 5), a name held elsewhere is
// contention, not a quorum failure: every TryLock fails with a
// *locks.HeldError naming the holder, a Lock waits until its context
// ends, and gets the name once it is released. The contender's clients
// do not retry a refused dial, so the refusals come first. (2 of 20 and
// 13 of 20 TryLocks failed with a *QuorumError, and Lock failed after
// 1ms.)
func TestRefusingMinorityIsContention(t *testing.T) {
	for _, c := range []struct{ n, dead int }{{3, 1}, {5, 2}} {
		t.Run(fmt.Sprintf("%d of %d masters refusing", c.dead, c.n), func(t *testing.T) {
			servers := testenv.StartRedis(t, c.n)
			addrs := addrsOf(servers)
			a := mustClient(t, addrs)
			// b's clients fail a refused dial at once (no dial retries),
			// so that the refusals come before the live masters' answers.
			b := mustClient(t, addrs, dialOnce())
			warm(t, b.l)
			name := uniqueName(t)
			ctx := ctxFor(t, 15*time.Second)
			held, err := a.l.TryLock(ctx, name)
			if err != nil {
				t.Fatal(err)
			}
			for _, s := range servers[:c.dead] {
				if err := s.Kill(); err != nil {
					t.Fatal(err)
				}
			}
			quorumErrs := 0
			for i := range 20 {
				l, err := b.l.TryLock(ctx, name)
				if err == nil {
					_ = l.Release(ctx)
					t.Fatalf("TryLock #%d granted a held name", i)
				}
				var he *locks.HeldError
				var qe *redlockprio.QuorumError
				switch {
				case errors.As(err, &qe):
					quorumErrs++
				case !errors.As(err, &he):
					t.Errorf("TryLock #%d = %v, want a *locks.HeldError", i, err)
				case he.Holder != held.(*redlockprio.Lease).HolderID():
					t.Errorf("TryLock #%d: holder %q, want %q", i, he.Holder, held.(*redlockprio.Lease).HolderID())
				}
			}
			if quorumErrs > 0 {
				t.Errorf("%d of 20 TryLocks of a held name failed with a *QuorumError with a quorum of masters up", quorumErrs)
			}
			short, cancel := context.WithTimeout(ctx, time.Second)
			start := time.Now()
			l, err := b.l.Lock(short, name)
			cancel()
			if err == nil {
				_ = l.Release(ctx)
				t.Fatal("Lock granted a held name")
			}
			if !errors.Is(err, context.DeadlineExceeded) {
				t.Errorf("Lock of a held name with 1s = %v after %v, want it to wait for its context", err, time.Since(start).Round(time.Millisecond))
			}
			if err := context.Cause(held.Context()); err != nil {
				t.Fatalf("the holder's lease ended: %v", err)
			}
			go func() {
				time.Sleep(200 * time.Millisecond)
				_ = held.Release(ctx)
			}()
			l, err = b.l.Lock(ctx, name)
			if err != nil {
				t.Fatalf("Lock after the release: %v", err)
			}
			if l.Token() <= held.Token() {
				t.Errorf("token %d after %d", l.Token(), held.Token())
			}
			_ = l.Release(ctx)
		})
	}
}

// TestPausedMinorityUnderContention: with one master of three paused
// (SIGSTOP), three clients pass one name back and forth for 3s. A step
// must be decided once a quorum has answered either way, or at the
// per-master call timeout, never at TTL/2: the name is never left
// without a holder for long. (With a 2s TTL, gaps of a second — TTL/2,
// the deadline of an undecided step — were common; later, about 1 run in
// 12, a waiter's refresh after two waiters that each found themselves
// the head split the two live masters and both failed: the deletion of a
// failed attempt's key did not wake the head.)
func TestPausedMinorityUnderContention(t *testing.T) {
	servers := testenv.StartRedis(t, 3)
	addrs := addrsOf(servers)
	opts := []redlockprio.Option{redlockprio.WithTTL(2 * time.Second), redlockprio.WithRenewInterval(600 * time.Millisecond)}
	var cs []*client
	for range 3 {
		c := mustClient(t, addrs, with(opts...))
		warm(t, c.l)
		cs = append(cs, c)
	}
	if err := servers[2].Pause(); err != nil {
		t.Fatal(err)
	}
	defer servers[2].Resume()
	name := uniqueName(t)
	ctx := ctxFor(t, 20*time.Second)
	run, stop := context.WithTimeout(ctx, 3*time.Second)
	defer stop()
	// A gap without a holder is a release and the next holder's attempt,
	// each decided within the call timeout (TTL/10 = 200ms) once the
	// paused master's answer is not waited for, and the wake-up between
	// them: three call timeouts, plus slack measured now and while the
	// clients run.
	rc := newRedis(addrs[0])
	bound := contracttest.MeasureBound(t, 3*200*time.Millisecond, func() error { return rc.Ping(ctx).Err() })
	_ = rc.Close()
	stopWatch := bound.Watch()
	h := contracttest.NewHistory(1)
	var (
		mu   sync.Mutex
		errs []error
	)
	var wg sync.WaitGroup
	for _, c := range cs {
		wg.Go(func() {
			for run.Err() == nil {
				l, err := c.l.Lock(run, name)
				if err != nil {
					if run.Err() == nil {
						mu.Lock()
						errs = append(errs, err)
						mu.Unlock()
					}
					return
				}
				exit := h.Enter("", l.Token())
				time.Sleep(2 * time.Millisecond)
				exit()
				_ = l.Release(ctx)
			}
		})
	}
	wg.Wait()
	stopWatch()
	for _, err := range errs {
		t.Errorf("Lock with one master of three paused: %v", err)
	}
	sections := h.Spans()
	sort.Slice(sections, func(i, j int) bool { return sections[i].Enter < sections[j].Enter })
	var longest time.Duration
	for i := 1; i < len(sections); i++ {
		longest = max(longest, sections[i].Enter-sections[i-1].Exit)
	}
	t.Logf("%d hand-offs in 3s with one master of three paused; longest without a holder: %v", len(sections), longest.Round(time.Millisecond))
	if len(sections) < 10 {
		t.Errorf("only %d critical sections in 3s", len(sections))
	}
	bound.Check(t, "the longest time without a holder", longest)
}

// TestSameServerTwiceRefused: two clients of the same Redis server, by
// the same address twice or by two names of one host, are one master, not
// two: with the third master dead, that one server would make a quorum.
// The Locker refuses them on first contact with an error matching
// locks.ErrInvalidOption that names both masters. (A lease was granted.)
func TestSameServerTwiceRefused(t *testing.T) {
	servers := testenv.StartRedis(t, 2)
	a, other := servers[0].Addr(), servers[1].Addr()
	_, port, _ := strings.Cut(a, ":")
	for _, c := range []struct {
		what  string
		addrs []string
	}{
		{"same address twice", []string{a, a, other}},
		{"127.0.0.1 and localhost", []string{a, "localhost:" + port, other}},
	} {
		t.Run(c.what, func(t *testing.T) {
			for _, dead := range []bool{false, true} {
				if dead {
					// A dead third master: the same server twice would
					// make the quorum on its own.
					c.addrs = []string{c.addrs[0], c.addrs[1], deadAddr(t)}
				}
				cl := mustClient(t, c.addrs)
				ctx := ctxFor(t, 10*time.Second)
				l, err := cl.l.Lock(ctx, uniqueName(t))
				if err == nil {
					_ = l.Release(ctx)
					t.Fatalf("a lease was granted with masters 0 and 1 the same server (third master dead: %v)", dead)
				}
				if !errors.Is(err, locks.ErrInvalidOption) || !strings.Contains(err.Error(), "same") {
					t.Errorf("Lock = %v, want an error matching ErrInvalidOption saying they are the same server", err)
				}
				t.Logf("third master dead %v: %v", dead, err)
			}
		})
	}
}

// TestDeadAndHungMastersCountAsFailed: 5 masters, a name held by A. With
// 1 refusing and 1 paused (SIGSTOP) master, 3 answer "held": TryLock must
// say *locks.HeldError within about one call timeout (200ms at TTL 600ms),
// and a 1s Lock must wait for its context. With 2 refusing and 1 paused,
// only 2 can answer: TryLock and Lock must fail with a *QuorumError, also
// within about one call timeout ("more than N − quorum failed", "a master
// that has not answered within the per-master call timeout counts as
// failed").
func TestDeadAndHungMastersCountAsFailed(t *testing.T) {
	for _, c := range []struct{ refusing, paused int }{{1, 1}, {2, 1}} {
		quorumLost := c.refusing+c.paused > 2
		t.Run(map[bool]string{false: "1 refusing 1 paused", true: "2 refusing 1 paused"}[quorumLost], func(t *testing.T) {
			servers := testenv.StartRedis(t, 5)
			addrs := addrsOf(servers)
			a, b := mustClient(t, addrs), mustClient(t, addrs)
			warm(t, b.l)
			name := uniqueName(t)
			ctx := ctxFor(t, 20*time.Second)
			held, err := a.l.TryLock(ctx, name)
			if err != nil {
				t.Fatal(err)
			}
			defer held.Release(context.Background())
			for _, s := range servers[:c.refusing] {
				if err := s.Kill(); err != nil {
					t.Fatal(err)
				}
			}
			for _, s := range servers[c.refusing : c.refusing+c.paused] {
				if err := s.Pause(); err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { _ = s.Resume() })
			}
			const callTimeout = 200 * time.Millisecond
			var worst time.Duration
			counts := map[string]int{}
			for i := range 10 {
				start := time.Now()
				l, err := b.l.TryLock(ctx, name)
				took := time.Since(start)
				worst = max(worst, took)
				if err == nil {
					_ = l.Release(ctx)
					t.Fatalf("TryLock #%d granted a held name", i)
				}
				var he *locks.HeldError
				var qe *redlockprio.QuorumError
				switch {
				case errors.As(err, &qe):
					counts["QuorumError"]++
				case errors.As(err, &he):
					counts["HeldError"]++
				default:
					counts[err.Error()]++
				}
			}
			t.Logf("10 TryLocks: %v, slowest %v", counts, worst.Round(time.Millisecond))
			want := "HeldError"
			if quorumLost {
				want = "QuorumError"
			}
			if counts[want] != 10 {
				t.Errorf("TryLocks gave %v, want 10 %s", counts, want)
			}
			if worst > callTimeout+300*time.Millisecond {
				t.Errorf("a TryLock took %v with a hung minority, call timeout %v", worst, callTimeout)
			}
			short, cancel := context.WithTimeout(ctx, time.Second)
			start := time.Now()
			l, err := b.l.Lock(short, name)
			took := time.Since(start)
			cancel()
			if err == nil {
				_ = l.Release(ctx)
				t.Fatal("Lock granted a held name")
			}
			var qe *redlockprio.QuorumError
			t.Logf("Lock with 1s: %v after %v", err, took.Round(time.Millisecond))
			if quorumLost {
				if !errors.As(err, &qe) || took > callTimeout+300*time.Millisecond {
					t.Errorf("Lock with fewer than a quorum up = %v after %v, want a *QuorumError at once", err, took)
				}
			} else if !errors.Is(err, context.DeadlineExceeded) {
				t.Errorf("Lock of a held name with a dead and a hung master = %v after %v, want it to wait", err, took)
			}
		})
	}
}

// TestHeldErrorRetryAfterIsHoldersTTL: the docs say TryLock's HeldError has
// "RetryAfter [...] the holder's remaining TTL". Checked for a plain
// holder (TTL 2s) and for leftover keys of split thieves that carry a 3s
// victim's PTTL.
func TestHeldErrorRetryAfterIsHoldersTTL(t *testing.T) {
	addrs := addrsOf(testenv.StartRedis(t, 3))
	a := mustClient(t, addrs, withTiming(2*time.Second, 0.01))
	b := mustClient(t, addrs)
	warm(t, b.l)
	name := uniqueName(t)
	ctx := ctxFor(t, 10*time.Second)
	held, err := a.l.TryLock(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	defer held.Release(ctx)
	_, err = b.l.TryLock(ctx, name)
	var he *locks.HeldError
	if !errors.As(err, &he) {
		t.Fatalf("TryLock = %v, want a HeldError", err)
	}
	pttl := maxPTTL(t, addrs, name)
	t.Logf("RetryAfter %v, holder's key PTTL %v", he.RetryAfter, pttl)
	if he.RetryAfter < pttl/2 {
		t.Errorf("RetryAfter %v, holder's remaining TTL %v", he.RetryAfter, pttl)
	}
}

// TestSameServerBehindProxyRefused: one server reached by two addresses
// (directly and through a TCP proxy, as through a load balancer or an SSH
// tunnel) is one master: "Two masters that are one server [...] are found
// on first contact". Also when the second address is unreachable at first
// (its answers must not count until it is verified) and comes back later,
// with the third master dead: one server must never make the quorum.
func TestSameServerBehindProxyRefused(t *testing.T) {
	for _, how := range []string{"both reachable", "alias reachable later, third dead"} {
		t.Run(how, func(t *testing.T) {
			servers := testenv.StartRedis(t, 2)
			px := testenv.NewProxy(t, servers[0].Addr())
			third := servers[1].Addr()
			if how != "both reachable" {
				px.Cut()
			}
			var rcs []*redis.Client
			var ms []redis.UniversalClient
			for _, a := range []string{servers[0].Addr(), px.Addr(), third} {
				rc := newRedis(a)
				rcs = append(rcs, rc)
				ms = append(ms, rc)
			}
			lc, err := redlockprio.New(ms, redlockprio.WithTTL(testTTL), redlockprio.WithRenewInterval(testRenew))
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
			ctx := ctxFor(t, 10*time.Second)
			name := uniqueName(t)
			if how != "both reachable" {
				// First contact with masters 0 and 2 only: a real quorum.
				lease, err := l.TryLock(ctx, name)
				t.Logf("with the alias cut: %v", err)
				if err == nil {
					_ = lease.Release(ctx)
				}
				servers[1].Stop()
				px.Restore()
			}
			var granted int
			for i := range 5 {
				lease, err := l.TryLock(ctx, name)
				if err == nil {
					granted++
					t.Errorf("TryLock #%d granted with %s: one server counted twice", i, how)
					_ = lease.Release(context.Background())
					continue
				}
				if i == 0 {
					t.Logf("TryLock: %v (ErrInvalidOption: %v)", err, errors.Is(err, locks.ErrInvalidOption))
				}
				if how == "both reachable" && !errors.Is(err, locks.ErrInvalidOption) {
					t.Errorf("TryLock #%d = %v, want ErrInvalidOption", i, err)
				}
				time.Sleep(50 * time.Millisecond)
			}
		})
	}
}

// contender is one client of runMixedContention: TTL, drift factor, priority.
type contender struct {
	ttl   time.Duration
	drift float64
	prio  int
}

// runMixedContention runs the clients on one name for d: each loops Lock
// (context 0.2–2s) or, 3 times in 10, TryLock; holds 5–155ms; releases;
// pauses 0–20ms. It returns the grants, QuorumErrors, the longest time
// without a holder, and how many times the name had no holder for a
// stall or longer.
func runMixedContention(t *testing.T, addrs []string, cfg []contender, d time.Duration, variant ...string) (grants, quorumErrs int, gap time.Duration, stalls int) {
	has := func(v string) bool {
		for _, x := range variant {
			if x == v {
				return true
			}
		}
		return false
	}
	name := uniqueName(t)
	hist := contracttest.NewWriteHistory()
	var mu sync.Mutex
	var spans [][2]time.Duration
	var wg sync.WaitGroup
	end := time.Now().Add(d)
	for i, c := range cfg {
		opts := []clientOption{withTiming(c.ttl, c.drift), withPriority(c.prio)}
		if has("fast refusal") {
			// As TestRefusingMinorityIsContention's contender: go-redis
			// does not retry a refused dial.
			opts = append(opts, dialOnce())
		}
		cl := mustClient(t, addrs, opts...)
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
				s := hist.Begin(fmt.Sprintf("c%d", i), l)
				stop := make(chan struct{})
				time.AfterFunc(time.Duration(5+r.IntN(150))*time.Millisecond, func() { close(stop) })
				s.WriteWhileLive(stop)
				s.LetGo()
				mu.Lock()
				grants++
				x := s.Record()
				spans = append(spans, [2]time.Duration{x.Granted, x.LetGo})
				mu.Unlock()
				_ = l.Release(context.Background())
				cancel()
				time.Sleep(time.Duration(r.IntN(20)) * time.Millisecond)
			}
		})
	}
	wg.Wait()
	if err := hist.Check(); err != nil {
		t.Logf("sections:\n%v", hist)
		t.Error(err)
	}
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

// TestRefusingMinorityDoesNotStallMixedContention: five clients with
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
func TestRefusingMinorityDoesNotStallMixedContention(t *testing.T) {
	cfg := []contender{
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
	eq := append([]contender(nil), cfg...)
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

// expireEarly makes the master at addr expire key now, as a master whose
// clock jumped forward past the key's expiry would, and waits until the
// key is gone.
func expireEarly(t testing.TB, addr, key string) {
	t.Helper()
	rc := newRedis(addr)
	defer rc.Close()
	ctx := context.Background()
	ok, err := rc.PExpire(ctx, key, time.Millisecond).Result()
	if err != nil || !ok {
		t.Fatalf("PEXPIRE %s 1 on %s = %v, %v: the key should be there", key, addr, ok, err)
	}
	for deadline := time.Now().Add(time.Second); ; {
		n, err := rc.Exists(ctx, key).Result() // an access expires it lazily
		if err != nil {
			t.Fatal(err)
		}
		if n == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s still exists on %s a second after PEXPIRE 1", key, addr)
		}
		time.Sleep(time.Millisecond)
	}
}

// TestClockJumpLimit demonstrates a documented limit, not a guarantee:
// Redlock is not safe when a majority of the masters expire keys early,
// as a master whose clock jumps forward does (validity is local time, key
// expiry the masters' time). The test makes two of three masters expire
// the first lease's key at once (PEXPIRE 1, which is what a forward jump
// past the expiry amounts to) and shows that a second client then gets
// the name while the first lease is still live — two holders at once.
// It then shows the mitigation the package offers: the second holder's
// fencing token is higher, so a resource that checks tokens refuses the
// first holder's writes; and the first holder learns of the loss at its
// next renewal, before its deadline.
func TestClockJumpLimit(t *testing.T) {
	addrs := addrsOf(testenv.StartRedis(t, 3))
	// A renewal interval long enough that the first holder does not renew
	// (and so learn that its keys are gone) before the second takes the
	// name.
	const ttl, renew = 3 * time.Second, 900 * time.Millisecond
	opts := []redlockprio.Option{redlockprio.WithTTL(ttl), redlockprio.WithRenewInterval(renew)}
	a, b := mustClient(t, addrs, with(opts...)), mustClient(t, addrs, with(opts...))
	name := uniqueName(t)
	ctx := ctxFor(t, 10*time.Second)

	first, err := a.l.TryLock(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	defer first.Release(ctx)
	firstDeadline := first.(*redlockprio.Lease).Deadline()
	key := "latchkey:{" + name + "}:1"
	for _, addr := range addrs[:2] { // a majority
		expireEarly(t, addr, key)
	}
	second, err := b.l.TryLock(ctx, name)
	if err != nil {
		t.Fatalf("expected the documented double grant after a majority expired the key early, got %v", err)
	}
	granted := time.Now()
	defer second.Release(ctx)
	if err := context.Cause(first.Context()); err != nil || !granted.Before(firstDeadline) {
		t.Fatalf("the first lease was no longer live when the second was granted (cause %v, deadline in %v): the limit did not show",
			err, firstDeadline.Sub(granted))
	}
	t.Logf("double grant (the documented limit): first lease (token %d) live for %v more when the second (token %d) was granted",
		first.Token(), firstDeadline.Sub(granted).Round(time.Millisecond), second.Token())

	// The mitigation: fencing tokens. The later holder's token is higher,
	// so a fenced resource that has seen it refuses the first holder.
	if second.Token() <= first.Token() {
		t.Fatalf("the second holder's token %d is not above the first's %d: fencing cannot help", second.Token(), first.Token())
	}
	var res fencedResource
	if err := res.write(second.Token(), "second"); err != nil {
		t.Fatalf("the fenced resource refused the current holder: %v", err)
	}
	if err := res.write(first.Token(), "first"); err == nil {
		t.Errorf("the fenced resource accepted a write from the first, stale, holder")
	} else {
		t.Logf("the fenced resource refused the first holder: %v", err)
	}

	// The first holder's next renewal finds its keys gone on a quorum: its
	// lease ends with ErrLost, before its deadline.
	select {
	case <-first.Context().Done():
	case <-time.After(renew + 2*time.Second):
		t.Fatalf("the first lease is still live %v after the second grant", renew+2*time.Second)
	}
	ended := time.Now()
	if cause := context.Cause(first.Context()); !errors.Is(cause, locks.ErrLost) {
		t.Errorf("the first lease ended with %v, want ErrLost", cause)
	}
	if !ended.Before(firstDeadline) {
		t.Errorf("the first lease ended %v after its deadline, not before it", ended.Sub(firstDeadline))
	}
	t.Logf("the first lease ended %v after the second grant (%v before its deadline): %v",
		ended.Sub(granted).Round(time.Millisecond), firstDeadline.Sub(ended).Round(time.Millisecond), context.Cause(first.Context()))
	if err := context.Cause(second.Context()); err != nil {
		t.Errorf("the second lease ended: %v", err)
	}
}

// hungBound is how long a step may take with one master of three hung:
// far below the per-call timeout the tests' clients have (ReadTimeout
// 2s, and TTL/2 = 5s for the calls' contexts below). It is a generous
// scheduling margin, not a performance claim.
const hungBound = 600 * time.Millisecond

// TestHungMinorityDoesNotDelaySteps: with one master of three hung
// (SIGSTOPped, or behind a black hole), a step returns as soon as its
// outcome is decided, not when the hung master's call times out: Lock,
// Release, a Lock of the name just released (whose call to the hung
// master queues behind the release's), and a TryLock of a held name
// (decided once two masters said "held": no quorum can grant).
func TestHungMinorityDoesNotDelaySteps(t *testing.T) {
	servers := testenv.StartRedis(t, 3)
	addrs := addrsOf(servers)
	opts := []redlockprio.Option{redlockprio.WithTTL(10 * time.Second), redlockprio.WithRenewInterval(time.Second)}
	for _, fault := range []string{"SIGSTOP", "black hole"} {
		t.Run(fault, func(t *testing.T) {
			c := mustClient(t, addrs, viaProxies(), with(opts...))
			other := mustClient(t, addrs, with(opts...))
			warm(t, c.l) // the inbox is subscribed on every master
			ctx := ctxFor(t, 20*time.Second)
			held := uniqueName(t)
			holder, err := other.l.TryLock(ctx, held)
			if err != nil {
				t.Fatal(err)
			}
			defer holder.Release(ctx)

			switch fault {
			case "SIGSTOP":
				if err := servers[2].Pause(); err != nil {
					t.Fatal(err)
				}
				defer servers[2].Resume()
			default:
				c.proxies[2].BlackHole()
				defer c.proxies[2].Restore()
			}
			timed := func(what string, f func() error) {
				t.Helper()
				start := time.Now()
				err := f()
				took := time.Since(start)
				if err != nil {
					t.Fatalf("%s with a hung master: %v", what, err)
				}
				if took > hungBound {
					t.Errorf("%s took %v with one master of three hung, want at most %v", what, took.Round(time.Millisecond), hungBound)
				}
				t.Logf("%s: %v", what, took.Round(time.Millisecond))
			}
			name := uniqueName(t)
			for i := range 2 {
				var lease locks.Lease
				timed(fmt.Sprintf("Lock #%d", i+1), func() (err error) {
					lease, err = c.l.Lock(ctx, name)
					return err
				})
				timed(fmt.Sprintf("Release #%d", i+1), func() error { return lease.Release(ctx) })
			}
			timed("TryLock of a held name", func() error {
				lease, err := c.l.TryLock(ctx, held)
				if err == nil {
					_ = lease.Release(ctx)
					return errors.New("granted a held name")
				}
				if !errors.Is(err, locks.ErrNotAcquired) {
					return fmt.Errorf("got %w, want ErrNotAcquired", err)
				}
				return nil
			})

			// Once the master is back, the calls left to the background
			// have done their work there: the released name is free, the
			// held one still its holder's.
			if fault == "SIGSTOP" {
				_ = servers[2].Resume()
			} else {
				c.proxies[2].Restore()
			}
			for deadline := time.Now().Add(5 * time.Second); keyExists(t, addrs[2], "latchkey:{"+name+"}:1"); {
				if time.Now().After(deadline) {
					t.Fatalf("the released lease's key is still on the hung master 5s after it came back")
				}
				time.Sleep(10 * time.Millisecond)
			}
			if got, want := holderOf(t, addrs[2], held), holder.(*redlockprio.Lease).HolderID(); got != want {
				t.Errorf("the held name's key on the hung master is %q's, want the holder %q's", got, want)
			}
		})
	}
}

// TestFirstLockWithHungMaster: a new Locker's first Lock waits for its
// inbox to be subscribed on a quorum of masters only (a thief's notice
// goes through every master it reaches, and two quorums share one), not
// on every master: a hung minority does not delay it.
func TestFirstLockWithHungMaster(t *testing.T) {
	addrs := addrsOf(testenv.StartRedis(t, 3))
	opts := []redlockprio.Option{redlockprio.WithTTL(10 * time.Second), redlockprio.WithRenewInterval(time.Second)}
	c := mustClient(t, addrs, viaProxies(), with(opts...))
	c.proxies[2].BlackHole()
	defer c.proxies[2].Restore()
	ctx := ctxFor(t, 10*time.Second)
	start := time.Now()
	lease, err := c.l.Lock(ctx, uniqueName(t))
	took := time.Since(start)
	if err != nil {
		t.Fatal(err)
	}
	defer lease.Release(ctx)
	t.Logf("a new Locker's first Lock with one master of three hung: %v", took.Round(time.Millisecond))
	if took > hungBound {
		t.Errorf("a new Locker's first Lock took %v with one master of three hung, want at most %v (it waited for every inbox subscription)", took.Round(time.Millisecond), hungBound)
	}
}
