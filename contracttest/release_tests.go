package contracttest

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/latchkey-go/latchkey/locks"
)

// testRelease: Release is idempotent, ends the context with ErrReleased,
// and frees the name for others.
func testRelease(t testing.TB, nh NewHarness) {
	e := newEnv(t, nh)
	defer e.close()
	name := e.name()
	a, b := e.newClientLocker(), e.newClientLocker()
	lease := e.mustTryLock(a, name)
	ctx := lease.Context()
	if err := ctx.Err(); err != nil {
		t.Fatalf("a fresh lease's context has ended: %v", context.Cause(ctx))
	}
	if !sameContext(lease.Context(), ctx) {
		t.Errorf("lease.Context() returned two different contexts for a live lease; every call must return the same")
	}
	if lease.Name() != name {
		t.Errorf("lease.Name() = %q, want %q", lease.Name(), name)
	}
	tok := lease.Token()
	var wg sync.WaitGroup
	errs := make([]error, 3)
	for i := range errs {
		wg.Go(func() { errs[i] = lease.Release(e.ctx) })
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Errorf("concurrent Release #%d: %v", i, err)
		}
	}
	if err := lease.Release(e.ctx); err != nil {
		t.Errorf("second Release: %v; want nil (Release is idempotent)", err)
	}
	if cause := context.Cause(lease.Context()); !errors.Is(cause, locks.ErrReleased) {
		t.Errorf("cause after Release = %v, want locks.ErrReleased", cause)
	}
	if lease.Token() != tok {
		t.Errorf("Token changed after Release: %d, was %d", lease.Token(), tok)
	}
	if !sameContext(lease.Context(), ctx) {
		t.Errorf("lease.Context() after Release is not the context it returned before; every call must return the same")
	}
	e.mustRelease(e.mustTryLock(b, name))
}

// testReleaseEndedContext: Release with a context that has already ended
// still ends the lease locally, with ErrReleased, and returns nil or ctx's
// error; the broker forgets the lease by itself (its TTL), so another
// client holds the name within CrashRecovery at the latest.
func testReleaseEndedContext(t testing.TB, nh NewHarness) {
	e := newEnv(t, nh)
	defer e.close()
	name := e.name()
	a, b := e.newClientLocker(), e.newClientLocker()
	lease := e.mustTryLock(a, name)

	ended, cancel := context.WithCancel(e.ctx)
	cancel()
	start := time.Now()
	done := make(chan error, 1)
	go func() { done <- lease.Release(ended) }()
	var err error
	select {
	case err = <-done:
	case <-time.After(opTimeout):
		t.Fatalf("Release with a cancelled context did not return within %v", opTimeout)
	}
	if err != nil && !errors.Is(err, context.Canceled) {
		t.Errorf("Release with a cancelled context = %v; want nil or an error matching context.Canceled", err)
	}
	if lease.Context().Err() == nil {
		t.Fatalf("the lease is still live after Release with a cancelled context returned; it must end locally")
	}
	if cause := context.Cause(lease.Context()); !errors.Is(cause, locks.ErrReleased) {
		t.Errorf("cause after Release with a cancelled context = %v, want locks.ErrReleased", cause)
	}

	limit := bound(e.caps.CrashRecovery)
	ctx, cancelLock := context.WithDeadline(e.ctx, start.Add(limit))
	defer cancelLock()
	next, lerr := b.Lock(ctx, name)
	took := time.Since(start)
	if lerr != nil {
		t.Fatalf("after Release with a cancelled context (which returned %v), Lock(%q) by another client failed after %v (stated CrashRecovery %v): %v",
			err, name, took.Round(time.Millisecond), e.caps.CrashRecovery, lerr)
	}
	t.Logf("the name came back %v after Release with a cancelled context returned %v (stated CrashRecovery %v)",
		took.Round(time.Millisecond), err, e.caps.CrashRecovery)
	e.expectTokenAbove(next, lease, "the next holder", "the released holder")
	if err2 := lease.Release(e.ctx); (err2 == nil) != (err == nil) {
		t.Errorf("second Release = %v, first = %v; want the first's result (Release is idempotent)", err2, err)
	}
	e.expectHeld(a, name, "after the first holder's second Release")
	e.mustRelease(next)
}

