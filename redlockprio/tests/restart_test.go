package redlockprio_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/latchkey-go/latchkey/contracttest"
	"github.com/latchkey-go/latchkey/contracttest/testenv"
	"github.com/latchkey-go/latchkey/locks"
)

// TestMasterRestartedEmptyMidTheft: V (priority 1, TTL 3s) holds on 3
// masters and is cut off, writing while its context is live; T (priority
// 2, TTL 400ms) steals every key and waits for V. Then one master is
// killed and restarted empty (a single master: within the docs' limits),
// and either H (priority 3, TTL 300ms) steals, or T's Locker is closed and
// a priority-0 Lock waits. Nobody may be granted while V may still run,
// and tokens must still increase.
func TestMasterRestartedEmptyMidTheft(t *testing.T) {
	for _, last := range []string{"H steals", "T closed then p0"} {
		t.Run(last, func(t *testing.T) {
			servers := testenv.StartRedis(t, 3)
			addrs := addrsOf(servers)
			hist := contracttest.NewWriteHistory()
			v := mustClient(t, addrs, viaProxies(), withTiming(3*time.Second, 0.01), withPriority(1))
			tc := mustClient(t, addrs, withTiming(400*time.Millisecond, 0.05), withPriority(2))
			prio := 3
			if last != "H steals" {
				prio = 0
			}
			h := mustClient(t, addrs, withTiming(300*time.Millisecond, 0.1), withPriority(prio))
			warm(t, tc.l)
			warm(t, h.l)
			name := uniqueName(t)
			ctx := ctxFor(t, 20*time.Second)
			vl, err := v.l.TryLock(ctx, name)
			if err != nil {
				t.Fatal(err)
			}
			// V must hold on all 3 masters before it is cut off, as this
			// test means: TryLock returns once a quorum answered, and a V
			// on a bare quorum (2 of 3) with one of them restarted empty is
			// the documented limit (TestBareQuorumLeaseLostToOneEmptyRestart), not
			// this test's case. A CI run failed so, as far as its log
			// tells: H won a quorum 422ms in, about T's own 400ms TTL,
			// which T's key has only where T found the name free.
			waitForHolder(t, addrs, name, v.c.ID())
			s1 := hist.Begin("V", vl)
			done1 := make(chan struct{})
			go func() { defer close(done1); s1.WriteWhileLive(nil) }()
			v.cut()
			tctx, cancel := context.WithCancel(ctx)
			defer cancel()
			done2 := lockAsync(tctx, hist, "T", tc.l, name)
			waitForHolder(t, addrs, name, tc.c.ID())
			if last != "H steals" {
				_ = tc.c.Close(context.Background())
			}
			if err := servers[0].Restart(); err != nil {
				t.Fatal(err)
			}
			restartAt := hist.Now()
			hl, err := h.l.Lock(ctx, name)
			if err != nil {
				t.Fatal(err)
			}
			sh := hist.Begin("H", hl)
			sh.Write(hist.Now())
			sh.LetGo()
			_ = hl.Release(ctx)
			<-done1
			s1.LetGo()
			cancel()
			// T's Lock may end with a HeldError here though it was
			// cancelled: see TestRobbedWaitingLockKeepsWaiting.
			t.Logf("T: %v", <-done2)
			x1, xh := s1.Record(), sh.Record()
			t.Logf("restart at %v; V context ended %v, deadline %v; H granted %v (tokens %d -> %d)",
				ms(restartAt), ms(x1.ContextEnd), ms(x1.Deadline), ms(xh.Granted), x1.Token, xh.Token)
			t.Logf("sections:\n%v", hist)
			if err := hist.Check(); err != nil {
				t.Error(err)
			}
		})
	}
}

