package redlockprio_test

import (
	"context"
	"testing"
	"time"

	"github.com/latchkey-go/latchkey/contracttest/testenv"
	"github.com/latchkey-go/latchkey/locks"
	"github.com/latchkey-go/latchkey/redlockprio"
)

// TestAttack2ImmediateAckWaiterInChain: p1 (priority 1, TTL 2s, default
// acknowledgement) holds, and its code lets go (Release) 800ms after its
// context ended. p2 (priority 2, TTL 600ms, WithImmediateAck) steals and
// waits for p1. Then p3 (priority 3, TTL 400ms, default) steals from the
// waiting p2; or p2's Lock gives up (context) or its Locker closes and a
// priority-0 Lock waits. p2's option is about its leases, and it never held
// one: "an attempt or lease that is robbed while it is still waiting for its
// own victim ends at once but delays its acknowledgement until its own
// victim has acknowledged or run out", "the highest thief never proceeds
// while the first victim may still run". Nobody may be granted before p1's
// Release.
func TestAttack2ImmediateAckWaiterInChain(t *testing.T) {
	for _, last := range []string{"p3 steals", "p2 gives up then p0", "p2 closed then p0"} {
		t.Run(last, func(t *testing.T) {
			addrs := addrsOf(testenv.StartRedis(t, 3))
			clk := newAtkClock()
			p1 := mustClient(t, addrs, atkOpts(2*time.Second, 0.01, 1)...)
			p2 := mustClient(t, addrs, atkOpts(600*time.Millisecond, 0.01, 2, redlockprio.WithImmediateAck())...)
			prio3 := 3
			if last != "p3 steals" {
				prio3 = 0
			}
			p3 := mustClient(t, addrs, atkOpts(400*time.Millisecond, 0.01, prio3)...)
			warm(t, p1.l)
			warm(t, p2.l)
			warm(t, p3.l)
			name := uniqueName(t)
			ctx := ctxFor(t, 20*time.Second)

			v, err := p1.l.TryLock(ctx, name)
			if err != nil {
				t.Fatal(err)
			}
			s1 := clk.begin("p1", v)
			stop := make(chan struct{})
			done1 := make(chan struct{})
			go func() { defer close(done1); clk.workIgnoringContext(s1, v, stop) }()
			released := make(chan struct{})
			go func() {
				defer close(released)
				<-v.Context().Done()
				time.Sleep(800 * time.Millisecond)
				close(stop)
				<-done1
				clk.end(s1, v)
				_ = v.Release(context.Background())
			}()
			ctx2, cancel2 := context.WithCancel(ctx)
			defer cancel2()
			if last == "p2 gives up then p0" {
				ctx2, cancel2 = context.WithTimeout(ctx, 300*time.Millisecond)
				defer cancel2()
			}
			done2 := lockAsync(ctx2, clk, "p2", p2.l, name)
			waitForHolder(t, addrs, name, p2.c.ID())
			switch last {
			case "p2 gives up then p0":
				t.Logf("p2: %v", <-done2)
			case "p2 closed then p0":
				_ = p2.c.Close(context.Background())
			}
			l3, err := p3.l.Lock(ctx, name)
			if err != nil {
				x1 := clk.snap(s1)
				t.Fatalf("p3's Lock at %v (p1 context ended %v, p1 let go %v): %v", ms(clk.now()), ms(x1.ctxEnd), ms(x1.ended), err)
			}
			s3 := clk.begin("p3", l3)
			clk.write(s3, clk.now())
			clk.end(s3, l3)
			_ = l3.Release(ctx)
			<-released
			x1 := clk.snap(s1)
			t.Logf("p1 context ended %v, let go %v, deadline %v; p3 granted %v (tokens %d -> %d)",
				ms(x1.ctxEnd), ms(x1.ended), ms(x1.deadline), ms(s3.granted), x1.token, s3.token)
			if s3.granted < x1.ended && s3.granted < x1.deadline {
				t.Errorf("p3 was granted %v before p1 let go", ms(x1.ended-s3.granted))
			}
			cancel2()
			if last == "p3 steals" {
				<-done2
			}
			if clk.check(t) > 0 {
				clk.dump(t)
			}
		})
	}
}

// TestAttack2ImmediateAckHolderChain: leases of both kinds in one chain of
// holders. p1 (priority 1, TTL 1s, WithImmediateAck) holds and stops
// writing the moment its context ends (as that option requires). p2
// (priority 2, TTL 1s, default) steals, gets the lease once p1
// acknowledged, holds it, and its code lets go 500ms after its context
// ended. p3 (priority 3, TTL 600ms, WithImmediateAck) steals from p2: p2's
// acknowledgement is the default one, sent at Release ("sent when the
// victim calls Lease.Release"), so p3 must not be granted before p2's
// Release; and tokens p1 < p2 < p3.
func TestAttack2ImmediateAckHolderChain(t *testing.T) {
	addrs := addrsOf(testenv.StartRedis(t, 3))
	clk := newAtkClock()
	p1 := mustClient(t, addrs, atkOpts(time.Second, 0.01, 1, redlockprio.WithImmediateAck())...)
	p2 := mustClient(t, addrs, atkOpts(time.Second, 0.01, 2)...)
	p3 := mustClient(t, addrs, atkOpts(600*time.Millisecond, 0.01, 3, redlockprio.WithImmediateAck())...)
	warm(t, p1.l)
	warm(t, p2.l)
	warm(t, p3.l)
	name := uniqueName(t)
	ctx := ctxFor(t, 20*time.Second)
	v1, err := p1.l.TryLock(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	s1 := clk.begin("p1", v1)
	go func() {
		clk.workWhileLive(s1, v1, nil)
		clk.end(s1, v1)
		_ = v1.Release(context.Background())
	}()
	time.Sleep(50 * time.Millisecond)
	t2 := time.Now()
	v2, err := p2.l.Lock(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	s2 := clk.begin("p2", v2)
	t.Logf("p2 granted after %v", time.Since(t2))
	released2 := make(chan struct{})
	go func() {
		defer close(released2)
		stop := make(chan struct{})
		done := make(chan struct{})
		go func() { defer close(done); clk.workIgnoringContext(s2, v2, stop) }()
		<-v2.Context().Done()
		time.Sleep(500 * time.Millisecond)
		close(stop)
		<-done
		clk.end(s2, v2)
		_ = v2.Release(context.Background())
	}()
	time.Sleep(50 * time.Millisecond)
	v3, err := p3.l.Lock(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	s3 := clk.begin("p3", v3)
	clk.write(s3, clk.now())
	clk.end(s3, v3)
	_ = v3.Release(ctx)
	<-released2
	x2 := clk.snap(s2)
	t.Logf("p2 context ended %v, let go %v, deadline %v; p3 granted %v; tokens %d %d %d",
		ms(x2.ctxEnd), ms(x2.ended), ms(x2.deadline), ms(s3.granted), s1.token, x2.token, s3.token)
	if s3.granted < x2.ended && s3.granted < x2.deadline {
		t.Errorf("p3 was granted %v before p2 let go", ms(x2.ended-s3.granted))
	}
	if clk.check(t) > 0 {
		clk.dump(t)
	}
	var _ locks.Lease = v3
}
