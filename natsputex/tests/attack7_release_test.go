package natsputex_test

// Attack round 7 (see attack7_test.go), continued: Release, a Supervisor's
// blank on shutdown and Client.Close made while nats.go reconnects.

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/latchkey-go/latchkey/contracttest"
	"github.com/latchkey-go/latchkey/contracttest/testenv"
	"github.com/latchkey-go/latchkey/locks"
	"github.com/latchkey-go/latchkey/natsputex"
)

// blanks returns the empty writes (blanks, deletes) stored after t.
func blanks(w *keyWatch, t time.Time) []keyWrite { return nodeWrites(w, "", t) }

// holdAndCut7 takes key with holder's TryLock and, if waiter is not nil,
// starts waiter's Lock of it (ctx 10s); 3R later it cuts l halfway
// between two renewals of the lease and waits for nats.go to see it. It
// returns the lease, its token in the key, the waiting Lock and the time
// of the cut.
func holdAndCut7(t *testing.T, l *link7, holder, waiter *natsputex.Client, writes *keyWatch, key string) (lease locks.Lease, token string, waiting <-chan outcome, cut time.Time) {
	t.Helper()
	lease, err := holder.Locker().TryLock(context.Background(), key)
	if err != nil {
		t.Fatal(err)
	}
	token = writeAt(t, writes, lease.Token()).value
	if waiter != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		t.Cleanup(cancel)
		waiting = goLock(ctx, waiter.Locker(), key, false)
	}
	time.Sleep(3 * testR)
	cut = cutAfterRenewal(t, writes, token, l.proxy.Cut)
	waitFor(t, 2*time.Second, "nats.go sees the link cut", l.nc.IsReconnecting)
	return lease, token, waiting, cut
}

