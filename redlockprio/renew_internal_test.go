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

	"github.com/latchkey-go/latchkey/locks"
	"github.com/latchkey-go/latchkey/locks/driver"
)

// TestRenewRoundEndsBeforeEarliestDeadline: a renewal round whose masters
// hang gives up before the earliest validity in its batch (less the drift
// allowance), even when that is closer than one renewal interval, so that
// the lease ends with ErrLost before its validity runs out rather than at
// it.
func TestRenewRoundEndsBeforeEarliestDeadline(t *testing.T) {
	servers := startRedis(t, 1)
	rc := redis.NewClient(&redis.Options{Addr: servers[0].Addr(), ContextTimeoutEnabled: true, MaxRetries: -1})
	defer rc.Close()
	const ttl, renew = 600 * time.Millisecond, 190 * time.Millisecond
	c, err := New([]*redis.Client{rc}, WithTTL(ttl), WithRenewInterval(renew))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close(context.Background())
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
	lease := driver.NewLease(context.Background(), driver.Spec{Name: "n", Token: 1, Deadline: deadline})
	cl := &claim{c: c, name: "n", id: "id", key: c.key("n", 1), fence: c.fenceKey("n"), ackable: make(chan struct{}), lease: lease}
	c.mu.Lock()
	c.byLease[lease] = cl
	c.mu.Unlock()
	// The registry's round context ends at the earliest deadline.
	round, cancel := context.WithDeadline(context.Background(), deadline)
	defer cancel()
	answers := c.renew(round, []*driver.Lease{lease})
	returned := time.Now()

	if !returned.Before(deadline) {
		t.Errorf("the renewal round returned %v after the lease's validity ended", returned.Sub(deadline))
	}
	if len(answers) != 1 {
		t.Fatalf("the renewal round gave %d answers for a batch of 1", len(answers))
	}
	cause := answers[0].Err
	if !errors.Is(cause, locks.ErrLost) {
		t.Fatalf("the renewal round that reached no master, %v before the lease's deadline, does not end it: answer %+v, want ErrLost", time.Until(deadline), answers[0])
	}
	var qe *QuorumError
	if !errors.As(cause, &qe) {
		t.Errorf("cause = %v: not the failed renewal's", cause)
	}
}

// renewLoops counts the goroutines running a Client's renewal loop (its
// registry's), found
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
			if !strings.HasPrefix(line, "created by ") && strings.Contains(line, "driver.(*Registry).renewLoop(") {
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
	servers := startRedis(t, 3)
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
	c, err := New(ms, WithTTL(ttl), WithRenewInterval(renew))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close(context.Background())
	l := c.Locker()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	// Goroutines of other tests' Lockers are not this Locker's: count from
	// what runs before it holds anything (none, as they are all closed).
	others := renewLoops()
	// state counts the renewal goroutines.
	state := func(want bool) (ok bool, got string) {
		n := renewLoops() - others
		ok = want && n == 1 || !want && n == 0
		return ok, fmt.Sprintf("%d renewal goroutines", n)
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

	// The Client is still open: the next lease (which a closed Client
	// refuses) brings the goroutine back, and is renewed.
	d, err := l.Lock(ctx, "a")
	if err != nil {
		t.Fatal(err)
	}
	waitState(true, time.Second)
	renewed(d.(*Lease))
	if err := d.Release(ctx); err != nil {
		t.Fatal(err)
	}
	waitState(false, exitBound)
}
