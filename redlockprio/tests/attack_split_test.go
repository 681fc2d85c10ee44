package redlockprio_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/latchkey-go/latchkey/contracttest/testenv"
	"github.com/latchkey-go/latchkey/locks"
	"github.com/latchkey-go/latchkey/redlockprio"
)

// TestAttackSplitVoteThievesThenHigher: V (priority 1, TTL 3s) holds a
// name on 3 masters. Three thieves A, B, C of priority 2 (TTL 400ms) try
// it at once, each reaching "its" master first (the others' links are
// slowed by 80ms each way), so each displaces V on one master and finds
// the other two held by an equal priority: a split vote, every master
// answered, none granted. Each told V and must keep its key until V
// acknowledged or ran out of validity ("Deleting it at once would let a
// third client take the name while the victim still runs"). Then H
// (priority 3, TTL 300ms) displaces the three leftover keys: H must not
// proceed while V may still run ("the highest thief never proceeds while
// the first victim may still run"). V either ignores its context until it
// calls Release 1.5s after it ended ("V told, slow to let go"), or is cut
// off and writes while its context is live ("V cut off").
func TestAttackSplitVoteThievesThenHigher(t *testing.T) {
	for _, how := range []string{"V told, slow to let go", "V cut off"} {
		t.Run(how, func(t *testing.T) {
			addrs := addrsOf(testenv.StartRedis(t, 3))
			clk := newAtkClock()
			v := mustProxied(t, addrs, atkOpts(3*time.Second, 0.01, 1)...)
			var thieves []*proxied
			for range 3 {
				thieves = append(thieves, mustProxied(t, addrs, atkOpts(400*time.Millisecond, 0.01, 2)...))
			}
			h := mustClient(t, addrs, atkOpts(300*time.Millisecond, 0.01, 3)...)
			warm(t, v.l)
			for _, th := range thieves {
				warm(t, th.l)
			}
			warm(t, h.l)
			name := uniqueName(t)
			ctx := ctxFor(t, 20*time.Second)

			vl, err := v.l.TryLock(ctx, name)
			if err != nil {
				t.Fatal(err)
			}
			s1 := clk.begin("V", vl)
			stop := make(chan struct{})
			done1 := make(chan struct{})
			released := make(chan struct{})
			if how == "V cut off" {
				go func() { defer close(done1); clk.workWhileLive(s1, vl, stop) }()
				v.cut()
				go func() {
					defer close(released)
					<-done1
					clk.end(s1, vl)
				}()
			} else {
				go func() { defer close(done1); clk.workIgnoringContext(s1, vl, stop) }()
				go func() {
					defer close(released)
					<-vl.Context().Done()
					time.Sleep(1500 * time.Millisecond)
					close(stop)
					<-done1
					clk.end(s1, vl)
					_ = vl.Release(context.Background())
				}()
			}

			for i, th := range thieves {
				for j, px := range th.proxies {
					if j != i {
						px.Latency(80 * time.Millisecond)
					}
				}
			}
			var wg sync.WaitGroup
			errs := make([]error, 3)
			for i, th := range thieves {
				wg.Go(func() {
					l, err := th.l.TryLock(ctx, name)
					if err == nil {
						s := clk.begin("thief", l)
						clk.write(s, clk.now())
						clk.end(s, l)
						_ = l.Release(ctx)
					}
					errs[i] = err
				})
			}
			wg.Wait()
			for _, th := range thieves {
				for _, px := range th.proxies {
					px.Restore()
				}
			}
			split := true
			for i := range 3 {
				holder := holderOf(t, addrs[i], name)
				t.Logf("thief %d: %v; master %d held by %q", i, errs[i], i, holder)
				split = split && strings.HasPrefix(holder, thieves[i].c.ID()+":")
			}
			if !split {
				t.Skip("the vote did not split as arranged")
			}
			for i, a := range addrs {
				t.Logf("master %d: PTTL %v", i, maxPTTL(t, []string{a}, name))
			}
			splitAt := clk.now()
			hl, err := h.l.Lock(ctx, name)
			if err != nil {
				t.Fatal(err)
			}
			sh := clk.begin("H", hl)
			clk.write(sh, clk.now())
			clk.end(sh, hl)
			_ = hl.Release(ctx)
			<-released
			t.Logf("split at %v; V context ended %v (%v), V let go %v, V deadline %v; H granted %v (tokens %d -> %d)",
				ms(splitAt), ms(s1.ctxEnd), context.Cause(vl.Context()), ms(s1.ended), ms(s1.deadline), ms(sh.granted), s1.token, sh.token)
			clk.dump(t)
			if sh.granted < s1.ended && sh.granted < s1.deadline {
				t.Errorf("H was granted %v before V let go (V's deadline %v)", ms(s1.ended-sh.granted), ms(s1.deadline))
			}
			clk.check(t)
			var he *locks.HeldError
			for i, err := range errs {
				if err != nil && !errors.As(err, &he) {
					var qe *redlockprio.QuorumError
					t.Logf("thief %d's TryLock: %v (QuorumError: %v)", i, err, errors.As(err, &qe))
				}
			}
		})
	}
}