// TestAttack7ReleaseDuringReconnect: ConnectOptions: a write refused while
// nats.go reconnects is sent again once the connection is back, "while
// the write's own bound lasts"; "Release blanks the key, conditioned on
// the lease's last revision ...: a stale release never frees a
// successor"; a Release "made after a restart of the server wakes a
// waiter at once". A Locker lease is held by a client whose link is cut
// halfway between two renewals; another client waits in Lock on a direct
// link; Release is called while nats.go reconnects:
//   - long-ctx (F = 20: T = 2s; Release's ctx 3s; link back after 150ms):
//     Release must return nil once back (within 200ms of the reconnect),
//     the key be blanked after the reconnect, and the waiter get it within
//     500ms of the blank, long before T.
//   - short-ctx (F = 20, ctx 50ms; link back after 250ms): Release must
//     return within 50ms (+60ms), nil or ctx's error ("the name is freed
//     without ctx (background or TTL)"): the waiter must get the key by
//     T + C·R + R (+0.5s) after the lease's last write; whether the blank
//     was sent again once back is logged.
//   - past-deadline (F = 3: T = 300ms, validity 250ms; ctx 2s; link back
//     after 450ms): the lease runs out during the cut and the waiter takes
//     the key over T after its last write; the blank, conditional on the
//     lease's revision, must never land after the waiter's write.
//
// In each, the waiter's lease is granted only once the holder's has ended.
func TestAttack7ReleaseDuringReconnect(t *testing.T) {
	for _, tc := range []struct {
		name           string
		F              int
		ctx, down      time.Duration
		blankPromptly  bool
		leaseOutlasted bool
	}{
		{"long-ctx", 20, 3 * time.Second, 150 * time.Millisecond, true, false},
		{"short-ctx", 20, 50 * time.Millisecond, 250 * time.Millisecond, false, false},
		{"past-deadline", 3, 2 * time.Second, 450 * time.Millisecond, false, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			T := time.Duration(tc.F) * testR
			url, bucket, key := atk4Env(t)
			writes := watchWrites(t, url, bucket, key)
			l := dial7(t, url)
			timing := []natsputex.Option{natsputex.WithFailureThreshold(tc.F)}
			holder := l.client(t, bucket, append(timing, natsputex.WithHolderID("holder"))...)
			waiter := newTestClient(t, url, bucket, append(timing, natsputex.WithHolderID("waiter"))...)
			g := newGrants()
			lease, token, waiting, cut := holdAndCut7(t, l, holder, waiter, writes, key)
			g.grant("holder", lease)
			last, _ := writes.lastBy(token, cut)
			rctx, rcancel := context.WithTimeout(context.Background(), tc.ctx)
			defer rcancel()
			released := make(chan outcome, 1)
			began := time.Now()
			go func() { err := lease.Release(rctx); released <- outcome{err: err, at: time.Now()} }()
			time.Sleep(time.Until(cut.Add(tc.down)))
			back := l.restore(t)
			r := waitOutcome(t, released, tc.ctx+3*time.Second, "Release")
			w := waitOutcome(t, waiting, 5*time.Second, "the waiter's Lock")
			if w.err != nil {
				t.Fatalf("the waiter's Lock: %v", w.err)
			}
			defer func() { _ = w.lease.Release(context.Background()) }()
			g.grant("waiter", w.lease)
			ww := writeAt(t, writes, w.lease.Token())
			bl := blanks(writes, cut)
			t.Logf("Release began %v after the cut, the link back %v after it; Release returned %v after it began (%v after the reconnect): %v; blanks after the cut: %d; the waiter's write (rev %d) stored %v after the holder's last write (rev %d), %v after the reconnect",
				ms(began.Sub(cut)), ms(back.Sub(cut)), ms(r.at.Sub(began)), ms(r.at.Sub(back)), r.err, len(bl), ww.rev, ms(ww.created.Sub(last.created)), last.rev, ms(ww.created.Sub(back)))
			for _, b := range bl {
				t.Logf("  blank rev %d stored %v after the reconnect", b.rev, ms(b.created.Sub(back)))
				if b.rev > ww.rev {
					t.Errorf("the holder's blank (rev %d) landed after the waiter took the key (rev %d): a stale release freed a successor", b.rev, ww.rev)
				}
			}
			if lease.Context().Err() == nil {
				t.Error("the lease is still live after Release returned")
			}
			switch {
			case tc.blankPromptly:
				if r.err != nil {
					t.Errorf("Release with %v of ctx, the link back after %v: %v", tc.ctx, tc.down, r.err)
				}
				if d := r.at.Sub(back); d > 200*time.Millisecond {
					t.Errorf("Release returned %v after the reconnect, not once the blank was sent again", ms(d))
				}
				if len(bl) == 0 {
					t.Fatal("the key was not blanked after the reconnect")
				}
				if d := ww.created.Sub(bl[0].created); d > 500*time.Millisecond {
					t.Errorf("the waiter took the key %v after the blank, not at once", ms(d))
				}
			case tc.leaseOutlasted:
				if d := ww.created.Sub(last.created); d < T-10*time.Millisecond {
					t.Errorf("the waiter took the key %v after the holder's last write, before T = %v", ms(d), T)
				}
			default:
				if d := r.at.Sub(began); d > tc.ctx+slack6 {
					t.Errorf("Release returned %v after it began, later than its ctx (%v, +%v)", ms(d), tc.ctx, slack6)
				}
				if r.err != nil && !errors.Is(r.err, context.DeadlineExceeded) {
					t.Errorf("Release returned %v: neither nil nor ctx's error", r.err)
				}
				if d := ww.created.Sub(last.created); d > T+testC*testR+testR+500*time.Millisecond {
					t.Errorf("the waiter took the key %v after the holder's last write, later than T + C·R + R (+0.5s)", ms(d))
				}
			}
			g.check(t)
		})
	}
}

