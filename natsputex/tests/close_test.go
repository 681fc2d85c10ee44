package natsputex_test

// Client.Close: ends every lease, blanks the keys, is bounded by its ctx.

import (
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/latchkey-go/latchkey/contracttest"
	"github.com/latchkey-go/latchkey/locks"
	"github.com/latchkey-go/latchkey/locks/driver"
	"github.com/latchkey-go/latchkey/natsputex"
)

// TestCloseDuringSlowRoundLeavesKeysFree: a Client with 20 leases whose replies
// are held for 200ms is closed, with a context of 5s, while a renewal
// round is in flight. With time enough, "Close ends every lease ... then
// blanks their keys": a waiter of another client must find the keys free
// (no takeover, which costs T + C·R of silence) once Close returned.
func TestCloseDuringSlowRoundLeavesKeysFree(t *testing.T) {
	url, bucket := promiseEnv(t, "closeslow")
	holder, proxy := proxiedClient(t, url, bucket, natsputex.WithHolderID("closing"))
	waiter := newTestClient(t, url, bucket, natsputex.WithHolderID("waiter"))
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	names := leaseNames(20)
	for _, n := range names {
		if _, err := holder.Locker().TryLock(ctx, n); err != nil {
			t.Fatal(err)
		}
	}
	var rounds atomic.Int32
	defer holder.Locker().Observe(func(e driver.Event) {
		if e.Kind == driver.EventRenewRound {
			rounds.Add(1)
		}
	})()
	time.Sleep(250 * time.Millisecond)
	proxy.DelayReplies(200 * time.Millisecond)
	time.Sleep(150 * time.Millisecond) // a round is in flight
	cctx, ccancel := context.WithTimeout(context.Background(), 5*time.Second)
	start := time.Now()
	err := holder.Close(cctx)
	ccancel()
	t.Logf("Close took %v: %v (%d rounds before)", time.Since(start).Round(time.Millisecond), err, rounds.Load())
	proxy.Restore()
	var takeovers atomic.Int32
	defer waiter.Locker().Observe(func(e driver.Event) {
		if e.Kind == driver.EventTakeover {
			takeovers.Add(1)
		}
	})()
	start = time.Now()
	for _, n := range names {
		l, err := waiter.Locker().TryLock(ctx, n)
		if err != nil {
			t.Logf("%s: %v", n, err)
			continue
		}
		_ = l.Release(ctx)
	}
	t.Logf("TryLock of %d keys after Close: %v, %d takeovers", len(names), time.Since(start).Round(time.Millisecond), takeovers.Load())
	if takeovers.Load() > 0 {
		t.Errorf("%d of %d keys were not blanked by a Close given time enough (a waiter paid T + C·R)", takeovers.Load(), len(names))
	}
}

