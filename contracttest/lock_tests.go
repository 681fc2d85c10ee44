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
	if sl, ok := lease.(locks.SlotLease); !ok {
		t.Errorf("a Locker's lease is a %T, not a locks.SlotLease", lease)
	} else if n := sl.Slot(); n != 0 {
		t.Errorf("a Locker's lease reports Slot() = %d, want 0", n)
	}
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