// TestAttack7SupervisorBlankDuringReconnect: Run: "Then it stops the
// service, blanks the key if it still holds the agent's last write (so
// another agent takes over at once ...)"; "When Run's context ends ...
// the agent still holds the key while Stop runs, and renews it";
// ConnectOptions: the refused write (here the blank, and renewals) is sent
// again once the connection is back. node-a (R = 100ms, F = 10, C = 1) is
// active behind a proxy, node-b stands by on a direct link. node-a's link
// is cut halfway between two renewals, its Run's context cancelled (Stop
// takes 20ms), and the link restored 200ms after the cut: the key must be
// blanked after the reconnect (node-a's last write before it being
// node-a's), node-b start within 500ms of that blank (not T + C·R after
// node-a's last write), after node-a's Stop returned, and the services
// never overlap.
func TestAttack7SupervisorBlankDuringReconnect(t *testing.T) {
	const F = 10
	url, bucket, key := atk4Env(t)
	writes := watchWrites(t, url, bucket, key)
	proxy := testenv.NewProxy(t, strings.TrimPrefix(url, "nats://"))
	h := contracttest.NewHistory(1)
	a, b := activeAndStandby(t, "nats://"+proxy.Addr(), url, bucket, key, h, 20*time.Millisecond, natsputex.WithFailureThreshold(F))
	time.Sleep(2 * testR)
	cut := cutAfterRenewal(t, writes, "node-a", proxy.Cut)
	waitFor(t, 2*time.Second, "node-a's connection reconnects", a.nc.IsReconnecting)
	a.cancel()
	time.Sleep(time.Until(cut.Add(200 * time.Millisecond)))
	proxy.Restore()
	waitFor(t, 3*time.Second, "node-a's connection is back", a.nc.IsConnected)
	back := time.Now()
	if _, ok := a.wait(5 * time.Second); !ok {
		t.Fatal("node-a's Run did not return")
	}
	waitFor(t, 5*time.Second, "node-b starts", b.running)
	bStart := b.getStarts()[0]
	bl := blanks(writes, cut)
	stop, _ := a.firstStopAfter(cut)
	t.Logf("node-a's link back %v after the cut; its Stop ran %v–%v after it; blanks after the cut: %d; node-b started %v after the reconnect", ms(back.Sub(cut)), ms(stop.begin.Sub(cut)), ms(stop.end.Sub(cut)), len(bl), ms(bStart.begin.Sub(back)))
	if len(bl) == 0 {
		t.Error("node-a's blank was not sent again once its connection was back")
	} else {
		prev, _ := writeBefore(writes, "node-a", bl[0].rev)
		t.Logf("blank rev %d stored %v after the reconnect; node-a's write before it rev %d", bl[0].rev, ms(bl[0].created.Sub(back)), prev.rev)
		if d := bStart.begin.Sub(bl[0].created); d > 500*time.Millisecond {
			t.Errorf("node-b started %v after the blank, not at once", ms(d))
		}
	}
	if bStart.begin.Before(stop.end) {
		t.Errorf("node-b started %v before node-a's Stop returned", ms(stop.end.Sub(bStart.begin)))
	}
	stopNodes(b)
	if err := h.Check(); err != nil {
		t.Errorf("services overlapped: %v", err)
	}
}

