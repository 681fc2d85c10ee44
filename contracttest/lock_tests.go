package contracttest

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/latchkey-go/latchkey/locks"
)

const (
	contenders = 4 // clients racing for one name
	rounds     = 8 // critical sections per client
	sectionFor = 2 * time.Millisecond
)

// race runs k clients for rounds critical sections each on one name, each
// section lasting hold, and records every section in h; each section
// writes to res when it is not nil.
func race(e *env, name string, hold time.Duration, h *History, res *FencedResource, acquire func(i int) func(ctx context.Context, name string) (locks.Lease, error)) {
	e.t.Helper()
	var wg sync.WaitGroup
	errs := make(chan error, contenders*rounds)
	for i := range contenders {
		get := acquire(i)
		wg.Go(func() {
			for r := range rounds {
				who := fmt.Sprintf("client%d/round%d", i, r)
				if err := section(e, get, name, who, hold, h, res); err != nil {
					errs <- fmt.Errorf("%s: %w", who, err)
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		e.t.Error(err)
	}
}

func section(e *env, get func(context.Context, string) (locks.Lease, error), name, who string, hold time.Duration, h *History, res *FencedResource) error {
	ctx, cancel := context.WithTimeout(e.ctx, time.Minute)
	defer cancel()
	lease, err := get(ctx, name)
	if err != nil {
		return fmt.Errorf("acquire: %w", err)
	}
	defer func() { _ = lease.Release(ctx) }()
	exit := h.Enter(who, lease.Token())
	if res != nil {
		if err := res.Write(who, lease.Token()); err != nil {
			exit()
			return err
		}
	}
	time.Sleep(hold)
	if err := context.Cause(lease.Context()); err != nil {
		exit()
		return fmt.Errorf("lease ended inside its critical section: %w", err)
	}
	exit()
	return lease.Release(ctx)
}

func lockers(e *env) func(int) func(context.Context, string) (locks.Lease, error) {
	return func(int) func(context.Context, string) (locks.Lease, error) { return e.newClientLocker().Lock }
}

// testMutualExclusion: several clients take turns on one name; no two
// critical sections overlap.
func testMutualExclusion(t testing.TB, nh NewHarness) {
	e := newEnv(t, nh)
	defer e.close()
	h := NewHistory(1)
	race(e, e.name(), sectionFor, h, nil, lockers(e))
	if err := h.Check(); err != nil {
		t.Fatalf("mutual exclusion broken: %v", err)
	}
	if got, want := h.Len(), contenders*rounds; got != want {
		t.Fatalf("recorded %d critical sections, want %d", got, want)
	}
}

// testFencing: tokens strictly increase across holders, so a fenced
// resource accepts every write of a correct run.
func testFencing(t testing.TB, nh NewHarness) {
	e := newEnv(t, nh)
	defer e.close()
	if !e.caps.Fencing {
		l := e.newClientLocker()
		lease := e.mustTryLock(l, e.name())
		defer e.mustRelease(lease)
		if tok := lease.Token(); tok != 0 {
			t.Fatalf("the backend claims no fencing but Token() = %d: tokens must be 0 when not real", tok)
		}
		t.Skip("fencing tokens not supported")
	}
	name := e.name()
	a, b := e.newClientLocker(), e.newClientLocker()
	first := e.mustTryLock(a, name)
	e.mustRelease(first)
	second := e.mustTryLock(b, name)
	e.mustRelease(second)
	if first.Token() == 0 || second.Token() <= first.Token() {
		t.Fatalf("tokens of successive holders: %d then %d, want 0 < first < second", first.Token(), second.Token())
	}
	res := &FencedResource{}
	race(e, name, sectionFor, NewHistory(1), res, lockers(e))
	if got, want := res.Accepted(), contenders*rounds; got != want && !t.Failed() {
		t.Fatalf("fenced resource accepted %d writes, want %d", got, want)
	}
}

// tryLockAtOnce bounds two failing TryLocks: a few round trips each,
// with room for a loaded machine and the race detector.
const tryLockAtOnce = 2 * time.Second

// testTryLockHeld: TryLock of a held name fails at once with
// ErrNotAcquired, from another client and from the holder's own (leases
// are not reentrant).
func testTryLockHeld(t testing.TB, nh NewHarness) {
	e := newEnv(t, nh)
	defer e.close()
	name := e.name()
	a, b := e.newClientLocker(), e.newClientLocker()
	lease := e.mustTryLock(a, name)
	start := time.Now()
	e.expectHeld(b, name, "while another client holds the name")
	e.expectHeld(a, name, "from the holder's own client (leases are not reentrant)")
	// "At once": a TryLock does not wait for the holder (whose lease is
	// renewed, so waiting would last until the op timeout).
	if took := time.Since(start); took > tryLockAtOnce {
		t.Errorf("two TryLocks of a held name took %v, want under %v: TryLock must not wait", took, tryLockAtOnce)
	}
	if err := context.Cause(lease.Context()); err != nil {
		t.Fatalf("the holder's lease ended after failed TryLocks: %v", err)
	}
	e.mustRelease(lease)
	e.mustRelease(e.mustTryLock(b, name))
}

// testLockWaitsForRelease: Lock on a held name waits, and gets it soon after
// the release.
func testLockWaitsForRelease(t testing.TB, nh NewHarness) {
	e := newEnv(t, nh)
	defer e.close()
	name := e.name()
	a, b := e.newClientLocker(), e.newClientLocker()
	held := e.mustTryLock(a, name)

	got := make(chan locks.Lease, 1)
	errc := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(e.ctx, time.Minute)
		defer cancel()
		lease, err := b.Lock(ctx, name)
		if err != nil {
			errc <- err
			return
		}
		got <- lease
	}()
	select {
	case lease := <-got:
		_ = lease.Release(e.ctx)
		t.Fatalf("Lock(%q) returned while another client held it", name)
	case err := <-errc:
		t.Fatalf("waiting Lock(%q): %v", name, err)
	case <-time.After(200 * time.Millisecond):
	}
	e.mustRelease(held)
	select {
	case lease := <-got:
		e.expectTokenAbove(lease, held, "the waiter", "the released holder")
		e.mustRelease(lease)
	case err := <-errc:
		t.Fatalf("waiting Lock(%q) after release: %v", name, err)
	case <-time.After(opTimeout):
		t.Fatalf("waiting Lock(%q) did not get the name within %v of its release", name, opTimeout)
	}
}

// testDistinctNames: holding one name does not block another.
func testDistinctNames(t testing.TB, nh NewHarness) {
	e := newEnv(t, nh)
	defer e.close()
	a, b := e.newClientLocker(), e.newClientLocker()
	n1, n2 := e.name(), e.name()
	l1 := e.mustTryLock(a, n1)
	l2 := e.mustTryLock(b, n2)
	l3 := e.mustTryLock(a, e.name())
	e.mustRelease(l1)
	e.mustRelease(l2)
	e.mustRelease(l3)
}

// testCancellation: a Lock whose context ends returns ctx's error and holds
// nothing; so does a Lock with a context already cancelled.
func testCancellation(t testing.TB, nh NewHarness) {
	e := newEnv(t, nh)
	defer e.close()
	name := e.name()
	a, b, c := e.newClientLocker(), e.newClientLocker(), e.newClientLocker()
	held := e.mustTryLock(a, name)
	lock := func(ctx context.Context) (locks.Lease, error) { return b.Lock(ctx, name) }

	e.expectEndsWithContext("Lock", "got a lease from Lock while another client held the name", lock)
	e.mustRelease(held)
	e.expectCancelledFails("Lock", lock)
	// Nothing of the cancelled calls may stay held.
	e.mustRelease(e.mustTryLock(c, name))
}

// expectEndsWithContext checks that call, made while what it asks for is
// held elsewhere, returns an error matching its context's once that context
// ends: by its deadline, then by a cancel. op names the call in failures;
// granted is the error reported when it returns a lease instead.
func (e *env) expectEndsWithContext(op, granted string, call func(context.Context) (locks.Lease, error)) {
	e.t.Helper()
	for _, tc := range []struct {
		want error
		ctx  func() (context.Context, context.CancelFunc)
	}{
		{context.DeadlineExceeded, func() (context.Context, context.CancelFunc) {
			return context.WithTimeout(e.ctx, 150*time.Millisecond)
		}},
		{context.Canceled, func() (context.Context, context.CancelFunc) {
			ctx, cancel := context.WithCancel(e.ctx)
			time.AfterFunc(150*time.Millisecond, cancel)
			return ctx, cancel
		}},
	} {
		ctx, cancel := tc.ctx()
		done := make(chan error, 1)
		go func() {
			lease, err := call(ctx)
			if err == nil {
				_ = lease.Release(e.ctx)
				err = errors.New(granted)
			}
			done <- err
		}()
		select {
		case err := <-done:
			if !errors.Is(err, tc.want) {
				e.t.Errorf("%s with a context ending in %v returned %v; want an error matching it", op, tc.want, err)
			}
		case <-time.After(opTimeout):
			e.t.Errorf("%s did not return within %v of its context ending (%v)", op, opTimeout, tc.want)
		}
		cancel()
	}
}

// expectCancelledFails checks that call with a context already cancelled
// returns an error matching context.Canceled (and no lease), even with the
// name free. op names the call in the failure.
func (e *env) expectCancelledFails(op string, call func(context.Context) (locks.Lease, error)) {
	e.t.Helper()
	cancelled, cancel := context.WithCancel(e.ctx)
	cancel()
	if lease, err := call(cancelled); !errors.Is(err, context.Canceled) {
		if err == nil {
			_ = lease.Release(e.ctx)
		}
		e.t.Errorf("%s with a cancelled context returned %v; want context.Canceled", op, err)
	}
}

// testCancellationRace: contexts that end at random moments while the
// holder releases at random moments never leave the name held: after each
// round, once the holder has released and the waiter's Lock has returned
// (and the waiter released what it got), a third client takes the name at
// once. The waiter's context ends a little before the release in even
// rounds and a little after it in odd ones, so that both orders are run
// close to the moment they cross.
func testCancellationRace(t testing.TB, nh NewHarness) {
	e := newEnv(t, nh)
	defer e.close()
	name := e.name()
	a, b, c := e.newClientLocker(), e.newClientLocker(), e.newClientLocker()
	for i := range 10 {
		held := e.mustLock(a, name)
		first := time.Duration(rand.IntN(40)) * time.Millisecond
		second := first + time.Duration(1+rand.IntN(4))*time.Millisecond
		deadline, release, order := first, second, "before"
		if i%2 == 1 {
			deadline, release, order = second, first, "after"
		}
		ctx, cancel := context.WithTimeout(e.ctx, deadline)
		waited := make(chan string, 1) // what the waiter's Lock did
		go func() {
			lease, err := b.Lock(ctx, name)
			switch {
			case err == nil:
				if rerr := lease.Release(e.ctx); rerr != nil {
					t.Errorf("round %d: Release of the waiter's lease: %v", i, rerr)
				}
				waited <- "got the name and released it"
			case !errors.Is(err, context.DeadlineExceeded):
				t.Errorf("round %d: Lock failed with %v; want a lease or context.DeadlineExceeded", i, err)
				waited <- fmt.Sprintf("returned %v", err)
			default:
				waited <- fmt.Sprintf("returned %v", err)
			}
		}()
		time.Sleep(release)
		e.mustRelease(held)
		outcome := <-waited
		cancel()
		tctx, tcancel := e.opCtx()
		lease, err := c.TryLock(tctx, name)
		tcancel()
		if err != nil {
			t.Fatalf("round %d (the waiter's context ending %v %s the holder's release): the waiter's Lock %s; then TryLock(%q) by a third client = %v; the name must be free (%s)",
				i, second-first, order, outcome, name, err, e.freedAfter(c, name))
		}
		e.mustRelease(lease)
	}
}

// freedAfter says how long a name that should be free takes to come
// free for l: within CrashRecovery (left to expire, or undone late) or
// not at all.
func (e *env) freedAfter(l locks.Locker, name string) string {
	start := time.Now()
	ctx, cancel := context.WithTimeout(e.ctx, bound(e.caps.CrashRecovery))
	defer cancel()
	lease, err := l.Lock(ctx, name)
	if err != nil {
		return fmt.Sprintf("still held %v later: %v", time.Since(start).Round(time.Millisecond), err)
	}
	_ = lease.Release(e.ctx)
	return fmt.Sprintf("it came free %v later", time.Since(start).Round(time.Millisecond))
}

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

	if err := c.Close(); err != nil {
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
	if err := c.Close(); err != nil {
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
	ctx, cancel := e.opCtx()
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
	ctx, cancel := e.opCtx()
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
