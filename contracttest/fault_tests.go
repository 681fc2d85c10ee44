package contracttest

import (
	"cmp"
	"context"
	"errors"
	"testing"
	"time"

	"github.com/latchkey-go/latchkey/locks"
)

// FaultHarness is an optional interface that may be implemented by a
// [Harness] whose clients can reach the broker through a fault proxy
// (testenv.Proxy, or testenv.Proxies for several masters): NewFaultyClient
// is NewClient with every connection of the client going through link.
type FaultHarness interface {
	NewFaultyClient(ctx context.Context) (Client, Link, error)
}

// Link is one client's network path to its broker, which a test breaks on
// purpose; *testenv.Proxy and testenv.Proxies implement it.
type Link interface {
	BlackHole()   // nothing gets through either way, not even a close
	DropReplies() // requests reach the broker, replies are lost
	Restore()     // undo the faults
}

// newFaultyClientLocker makes a client behind a Link and returns its
// Locker, or skips the test.
func (e *env) newFaultyClientLocker() (locks.Locker, Link) {
	e.t.Helper()
	c, link := e.newFaultyClient()
	return c.Locker(), link
}

// newFaultyClient makes a client with a Locker behind a Link, or skips
// the test.
func (e *env) newFaultyClient() (Client, Link) {
	e.t.Helper()
	fh, ok := e.h.(FaultHarness)
	if !ok {
		e.t.Skip("the harness cannot put a fault proxy in a client's path (no FaultHarness)")
	}
	c, link, err := fh.NewFaultyClient(e.ctx)
	if errors.Is(err, errors.ErrUnsupported) {
		e.t.Skip("the harness cannot put a fault proxy in a client's path")
	}
	if err != nil {
		e.t.Fatalf("NewFaultyClient: %v", err)
	}
	e.track(c)
	if c.Locker() == nil {
		e.t.Skip("the backend has no Locker")
	}
	return c, link
}

// testCloseHungBroker: a client whose broker stops answering (its link
// open and silent) closes within Capabilities().CloseBound, plus slack
// measured on a healthy client and while Close runs, though its ctx never
// ends; and its lease has ended when Close returns. The broker hangs
// either while the client holds a lease, or before its first lock: what
// that lock starts (a connection's handshake, a subscription) must not
// hold Close past the bound either.
func testCloseHungBroker(t testing.TB, nh NewHarness) {
	e := newEnv(t, nh)
	defer e.close()
	if e.caps.CloseBound <= 0 {
		t.Skip("the backend states no CloseBound")
	}
	c, link := e.newFaultyClient()
	held := e.mustTryLock(c.Locker(), e.name())
	probe := e.newClientLocker()
	b := MeasureBound(t, e.caps.CloseBound, func() error {
		ctx, cancel := e.opCtx()
		defer cancel()
		l, err := probe.TryLock(ctx, e.name())
		if err != nil {
			return err
		}
		return l.Release(ctx)
	})
	link.BlackHole()
	defer link.Restore()
	e.closeWithin(b, c, "Close with the broker not answering")
	if held.Context().Err() == nil {
		t.Error("Close returned while its client's lease was still live")
	}

	c, link = e.newFaultyClient()
	link.BlackHole()
	defer link.Restore()
	ctx, cancel := context.WithTimeout(e.ctx, e.caps.CloseBound)
	lease, err := c.Locker().TryLock(ctx, e.name())
	cancel()
	e.closeWithin(b, c, "Close with the broker hung before the first lock")
	if err == nil && lease.Context().Err() == nil {
		t.Error("Close returned while the lease its client got from a hung broker was still live")
	}
}

// closeWithin closes c with a context that never ends, and fails the test
// when that takes longer than b.
func (e *env) closeWithin(b Bound, c Client, what string) {
	e.t.Helper()
	done := make(chan error, 1)
	start := time.Now()
	stopWatch := b.Watch()
	go func() { done <- c.Close(context.Background()) }()
	select {
	case err := <-done:
		took := time.Since(start)
		stopWatch()
		b.Check(e.t, what, took)
		if err != nil {
			e.t.Logf("%s: %v", what, err)
		}
	case <-time.After(b.Limit() + opTimeout):
		stopWatch()
		e.t.Fatalf("%s had not returned after %v; bound %v", what, time.Since(start), b)
	}
}

