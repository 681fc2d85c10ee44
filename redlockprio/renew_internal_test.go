package redlockprio

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/latchkey-go/latchkey/contracttest/testenv"
	"github.com/latchkey-go/latchkey/locks"
	"github.com/latchkey-go/latchkey/locks/driver"
)

// TestRenewRoundEndsBeforeEarliestDeadline: a renewal round whose masters
// hang gives up before the earliest validity in its batch (less the drift
// allowance), even when that is closer than one renewal interval, so that
// the lease ends with ErrLost before its validity runs out rather than at
// it.
func TestRenewRoundEndsBeforeEarliestDeadline(t *testing.T) {
	servers := testenv.StartRedis(t, 1)
	rc := redis.NewClient(&redis.Options{Addr: servers[0].Addr(), ContextTimeoutEnabled: true, MaxRetries: -1})
	defer rc.Close()
	const ttl, renew = 600 * time.Millisecond, 190 * time.Millisecond
	l, err := New([]redis.UniversalClient{rc}, WithTTL(ttl), WithRenewInterval(renew))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	if err := rc.Ping(context.Background()).Err(); err != nil {
		t.Fatal(err)
	}
	if err := servers[0].Pause(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = servers[0].Resume() }()

	// A lease whose validity ends within one renewal interval: one whose
	// acquisition was slow, say.
	deadline := time.Now().Add(renew / 2)
	e := &Lease{l: l, name: "n", id: "id", key: l.key("n", 1), fence: l.fenceKey("n"), settled: make(chan struct{})}
	e.base = driver.NewLease(context.Background(), driver.Spec{Name: "n", Deadline: deadline})
	l.renewBatch([]*Lease{e}, []uint64{1})
	returned := time.Now()

	if !returned.Before(deadline) {
		t.Errorf("the renewal round returned %v after the lease's validity ended", returned.Sub(deadline))
	}
	select {
	case <-e.base.Context().Done():
	default:
		t.Fatalf("the lease is live after a renewal round that reached no master, %v before its deadline", time.Until(deadline))
	}
	cause := context.Cause(e.base.Context())
	if !errors.Is(cause, locks.ErrLost) {
		t.Errorf("cause = %v, want ErrLost", cause)
	}
	var qe *QuorumError
	if !errors.As(cause, &qe) {
		t.Errorf("cause = %v: the lease ran into its deadline, not ended by the failed renewal", cause)
	}
}

// renewLoops counts the goroutines running a Locker's renewal loop, found
// by function name in every goroutine's stack (as goleak does). A frame,
// not a "created by" line: a goroutine the loop started is not the loop.
func renewLoops() int {
	buf := make([]byte, 1<<16)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			buf = buf[:n]
			break
		}
		buf = make([]byte, 2*len(buf))
	}
	count := 0
	for g := range strings.SplitSeq(string(buf), "\n\n") {
		for line := range strings.SplitSeq(g, "\n") {
			if !strings.HasPrefix(line, "created by ") && strings.Contains(line, "redlockprio.(*Locker).renewLoop(") {
				count++
				break
			}
		}
	}
	return count
}

// TestRenewGoroutineExitsWhenNoLeaseHeld: every lease of a Locker is
// renewed from one goroutine, which exits once no lease is held — while
// the Locker stays open — and comes back for the next lease.
func TestRenewGoroutineExitsWhenNoLeaseHeld(t *testing.T) {
	servers := testenv.StartRedis(t, 3)
	var ms []redis.UniversalClient
	for _, s := range servers {
		rc := redis.NewClient(&redis.Options{Addr: s.Addr(), ContextTimeoutEnabled: true, MaxRetries: -1})
		defer rc.Close()
		ms = append(ms, rc)
	}
	const ttl, renew = 600 * time.Millisecond, 190 * time.Millisecond
	// How long the loop may take to notice, at its next tick, that no
	// lease is left: a generous scheduling margin, not a performance claim.
	const exitBound = renew + time.Second
	l, err := New(ms, WithTTL(ttl), WithRenewInterval(renew))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	// Goroutines of other tests' Lockers are not this Locker's: count from
	// what runs before it holds anything (none, as they are all closed).
	others := renewLoops()
	renewing := func() bool {
		l.mu.Lock()
		defer l.mu.Unlock()
		return l.renewing
	}
	// state checks both views: the Locker's own flag and the goroutines.
	state := func(want bool) (ok bool, got string) {
		r, n := renewing(), renewLoops()-others
		ok = r == want && (want && n == 1 || !want && n == 0)
		return ok, fmt.Sprintf("renewing %v, %d renewal goroutines", r, n)
	}
	waitState := func(want bool, within time.Duration) time.Duration {
		t.Helper()
		start := time.Now()
		for {
			ok, got := state(want)
			if ok {
				return time.Since(start)
			}
			if time.Since(start) > within {
				t.Fatalf("%v after the change: %s, want %s", within, got, map[bool]string{true: "one", false: "none"}[want])
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	// renewed waits until lease's deadline moves: the loop renews it.
	renewed := func(lease *Lease) {
		t.Helper()
		first := lease.Deadline()
		for start := time.Now(); !lease.Deadline().After(first); time.Sleep(5 * time.Millisecond) {
			if time.Since(start) > 3*renew {
				t.Fatalf("%q was not renewed in %v (renewal every %v)", lease.Name(), 3*renew, renew)
			}
		}
	}

	if ok, got := state(false); !ok {
		t.Fatalf("before any lease: %s, want none", got)
	}
	a, err := l.Lock(ctx, "a")
	if err != nil {
		t.Fatal(err)
	}
	b, err := l.Lock(ctx, "b")
	if err != nil {
		t.Fatal(err)
	}
	// One goroutine for both leases. (Started with the first lease, it
	// may not have run yet.)
	waitState(true, time.Second)
	renewed(a.(*Lease))
	renewed(b.(*Lease))

	if err := a.Release(ctx); err != nil {
		t.Fatal(err)
	}
	time.Sleep(2 * renew) // ticks with one lease left
	if ok, got := state(true); !ok {
		t.Fatalf("one lease left: %s, want one", got)
	}
	renewed(b.(*Lease))

	if err := b.Release(ctx); err != nil {
		t.Fatal(err)
	}
	took := waitState(false, exitBound)
	t.Logf("the renewal goroutine exited %v after the last Release (interval %v)", took.Round(time.Millisecond), renew)
	time.Sleep(2 * renew) // it does not come back by itself
	if ok, got := state(false); !ok {
		t.Fatalf("no lease held for %v: %s, want none", 2*renew, got)
	}

	// The Locker is still open: the next lease (which a closed Locker
	// refuses) brings the goroutine back, and is renewed.
	c, err := l.Lock(ctx, "a")
	if err != nil {
		t.Fatal(err)
	}
	waitState(true, time.Second)
	renewed(c.(*Lease))
	if err := c.Release(ctx); err != nil {
		t.Fatal(err)
	}
	waitState(false, exitBound)
}
