package redlockprio_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/latchkey-go/latchkey/contracttest/testenv"
	"github.com/latchkey-go/latchkey/locks"
	"github.com/latchkey-go/latchkey/redlockprio"
)

// TestAttackQuorumCountingDeadAndHung: 5 masters, a name held by A. With
// 1 refusing and 1 paused (SIGSTOP) master, 3 answer "held": TryLock must
// say *locks.HeldError within about one call timeout (200ms at TTL 600ms),
// and a 1s Lock must wait for its context. With 2 refusing and 1 paused,
// only 2 can answer: TryLock and Lock must fail with a *QuorumError, also
// within about one call timeout ("more than N − quorum failed", "a master
// that has not answered within the per-master call timeout counts as
// failed").
func TestAttackQuorumCountingDeadAndHung(t *testing.T) {
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

// TestAttackRetryAfterIsHoldersTTL: the docs say TryLock's HeldError has
// "RetryAfter [...] the holder's remaining TTL". Checked for a plain
// holder (TTL 2s) and for leftover keys of split thieves that carry a 3s
// victim's PTTL.
func TestAttackRetryAfterIsHoldersTTL(t *testing.T) {
	addrs := addrsOf(testenv.StartRedis(t, 3))
	a := mustClient(t, addrs, atkOpts(2*time.Second, 0.01, 0)...)
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