// TestAttack7CloseDuringReconnect: Client.Close "ends every lease of the
// client with a cause matching locks.ErrLost and locks.ErrClosed, then
// blanks their keys ..., makes waiting calls ... return ... Every wait is
// bounded by ctx: when ctx ends first, Close returns an error matching
// ctx.Err() and the rest finishes in the background"; ConnectOptions: a
// refused write is sent again once back, while its bound lasts. A client
// (R = 100ms, F = 10: T = 1s) behind a proxy holds two leases ("a", "b")
// and waits in Lock for "c" (written by hand); its link is cut and, while
// nats.go reconnects, Close is called with a 200ms ctx. Close must return
// within 200ms (+60ms), nil or ctx's error; the leases must have ended
// with ErrLost and ErrClosed, the Lock returned ErrClosed by then.
//   - back: the link is restored 100ms after Close returned: "a" and "b"
//     must be blanked after the reconnect (the rest finishing in the
//     background) and taken at once by another client's TryLock; none of
//     natsputex's goroutines may outlive max(T, 1s) + 0.5s.
//   - never-back: the link stays cut: none of natsputex's goroutines may
//     outlive max(T, 1s) + 0.5s (a write waiting for a reconnect that does
//     not come), the connection still reconnecting.
func TestAttack7CloseDuringReconnect(t *testing.T) {
	const F = 10
	const T = F * testR
	for _, back := range []bool{true, false} {
		name := "back"
		if !back {
			name = "never-back"
		}
		t.Run(name, func(t *testing.T) {
			url, bucket, _ := atk4Env(t)
			kv := mustBucket(t, url, bucket)
			writes := map[string]*keyWatch{"a": watchWrites(t, url, bucket, "a"), "b": watchWrites(t, url, bucket, "b")}
			if _, err := kv.Put(context.Background(), "c", []byte("ghost")); err != nil {
				t.Fatal(err)
			}
			before := libGoroutines()
			l := dial7(t, url)
			c, err := natsputex.New(context.Background(), l.js, bucket, natsputex.WithRenewInterval(testR), natsputex.WithFailureThreshold(F), natsputex.WithHolderID("closer"))
			if err != nil {
				t.Fatal(err)
			}
			var leases []locks.Lease
			for _, name := range []string{"a", "b"} {
				lease, err := c.Locker().TryLock(context.Background(), name)
				if err != nil {
					t.Fatal(err)
				}
				leases = append(leases, lease)
			}
			waiting := goLock(context.Background(), c.Locker(), "c", false)
			time.Sleep(3 * testR)
			cut := l.cut(t)
			ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
			defer cancel()
			began := time.Now()
			err = c.Close(ctx)
			returned := time.Now()
			t.Logf("Close began %v after the cut, returned %v after it began: %v", ms(began.Sub(cut)), ms(returned.Sub(began)), err)
			if d := returned.Sub(began); d > 200*time.Millisecond+slack6 {
				t.Errorf("Close returned %v after it began, later than its ctx (200ms, +%v)", ms(d), slack6)
			}
			if err != nil && !errors.Is(err, context.DeadlineExceeded) {
				t.Errorf("Close returned %v: neither nil nor ctx's error", err)
			}
			for i, lease := range leases {
				if cause := context.Cause(lease.Context()); !errors.Is(cause, locks.ErrLost) || !errors.Is(cause, locks.ErrClosed) {
					t.Errorf("lease %d ended with %v, not ErrLost and ErrClosed", i, cause)
				}
			}
			select {
			case o := <-waiting:
				if !errors.Is(o.err, locks.ErrClosed) {
					t.Errorf("the waiting Lock returned %v, not ErrClosed", o.err)
				}
			case <-time.After(testR):
				t.Error("the waiting Lock had not returned within R of Close's return")
			}
			var up time.Time
			if back {
				time.Sleep(100 * time.Millisecond)
				up = l.restore(t)
			}
			left := newLibGoroutines(before, max(T, time.Second)+500*time.Millisecond)
			t.Logf("natsputex goroutines left %v after Close returned: %d (connection reconnecting: %v)", ms(time.Since(returned)), len(left), l.nc.IsReconnecting())
			for _, g := range left {
				t.Errorf("a goroutine outlived Close by %v (back: %v):\n%s", ms(time.Since(returned)), back, g)
			}
			if !back {
				return
			}
			other := newTestClient(t, url, bucket, natsputex.WithFailureThreshold(F), natsputex.WithHolderID("other"))
			for _, name := range []string{"a", "b"} {
				bl := blanks(writes[name], cut)
				if len(bl) == 0 {
					t.Errorf("%q was not blanked once the connection was back (%v after Close returned)", name, ms(up.Sub(returned)))
				} else {
					t.Logf("%q blanked (rev %d) %v after the reconnect", name, bl[0].rev, ms(bl[0].created.Sub(up)))
				}
				lease, err := other.Locker().TryLock(context.Background(), name)
				if err != nil {
					t.Errorf("another client's TryLock of %q after Close: %v", name, err)
				} else {
					_ = lease.Release(context.Background())
				}
			}
		})
	}
}