// testClosed: once a client is closed, its Locker's Lock and TryLock and
// its Semaphore's Acquire and TryAcquire fail with ErrClosed, also a Lock
// of a name held elsewhere, which must not wait for it.
func testClosed(t testing.TB, nh NewHarness) {
	e := newEnv(t, nh)
	defer e.close()
	c, l := e.newClientWithLocker()
	var s locks.Semaphore
	if e.caps.Semaphore {
		var err error
		if s, err = c.Semaphore(e.ctx, semSize); err != nil {
			t.Fatalf("Semaphore(%d): %v", semSize, err)
		}
	} else {
		e.skippedPart("Acquire and TryAcquire on a closed client", "the backend has no Semaphore")
	}
	busyName, free := e.name(), e.name()
	other := e.newClientLocker()
	busy := e.mustTryLock(other, busyName)

	if err := closeClient(c); err != nil {
		t.Errorf("Close: %v", err)
	}
	type call struct {
		what string
		call func(context.Context) (locks.Lease, error)
	}
	calls := []call{
		{"TryLock of a free name", func(ctx context.Context) (locks.Lease, error) { return l.TryLock(ctx, free) }},
		{"Lock of a free name", func(ctx context.Context) (locks.Lease, error) { return l.Lock(ctx, free) }},
		{"Lock of a name held by another client", func(ctx context.Context) (locks.Lease, error) { return l.Lock(ctx, busyName) }},
	}
	if s != nil {
		calls = append(calls,
			call{"Semaphore TryAcquire", func(ctx context.Context) (locks.Lease, error) { return s.TryAcquire(ctx, free) }},
			call{"Semaphore Acquire", func(ctx context.Context) (locks.Lease, error) { return s.Acquire(ctx, free) }},
		)
	}
	for _, tc := range calls {
		ctx, cancel := e.opCtx()
		lease, err := tc.call(ctx)
		switch {
		case err == nil:
			_ = lease.Release(ctx)
			t.Errorf("%s on a closed client succeeded; want an error matching locks.ErrClosed", tc.what)
		case !errors.Is(err, locks.ErrClosed):
			t.Errorf("%s on a closed client = %v; want an error matching locks.ErrClosed", tc.what, err)
		}
		cancel()
	}
	e.mustRelease(busy)
}

// testCloseEndsLeases: closing a client ends the leases it holds with
// ErrLost (the cause of a lease whose client was closed), and frees their
// names for other clients, within CrashRecovery at the latest.
func testCloseEndsLeases(t testing.TB, nh NewHarness) {
	e := newEnv(t, nh)
	defer e.close()
	c, l := e.newClientWithLocker()
	type held struct {
		what  string
		lease locks.Lease
		again func(context.Context) (locks.Lease, error) // by another client
	}
	lockName := e.name()
	other := e.newClientLocker()
	leases := []held{{"lock", e.mustTryLock(l, lockName), func(ctx context.Context) (locks.Lease, error) {
		return other.Lock(ctx, lockName)
	}}}
	if e.caps.Semaphore {
		s, err := c.Semaphore(e.ctx, 1)
		if err != nil {
			t.Fatalf("Semaphore(1): %v", err)
		}
		semName := e.name()
		lease := e.mustTryAcquire(s, semName, "of a free one-slot semaphore")
		otherSem := e.newClientSemaphore(1)
		leases = append(leases, held{"semaphore slot", lease, func(ctx context.Context) (locks.Lease, error) {
			return otherSem.Acquire(ctx, semName)
		}})
	} else {
		e.skippedPart("a semaphore slot held by the closed client", "the backend has no Semaphore")
	}

	start := time.Now()
	if err := closeClient(c); err != nil {
		t.Errorf("Close: %v", err)
	}
	for _, h := range leases {
		if _, err := waitEnded(h.lease, bound(e.caps.LossDetection)); err != nil {
			t.Errorf("%s after its client was closed (stated LossDetection %v): %v", h.what, e.caps.LossDetection, err)
		} else if cause := context.Cause(h.lease.Context()); !errors.Is(cause, locks.ErrLost) {
			t.Errorf("cause of a %s whose client was closed = %v, want an error matching locks.ErrLost", h.what, cause)
		}
	}
	ctx, cancel := context.WithDeadline(e.ctx, start.Add(bound(e.caps.CrashRecovery)))
	defer cancel()
	for _, h := range leases {
		next, err := h.again(ctx)
		if err != nil {
			t.Errorf("another client could not take the %s the closed client held, %v after Close (stated CrashRecovery %v): %v",
				h.what, time.Since(start).Round(time.Millisecond), e.caps.CrashRecovery, err)
			continue
		}
		e.mustRelease(next)
	}
}

// testStaleRelease: releasing a lease again after another client took the
// name, or releasing a lease taken away at the broker, never frees the new
// holder.
func testStaleRelease(t testing.TB, nh NewHarness) {
	e := newEnv(t, nh)
	defer e.close()
	name := e.name()
	a, b, c := e.newClientLocker(), e.newClientLocker(), e.newClientLocker()
	old := e.mustTryLock(a, name)
	e.mustRelease(old)
	next := e.mustTryLock(b, name)
	_ = old.Release(e.ctx)
	e.expectHeld(c, name, "after a stale second Release of the previous holder")
	e.mustRelease(next)

	r, ok := e.h.(Revoker)
	if !ok {
		e.skippedPart("the stale Release of a revoked lease", "the harness cannot revoke leases (not a Revoker)")
		return
	}
	old = e.mustTryLock(a, name)
	ctx, cancel := e.revokeCtx()
	defer cancel()
	if err := r.Revoke(ctx, name); err != nil {
		t.Fatalf("Revoke(%q): %v", name, err)
	}
	next = e.mustLock(b, name)
	if err := old.Release(ctx); err != nil && !errors.Is(err, locks.ErrLost) {
		t.Errorf("Release of a revoked lease: %v; want nil or an error matching locks.ErrLost", err)
	}
	e.expectHeld(c, name, "after the revoked holder's Release")
	e.mustRelease(next)
}
