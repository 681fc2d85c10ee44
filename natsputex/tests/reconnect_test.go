package natsputex_test

// Reconnects: a request nats.go refused while it reconnects is sent again
// once the connection is back (ConnectOptions), waiting calls look again,
// and a link cut or black-holed ends no lease that could renew in time.

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"go.uber.org/goleak"

	"github.com/latchkey-go/latchkey/contracttest"
	"github.com/latchkey-go/latchkey/contracttest/testenv"
	"github.com/latchkey-go/latchkey/contracttest/testenv/natsenv"
	"github.com/latchkey-go/latchkey/locks"
	"github.com/latchkey-go/latchkey/natsputex"
)

// TestConfirmationAcrossLinkCut: a Supervisor "starts the service only once
// C intervals (C·R) have passed since its first write of the hold was
// answered as a success, every write since having succeeded too"; a
// confirmation write refused while nats.go reconnects is sent again once
// back (ConnectOptions), and a holder "cut off from NATS ends its lease by
// itself once T − margin has passed since its last successful write
// began"; a confirmer that gives up "never blanks the key". node-a
// (direct, R = 100ms, F = 3, C = 3) is killed; node-b (behind a proxy,
// C = 3) takes over and, while it confirms, its link is cut:
//   - short (restored after 90ms: nats.go back 100–200ms after the cut,
//     within its validity of 250ms): its confirmation writes are sent
//     again once back; it starts C·R after its takeover write.
//   - long (400ms, longer than its validity): it must give up without
//     blanking; node-c (direct, C = 3), started during the cut, may take
//     the key only T after node-b's last write.
//
// Every Start comes T after another token's write and C·R after its first
// write (checkTakeovers); the services never overlap.
func TestConfirmationAcrossLinkCut(t *testing.T) {
	const (
		C = 3
		T = testF * testR
	)
	for _, tc := range []struct {
		name string
		down time.Duration
	}{{"short", 90 * time.Millisecond}, {"long", 400 * time.Millisecond}} {
		t.Run(tc.name, func(t *testing.T) {
			p := newProxiedEnv(t)
			opts := []natsputex.Option{natsputex.WithConfirmations(C)}
			a, b := activeAndStandby(t, p.url, p.addr(), p.bucket, p.key, p.h, 20*time.Millisecond, opts...)
			time.Sleep(2 * testR)
			afterRenewal(t, p.writes, "node-a", 0, a.kill)
			waitFor(t, 3*time.Second, "node-b confirms", func() bool { return b.sup.Phase() == natsputex.PhaseConfirming })
			took := nodeWrites(p.writes, "node-b", time.Time{})[0]
			time.Sleep(testR)
			cut := time.Now()
			p.proxy.Cut()
			waitFor(t, 2*time.Second, "node-b's connection reconnects", b.nc.IsReconnecting)
			nodes := []*node{b}
			if tc.name == "long" {
				nodes = append(nodes, startNode(t, p.url, p.bucket, p.key, "node-c", p.h, onConnectOptions(), withClientOptions(opts...)))
			}
			time.Sleep(time.Until(cut.Add(tc.down)))
			p.proxy.Restore()
			waitFor(t, 3*time.Second, "node-b's connection is back", b.nc.IsConnected)
			back := time.Now()
			up := waitActiveNode(t, 5*time.Second, nodes...)
			time.Sleep(T + C*testR)
			bl := blanks(p.writes, cut)
			stopNodes(nodes...)
			t.Logf("%s: node-b's takeover write rev %d; cut %v after it for %v (back %v after the cut); %s active, %d blanks since the cut",
				tc.name, took.rev, ms(cut.Sub(took.created)), tc.down, ms(back.Sub(cut)), up.name, len(bl))
			p.writes.logAll(t, cut)
			if tc.name == "long" && len(bl) > 0 {
				t.Error("node-b, cut off while it confirmed, blanked the key")
			}
			for _, n := range nodes {
				checkTakeovers(t, p.writes, n, T, C*testR)
			}
			if err := p.h.Check(); err != nil {
				t.Errorf("services overlapped: %v", err)
			}
		})
	}
}

// TestSupervisorTakeoverAcrossLinkCut: TestServerRestartAtTakeoverWrite through
// a proxy, node-b's link cut by its Standby check before its takeover
// write and restored 90ms later (nats.go back 100–200ms after the cut,
// within node-b's validity of 250ms) or 300ms later (after it). Every
// Start must come T after another token's write and C·R after its first
// write (checkTakeovers); one agent must run the service within T + C·R +
// the cut + 2R (+0.5s) of node-a's last write; the services never
// overlap. What node-b did with a write that landed after its validity is
// logged.
func TestSupervisorTakeoverAcrossLinkCut(t *testing.T) {
	const (
		C = 2
		T = testF * testR
	)
	for _, down := range []time.Duration{90 * time.Millisecond, 300 * time.Millisecond} {
		t.Run(down.String(), func(t *testing.T) {
			p := newProxiedEnv(t)
			_, b, lastA, cut := faultAtTakeover(t, p.url, p.addr(), p.bucket, p.key, p.writes, p.h, p.proxy.Cut)
			time.Sleep(time.Until(cut.Add(down)))
			p.proxy.Restore()
			waitFor(t, 3*time.Second, "node-b's connection is back", b.nc.IsConnected)
			back := time.Now()
			waitFor(t, 5*time.Second, "node-b starts", b.running)
			st := b.getStarts()[0]
			stopNodes(b)
			t.Logf("cut %v after node-a's last write, back %v after the cut; node-b started %v after node-a's last write", ms(cut.Sub(lastA.created)), ms(back.Sub(cut)), ms(st.begin.Sub(lastA.created)))
			p.writes.logAll(t, back)
			for _, e := range eventsAfter(b, cut) {
				t.Logf("  node-b: %v", e)
			}
			if bound := T + C*testR + back.Sub(cut) + 2*testR + 500*time.Millisecond; st.begin.Sub(lastA.created) > bound {
				t.Errorf("node-b started %v after node-a's last write, later than T + C·R + the cut + 2R (+0.5s) = %v", ms(st.begin.Sub(lastA.created)), ms(bound))
			}
			checkTakeovers(t, p.writes, b, T, C*testR)
			if err := p.h.Check(); err != nil {
				t.Errorf("services overlapped: %v", err)
			}
		})
	}
}

