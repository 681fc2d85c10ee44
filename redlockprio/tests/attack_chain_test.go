package redlockprio_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/latchkey-go/latchkey/contracttest/testenv"
	"github.com/latchkey-go/latchkey/locks"
	"github.com/latchkey-go/latchkey/redlockprio"
)

// opts builds a Locker's options from a TTL, drift factor and priority,
// with the longest renewal interval New accepts.
func atkOpts(ttl time.Duration, drift float64, prio int, more ...redlockprio.Option) []redlockprio.Option {
	d := time.Duration(float64(ttl)*drift) + 2*time.Millisecond
	ri := (ttl - d) / 3
	return append([]redlockprio.Option{redlockprio.WithTTL(ttl), redlockprio.WithDriftFactor(drift),
		redlockprio.WithPriority(prio), redlockprio.WithRenewInterval(ri)}, more...)
}

// lockAsync runs Lock in the background; what it returns comes on the channel.
// A lease it gets is released at once (a waiting thief is not supposed to
// get the name in these tests before the test ends it).
// A grant is recorded on clk as a section of one write.
func lockAsync(ctx context.Context, clk *atkClock, who string, l *redlockprio.Locker, name string) <-chan error {
	done := make(chan error, 1)
	go func() {
		lease, err := l.Lock(ctx, name)
		if err == nil {
			s := clk.begin(who, lease)
			clk.write(s, clk.now())
			clk.end(s, lease)
			_ = lease.Release(context.Background())
			err = errors.New("got the name")
		}
		done <- err
	}()
	return done
}

// TestAttackChainOf4MixedTTLs: a 3s victim p1 (priority 1, drift 0.01) is
// cut off while it keeps writing under its live context; p2 (400ms, drift
// 0.05, priority 2) steals and waits for it; p3 (1s, drift 0, priority 3)
// steals from the waiting p2; then either p4 (300ms, drift 0.2, priority
// 4) steals from p3, or p2 and p3 give up (their contexts end mid-wait) or
// are closed, and a priority-0 Lock (300ms) waits. The docs: "the highest
// thief never proceeds while the first victim may still run, whatever the
// links' TTLs", and the keys of a thief that gave up or closed are kept
// until its victim acknowledged or ran out.
func TestAttackChainOf4MixedTTLs(t *testing.T) {
	for _, last := range []string{"p4 steals", "waiters give up then p0", "waiters closed then p0"} {
		t.Run(last, func(t *testing.T) {
			addrs := addrsOf(testenv.StartRedis(t, 3))
			clk := newAtkClock()
			p1 := mustProxied(t, addrs, atkOpts(3*time.Second, 0.01, 1)...)
			p2 := mustClient(t, addrs, atkOpts(400*time.Millisecond, 0.05, 2)...)
			p3 := mustClient(t, addrs, atkOpts(time.Second, 0, 3)...)
			prio4 := 4
			if last != "p4 steals" {
				prio4 = 0
			}
			p4 := mustClient(t, addrs, atkOpts(300*time.Millisecond, 0.2, prio4)...)
			warm(t, p2.l)
			warm(t, p3.l)
			warm(t, p4.l)
			name := uniqueName(t)
			ctx := ctxFor(t, 20*time.Second)

			v, err := p1.l.TryLock(ctx, name)
			if err != nil {
				t.Fatal(err)
			}
			s1 := clk.begin("p1", v)
			stop := make(chan struct{})
			done1 := make(chan struct{})
			go func() { defer close(done1); clk.workWhileLive(s1, v, stop) }()
			p1.cut()
			cutAt := clk.now()

			waitCtx := ctx
			if last == "waiters give up then p0" {
				var cancel context.CancelFunc
				waitCtx, cancel = context.WithTimeout(ctx, 600*time.Millisecond)
				defer cancel()
			}
			done2 := lockAsync(waitCtx, clk, "p2", p2.l, name)
			waitForHolder(t, addrs, name, p2.c.ID())
			done3 := lockAsync(waitCtx, clk, "p3", p3.l, name)
			waitForHolder(t, addrs, name, p3.c.ID())
			switch last {
			case "waiters give up then p0":
				t.Logf("p2: %v; p3: %v", <-done2, <-done3)
			case "waiters closed then p0":
				_ = p2.c.Close(context.Background())
				_ = p3.c.Close(context.Background())
			}
			l4, err := p4.l.Lock(ctx, name)
			if err != nil {
				t.Fatal(err)
			}
			s4 := clk.begin("p4", l4)
			clk.write(s4, clk.now())
			clk.end(s4, l4)
			_ = l4.Release(ctx)
			<-done1 // p1's context ends by its deadline at the latest
			clk.end(s1, v)
			close(stop)
			if last == "p4 steals" {
				t.Logf("p2's Lock: %v; p3's Lock: %v", <-done2, <-done3) // may retry and get it after p4
			}
			t.Logf("cut at %v; p1 context ended %v (%v), p1 deadline %v; p4 granted %v (token %d > %d)",
				ms(cutAt), ms(s1.ctxEnd), context.Cause(v.Context()), ms(s1.deadline), ms(s4.granted), s4.token, s1.token)
			clk.dump(t)
			if s4.granted < s1.deadline {
				t.Errorf("p4 granted %v before p1's validity deadline (p1 wrote until %v)",
					ms(s1.deadline-s4.granted), ms(s1.lastWrite))
			}
			clk.check(t)
		})
	}
}