// TestBareQuorumLeaseLostToOneEmptyRestart: 3 masters. V (TTL 2s, alive,
// writing while its context is live) holds a name granted by masters 0 and
// 1 only: its own link to master 2 refuses connections (after first
// contact). Master 0 — one master — is then restarted empty, 1.5 renewal
// intervals after the grant, and B TryLocks.
//
// Variant "m2 refusing V throughout": the lease sat on a bare quorum for
// its whole life, so one restart leaves it on a minority. The package doc
// states this limit ("A lease may sit on a bare quorum ... for its whole
// life"); the test shows it: B is granted while V's lease is live, with a
// token no greater than V's. (Found by a test written from the docs,
// which then promised more.)
//
// Variant "m2 back before the restart": V's link to master 2 is restored
// 50ms after the grant, so the background raise and the renewals reach it
// before the restart; V's key is then on masters 1 and 2 after the
// restart: B must not be granted while V's lease is live, and tokens
// must increase (hist.Check).
func TestBareQuorumLeaseLostToOneEmptyRestart(t *testing.T) {
	for _, variant := range []string{"m2 refusing V throughout", "m2 back before the restart"} {
		t.Run(variant, func(t *testing.T) { bareQuorumRestart(t, variant == "m2 back before the restart") })
	}
}

func bareQuorumRestart(t *testing.T, back bool) {
	servers := testenv.StartRedis(t, 3)
	addrs := addrsOf(servers)
	hist := contracttest.NewWriteHistory()
	const ttl = 2 * time.Second
	v := mustClient(t, addrs, viaProxies(), withTiming(ttl, 0.01))
	b := mustClient(t, addrs, withTiming(ttl, 0.01))
	warm(t, v.l)
	warm(t, b.l)
	name := uniqueName(t)
	ctx := ctxFor(t, 15*time.Second)
	v.proxies[2].Cut()
	vl, err := v.l.TryLock(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	sv := hist.Begin("V", vl)
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() { defer close(done); sv.WriteWhileLive(stop) }()
	if back {
		time.Sleep(50 * time.Millisecond)
		v.proxies[2].Restore()
	}
	// 1.5 renewal intervals ((2s − 22ms)/3 ≈ 660ms): past the window the
	// docs give.
	time.Sleep(time.Second)
	if err := servers[0].Restart(); err != nil {
		t.Fatal(err)
	}
	t.Logf("master 0 restarted empty at %v; fences now %d %d %d", ms(hist.Now()),
		fenceOf(t, addrs[0], name), fenceOf(t, addrs[1], name), fenceOf(t, addrs[2], name))
	bl, err := b.l.TryLock(ctx, name)
	for try := 1; try < 5 && err != nil && strings.Contains(err.Error(), "no answer within the grace"); try++ {
		// The restarted master's answer (a new connection) came after the
		// grace for stragglers. The scenario stands: B asks again once
		// its own attempt's keys are gone (the "held for up to" of its
		// split answers).
		t.Logf("B: %v; again", err)
		bl, err = b.l.TryLock(ctx, name)
		for range 10 {
			he, ok := errors.AsType[*locks.HeldError](err)
			if !ok || he.RetryAfter <= 0 || he.RetryAfter >= 100*time.Millisecond {
				break
			}
			time.Sleep(he.RetryAfter)
			bl, err = b.l.TryLock(ctx, name)
		}
	}
	if !back {
		// The documented limit, shown: one restart of a bare quorum.
		if err != nil {
			t.Fatalf("B: %v; the documented limit (a lease on a bare quorum loses it to one restart) did not show", err)
		}
		if vl.Context().Err() != nil {
			t.Fatalf("V's lease ended (%v) before B's grant: the limit did not show", context.Cause(vl.Context()))
		}
		t.Logf("limit shown: B granted with token %d while V (token %d) still held", bl.Token(), vl.Token())
		_ = bl.Release(ctx)
		close(stop)
		<-done
		_ = vl.Release(context.Background())
		return
	}
	if err != nil {
		t.Logf("B: %v (held)", err)
	} else {
		sb := hist.Begin("B", bl)
		sb.Write(hist.Now())
		sb.LetGo()
		_ = bl.Release(ctx)
	}
	wait := 3 * time.Second // V writes until its lease ends by itself
	if err != nil {
		wait = 0 // B was refused: nothing to overlap with
	}
	select {
	case <-done:
	case <-time.After(wait):
	}
	close(stop)
	<-done
	sv.LetGo()
	_ = vl.Release(context.Background())
	t.Logf("sections:\n%v", hist)
	if err := hist.Check(); err != nil {
		t.Error(err)
	}
}