// TestReleaseDuringReconnect: ConnectOptions: a write refused while
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
func TestReleaseDuringReconnect(t *testing.T) {
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
			url, bucket, key := localEnv(t)
			writes := watchWrites(t, url, bucket, key)
			l := dialLink(t, url)
			timing := []natsputex.Option{natsputex.WithFailureThreshold(tc.F)}
			holder := l.client(t, bucket, append(timing, natsputex.WithHolderID("holder"))...)
			waiter := newTestClient(t, url, bucket, append(timing, natsputex.WithHolderID("waiter"))...)
			g := newGrants()
			lease, token, waiting, cut := holdAndCut(t, l, holder, waiter, writes, key)
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
				if d := r.at.Sub(began); d > tc.ctx+timingSlack {
					t.Errorf("Release returned %v after it began, later than its ctx (%v, +%v)", ms(d), tc.ctx, timingSlack)
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

// TestSupervisorBlankDuringReconnect: Run: "Then it stops the
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
func TestSupervisorBlankDuringReconnect(t *testing.T) {
	const F = 10
	url, bucket, key := localEnv(t)
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

// TestCloseDuringReconnect: Client.Close "ends every lease of the
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
func TestCloseDuringReconnect(t *testing.T) {
	const F = 10
	const T = F * testR
	for _, back := range []bool{true, false} {
		name := "back"
		if !back {
			name = "never-back"
		}
		t.Run(name, func(t *testing.T) {
			url, bucket, _ := localEnv(t)
			kv := mustBucket(t, url, bucket)
			writes := map[string]*keyWatch{"a": watchWrites(t, url, bucket, "a"), "b": watchWrites(t, url, bucket, "b")}
			if _, err := kv.Put(context.Background(), "c", []byte("ghost")); err != nil {
				t.Fatal(err)
			}
			before := goleak.IgnoreCurrent()
			l := dialLink(t, url)
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
			if d := returned.Sub(began); d > 200*time.Millisecond+timingSlack {
				t.Errorf("Close returned %v after it began, later than its ctx (200ms, +%v)", ms(d), timingSlack)
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
			left := goroutinesLeft(before, max(T, time.Second)+500*time.Millisecond)
			if left == nil {
				t.Logf("no goroutine of the client left %v after Close returned (connection reconnecting: %v)", ms(time.Since(returned)), l.nc.IsReconnecting())
			} else {
				t.Errorf("goroutines outlived Close by %v (back: %v): %v", ms(time.Since(returned)), back, left)
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

// TestRenewalResentAfterReconnect: "a write that nats.go refused to send
// while it reconnects has not failed: it is sent again once the connection
// is back, see ConnectOptions"; ConnectOptions: "natsputex sends such a
// write again itself once the connection is back, while the write's own
// bound lasts (a renewal's: the lease's validity), so a holder whose server
// restarted within that keeps its lease". A Locker lease (R = 100ms) is held
// by a client whose link is cut halfway between two renewals:
//   - back-in-time (F = 10: validity 950ms): cut for 200–400ms, three
//     times. The lease must stay live and a renewal of its token land
//     within 50ms of nats.go's reconnect (it was due during the cut).
//   - taken-meanwhile (F = 10): during the cut the key is written by hand
//     ("intruder"). The resent renewal is conditional on the lease's
//     revision: it must be refused, the lease end with ErrLost within R
//     (plus slack measured in the test) of the reconnect, its token never be written after the
//     intruder's, and Release leave the intruder's write.
//   - past-deadline (F = 3: T = 300ms, margin 50ms): five rounds, each a
//     fresh key held by the cut client with a waiter on a direct link;
//     the link is restored 150ms, 80ms, 30ms before the lease's deadline,
//     at it, and 200ms after it (down longer than T). The lease must end
//     by its deadline (+3ms: watchValidity), no write of its token be
//     stored after its final deadline, give or take a trip to the server
//     measured in the test (a resent renewal past the bound would make
//     the key look held by a dead lease), nor after the
//     waiter's takeover; the waiter must take the key T after the
//     holder's last write and hold it only once the lease has ended.
func TestRenewalResentAfterReconnect(t *testing.T) {
	t.Run("back-in-time", func(t *testing.T) {
		const F = 10
		url, bucket, key := localEnv(t)
		writes := watchWrites(t, url, bucket, key)
		l := dialLink(t, url)
		c := l.client(t, bucket, natsputex.WithFailureThreshold(F), natsputex.WithHolderID("holder"))
		v := watchValidity(t)
		lease, err := c.Locker().TryLock(context.Background(), key)
		if err != nil {
			t.Fatal(err)
		}
		v.add("holder", lease)
		token := writeAt(t, writes, lease.Token()).value
		for i, down := range []time.Duration{200 * time.Millisecond, 300 * time.Millisecond, 400 * time.Millisecond} {
			time.Sleep(3 * testR)
			cut := cutAfterRenewal(t, writes, token, l.proxy.Cut)
			waitFor(t, 2*time.Second, "nats.go sees the link cut", l.nc.IsReconnecting)
			time.Sleep(time.Until(cut.Add(down)))
			back := l.restore(t)
			waitFor(t, 2*time.Second, "a renewal after the reconnect", func() bool { return len(nodeWrites(writes, token, cut)) > 0 })
			first := nodeWrites(writes, token, cut)[0]
			t.Logf("round %d: link cut for %v, back %v after the cut; the first renewal since (rev %d) stored %v after the reconnect; lease live: %v",
				i, ms(down), ms(back.Sub(cut)), first.rev, ms(first.created.Sub(back)), lease.Context().Err() == nil)
			if d := first.created.Sub(back); d > 50*time.Millisecond {
				t.Errorf("round %d: the renewal refused during the cut landed %v after the reconnect, not once the connection was back (resent every ~10ms)", i, ms(d))
			}
			if err := lease.Context().Err(); err != nil {
				t.Fatalf("round %d: the lease ended though the link was back %v after its last renewal, within its validity (950ms): %v", i, ms(back.Sub(cut)), context.Cause(lease.Context()))
			}
		}
		if err := lease.Release(context.Background()); err != nil {
			t.Errorf("Release: %v", err)
		}
		v.check(t)
	})

	t.Run("taken-meanwhile", func(t *testing.T) {
		const F = 10
		url, bucket, key := localEnv(t)
		writes := watchWrites(t, url, bucket, key)
		kv := mustBucket(t, url, bucket)
		l := dialLink(t, url)
		c := l.client(t, bucket, natsputex.WithFailureThreshold(F), natsputex.WithHolderID("holder"))
		direct, _, err := connect(url)
		if err != nil {
			t.Fatal(err)
		}
		defer direct.Close()
		bound := contracttest.MeasureBound(t, testR, direct.Flush)
		lease, _, _, cut := holdAndCut(t, l, c, nil, writes, key)
		time.Sleep(30 * time.Millisecond)
		irev, err := kv.Put(context.Background(), key, []byte("intruder"))
		if err != nil {
			t.Fatal(err)
		}
		time.Sleep(time.Until(cut.Add(250 * time.Millisecond)))
		stopWatch := bound.Watch()
		back := l.restore(t)
		waitFor(t, 2*time.Second, "the lease ends", func() bool { return lease.Context().Err() != nil })
		ended := time.Now()
		stopWatch()
		t.Logf("intruder at rev %d; link back %v after the cut; the lease ended %v after the reconnect: %v",
			irev, ms(back.Sub(cut)), ms(ended.Sub(back)), context.Cause(lease.Context()))
		if !errors.Is(context.Cause(lease.Context()), locks.ErrLost) {
			t.Errorf("the lease ended with %v, not ErrLost", context.Cause(lease.Context()))
		}
		bound.Check(t, "the lease's end after the reconnect (its resent renewal should have been refused at once)", ended.Sub(back))
		time.Sleep(3 * testR)
		err = lease.Release(context.Background())
		t.Logf("Release: %v", err)
		if err == nil || !errors.Is(err, locks.ErrLost) {
			t.Errorf("Release of the lost lease returned %v, want an error matching ErrLost", err)
		}
		time.Sleep(testR)
		for _, w := range writes.all() {
			if w.rev > irev {
				t.Errorf("the key was written after the intruder (rev %d): rev %d %q", irev, w.rev, w.value)
			}
		}
		if e, err := kv.Get(context.Background(), key); err != nil || e.Revision() != irev {
			t.Errorf("the key: %v %v; want the intruder's write, rev %d", e, err, irev)
		}
	})

	t.Run("past-deadline", func(t *testing.T) {
		const T = testF * testR
		url, bucket, _ := localEnv(t)
		l := dialLink(t, url)
		holder := l.client(t, bucket, natsputex.WithHolderID("holder"))
		waiter := newTestClient(t, url, bucket, natsputex.WithHolderID("waiter"))
		v := watchValidity(t)
		g := newGrants()
		// A write sent before the deadline is stored a trip later: the
		// slack for "stored after the deadline" is measured, a round trip
		// to the server and the scheduler's stalls while the round runs.
		direct, _, err := connect(url)
		if err != nil {
			t.Fatal(err)
		}
		defer direct.Close()
		bound := contracttest.MeasureBound(t, 0, direct.Flush)
		for i, off := range []time.Duration{-150 * time.Millisecond, -80 * time.Millisecond, -30 * time.Millisecond, 0, 200 * time.Millisecond} {
			key := fmt.Sprintf("job%d", i)
			writes := watchWrites(t, url, bucket, key)
			lease, token, waiting, cut := holdAndCut(t, l, holder, waiter, writes, key)
			v.add(key+" holder", lease)
			g.grant(key+" holder", lease)
			dl := lease.(interface{ Deadline() time.Time }).Deadline()
			stopWatch := bound.Watch()
			time.Sleep(time.Until(dl.Add(off)))
			back := l.restore(t)
			time.Sleep(2 * T)
			survived := lease.Context().Err() == nil
			if survived {
				_ = lease.Release(context.Background())
			}
			stopWatch()
			w := waitOutcome(t, waiting, 5*time.Second, "the waiter's Lock")
			if w.err != nil {
				t.Fatalf("%s: the waiter's Lock: %v", key, w.err)
			}
			g.grant(key+" waiter", w.lease)
			v.add(key+" waiter", w.lease)
			final := lease.(interface{ Deadline() time.Time }).Deadline()
			last, _ := writes.lastBy(token, time.Now())
			ww := writeAt(t, writes, w.lease.Token())
			t.Logf("%s: restored %v from the deadline at the cut; back %v after the cut (deadline %v after it); lease survived: %v, its last write rev %d, final deadline %v after the cut; the waiter took rev %d %v after that write",
				key, off, ms(back.Sub(cut)), ms(dl.Sub(cut)), survived, last.rev, ms(final.Sub(cut)), ww.rev, ms(ww.created.Sub(last.created)))
			for _, hw := range nodeWrites(writes, token, cut) {
				if slack := 2*time.Millisecond + bound.RoundTrip + 2*bound.Scheduler; hw.created.After(final.Add(slack)) {
					t.Errorf("%s: the holder's token was written (rev %d) %v after its lease's deadline, more than the slack %v (2ms + round trip %v + 2 × scheduler stall %v): a write resent past its bound",
						key, hw.rev, ms(hw.created.Sub(final)), ms(slack), ms(bound.RoundTrip), ms(bound.Scheduler))
				}
				if hw.rev > ww.rev {
					t.Errorf("%s: the holder's token was written (rev %d) after the waiter took the key (rev %d)", key, hw.rev, ww.rev)
				}
			}
			if !survived {
				if d := ww.created.Sub(last.created); d < T-10*time.Millisecond {
					t.Errorf("%s: the waiter took the key %v after the holder's last write, before T = %v", key, ms(d), T)
				}
			}
			_ = w.lease.Release(context.Background())
		}
		v.check(t)
		g.check(t)
	})
}

// TestTakeRefusedDuringReconnectIsResent: Lock: "A write that would take the
// key is not interrupted when ctx ends (it could land all the same, and
// leave the key held by no one for T): Lock then returns once it is
// answered, at most max(T, 1s) later, with the lease if the write won the
// key"; "On failure Lock returns an error and holds nothing; when ctx ends
// first, the error matches ctx.Err()"; a takeover "given up before its C
// intervals of confirmation are done (ctx ended ...) leaves its last write";
// ConnectOptions: a write refused while nats.go reconnects is sent again
// once the connection is back. A key is written by hand ("ghost", no
// timing); a client (R = 100ms, F = 3, C = 0 or 1) behind a proxy takes it
// over with Lock (waiting for it) or TryLock (made once it is silent for T).
// Its health check, told Standby before the takeover write, cuts the link
// and returns once nats.go reconnects, so the write is refused; the link is
// restored 90ms later ("fast": nats.go is back 100–200ms after the cut,
// within the lease's validity T − margin = 250ms) or 300ms later ("slow":
// back after the validity, within the take's bound max(T, 1s)). With a long
// ctx a Lock must return the lease (a TryLock may fail, holding nothing):
// its write stored after the cut, T after the ghost's, the call returning
// C·R after it. With a ctx that ends 40–60ms into the cut, the call must
// return within max(T, 1s) (+60ms) of the ctx's end, with the lease (live,
// its token the key's revision) or with ctx's error. With C = 0 a failed
// call means no write of its token may be stored ("with the lease if the
// write won the key"; else the key is held by no one for T). Then a third
// client's TryLock must take the key within C·R + R (+0.3s) once it is T
// silent.
func TestTakeRefusedDuringReconnectIsResent(t *testing.T) {
	const T = testF * testR
	for _, tc := range []struct {
		name string
		C    int
		long bool
		try  bool
		down time.Duration // from the cut to the restore
	}{
		{"lock-C0-ctx-long-fast", 0, true, false, 90 * time.Millisecond},
		{"lock-C0-ctx-long-slow", 0, true, false, 300 * time.Millisecond},
		{"lock-C0-ctx-ends-fast", 0, false, false, 90 * time.Millisecond},
		{"lock-C0-ctx-ends-slow", 0, false, false, 300 * time.Millisecond},
		{"lock-C1-ctx-long-fast", 1, true, false, 90 * time.Millisecond},
		{"lock-C1-ctx-ends-slow", 1, false, false, 300 * time.Millisecond},
		{"trylock-C0-ctx-long-fast", 0, true, true, 90 * time.Millisecond},
		{"trylock-C0-ctx-long-slow", 0, true, true, 300 * time.Millisecond},
		{"trylock-C0-ctx-ends-slow", 0, false, true, 300 * time.Millisecond},
	} {
		t.Run(tc.name, func(t *testing.T) {
			url, bucket, key := localEnv(t)
			writes := watchWrites(t, url, bucket, key)
			kv := mustBucket(t, url, bucket)
			l := dialLink(t, url)
			var armed atomic.Pointer[time.Time]
			hc, cuts := faultHook(&armed, l.proxy.Cut, l.nc.IsReconnecting)
			taker := l.client(t, bucket, natsputex.WithConfirmations(tc.C), natsputex.WithHolderID("taker"), natsputex.WithHealthCheck(hc))
			third := newTestClient(t, url, bucket, natsputex.WithHolderID("third"))
			grev, err := kv.Put(context.Background(), key, []byte("ghost"))
			if err != nil {
				t.Fatal(err)
			}
			ghost := writeAt(t, writes, grev)
			due := ghost.created.Add(T)
			from := due.Add(-30 * time.Millisecond)
			armed.Store(&from)
			if tc.try {
				time.Sleep(time.Until(due.Add(20 * time.Millisecond)))
			}
			ctxEnd := time.Now().Add(5 * time.Second)
			if !tc.long {
				ctxEnd = due.Add(60 * time.Millisecond)
				if tc.try {
					ctxEnd = time.Now().Add(40 * time.Millisecond)
				}
			}
			ctx, cancel := context.WithDeadline(context.Background(), ctxEnd)
			defer cancel()
			got := goLock(ctx, taker.Locker(), key, tc.try)
			var cut time.Time
			select {
			case cut = <-cuts:
			case o := <-got:
				t.Fatalf("the call returned (%v) before its Standby health check ran", o.err)
			case <-time.After(3 * time.Second):
				t.Fatal("no Standby health check before the takeover")
			}
			time.Sleep(time.Until(cut.Add(tc.down)))
			back := l.restore(t)
			bound := max(T, time.Second) + timingSlack
			o := waitOutcome(t, got, time.Until(ctxEnd.Add(bound+5*time.Second)), "the taker's call")
			if o.err == nil {
				writeAt(t, writes, o.lease.Token())
			} else {
				time.Sleep(2 * testR) // a write landing late
			}
			ws := prefixed(writes, "taker", ghost.created)
			t.Logf("cut by the Standby check %v after the takeover was due, back %v after the cut; ctx ends %v after the cut; the call returned %v after the cut (%v after the ctx's end): lease %v, err %v; taker's writes: %d",
				ms(cut.Sub(due)), ms(back.Sub(cut)), ms(ctxEnd.Sub(cut)), ms(o.at.Sub(cut)), ms(o.at.Sub(ctxEnd)), o.lease != nil, o.err, len(ws))
			for _, w := range ws {
				t.Logf("  taker's write rev %d stored %v after the cut, %v after the reconnect", w.rev, ms(w.created.Sub(cut)), ms(w.created.Sub(back)))
			}
			if d := o.at.Sub(ctxEnd); d > bound {
				t.Errorf("the call returned %v after its ctx ended, later than max(T, 1s) = %v (+%v)", ms(d), max(T, time.Second), timingSlack)
			}
			if o.err == nil {
				w := writeAt(t, writes, o.lease.Token())
				if !strings.HasPrefix(w.value, "taker") {
					t.Errorf("the lease's token %d is rev %d %q, not the taker's write", o.lease.Token(), w.rev, w.value)
				}
				if err := o.lease.Context().Err(); err != nil {
					t.Errorf("the lease returned was already over: %v", context.Cause(o.lease.Context()))
				}
				if d := w.created.Sub(ghost.created); d < T-10*time.Millisecond {
					t.Errorf("the taker took the key %v after the ghost's write, before T = %v", ms(d), T)
				}
				if d := o.at.Sub(w.created); d < time.Duration(tc.C)*testR-10*time.Millisecond {
					t.Errorf("the call returned %v after its takeover write was stored, before C·R = %v", ms(d), time.Duration(tc.C)*testR)
				}
				if !w.created.After(cut) {
					t.Errorf("the takeover write (rev %d) landed before the cut: the reconnect path was not exercised", w.rev)
				}
				_ = o.lease.Release(context.Background())
				return
			}
			if tc.long && !tc.try {
				t.Errorf("the Lock failed though its ctx had %v left and the link was back %v after the cut: %v", ms(ctxEnd.Sub(o.at)), ms(back.Sub(cut)), o.err)
			}
			if !o.at.Before(ctxEnd) && !errors.Is(o.err, ctx.Err()) {
				t.Errorf("the call failed with %v after its ctx ended, not an error matching %v", o.err, ctx.Err())
			}
			if tc.C == 0 {
				for _, w := range ws {
					t.Errorf("the call failed (%v) but its write rev %d won the key (stored %v after the call returned): the key is held by no one for T", o.err, w.rev, ms(w.created.Sub(o.at)))
				}
			}
			last := ghost
			if len(ws) > 0 {
				last = ws[len(ws)-1]
			}
			time.Sleep(time.Until(last.created.Add(T)))
			began := time.Now()
			lease, err := third.Locker().TryLock(context.Background(), key)
			t.Logf("a third client's TryLock, %v after the last write (rev %d %q): %v after it began: %v", ms(began.Sub(last.created)), last.rev, last.value, ms(time.Since(began)), err)
			if err != nil {
				t.Errorf("the key, silent for T, was not free to a third client's TryLock: %v", err)
			} else {
				_ = lease.Release(context.Background())
				if d := time.Since(began); d > testC*testR+testR+300*time.Millisecond {
					t.Errorf("the third client's TryLock took %v, more than C·R + R (+0.3s)", ms(d))
				}
			}
		})
	}
}

// TestWaitingLockAcrossLinkCut: "Waiting calls look at their keys again
// as soon as the connection is back, and make their KV watches again";
// "waiting calls wait ... A request sent then is not answered even after
// the election, so each is bounded ... and made again"; ConnectOptions:
// "no buffering of writes while reconnecting". A client connected with
// ConnectOptions waits in Lock (ctx 5s, the default backoff) behind a
// proxy:
//   - live-holder: the key is held by another client's lease (F = 10)
//     that renews; the waiter's link is cut for 250ms, three times. The
//     Lock must still wait after each (its polls or reads refused by
//     nats.go meanwhile are made again), and get the key within 1s of the
//     holder's Release.
//   - new-calls-while-down: a Lock and a TryLock (ctx 3s) of free keys
//     made while the link is cut (restored 200ms later). The docs speak
//     of waiting calls only: what they return is logged; a failed Lock
//     must leave no write of its token.
//   - takeover-due: the key is written by hand ("ghost") and the link is
//     cut from 60ms before the takeover is due (T after the ghost's write)
//     to 150ms after it: the Lock must return the lease, T after the
//     ghost's write.
func TestWaitingLockAcrossLinkCut(t *testing.T) {
	const T = testF * testR
	t.Run("live-holder", func(t *testing.T) {
		url, bucket, key := localEnv(t)
		l := dialLink(t, url)
		holder := newTestClient(t, url, bucket, natsputex.WithFailureThreshold(10))
		waiter := l.client(t, bucket, natsputex.WithFailureThreshold(10), natsputex.WithHolderID("waiter"))
		lease, err := holder.Locker().TryLock(context.Background(), key)
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		got := goLock(ctx, waiter.Locker(), key, false)
		time.Sleep(3 * testR)
		for i := 0; i < 3; i++ {
			cut := l.cut(t)
			time.Sleep(250 * time.Millisecond)
			back := l.restore(t)
			select {
			case o := <-got:
				t.Fatalf("cut %d: the waiting Lock returned %v after the cut (the link back %v after it), its ctx with %v left: lease %v, err %v",
					i, ms(o.at.Sub(cut)), ms(back.Sub(cut)), ms(time.Until(time.Now().Add(5*time.Second))), o.lease != nil, o.err)
			case <-time.After(300 * time.Millisecond):
				t.Logf("cut %d: link back %v after the cut; the Lock still waits", i, ms(back.Sub(cut)))
			}
		}
		released := time.Now()
		if err := lease.Release(context.Background()); err != nil {
			t.Fatal(err)
		}
		o := waitOutcome(t, got, 3*time.Second, "the waiting Lock")
		if o.err != nil {
			t.Fatalf("the waiting Lock: %v", o.err)
		}
		defer func() { _ = o.lease.Release(context.Background()) }()
		t.Logf("the waiter got the key %v after the Release", ms(o.at.Sub(released)))
		if d := o.at.Sub(released); d > time.Second {
			t.Errorf("the waiter got the key %v after the Release, not within 1s", ms(d))
		}
	})
	t.Run("new-calls-while-down", func(t *testing.T) {
		url, bucket, key := localEnv(t)
		writes := watchWrites(t, url, bucket, key)
		l := dialLink(t, url)
		c := l.client(t, bucket, natsputex.WithHolderID("caller"))
		cut := l.cut(t)
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		defer cancel()
		lock := goLock(ctx, c.Locker(), key, false)
		try := goLock(ctx, c.Locker(), key+"-try", true)
		time.Sleep(200 * time.Millisecond)
		back := l.restore(t)
		for name, ch := range map[string]<-chan outcome{"Lock": lock, "TryLock": try} {
			o := waitOutcome(t, ch, 4*time.Second, name)
			t.Logf("%s of a free key made while nats.go reconnects (ctx 3s): returned %v after the cut (link back %v after it): lease %v, err %v",
				name, ms(o.at.Sub(cut)), ms(back.Sub(cut)), o.lease != nil, o.err)
			if o.lease != nil {
				_ = o.lease.Release(context.Background())
			} else if name == "Lock" {
				time.Sleep(2 * testR)
				if ws := prefixed(writes, "caller", cut); len(ws) > 0 {
					t.Errorf("the Lock failed (%v) but its write rev %d landed %v after it returned", o.err, ws[0].rev, ms(ws[0].created.Sub(o.at)))
				}
			}
		}
	})
	t.Run("takeover-due", func(t *testing.T) {
		url, bucket, key := localEnv(t)
		writes := watchWrites(t, url, bucket, key)
		kv := mustBucket(t, url, bucket)
		l := dialLink(t, url)
		waiter := l.client(t, bucket, natsputex.WithHolderID("waiter"))
		grev, err := kv.Put(context.Background(), key, []byte("ghost"))
		if err != nil {
			t.Fatal(err)
		}
		ghost := writeAt(t, writes, grev)
		due := ghost.created.Add(T)
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		got := goLock(ctx, waiter.Locker(), key, false)
		time.Sleep(time.Until(due.Add(-60 * time.Millisecond)))
		cut := l.cut(t)
		time.Sleep(time.Until(due.Add(150 * time.Millisecond)))
		back := l.restore(t)
		o := waitOutcome(t, got, 3*time.Second, "the waiting Lock")
		t.Logf("cut %v before the takeover was due, back %v after it; the Lock returned %v after it: lease %v, err %v", ms(due.Sub(cut)), ms(back.Sub(due)), ms(o.at.Sub(due)), o.lease != nil, o.err)
		if o.err != nil {
			t.Fatalf("the waiting Lock (ctx 5s) failed %v after the cut, the link back %v after it: %v", ms(o.at.Sub(cut)), ms(back.Sub(cut)), o.err)
		}
		defer func() { _ = o.lease.Release(context.Background()) }()
		if w := writeAt(t, writes, o.lease.Token()); w.created.Sub(ghost.created) < T-10*time.Millisecond {
			t.Errorf("the waiter took the key %v after the ghost's write, before T = %v", ms(w.created.Sub(ghost.created)), T)
		}
	})
}

// goroutinesLeft waits up to within for the goroutines started since
// before (a goleak.IgnoreCurrent) to end, but those of nats.go connections
// and fault proxies the test still holds, and returns goleak's report of
// those left, nil when none.
func goroutinesLeft(before goleak.Option, within time.Duration) error {
	// findRetries is about how long goleak.Find retries before it reports.
	const findRetries = 450 * time.Millisecond
	opts := append(natsenv.ConsumerGoroutines(), before,
		goleak.IgnoreAnyFunction("github.com/nats-io/nats%2ego.(*Conn).readLoop"),
		goleak.IgnoreAnyFunction("github.com/nats-io/nats%2ego.(*Conn).flusher"),
		goleak.IgnoreAnyFunction("github.com/nats-io/nats%2ego.(*Conn).doReconnect"),
		goleak.IgnoreAnyFunction("github.com/nats-io/nats%2ego.(*Conn).waitForMsgs"),
		goleak.IgnoreAnyFunction("github.com/nats-io/nats%2ego.(*asyncCallbacksHandler).asyncCBDispatcher"),
		goleak.IgnoreAnyFunction("github.com/latchkey-go/latchkey/contracttest/testenv.(*Proxy).accept"),
		goleak.IgnoreAnyFunction("github.com/latchkey-go/latchkey/contracttest/testenv.(*Proxy).serve"),
		goleak.IgnoreAnyFunction("github.com/latchkey-go/latchkey/contracttest/testenv.(*Proxy).read"),
		goleak.IgnoreAnyFunction("github.com/latchkey-go/latchkey/contracttest/testenv.(*Proxy).write"),
	)
	deadline := time.Now().Add(within)
	for {
		if time.Until(deadline) <= findRetries {
			time.Sleep(time.Until(deadline.Add(-findRetries)))
			return goleak.Find(opts...)
		}
		if goleak.Find(opts...) == nil {
			return nil
		}
	}
}

// TestCallDuringCutCountsSilenceFromAnsweredRead: Lock and TryLock: "The
// silence is counted from the key's last write as the server's clock stamped
// it, against the server's time when this call first reads the key ... and
// from then on by this call's own clock"; "a key held by another token is
// taken over only after it has gone T = F·R without any write"; change A: a
// Lock or TryLock made while the link is down waits for it, its read (and
// clock write) sent again once the connection is back. If the call counted
// its own clock from its first, refused attempt rather than from the attempt
// the server stamped, it would think the key silent for the time the link
// was down longer than it was. A holder (R = 100ms, F = 6: T = 600ms,
// validity 550ms) is cut off for good halfway between two renewals; a caller
// (R = 50ms, F = 3, C = 0: it waits for the holder's longer T) on a link of
// its own cut beforehand makes its Lock or TryLock 20ms after the holder's
// cut, and its link comes back 100ms or 250ms later (nats.go reconnects
// 100–200ms after). In the "waiting" case the Lock is made with the link up,
// and both links are cut just as a renewal is stored, the caller's restored
// 100ms later. The caller's takeover write must be stored no sooner than T
// (−5ms) after the holder's last write, its lease granted only once the
// holder's has ended (C = 0: no confirmation hides an early takeover), and
// no lease live past its deadline.
func TestCallDuringCutCountsSilenceFromAnsweredRead(t *testing.T) {
	const (
		F = 6
		T = F * testR
	)
	for _, tc := range []struct {
		name string
		try  bool
		wait bool
		down time.Duration // from the call (the cut, when waiting) to the restore
	}{
		{"trylock-down100", true, false, 100 * time.Millisecond},
		{"trylock-down250", true, false, 250 * time.Millisecond},
		{"lock-down100", false, false, 100 * time.Millisecond},
		{"lock-down250", false, false, 250 * time.Millisecond},
		{"waiting-cut-at-renewal", false, true, 100 * time.Millisecond},
	} {
		t.Run(tc.name, func(t *testing.T) {
			url, bucket, key := localEnv(t)
			writes := watchWrites(t, url, bucket, key)
			hl, cl := dialLink(t, url), dialLink(t, url)
			holder := hl.client(t, bucket, natsputex.WithFailureThreshold(F), natsputex.WithHolderID("holder"))
			caller := cl.client(t, bucket, natsputex.WithRenewInterval(testR/2), natsputex.WithConfirmations(0), natsputex.WithHolderID("caller"))
			lease, token, v, g, _ := holdWatched(t, holder, writes, key)
			ctx, cancel := context.WithTimeout(context.Background(), 4*time.Second)
			defer cancel()
			var got <-chan outcome
			var call time.Time
			if tc.wait {
				got = goLock(ctx, caller.Locker(), key, false)
				time.Sleep(3 * testR)
				call = afterRenewal(t, writes, token, 0, func() { cl.proxy.Cut(); hl.proxy.Cut() })
			} else {
				time.Sleep(2 * testR)
				cl.cut(t)
				cutAfterRenewal(t, writes, token, hl.proxy.Cut)
				time.Sleep(20 * time.Millisecond)
				call = time.Now()
				got = goLock(ctx, caller.Locker(), key, tc.try)
			}
			waitFor(t, 2*time.Second, "nats.go sees the caller's link cut", cl.nc.IsReconnecting)
			time.Sleep(time.Until(call.Add(tc.down)))
			back := cl.restore(t)
			o := waitOutcome(t, got, 5*time.Second, "the caller's call")
			last, _ := writes.lastBy(token, time.Now())
			t.Logf("holder's last write rev %d; the call made %v after it, the caller's link back %v after it; the call returned %v after it: lease %v, err %v; the holder's lease ended: %v (deadline %v after its last write)",
				last.rev, ms(call.Sub(last.created)), ms(back.Sub(last.created)), ms(o.at.Sub(last.created)), o.lease != nil, o.err,
				lease.Context().Err() != nil, ms(lease.(interface{ Deadline() time.Time }).Deadline().Sub(last.created)))
			if o.err != nil {
				if !tc.try || !errors.Is(o.err, locks.ErrNotAcquired) {
					t.Errorf("the call failed: %v", o.err)
				}
				if !tc.try && o.at.Before(call.Add(3*time.Second)) {
					t.Errorf("the Lock failed %v after it was made, its ctx with time left", ms(o.at.Sub(call)))
				}
				v.check(t)
				return
			}
			g.grant("caller", o.lease)
			v.add("caller", o.lease)
			w := writeAt(t, writes, o.lease.Token())
			t.Logf("the caller's takeover write rev %d stored %v after the holder's last write (T = %v)", w.rev, ms(w.created.Sub(last.created)), T)
			if d := w.created.Sub(last.created); d < T-5*time.Millisecond {
				t.Errorf("the caller took the key %v after the holder's last write, before T = %v: it counted the time its link was down as silence", ms(d), T)
			}
			if tc.try && back.Sub(last.created) < T-50*time.Millisecond && w.created.Sub(last.created) < T {
				t.Errorf("the TryLock, whose link was back %v after the holder's last write, took the key", ms(back.Sub(last.created)))
			}
			_ = o.lease.Release(context.Background())
			v.check(t)
			g.check(t)
		})
	}
}

// TestWatchAfterBlackHole: a waiting Lock (T = 10s, backoff 20s)
// whose own link to the server is black-holed for 1.5s, then restored
// (the proxy closes the connection that lost data; nats.go reconnects),
// or cut and restored. "Waiting calls look at their keys again as soon as
// the connection is back, and make their KV watches again": the holder's
// release, 1s after the link is back, wakes the waiter within a second.
func TestWatchAfterBlackHole(t *testing.T) {
	for _, fault := range []string{"blackhole", "cut"} {
		t.Run(fault, func(t *testing.T) {
			url, bucket := promiseEnv(t, "watch")
			proxy := testenv.NewProxy(t, strings.TrimPrefix(url, "nats://"))
			slow := []natsputex.Option{natsputex.WithRenewInterval(time.Second), natsputex.WithFailureThreshold(10)}
			holder := newTestClient(t, url, bucket, slow...).Locker()
			waiter := newTestClient(t, "nats://"+proxy.Addr(), bucket,
				append(slow, natsputex.WithBackoff(locks.Backoff{Min: 20 * time.Second, Max: 20 * time.Second}))...).Locker()
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			lease, err := holder.TryLock(ctx, "job")
			if err != nil {
				t.Fatal(err)
			}
			got := lockBehind(ctx, waiter, "job", lease)
			time.Sleep(500 * time.Millisecond)
			if fault == "cut" {
				proxy.Cut()
			} else {
				proxy.BlackHole()
			}
			time.Sleep(1500 * time.Millisecond)
			proxy.Restore()
			time.Sleep(time.Second)
			released := time.Now()
			if err := lease.Release(ctx); err != nil {
				t.Fatal(err)
			}
			select {
			case g := <-got:
				if g.err != nil {
					t.Fatalf("the waiter's Lock: %v", g.err)
				}
				defer g.lease.Release(context.Background())
				took := time.Since(released)
				t.Logf("%s: the waiter got the key %v after the release", fault, took.Round(time.Millisecond))
				if took > time.Second {
					t.Errorf("the waiter got the key %v after the release: its watch did not come back with its link", took.Round(time.Millisecond))
				}
				if g.otherLive {
					t.Error("double grant")
				}
			case <-time.After(3 * time.Second):
				t.Errorf("%s: the waiter did not get the key within 3s of the release (T = 10s, backoff 20s): its watch did not come back with its link", fault)
			}
		})
	}
}

// TestWatchAfterRestart: a waiting Lock's KV watch works again as soon as
// the client has reconnected after a server restart: the holder's release
// after the restart wakes the waiter within a second, though its polling
// and its takeover timer would not wake it for about 9 s. Before,
// the watch's consumer stayed silent for 5–10 s after a restart. On the
// embedded server and on the nats-server program (2.9 here).
func TestWatchAfterRestart(t *testing.T) {
	for _, tc := range []struct {
		name  string
		start func(t testing.TB) *natsenv.Server
	}{
		{"embedded", natsenv.StartServer},
		{"binary", natsenv.StartBinaryServer},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := tc.start(t)
			t.Logf("nats-server %s", s.Version())
			url, bucket := s.URL(), uniqueBucket("rewatch")
			prepareBucket(t, url, bucket)
			slow := []natsputex.Option{natsputex.WithRenewInterval(time.Second), natsputex.WithFailureThreshold(10)}
			holder := newTestClient(t, url, bucket, slow...).Locker()
			waiter := newTestClient(t, url, bucket, append(slow, natsputex.WithBackoff(locks.Backoff{Min: 20 * time.Second, Max: 20 * time.Second}))...).Locker()
			ctx, cancel := context.WithTimeout(context.Background(), 40*time.Second)
			defer cancel()
			lease, err := holder.TryLock(ctx, "job")
			if err != nil {
				t.Fatal(err)
			}
			got := lockBehind(ctx, waiter, "job", lease)
			time.Sleep(500 * time.Millisecond) // the waiter watches the key

			if err := s.Restart(); err != nil {
				t.Fatal(err)
			}
			time.Sleep(2 * time.Second) // both reconnect; the holder renews
			if err := lease.Context().Err(); err != nil {
				t.Fatalf("the holder lost its lease across the restart: %v", context.Cause(lease.Context()))
			}
			released := time.Now()
			if err := lease.Release(ctx); err != nil {
				t.Fatalf("Release after the restart: %v", err)
			}
			g := mustGrant(t, got)
			took := time.Since(released)
			t.Logf("the waiter got the key %v after the release that followed the restart", took.Round(time.Millisecond))
			if took > time.Second {
				t.Fatalf("the waiter got the key %v after the release: its watch did not come back with the connection", took.Round(time.Millisecond))
			}
			if g.otherLive {
				t.Error("double grant")
			}
		})
	}
}

// TestNewSaysWhatItWaitedFor: the stream leader of an R3 bucket is killed
// (SIGKILL: no leadership handed over) on a 3-node cluster of the
// nats-server program. New, called at once on a surviving node, gets no
// answer until the others elect a leader (4–9 s of election timeout):
// with a 2 s context its error says what it waited for (the bucket's
// stream), for how long, and matches ctx.Err(); with a longer one it
// waits out the election and succeeds. The program is 2.9 here, so the
// bucket needs WithUnsafeServer; the stall is the same on later releases.
func TestNewSaysWhatItWaitedFor(t *testing.T) {
	if testing.Short() {
		t.Skip("a 3-node cluster is slow to start")
	}
	c := natsenv.StartBinaryCluster(t, 3)
	t.Logf("nats-server %v", c.Versions())
	opts := []natsputex.Option{natsputex.WithReplicas(3), natsputex.WithUnsafeServer(func(error) {})}
	bucket := uniqueBucket("waitfor")
	prepareBucket(t, c.URLs(), bucket, opts...)
	nodes := c.Servers()
	leader := bucketLeader(t, c.URLs(), bucket, nodes, -1)
	other := nodes[(leader+1)%len(nodes)]
	nc, js, err := connect(other.URL(), nats.IgnoreDiscoveredServers())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	nodes[leader].Kill()
	killed := time.Now()
	t.Logf("killed the stream leader %s", nodes[leader].Name())

	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	cl, err := natsputex.New(ctx, js, bucket, opts...)
	took := time.Since(killed)
	if err == nil {
		_ = cl.Close(context.Background())
		t.Skipf("New succeeded %v after the kill: the stream elected a leader sooner than nats-server's election timeout allows", took.Round(time.Millisecond))
	}
	t.Logf("New returned %v after the kill: %v", took.Round(time.Millisecond), err)
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("New's error does not match context.DeadlineExceeded: %v", err)
	}
	for _, want := range []string{bucket, "waited", "KV_" + bucket} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("New's error does not say %q: %v", want, err)
		}
	}

	ctx2, cancel2 := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel2()
	cl, err = natsputex.New(ctx2, js, bucket, opts...)
	if err != nil {
		t.Fatalf("New after the kill, with 30 s: %v", err)
	}
	_ = cl.Close(context.Background())
	t.Logf("New succeeded %v after the stream leader was killed", time.Since(killed).Round(time.Millisecond))
}

// TestStreamLeaderKillStall measures how long an R3 bucket takes no lock
// after its stream leader is killed (SIGKILL, no leadership handed over)
// on a 3-node cluster of the nats-server program, with a client connected
// to every node: the stall the package doc bounds by nats-server's
// election timeout (at most 9 s) plus one request's timeout and the
// client's reconnect wait. The bound checked is that, plus 5 s for a
// loaded machine.
func TestStreamLeaderKillStall(t *testing.T) {
	if testing.Short() {
		t.Skip("a 3-node cluster and up to 20 s of stall")
	}
	c := natsenv.StartBinaryCluster(t, 3)
	t.Logf("nats-server %v", c.Versions())
	opts := []natsputex.Option{natsputex.WithReplicas(3), natsputex.WithUnsafeServer(func(error) {})}
	bucket := uniqueBucket("stall")
	prepareBucket(t, c.URLs(), bucket, opts...)
	nodes := c.Servers()
	leader := bucketLeader(t, c.URLs(), bucket, nodes, -1)
	l := newTestClient(t, c.URLs(), bucket, opts...).Locker()
	ctx, cancel := context.WithTimeout(context.Background(), 40*time.Second)
	defer cancel()
	if lease, err := l.TryLock(ctx, "warm"); err != nil {
		t.Fatal(err)
	} else {
		_ = lease.Release(ctx)
	}
	nodes[leader].Kill()
	killed := time.Now()
	const request = time.Second // natsputex bounds a request by max(T, 1s); T = 300ms here
	bound := 9*time.Second + request + 50*time.Millisecond + 5*time.Second
	for i := 0; ; i++ {
		octx, ocancel := context.WithTimeout(ctx, 2*time.Second)
		lease, err := l.TryLock(octx, fmt.Sprintf("n%d", i))
		ocancel()
		if err == nil {
			_ = lease.Release(ctx)
			took := time.Since(killed)
			t.Logf("the bucket took a lock again %v after its stream leader %s was killed (%d tries)", took.Round(time.Millisecond), nodes[leader].Name(), i+1)
			if took > bound {
				t.Errorf("stalled %v, beyond %v", took.Round(time.Millisecond), bound)
			}
			return
		}
		if time.Since(killed) > bound {
			t.Fatalf("no lock %v after the stream leader was killed: %v", time.Since(killed).Round(time.Millisecond), err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestConnectOptions: a connection made with ConnectOptions reconnects
// forever, quickly, and buffers no write while it reconnects.
func TestConnectOptions(t *testing.T) {
	url := natsenv.StartServer(t).URL()
	nc, err := nats.Connect(url, natsputex.ConnectOptions()...)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	o := nc.Opts
	if o.MaxReconnect != -1 || o.ReconnectWait > 100*time.Millisecond || o.ReconnectBufSize != -1 {
		t.Fatalf("MaxReconnect %d, ReconnectWait %v, ReconnectBufSize %d; want -1, <= 100ms, -1", o.MaxReconnect, o.ReconnectWait, o.ReconnectBufSize)
	}
}
