package contracttest

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/latchkey-go/latchkey/locks"
)

// testCrashLiveness: after the holder is killed, another client gets the
// name within the stated CrashRecovery bound.
func testCrashLiveness(t testing.TB, nh NewHarness) {
	e := newEnv(t, nh)
	defer e.close()
	name := e.name()
	holder, hl := e.newClientWithLocker()
	held := e.mustTryLock(hl, name)
	b := e.newClientLocker()
	start := time.Now()
	if err := e.h.Kill(e.ctx, holder); err != nil {
		t.Fatalf("Kill: %v", err)
	}
	limit := bound(e.caps.CrashRecovery)
	ctx, cancel := context.WithTimeout(e.ctx, limit)
	defer cancel()
	lease, err := b.Lock(ctx, name)
	took := time.Since(start)
	if err != nil {
		t.Fatalf("after Kill(holder), Lock(%q) failed after %v (stated bound %v): %v", name, took.Round(time.Millisecond), e.caps.CrashRecovery, err)
	}
	t.Logf("a killed holder's lock came back after %v (stated bound %v)", took.Round(time.Millisecond), e.caps.CrashRecovery)
	e.expectTokenAbove(lease, held, "the successor", "the killed holder")
	e.mustRelease(lease)
}

// testTryLockRecoversCrash: after the holder is killed, another client
// that only calls TryLock (a job that skips a run when the name is busy)
// gets the name within the stated CrashRecovery bound: a crashed holder's
// name comes back to TryLock too, not only to a Lock that waited for it.
// Each TryLock before then fails with ErrNotAcquired.
func testTryLockRecoversCrash(t testing.TB, nh NewHarness) {
	e := newEnv(t, nh)
	defer e.close()
	name := e.name()
	holder, hl := e.newClientWithLocker()
	held := e.mustTryLock(hl, name)
	b := e.newClientLocker()
	start := time.Now()
	if err := e.h.Kill(e.ctx, holder); err != nil {
		t.Fatalf("Kill: %v", err)
	}
	limit := bound(e.caps.CrashRecovery)
	pause := min(max(e.caps.CrashRecovery/20, 10*time.Millisecond), 100*time.Millisecond)
	tries := 0
	for {
		tries++
		ctx, cancel := e.opCtx()
		lease, err := b.TryLock(ctx, name)
		cancel()
		took := time.Since(start)
		if err == nil {
			t.Logf("TryLock took a killed holder's name after %v, at try %d (stated bound %v)", took.Round(time.Millisecond), tries, e.caps.CrashRecovery)
			e.expectTokenAbove(lease, held, "the successor", "the killed holder")
			e.mustRelease(lease)
			return
		}
		if !errors.Is(err, locks.ErrNotAcquired) {
			t.Fatalf("TryLock(%q) %v after Kill(holder): %v; want success or an error matching locks.ErrNotAcquired", name, took.Round(time.Millisecond), err)
		}
		if took > limit {
			t.Fatalf("TryLock(%q) still fails %v after Kill(holder), after %d tries (stated CrashRecovery %v): %v", name, took.Round(time.Millisecond), tries, e.caps.CrashRecovery, err)
		}
		time.Sleep(pause)
	}
}

// testLossOnKill: the killed client's own lease ends with ErrLost within
// LossDetection.
func testLossOnKill(t testing.TB, nh NewHarness) {
	e := newEnv(t, nh)
	defer e.close()
	holder, hl := e.newClientWithLocker()
	lease := e.mustTryLock(hl, e.name())
	if err := e.h.Kill(e.ctx, holder); err != nil {
		t.Fatalf("Kill: %v", err)
	}
	took, err := waitEnded(lease, bound(e.caps.LossDetection))
	if err != nil {
		t.Fatalf("after Kill (stated LossDetection %v): %v", e.caps.LossDetection, err)
	}
	if cause := context.Cause(lease.Context()); !errors.Is(cause, locks.ErrLost) {
		t.Fatalf("cause after Kill = %v, want an error matching locks.ErrLost", cause)
	}
	t.Logf("the killed client's lease ended after %v: %v", took.Round(time.Millisecond), context.Cause(lease.Context()))
}