// Guards: Close returned nil, 12 runs of 20, though the
// hold's Stop failed (when Run's loop ran that Stop before Close's
// release did, the release found the key kept and said nothing); Close
// now returns the failed Stop either way. Also seen: with a Stop longer
// than T, Close's blank finds node-b's takeover write (nothing renews a
// closed hold while Stop runs), which the package doc now says.
//
// TestCloseWhileActiveStopsServiceAndReportsStopFailure: Client.Close "ends
// every lease of the client ... A running Supervisor's hold is one of those
// leases: Close runs its Service.Stop and blanks its key only once Stop has
// returned (not at all when Stop fails, which Close returns), and Run
// returns an error matching locks.ErrClosed"; "when ctx ends first, Close
// returns an error matching ctx.Err() and the rest finishes in the
// background"; Stop's "context ends after T + C·R, never sooner". node-a (R
// = 100ms, F = 3, C = 2) is active with a Stop of 300ms; node-b is standby.
// Close with a 20ms context (it must return by then, and Stop must still run
// to its end with its own context), with a 5s one (it returns after Stop and
// the blank), and with a Stop that fails (Close returns that error, the key
// keeps node-a's write, node-b waits T + C·R).
func TestCloseWhileActiveStopsServiceAndReportsStopFailure(t *testing.T) {
	const (
		C = 2
		T = testF * testR
	)
	for _, tc := range []struct {
		name     string
		within   time.Duration
		stopFail bool
		stop     time.Duration
		shutdown bool // cancel Run's context instead of closing the client
	}{
		{"short-ctx", 20 * time.Millisecond, false, 300 * time.Millisecond, false},
		{"long-ctx", 5 * time.Second, false, 300 * time.Millisecond, false},
		{"long-ctx-stop-100ms", 5 * time.Second, false, 100 * time.Millisecond, false},
		{"stop-fails", 5 * time.Second, true, 0, false},
		{"run-cancelled", 0, false, 300 * time.Millisecond, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			url, bucket, key := localEnv(t)
			writes := watchWrites(t, url, bucket, key)
			h := contracttest.NewHistory(1)
			a := startNode(t, url, bucket, key, "node-a", h, withClientOptions(natsputex.WithConfirmations(C)))
			a.stopDelay.Store(int64(tc.stop))
			waitFor(t, 5*time.Second, "node-a starts its service", a.running)
			b := startNode(t, url, bucket, key, "node-b", h, withClientOptions(natsputex.WithConfirmations(C)))
			waitFor(t, 5*time.Second, "node-b is standby", func() bool {
				return b.sawEvent(func(e natsputex.Event) bool { return e.Holder == "node-a" })
			})
			time.Sleep(2 * testR)
			if tc.stopFail {
				a.failStop.Store(true)
			}
			var err error
			var took time.Duration
			closed := time.Now()
			if tc.shutdown {
				a.cancel()
			} else {
				ctx, cancel := context.WithTimeout(context.Background(), tc.within)
				err = a.c.Close(ctx)
				took = time.Since(closed)
				cancel()
				t.Logf("Close took %v: %v", took.Round(time.Millisecond), err)
			}
			runErr, ok := a.wait(5 * time.Second)
			if !ok {
				t.Fatal("Run did not return within 5s of Close")
			}
			t.Logf("Run returned %v after Close began (matches ErrStopFailed: %t; %d Stop calls): %v", time.Since(closed).Round(time.Millisecond), errors.Is(runErr, natsputex.ErrStopFailed), len(a.getStops()), runErr)
			if want := locks.ErrClosed; !tc.shutdown && !errors.Is(runErr, want) {
				t.Errorf("Run's error %v does not match locks.ErrClosed", runErr)
			}
			if tc.shutdown && !errors.Is(runErr, context.Canceled) {
				t.Errorf("Run's error %v does not match context.Canceled", runErr)
			}
			waitFor(t, 5*time.Second, "node-b starts its service", b.running)
			bStart := b.getStarts()[0].begin
			stop, ok := a.firstStopAfter(closed)
			if !ok {
				t.Fatal("node-a's Stop was not called after Close")
			}
			blanks := writes.blanksAfter(closed)
			last, _ := writes.lastBy("node-a", bStart)
			t.Logf("node-a's Stop began %v after Close, context %v long, returned %v after Close (its context: %v); %d blank(s); node-b started %v after Close, %v after node-a's last write",
				stop.begin.Sub(closed).Round(time.Millisecond), stop.left.Round(time.Millisecond), stop.end.Sub(closed).Round(time.Millisecond), stop.ctxErr,
				len(blanks), bStart.Sub(closed).Round(time.Millisecond), bStart.Sub(last.created).Round(time.Millisecond))
			for _, w := range writes.writesAfter(closed.Add(-testR)) {
				t.Logf("write rev %d %q stored %v after Close", w.rev, w.value, w.created.Sub(closed).Round(time.Millisecond))
			}
			if stop.left >= 0 && stop.left < T+C*testR-5*time.Millisecond {
				t.Errorf("the Stop run by Close has a context of %v, shorter than T + C·R = %v", stop.left.Round(time.Millisecond), T+C*testR)
			}
			if stop.ctxErr != nil {
				t.Errorf("the context of the Stop run by Close had ended (%v) when it returned after %v", stop.ctxErr, stop.end.Sub(stop.begin).Round(time.Millisecond))
			}
			switch {
			case tc.stopFail:
				if !errors.Is(err, natsputex.ErrStopFailed) {
					t.Errorf("Close = %v, want the failed Stop (ErrStopFailed)", err)
				}
				if len(blanks) > 0 {
					t.Errorf("the key was blanked (rev %d) though node-a's Stop failed", blanks[0].rev)
				}
				if d := bStart.Sub(last.created); d < T+C*testR {
					t.Errorf("node-b started %v after node-a's last write, before T + C·R = %v", d.Round(time.Millisecond), T+C*testR)
				}
			case tc.shutdown:
			case tc.within < time.Second:
				if !errors.Is(err, context.DeadlineExceeded) {
					t.Errorf("Close with a %v context = %v, want an error matching context.DeadlineExceeded", tc.within, err)
				}
				if took > tc.within+150*time.Millisecond {
					t.Errorf("Close with a %v context took %v", tc.within, took.Round(time.Millisecond))
				}
			default:
				if err != nil {
					t.Errorf("Close = %v", err)
				}
				if time.Now().Before(stop.end) || closed.Add(took).Before(stop.end) {
					t.Errorf("Close returned before node-a's Stop did")
				}
			}
			// Close ends the hold before Stop runs, so nothing renews the
			// key meanwhile: a Stop longer than T lets node-b take the
			// silent key over (it still starts only T + C·R after
			// node-a's last write), and node-a's blank then finds node-b's
			// write and leaves it (the package doc). When Run's context
			// ends instead, node-a renews while Stop runs and blanks.
			// node-b's takeover may also land just after Stop returned but
			// before node-a's blank: what counts is which came first.
			tookOver := false
			if first, ok := writes.firstBy("node-b"); ok && (len(blanks) == 0 || first.created.Before(blanks[0].created)) {
				tookOver = true
				if tc.shutdown && first.created.Before(stop.end) {
					t.Errorf("node-b took the key over %v before node-a's Stop returned, though node-a's Run was only cancelled (it holds the key while Stop runs)", stop.end.Sub(first.created).Round(time.Millisecond))
				}
			}
			if !tc.stopFail {
				if len(blanks) == 0 && !tookOver {
					t.Error("node-a's key was not blanked after its Stop returned")
				} else if len(blanks) > 0 && blanks[0].created.Before(stop.end) {
					t.Errorf("node-a's key was blanked %v before its Stop returned", stop.end.Sub(blanks[0].created).Round(time.Millisecond))
				}
				if bStart.Before(stop.end) {
					t.Errorf("node-b started %v before node-a's Stop returned", stop.end.Sub(bStart).Round(time.Millisecond))
				}
				if d := bStart.Sub(stop.end); d > T && !tookOver {
					t.Errorf("node-b started %v after node-a's Stop returned: as if the key had not been blanked", d.Round(time.Millisecond))
				}
				if err := h.Check(); err != nil {
					t.Errorf("services overlapped: %v", err)
				}
			}
			b.cancel()
			b.wait(5 * time.Second)
		})
	}
}

