package redlockprio_test

import (
	"context"
	"testing"
	"time"

	"github.com/latchkey-go/latchkey/contracttest/testenv"
)

// TestAttack2BareQuorumSingleRestart: 3 masters. V (TTL 2s, alive,
// writing while its context is live) holds a name granted by masters 0 and
// 1 only: its own link to master 2 refuses connections (after first
// contact). Master 0 — one master — is then restarted empty, 1.5 renewal
// intervals after the grant, and B TryLocks.
//
// Variant "m2 refusing V throughout": the lease sat on a bare quorum for
// its whole life, so one restart leaves it on a minority. The package doc
// states this limit ("A lease may sit on a bare quorum ... for its whole
// life"); the test shows it: B is granted while V's lease is live, with a
// token no greater than V's. (Found by an attack written from the docs,
// which then promised more.)
//
// Variant "m2 back before the restart": V's link to master 2 is restored
// 50ms after the grant, so the background raise and the renewals reach it
// before the restart; V's key is then on masters 1 and 2 after the
// restart: B must not be granted while V's lease is live, and tokens
// must increase (clk.check).
func TestAttack2BareQuorumSingleRestart(t *testing.T) {
	for _, variant := range []string{"m2 refusing V throughout", "m2 back before the restart"} {
		t.Run(variant, func(t *testing.T) { bareQuorumRestart(t, variant == "m2 back before the restart") })
	}
}

func bareQuorumRestart(t *testing.T, back bool) {
	servers := testenv.StartRedis(t, 3)
	addrs := addrsOf(servers)
	clk := newAtkClock()
	const ttl = 2 * time.Second
	opts := atkOpts(ttl, 0.01, 0)
	v := newAtk2Locker(t, addrs, false, opts...)
	b := mustClient(t, addrs, opts...)
	warm(t, v.l)
	warm(t, b.l)
	name := uniqueName(t)
	ctx := ctxFor(t, 15*time.Second)
	v.proxies[2].Cut()
	vl, err := v.l.TryLock(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	sv := clk.begin("V", vl)
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() { defer close(done); clk.workWhileLive(sv, vl, stop) }()
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
	t.Logf("master 0 restarted empty at %v; fences now %d %d %d", ms(clk.now()),
		fenceOf(t, addrs[0], name), fenceOf(t, addrs[1], name), fenceOf(t, addrs[2], name))
	bl, err := b.l.TryLock(ctx, name)
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
		sb := clk.begin("B", bl)
		clk.write(sb, clk.now())
		clk.end(sb, bl)
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
	clk.end(sv, vl)
	_ = vl.Release(context.Background())
	clk.dump(t)
	clk.check(t)
}