// partitionRecovery bounds how long a name held by a client that went
// silent (partitioned or paused: its sockets open) stays unavailable.
func (e *env) partitionRecovery() time.Duration {
	return bound(cmp.Or(e.caps.PauseRecovery, e.caps.CrashRecovery))
}

// testPartitionedHolder: a holder cut off by a black hole keeps nothing
// it cannot prove: by the time another client holds the name, the cut-off
// holder's lease has ended with ErrLost. After the partition heals, its
// stale Release does not free the successor's lock.
func testPartitionedHolder(t testing.TB, nh NewHarness) {
	e := newEnv(t, nh)
	defer e.close()
	a, link := e.newFaultyClientLocker()
	name := e.name()
	held := e.mustTryLock(a, name)
	link.BlackHole()
	cut := time.Now()

	b := e.newClientLocker()
	ctx, cancel := context.WithTimeout(e.ctx, e.partitionRecovery())
	lease, err := b.Lock(ctx, name)
	cancel()
	if err != nil {
		t.Fatalf("with the holder partitioned, Lock(%q) failed after %v: %v", name, time.Since(cut).Round(time.Millisecond), err)
	}
	if held.Context().Err() == nil {
		t.Fatalf("another client holds %q while the partitioned holder's lease is still live: two holders", name)
	}
	if cause := context.Cause(held.Context()); !errors.Is(cause, locks.ErrLost) {
		t.Errorf("the partitioned holder's lease ended with %v, want ErrLost", cause)
	}
	t.Logf("a partitioned holder's lock came back after %v", time.Since(cut).Round(time.Millisecond))
	e.expectTokenAbove(lease, held, "the successor", "the partitioned holder")

	link.Restore()
	rctx, rcancel := e.opCtx()
	_ = held.Release(rctx) // stale: may fail, must not free the successor's lock
	rcancel()
	e.expectHeld(e.newClientLocker(), name, "after the healed holder's stale Release")
	e.mustRelease(lease)
}

// testAmbiguousAcquire: an acquire whose reply is lost (it ran at the
// broker, its caller never heard) gives its caller an error, and is then
// either cleaned up or expires: another client holds the name within the
// partition bound, and the name works for everyone after the link heals
// (the faulty client itself may instead report ErrClosed, if the backend
// does not reconnect).
func testAmbiguousAcquire(t testing.TB, nh NewHarness) {
	e := newEnv(t, nh)
	defer e.close()
	a, link := e.newFaultyClientLocker()
	name := e.name()
	link.DropReplies()
	const wait = 500 * time.Millisecond
	actx, acancel := context.WithTimeout(e.ctx, wait)
	start := time.Now()
	lease, err := a.Lock(actx, name)
	acancel()
	if err == nil {
		_ = lease.Release(context.Background())
		t.Fatalf("Lock(%q) succeeded though no reply could reach it", name)
	}
	lost := time.Now()
	if took := lost.Sub(start); took > bound(wait+e.caps.CancelGrace) {
		t.Errorf("Lock(%q) with a %v context returned after %v (stated CancelGrace %v): the context must bound the wait", name, wait, took.Round(time.Millisecond), e.caps.CancelGrace)
	}

	b := e.newClientLocker()
	ctx, cancel := context.WithTimeout(e.ctx, e.partitionRecovery())
	got, err := b.Lock(ctx, name)
	cancel()
	if err != nil {
		t.Fatalf("after an acquire whose reply was lost, Lock(%q) failed after %v: %v", name, time.Since(lost).Round(time.Millisecond), err)
	}
	t.Logf("the name of an ambiguous acquire came back after %v", time.Since(lost).Round(time.Millisecond))
	e.mustRelease(got)

	link.Restore() // a request racing the reconnection may be lost: allow a retry
	ctx, cancel = e.opCtx()
	again, err := a.Lock(ctx, name)
	cancel()
	switch {
	case errors.Is(err, locks.ErrClosed):
		// A backend whose client is one connection may give up on it
		// (saying so with ErrClosed); others still lock.
		t.Logf("the client of the ambiguous acquire closed itself: %v", err)
		e.mustRelease(e.mustLock(e.newClientLocker(), name))
	case err != nil:
		t.Fatalf("after the link healed, the client of the ambiguous acquire cannot Lock(%q): %v", name, err)
	default:
		e.mustRelease(again)
	}
}