// TestCloseWhileNotActiveWaitsForNoRun: Client.Close "does not wait for Run
// itself, nor for a Stop of an agent that did not hold the key", and "a
// confirmer that gives up, for any reason, never blanks the key". In
// "standby", node-a (Stop 300ms) stands by while a Locker of another
// client holds the key: Close must return at once, Run with ErrClosed,
// and the Locker's lease and its write stay. In "confirming", node-c dies,
// node-a (C = 6) takes its key over and, while it confirms, its client is
// closed: node-a never starts, does not blank the key, Run returns
// ErrClosed, and node-b (C = 1) starts no sooner than T + node-a's C·R
// (300ms + 600ms) after node-a's last write.
func TestCloseWhileNotActiveWaitsForNoRun(t *testing.T) {
	const T = testF * testR
	t.Run("standby", func(t *testing.T) {
		url, bucket, key := localEnv(t)
		writes := watchWrites(t, url, bucket, key)
		holder := newTestClient(t, url, bucket, natsputex.WithHolderID("locker"))
		l, err := holder.Locker().TryLock(context.Background(), key)
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = l.Release(context.Background()) }()
		a := startNode(t, url, bucket, key, "node-a", contracttest.NewHistory(1))
		waitFor(t, 5*time.Second, "node-a is standby", func() bool {
			return a.sawEvent(func(e natsputex.Event) bool { return e.Holder != "" && e.Phase == natsputex.PhaseStandby })
		})
		time.Sleep(2 * testR)
		a.stopDelay.Store(int64(300 * time.Millisecond))
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		closed := time.Now()
		err = a.c.Close(ctx)
		took := time.Since(closed)
		runErr, ok := a.wait(5 * time.Second)
		t.Logf("Close took %v: %v; Run returned (%t) %v after: %v", took.Round(time.Millisecond), err, ok, time.Since(closed).Round(time.Millisecond), runErr)
		if err != nil {
			t.Errorf("Close = %v", err)
		}
		if took > 150*time.Millisecond {
			t.Errorf("Close of a standby agent took %v: it waited for its Stop (300ms)", took.Round(time.Millisecond))
		}
		if !ok || !errors.Is(runErr, locks.ErrClosed) {
			t.Errorf("Run = %v (returned: %t), want an error matching ErrClosed", runErr, ok)
		}
		time.Sleep(2 * testR)
		if l.Context().Err() != nil {
			t.Errorf("the Locker's lease ended when the standby's client closed: %v", context.Cause(l.Context()))
		}
		for _, w := range writes.writesAfter(closed) {
			if w.value != "locker" && !strings.HasPrefix(w.value, "locker") {
				t.Errorf("write rev %d %q after the standby's client closed", w.rev, w.value)
			}
		}
	})
	t.Run("confirming", func(t *testing.T) {
		const Ca = 6
		url, bucket, key := localEnv(t)
		writes := watchWrites(t, url, bucket, key)
		h := contracttest.NewHistory(1)
		c := startNode(t, url, bucket, key, "node-c", h)
		waitFor(t, 5*time.Second, "node-c starts its service", c.running)
		a := startNode(t, url, bucket, key, "node-a", h, withClientOptions(natsputex.WithConfirmations(Ca)))
		a.stopDelay.Store(int64(300 * time.Millisecond))
		waitFor(t, 5*time.Second, "node-a is standby", func() bool {
			return a.sawEvent(func(e natsputex.Event) bool { return e.Holder == "node-c" })
		})
		time.Sleep(2 * testR)
		c.kill()
		waitFor(t, 3*time.Second, "node-a confirms", func() bool { return a.sup.Phase() == natsputex.PhaseConfirming })
		b := startNode(t, url, bucket, key, "node-b", h)
		time.Sleep(2 * testR)
		if a.sup.Phase() != natsputex.PhaseConfirming {
			t.Fatalf("node-a is %v, no longer confirming", a.sup.Phase())
		}
		closed := time.Now()
		err := a.c.Close(context.Background())
		took := time.Since(closed)
		runErr, ok := a.wait(5 * time.Second)
		t.Logf("Close took %v: %v; Run returned (%t) %v after: %v", took.Round(time.Millisecond), err, ok, time.Since(closed).Round(time.Millisecond), runErr)
		if !ok || !errors.Is(runErr, locks.ErrClosed) {
			t.Errorf("Run = %v (returned: %t), want an error matching ErrClosed", runErr, ok)
		}
		waitFor(t, 5*time.Second, "node-b starts its service", b.running)
		bStart := b.getStarts()[0].begin
		last, _ := writes.lastBy("node-a", bStart)
		t.Logf("node-b started %v after node-a's last write (T + node-a's C·R = %v)", bStart.Sub(last.created).Round(time.Millisecond), T+Ca*testR)
		if len(a.getStarts()) > 0 {
			t.Error("node-a started its service though its client closed while it confirmed")
		}
		if bl := writes.blanksAfter(closed.Add(-testR)); len(bl) > 0 {
			t.Errorf("the key was blanked (rev %d, %v after Close) though node-a closed while confirming", bl[0].rev, bl[0].created.Sub(closed).Round(time.Millisecond))
		}
		if d := bStart.Sub(last.created); d < T+Ca*testR {
			t.Errorf("node-b started %v after node-a's last write, before T + node-a's C·R = %v", d.Round(time.Millisecond), T+Ca*testR)
		}
		b.cancel()
		b.wait(5 * time.Second)
		if err := h.Check(); err != nil {
			t.Errorf("services overlapped: %v", err)
		}
	})
}