// testLossOnRevoke: a lease taken away at the broker ends with ErrLost
// within LossDetection.
func testLossOnRevoke(t testing.TB, nh NewHarness) {
	e := newEnv(t, nh)
	defer e.close()
	r, ok := e.h.(Revoker)
	if !ok {
		t.Skip("the harness cannot revoke leases (not a Revoker)")
	}
	name := e.name()
	lease := e.mustTryLock(e.newClientLocker(), name)
	ctx, cancel := e.revokeCtx()
	defer cancel()
	if err := r.Revoke(ctx, name); err != nil {
		t.Fatalf("Revoke(%q): %v", name, err)
	}
	took, err := waitEnded(lease, bound(e.caps.LossDetection))
	if err != nil {
		t.Fatalf("after Revoke (stated LossDetection %v): %v", e.caps.LossDetection, err)
	}
	cause := context.Cause(lease.Context())
	if !errors.Is(cause, locks.ErrLost) {
		t.Fatalf("cause after Revoke = %v, want an error matching locks.ErrLost", cause)
	}
	t.Logf("a revoked lease ended after %v: %v", took.Round(time.Millisecond), cause)
	if err := lease.Release(ctx); !errors.Is(err, locks.ErrLost) {
		t.Errorf("Release of a lost lease = %v, want an error matching locks.ErrLost", err)
	}
}

// testPreemption: a higher priority takes the name; the victim's lease has
// ended with ErrPreempted before the thief's Lock returns; an equal
// priority never takes it.
func testPreemption(t testing.TB, nh NewHarness) {
	e := newEnv(t, nh)
	defer e.close()
	ph, ok := e.h.(PriorityHarness)
	if !ok {
		t.Skip("priorities not supported (not a PriorityHarness)")
	}
	client := func(p int) locks.Locker {
		c, err := ph.NewPriorityClient(e.ctx, p)
		if err != nil {
			t.Fatalf("NewPriorityClient(%d): %v", p, err)
		}
		e.track(c)
		return c.Locker()
	}
	name := e.name()
	low, low2, high, high2 := client(1), client(1), client(5), client(5)
	victim := e.mustTryLock(low, name)
	e.expectHeld(low2, name, "from an equal priority")

	thief := e.mustLock(high, name)
	if victim.Context().Err() == nil {
		t.Fatalf("the thief's Lock returned while the victim's lease was still live")
	}
	cause := context.Cause(victim.Context())
	if !errors.Is(cause, locks.ErrPreempted) || !errors.Is(cause, locks.ErrLost) {
		t.Errorf("victim's cause = %v, want one matching both locks.ErrPreempted and locks.ErrLost", cause)
	}
	e.expectTokenAbove(thief, victim, "the thief", "the victim")
	e.expectHeld(high2, name, "from an equal priority to the thief")
	e.expectHeld(low2, name, "from a lower priority than the thief")
	_ = victim.Release(e.ctx) // stale: must not free the thief
	e.expectHeld(low2, name, "after the victim's stale Release")
	e.mustRelease(thief)
	e.mustRelease(e.mustTryLock(low2, name))
}

// testNoLeaks: acquiring, releasing, losing and closing leave no goroutine
// behind (env.close checks, as it does for every test).
func testNoLeaks(t testing.TB, nh NewHarness) {
	e := newEnv(t, nh)
	defer e.close()
	a := e.newClientLocker()
	for range 3 {
		e.mustRelease(e.mustTryLock(a, e.name()))
	}
	_ = e.mustTryLock(a, e.name()) // left held: closing the client must end it
	victim := e.newClient()
	l := victim.Locker()
	if l == nil {
		e.skippedPart("a killed client's lease", "a second client has no Locker")
		return
	}
	_ = e.mustTryLock(l, e.name())
	if err := e.h.Kill(e.ctx, victim); err != nil {
		t.Fatalf("Kill: %v", err)
	}
}
