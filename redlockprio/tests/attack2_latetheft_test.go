package redlockprio_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/latchkey-go/latchkey/contracttest/testenv"
	"github.com/latchkey-go/latchkey/redlockprio"
)

// TestAttack2LateTheftAnswers: V (priority 1, TTL 3s) holds a name on 3
// masters and is cut off, writing while its lease context is live. H
// (priority 2, TTL 600ms, call timeout 100ms) tries to take it, but its
// replies from masters 1 and 2 come 400ms late (its scripts run there at
// once and displace V): H's step sees one answer and fails ("more than N −
// quorum failed"), and learns of its two thefts only from the late answers
// ("their answers are seen to in the background (a grant deleted after a
// failed attempt [...])"). The docs: "An attempt that does not win a quorum
// deletes whatever it got, except where it displaced a lower priority", it
// "keeps each such key until its victim has acknowledged or run out of
// validity; [...] Deleting it at once would let a third client take the
// name while the victim still runs". Then C (priority 0, TTL 600ms) Locks:
// it must not be granted while V may still write. Variant "C steals":
// C has priority 3 instead.
func TestAttack2LateTheftAnswers(t *testing.T) {
	for _, variant := range []string{"C waits", "C steals"} {
		t.Run(variant, func(t *testing.T) {
			addrs := addrsOf(testenv.StartRedis(t, 3))
			clk := newAtkClock()
			v := mustProxied(t, addrs, atkOpts(3*time.Second, 0.01, 1)...)
			h := newAtk2Locker(t, addrs, false, atkOpts(600*time.Millisecond, 0.01, 2, redlockprio.WithCallTimeout(100*time.Millisecond))...)
			pc := 0
			if variant == "C steals" {
				pc = 3
			}
			c := mustClient(t, addrs, atkOpts(600*time.Millisecond, 0.01, pc)...)
			warm(t, v.l)
			warm(t, h.l)
			warm(t, c.l)
			name := uniqueName(t)
			ctx := ctxFor(t, 20*time.Second)
			vl, err := v.l.TryLock(ctx, name)
			if err != nil {
				t.Fatal(err)
			}
			sv := clk.begin("V", vl)
			done := make(chan struct{})
			go func() {
				defer close(done)
				clk.workWhileLive(sv, vl, nil)
				clk.end(sv, vl)
			}()
			v.cut()
			h.proxies[1].DelayReplies(400 * time.Millisecond)
			h.proxies[2].DelayReplies(400 * time.Millisecond)
			_, herr := h.l.Lock(ctx, name)
			var qe *redlockprio.QuorumError
			t.Logf("H's Lock at %v: %v (QuorumError %v)", ms(clk.now()), herr, errors.As(herr, &qe))
			if herr == nil {
				t.Skip("H was granted")
			}
			for i, a := range addrs {
				t.Logf("master %d holder %q", i, holderOf(t, a, name))
			}
			time.Sleep(500 * time.Millisecond) // the late answers are in
			for i, a := range addrs {
				t.Logf("at %v master %d holder %q PTTL %v", ms(clk.now()), i, holderOf(t, a, name), maxPTTL(t, []string{a}, name))
			}
			cl, err := c.l.Lock(ctx, name)
			if err != nil {
				t.Fatal(err)
			}
			sc := clk.begin("C", cl)
			clk.write(sc, clk.now())
			clk.end(sc, cl)
			_ = cl.Release(ctx)
			<-done
			xv := clk.snap(sv)
			t.Logf("V context ended %v (%v), deadline %v; C granted %v", ms(xv.ctxEnd), context.Cause(vl.Context()), ms(xv.deadline), ms(sc.granted))
			if clk.check(t) > 0 {
				clk.dump(t)
			}
		})
	}
}