// TestAttackChainVictimIgnoresContext: the first victim p1 (2s, priority 1)
// is reachable but its work ignores its context: it lets go (Release) 800ms
// after its context ended. p2 (400ms, priority 2) steals and waits; then p3
// (300ms, priority 3) steals from the waiting p2, or p2 gives up or is
// closed and a priority-0 Lock waits. The docs: the acknowledgement is sent
// when the victim calls Release, and a robbed waiting thief delays its own
// until its victim acknowledged, so nobody may be granted before p1's
// Release.
func TestAttackChainVictimIgnoresContext(t *testing.T) {
	for _, last := range []string{"p3 steals", "p2 gives up then p0", "p2 closed then p0", "p3 steals, p2 gives up after"} {
		t.Run(last, func(t *testing.T) {
			addrs := addrsOf(testenv.StartRedis(t, 3))
			clk := newAtkClock()
			p1 := mustClient(t, addrs, atkOpts(2*time.Second, 0.01, 1)...)
			p2 := mustClient(t, addrs, atkOpts(400*time.Millisecond, 0.05, 2)...)
			prio3 := 3
			if last == "p2 gives up then p0" || last == "p2 closed then p0" {
				prio3 = 0
			}
			p3 := mustClient(t, addrs, atkOpts(300*time.Millisecond, 0.1, prio3)...)
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
			var ctxEnd time.Duration
			go func() {
				defer close(released)
				<-v.Context().Done()
				ctxEnd = clk.now()
				time.Sleep(800 * time.Millisecond)
				close(stop)
				<-done1
				clk.end(s1, v)
				_ = v.Release(context.Background())
			}()

			waitCtx := ctx
			if last == "p2 gives up then p0" {
				var cancel context.CancelFunc
				waitCtx, cancel = context.WithTimeout(ctx, 300*time.Millisecond)
				defer cancel()
			}
			ctx2, cancel2 := context.WithCancel(waitCtx)
			defer cancel2()
			done2 := lockAsync(ctx2, clk, "p2", p2.l, name)
			waitForHolder(t, addrs, name, p2.c.ID())
			switch last {
			case "p2 gives up then p0":
				err2 := <-done2
				t.Logf("p2: %v", err2)
				d := make(chan error, 1)
				d <- err2
				done2 = d
			case "p2 closed then p0":
				_ = p2.c.Close(context.Background())
			}
			var l3 locks.Lease
			if last == "p3 steals, p2 gives up after" {
				done3 := make(chan struct{})
				go func() {
					defer close(done3)
					l3, err = p3.l.Lock(ctx, name)
				}()
				waitForHolder(t, addrs, name, p3.c.ID())
				cancel2()
				<-done3
			} else {
				l3, err = p3.l.Lock(ctx, name)
			}
			if err != nil {
				t.Fatal(err)
			}
			s3 := clk.begin("p3", l3)
			clk.write(s3, clk.now())
			clk.end(s3, l3)
			_ = l3.Release(ctx)
			<-released
			t.Logf("p1 context ended %v (%v), p1 let go %v, deadline %v; p3 granted %v (tokens %d -> %d)",
				ms(ctxEnd), context.Cause(v.Context()), ms(s1.ended), ms(s1.deadline), ms(s3.granted), s1.token, s3.token)
			cancel2()
			<-done2
			clk.dump(t)
			clk.check(t)
		})
	}
}