// TestClientCloseEndsRun: "Run pumps until ctx ends or the
// client closes. Then it stops the service, blanks the key if it still
// holds the agent's last write (so another agent takes over at once ...)
// and returns an error matching ctx.Err() (or locks.ErrClosed)". node-a's
// Client is closed while its Supervisor is active: Run returns ErrClosed
// after Stop, and node-b starts well before T + C·R, after node-a's Stop.
// Then Run on the same Supervisor fails, and a second Run while one runs
// fails at once.
func TestClientCloseEndsRun(t *testing.T) {
	const C = 3
	url, bucket, key := supervisorEnv(t)
	h := contracttest.NewHistory(1)
	ca := newTestClient(t, url, bucket, natsputex.WithConfirmations(C))
	var mu sync.Mutex
	var exit func()
	var stoppedAt time.Time
	supA, err := ca.Supervisor(key, "node-a", natsputex.Service{
		Start: func(context.Context, uint64) error {
			mu.Lock()
			defer mu.Unlock()
			if exit == nil {
				exit = h.Enter("node-a", 0)
			}
			return nil
		},
		Stop: func(context.Context) error {
			time.Sleep(50 * time.Millisecond)
			mu.Lock()
			defer mu.Unlock()
			if exit != nil {
				exit()
				exit = nil
				stoppedAt = time.Now()
			}
			return nil
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- supA.Run(context.Background()) }()
	waitFor(t, 5*time.Second, "node-a becomes active", func() bool { return supA.Phase() == natsputex.PhaseActive })
	if err := supA.Run(context.Background()); err == nil {
		t.Error("a second Run while one runs returned nil")
	}
	b := startAgent(t, url, bucket, key, "node-b", h, withClientOptions(natsputex.WithConfirmations(C)))
	time.Sleep(3 * testR)
	closed := time.Now()
	_ = ca.Close(context.Background())
	var runErr error
	select {
	case runErr = <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("Run did not return after its client closed")
	}
	t.Logf("Run returned %v after Close: %v; phase %v", time.Since(closed).Round(time.Millisecond), runErr, supA.Phase())
	if !errors.Is(runErr, locks.ErrClosed) {
		t.Errorf("Run's error %v does not match locks.ErrClosed", runErr)
	}
	if supA.Phase() != natsputex.PhaseStopped {
		t.Errorf("phase after Run returned: %v, want stopped", supA.Phase())
	}
	waitFor(t, 5*time.Second, "node-b starts its service", b.running)
	took := b.lastStart().Sub(closed)
	mu.Lock()
	st := stoppedAt
	mu.Unlock()
	t.Logf("node-b started %v after node-a's client closed (T + C·R = %v); node-a's Stop returned %v after the close", took.Round(time.Millisecond), testF*testR+C*testR, st.Sub(closed).Round(time.Millisecond))
	if took >= testF*testR {
		t.Errorf("node-b started %v after node-a's client closed: node-a did not blank the key (T = %v)", took.Round(time.Millisecond), testF*testR)
	}
	b.stop()
	if err := h.Check(); err != nil {
		t.Errorf("services overlapped: %v", err)
	}
}

// TestCloseEndsLeasesAndBlanksKeys: Client.Close ends the client's leases
// (lock and semaphore slot) with a cause matching both ErrLost and
// ErrClosed before it returns, blanks their keys, so that another client's
// TryLock (which never takes a key over from a live-looking holder) gets
// them right after Close, not T later; and a Lock of the closing client
// waiting on a name held elsewhere returns with ErrClosed.
func TestCloseEndsLeasesAndBlanksKeys(t *testing.T) {
	url, bucket := promiseEnv(t, "close")
	closing := newTestClient(t, url, bucket)
	other := newTestClient(t, url, bucket)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	lease, err := closing.Locker().TryLock(ctx, "job")
	if err != nil {
		t.Fatal(err)
	}
	sem, err := closing.Semaphore(1)
	if err != nil {
		t.Fatal(err)
	}
	slot, err := sem.TryAcquire(ctx, "pool")
	if err != nil {
		t.Fatal(err)
	}
	busy, err := other.Locker().TryLock(ctx, "busy")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = busy.Release(context.Background()) }()
	waiting := lockBehind(ctx, closing.Locker(), "busy", busy)
	time.Sleep(2 * testR) // the closing client's Lock waits; its leases renew
	select {
	case g := <-waiting:
		t.Fatalf("the Lock of a name held by another client returned before Close: %v", g.err)
	default:
	}

	closed := time.Now()
	if err := closing.Close(context.Background()); err != nil {
		t.Errorf("Close: %v", err)
	}
	for what, l := range map[string]locks.Lease{"lock": lease, "semaphore slot": slot} {
		if l.Context().Err() == nil {
			t.Errorf("the %s's lease is live after Close returned", what)
			continue
		}
		cause := context.Cause(l.Context())
		if !errors.Is(cause, locks.ErrLost) || !errors.Is(cause, locks.ErrClosed) {
			t.Errorf("the %s's lease ended with %v, want an error matching both ErrLost and ErrClosed", what, cause)
		}
	}
	// Right after Close: well within T = F·R (300ms), and TryLock would
	// not take over a key still holding the closed client's token anyway.
	again, err := other.Locker().TryLock(ctx, "job")
	if err != nil {
		t.Errorf("TryLock of the closed client's lock right after Close: %v, want the key blanked", err)
	} else {
		_ = again.Release(ctx)
	}
	otherSem, err := other.Semaphore(1)
	if err != nil {
		t.Fatal(err)
	}
	if again, err := otherSem.TryAcquire(ctx, "pool"); err != nil {
		t.Errorf("TryAcquire of the closed client's slot right after Close: %v, want the key blanked", err)
	} else {
		_ = again.Release(ctx)
	}
	t.Logf("the other client's TryLock and TryAcquire returned %v after Close began (T = %v)", time.Since(closed).Round(time.Millisecond), other.TTL())

	select {
	case g := <-waiting:
		t.Logf("the waiting Lock returned %v after Close began: %v", time.Since(closed).Round(time.Millisecond), g.err)
		if g.err == nil {
			_ = g.lease.Release(ctx)
			t.Fatal("the waiting Lock of a name held by another client got it when its client closed")
		}
		if !errors.Is(g.err, locks.ErrClosed) {
			t.Errorf("the waiting Lock returned %v, want an error matching ErrClosed", g.err)
		}
	case <-time.After(2 * time.Second):
		t.Fatal("the waiting Lock did not return within 2s of Close")
	}
}

// TestCloseAfterReleaseLeftToBackground: Release "If ctx ends first ...
// the name is freed without ctx: by the backend finishing the release in
// the background"; Close "waits for those calls ... Every wait is bounded
// by ctx". A holder (R = 100ms, F = 20) whose replies are held for 300ms
// releases, with a ctx of 20ms, while a renewal round is in flight, and
// closes at once with a ctx of 5s. The release finishes in the
// background after the round; Close must wait for it, not cut it short,
// so that another client's TryLock finds the key free once Close returned
// (not after T = 2s of silence).
func TestCloseAfterReleaseLeftToBackground(t *testing.T) {
	url, bucket := promiseEnv(t, "closebg")
	const F = 20
	holder, proxy := proxiedClient(t, url, bucket, natsputex.WithHolderID("holder"), natsputex.WithFailureThreshold(F))
	other := newTestClient(t, url, bucket, natsputex.WithHolderID("other"), natsputex.WithFailureThreshold(F))
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	lease, err := holder.Locker().TryLock(ctx, "job")
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(2 * testR)
	proxy.DelayReplies(300 * time.Millisecond)
	time.Sleep(3 * testR / 2) // a round began within R and waits for its reply
	rctx, rcancel := context.WithTimeout(ctx, 20*time.Millisecond)
	rerr := lease.Release(rctx)
	rcancel()
	cctx, ccancel := context.WithTimeout(ctx, 5*time.Second)
	began := time.Now()
	cerr := holder.Close(cctx)
	ccancel()
	closed := time.Now()
	t.Logf("Release: %v; Close took %v: %v", rerr, ms(closed.Sub(began)), cerr)
	if rerr != nil && !errors.Is(rerr, context.DeadlineExceeded) {
		t.Errorf("Release returned %v: neither nil nor ctx's error", rerr)
	}
	if cerr != nil {
		t.Errorf("Close with 5s: %v", cerr)
	}
	l, err := other.Locker().TryLock(ctx, "job")
	if err != nil {
		t.Fatalf("another client's TryLock %v after Close returned: %v (the released key was not blanked)", ms(time.Since(closed)), err)
	}
	_ = l.Release(ctx)
}
