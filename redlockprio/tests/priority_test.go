package redlockprio_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/latchkey-go/latchkey/contracttest"
	"github.com/latchkey-go/latchkey/contracttest/testenv"
	"github.com/latchkey-go/latchkey/locks"
	"github.com/latchkey-go/latchkey/locks/driver"
	"github.com/latchkey-go/latchkey/redlockprio"
)

func TestTheftWithAcknowledgement(t *testing.T) {
	addrs := addrsOf(testenv.StartRedis(t, 3))
	low := mustClient(t, addrs, withPriority(1))
	high := mustClient(t, addrs, withPriority(5))
	high2 := mustClient(t, addrs, withPriority(5))
	name := uniqueName(t)
	ctx := ctxFor(t, 10*time.Second)
	victim, err := low.l.TryLock(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	// The victim lets go as soon as it hears: its Release is the
	// acknowledgement.
	go func() {
		<-victim.Context().Done()
		_ = victim.Release(context.Background())
	}()
	start := time.Now()
	thief, err := high.l.Lock(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	took := time.Since(start)
	if victim.Context().Err() == nil {
		t.Fatal("the thief's Lock returned while the victim's lease was live")
	}
	if cause := context.Cause(victim.Context()); !errors.Is(cause, locks.ErrPreempted) {
		t.Errorf("victim's cause = %v, want ErrPreempted", cause)
	}
	// With the acknowledgement, the thief does not wait out the TTL.
	if took > testTTL/2 {
		t.Errorf("the theft took %v: the acknowledgement did not arrive (TTL %v)", took, testTTL)
	}
	if thief.Token() <= victim.Token() {
		t.Errorf("thief's token %d not above the victim's %d", thief.Token(), victim.Token())
	}
	if _, err := high2.l.TryLock(ctx, name); !errors.Is(err, locks.ErrNotAcquired) {
		t.Errorf("an equal priority took the name from the thief: %v", err)
	}
	// The victim's stale release and renewals must not touch the thief's keys.
	if err := victim.Release(ctx); !errors.Is(err, locks.ErrPreempted) {
		t.Errorf("the victim's Release after the theft = %v, want an error matching ErrPreempted", err)
	}
	time.Sleep(2 * testRenew)
	id := thief.(*redlockprio.Lease).HolderID()
	for _, a := range addrs {
		if got := holderOf(t, a, name); got != id {
			t.Errorf("master %s: key held by %q, want the thief %q", a, got, id)
		}
	}
	if err := context.Cause(thief.Context()); err != nil {
		t.Fatalf("the thief's lease ended: %v", err)
	}
	t.Logf("theft with acknowledgement took %v", took.Round(time.Millisecond))
	_ = thief.Release(ctx)
}

func TestUnsafeStolenConsistencyFactor(t *testing.T) {
	addrs := addrsOf(testenv.StartRedis(t, 3))
	low := mustClient(t, addrs, viaProxies(), withPriority(1))
	high := mustClient(t, addrs, withPriority(5), with(redlockprio.WithUnsafeStolenConsistencyFactor(0.1)))
	name := uniqueName(t)
	ctx := ctxFor(t, 10*time.Second)
	victim, err := low.l.TryLock(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	low.cut()
	deadline := victim.(*redlockprio.Lease).Deadline()
	start := time.Now()
	thief, err := high.l.Lock(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	took := time.Since(start)
	// As documented: the thief stops waiting after 0.1·TTL, while the
	// unreachable victim may still believe it holds the name.
	if !time.Now().Before(deadline) {
		t.Fatalf("with the unsafe factor the thief still waited out the victim's validity (%v)", took)
	}
	if took < testTTL/10-10*time.Millisecond {
		t.Errorf("the thief waited %v, less than 0.1·TTL", took)
	}
	_ = thief.Release(ctx)
}

func TestEqualPriorityLockWaitsForRelease(t *testing.T) {
	addrs := addrsOf(testenv.StartRedis(t, 3))
	a := mustClient(t, addrs, withPriority(3))
	b := mustClient(t, addrs, withPriority(3))
	name := uniqueName(t)
	ctx := ctxFor(t, 10*time.Second)
	first, err := a.l.TryLock(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	got := make(chan locks.Lease, 1)
	go func() {
		l, err := b.l.Lock(ctx, name)
		if err != nil {
			t.Error(err)
		}
		got <- l
	}()
	// Over several renewals and what would have been expiries.
	select {
	case l := <-got:
		if l != nil {
			_ = l.Release(ctx)
		}
		t.Fatal("an equal priority's Lock returned while the name was held")
	case <-time.After(2 * testTTL):
	}
	if err := context.Cause(first.Context()); err != nil {
		t.Fatalf("the holder's lease ended under an equal priority: %v", err)
	}
	if err := first.Release(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case l := <-got:
		if l == nil {
			return
		}
		if l.Token() <= first.Token() {
			t.Errorf("token %d after %d", l.Token(), first.Token())
		}
		_ = l.Release(ctx)
	case <-time.After(5 * time.Second):
		t.Fatal("the waiting Lock did not get the name after its release")
	}
}

// TestAcknowledgementWaitsForRelease: a victim whose work cannot be
// interrupted (a 300ms step that ignores its context) acknowledges a
// theft only when its code lets go of the lease — its Release, or Do
// returning — or when its validity has run out, never earlier; with
// WithImmediateAck it acknowledges when its context ends, as documented.
// (It acknowledged at once, and the thief overlapped the step.)
func TestAcknowledgementWaitsForRelease(t *testing.T) {
	addrs := addrsOf(testenv.StartRedis(t, 3))
	const step = 300 * time.Millisecond
	victimOpts := []redlockprio.Option{redlockprio.WithPriority(1),
		redlockprio.WithTTL(3 * time.Second), redlockprio.WithRenewInterval(900 * time.Millisecond)}
	for _, how := range []string{"Release", "Do", "never released", "WithImmediateAck"} {
		t.Run(how, func(t *testing.T) {
			opts := victimOpts
			if how == "WithImmediateAck" {
				opts = append(opts[:len(opts):len(opts)], redlockprio.WithImmediateAck())
			}
			low := mustClient(t, addrs, with(opts...))
			high := mustClient(t, addrs, withPriority(5))
			warm(t, high.l)
			name := uniqueName(t)
			ctx := ctxFor(t, 15*time.Second)
			var (
				mu      sync.Mutex
				letGo   time.Time // when the victim's code let go of the lease
				victim  locks.Lease
				started = make(chan struct{})
				ended   = make(chan struct{})
			)
			work := func(lctx context.Context) {
				close(started)
				<-lctx.Done()
				time.Sleep(step) // cannot be interrupted
			}
			go func() {
				defer close(ended)
				if how == "Do" {
					err := locks.Do(ctx, low.l, name, func(lctx context.Context) error {
						work(lctx)
						mu.Lock()
						letGo = time.Now()
						mu.Unlock()
						return nil
					})
					if !errors.Is(err, locks.ErrPreempted) {
						t.Errorf("Do = %v, want ErrPreempted", err)
					}
					return
				}
				l, err := low.l.Lock(ctx, name)
				if err != nil {
					t.Error(err)
					close(started)
					return
				}
				mu.Lock()
				victim = l
				mu.Unlock()
				work(l.Context())
				if how == "never released" {
					return
				}
				mu.Lock()
				letGo = time.Now()
				mu.Unlock()
				_ = l.Release(ctx)
			}()
			<-started
			thief, err := high.l.Lock(ctx, name)
			if err != nil {
				t.Fatal(err)
			}
			got := time.Now()
			defer thief.Release(ctx)
			if how != "never released" {
				<-ended
			}
			mu.Lock()
			defer mu.Unlock()
			switch how {
			case "never released":
				dl := victim.(*redlockprio.Lease).Deadline()
				if got.Before(dl) {
					t.Errorf("the thief got the name %v before the unreleased victim's validity deadline", dl.Sub(got))
				}
				if got.After(dl.Add(time.Second)) {
					t.Errorf("the thief got the name %v after the unreleased victim's validity deadline", got.Sub(dl))
				}
				_ = victim.Release(ctx)
			case "WithImmediateAck":
				if !got.Before(letGo) {
					t.Errorf("with WithImmediateAck the thief got the name %v after the victim let go, want before", got.Sub(letGo))
				}
			default:
				if got.Before(letGo) {
					t.Errorf("the thief got the name %v before the victim let go of it (%s)", letGo.Sub(got).Round(time.Millisecond), how)
				} else {
					t.Logf("the thief got the name %v after the victim let go (%s)", got.Sub(letGo).Round(time.Millisecond), how)
				}
			}
		})
	}
}

// TestRobbedWaitingLockKeepsWaiting: V (priority 1, TTL 3s) holds and
// is cut off; T (priority 2) calls Lock with a 10s context, steals and
// waits for V; H (priority 3) steals from T and holds the name for 1s.
// T's Lock must not fail with ErrNotAcquired while its context is live:
// "Lock blocks until it holds name", "A held name is waited for also
// while a minority of the masters is down or hung", and TryLock, not
// Lock, is the one that "returns a *locks.HeldError" for a held name. It
// should get the name after H releases. With "master 0 restarted empty"
// one master is killed and restarted empty (a minority) before H steals.
// "T cancelled while H holds": then "When ctx ends first, Lock returns an
// error matching ctx.Err() and holds nothing" (see
// TestCancelledLockAfterRobberyReturnsCtxErr for a cancellation as H releases).
func TestRobbedWaitingLockKeepsWaiting(t *testing.T) {
	for _, how := range []string{"master 0 restarted empty, H releases at once", "T cancelled while H holds"} {
		t.Run(how, func(t *testing.T) {
			servers := testenv.StartRedis(t, 3)
			addrs := addrsOf(servers)
			hist := contracttest.NewWriteHistory()
			v := mustClient(t, addrs, viaProxies(), withTiming(3*time.Second, 0.01), withPriority(1))
			tc := mustClient(t, addrs, withTiming(400*time.Millisecond, 0.05), withPriority(2))
			h := mustClient(t, addrs, withTiming(300*time.Millisecond, 0.1), withPriority(3))
			warm(t, tc.l)
			warm(t, h.l)
			name := uniqueName(t)
			ctx := ctxFor(t, 20*time.Second)
			vl, err := v.l.TryLock(ctx, name)
			if err != nil {
				t.Fatal(err)
			}
			s1 := hist.Begin("V", vl)
			go s1.WriteWhileLive(nil)
			v.cut()
			tctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			defer cancel()
			type result struct {
				err    error
				at     time.Duration
				ctxErr error // T's context's error when Lock returned
			}
			done := make(chan result, 1)
			go func() {
				l, err := tc.l.Lock(tctx, name)
				at := hist.Now()
				ctxErr := tctx.Err()
				if err == nil {
					s := hist.Begin("T", l)
					s.Write(at)
					s.LetGo()
					_ = l.Release(context.Background())
				}
				done <- result{err, at, ctxErr}
			}()
			waitForHolder(t, addrs, name, tc.c.ID())
			if strings.HasPrefix(how, "master 0") {
				if err := servers[0].Restart(); err != nil {
					t.Fatal(err)
				}
			}
			hl, err := h.l.Lock(ctx, name)
			if err != nil {
				t.Fatal(err)
			}
			sh := hist.Begin("H", hl)
			sh.Write(hist.Now())
			var r result
			hold := time.Second
			if strings.HasSuffix(how, "at once") || how == "T cancelled as H releases" {
				hold = 0
			}
			if how == "T cancelled while H holds" {
				time.Sleep(200 * time.Millisecond)
				cancel()
			}
			select {
			case r = <-done:
			case <-time.After(hold):
			}
			sh.LetGo()
			_ = hl.Release(ctx)
			hReleased := hist.Now()
			if how == "T cancelled as H releases" {
				cancel()
			}
			if r.at == 0 {
				r = <-done
			}
			if strings.HasPrefix(how, "T cancelled") {
				t.Logf("H granted %v, released %v; T's Lock returned at %v (its context then: %v): %v",
					ms(sh.Record().Granted), ms(hReleased), ms(r.at), r.ctxErr, r.err)
				if r.err != nil && !errors.Is(r.err, context.Canceled) {
					// "when ctx ends first, the error matches ctx.Err()"
					t.Errorf("T's Lock, cancelled, returned %v, which does not match context.Canceled", r.err)
				}
				if err := hist.Check(); err != nil {
					t.Logf("sections:\n%v", hist)
					t.Error(err)
				}
				return
			}
			t.Logf("H granted %v, released %v; T's Lock returned at %v: %v", ms(sh.Record().Granted), ms(hReleased), ms(r.at), r.err)
			if errors.Is(r.err, locks.ErrNotAcquired) {
				t.Errorf("T's Lock failed with ErrNotAcquired %v before its context's end, H holding the name: %v",
					ms(10*time.Second-r.at), r.err)
			} else if r.err != nil {
				t.Errorf("T's Lock: %v", r.err)
			}
			if err := hist.Check(); err != nil {
				t.Logf("sections:\n%v", hist)
				t.Error(err)
			}
		})
	}
}

// TestHigherTryLockGivingUpKeepsVictimsName: a higher-priority TryLock waits for the
// displaced holder "or until ctx ends (then holding nothing)". V
// (priority 1, TTL 3s) is cut off and writes while its context is live; H
// (priority 2) TryLocks with 300ms: it must fail with an error matching
// context.DeadlineExceeded, and the keys it took must keep V's name, so
// that a priority-0 Lock gets it only after V's validity.
func TestHigherTryLockGivingUpKeepsVictimsName(t *testing.T) {
	addrs := addrsOf(testenv.StartRedis(t, 3))
	hist := contracttest.NewWriteHistory()
	v := mustClient(t, addrs, viaProxies(), withTiming(3*time.Second, 0.01), withPriority(1))
	h := mustClient(t, addrs, withTiming(400*time.Millisecond, 0.05), withPriority(2))
	p0 := mustClient(t, addrs, withTiming(300*time.Millisecond, 0.1))
	warm(t, h.l)
	warm(t, p0.l)
	name := uniqueName(t)
	ctx := ctxFor(t, 20*time.Second)
	vl, err := v.l.TryLock(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	s1 := hist.Begin("V", vl)
	done1 := make(chan struct{})
	go func() { defer close(done1); s1.WriteWhileLive(nil) }()
	v.cut()
	hctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	start := time.Now()
	_, err = h.l.TryLock(hctx, name)
	cancel()
	t.Logf("H's TryLock after %v: %v", time.Since(start).Round(time.Millisecond), err)
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("H's TryLock = %v, want an error matching context.DeadlineExceeded", err)
	}
	l0, err := p0.l.Lock(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	s0 := hist.Begin("p0", l0)
	s0.Write(hist.Now())
	s0.LetGo()
	_ = l0.Release(ctx)
	<-done1
	s1.LetGo()
	x1, x0 := s1.Record(), s0.Record()
	t.Logf("V context ended %v, deadline %v; p0 granted %v (tokens %d -> %d)",
		ms(x1.ContextEnd), ms(x1.Deadline), ms(x0.Granted), x1.Token, x0.Token)
	if err := hist.Check(); err != nil {
		t.Logf("sections:\n%v", hist)
		t.Error(err)
	}
}

// TestImmediateAckThiefRobbedWhileWaitingDelaysItsAck: p1 (priority 1, TTL 2s, default
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
func TestImmediateAckThiefRobbedWhileWaitingDelaysItsAck(t *testing.T) {
	for _, last := range []string{"p3 steals", "p2 gives up then p0", "p2 closed then p0"} {
		t.Run(last, func(t *testing.T) {
			addrs := addrsOf(testenv.StartRedis(t, 3))
			hist := contracttest.NewWriteHistory()
			p1 := mustClient(t, addrs, withTiming(2*time.Second, 0.01), withPriority(1))
			p2 := mustClient(t, addrs, withTiming(600*time.Millisecond, 0.01), withPriority(2), with(redlockprio.WithImmediateAck()))
			prio3 := 3
			if last != "p3 steals" {
				prio3 = 0
			}
			p3 := mustClient(t, addrs, withTiming(400*time.Millisecond, 0.01), withPriority(prio3))
			warm(t, p1.l)
			warm(t, p2.l)
			warm(t, p3.l)
			name := uniqueName(t)
			ctx := ctxFor(t, 20*time.Second)

			v, err := p1.l.TryLock(ctx, name)
			if err != nil {
				t.Fatal(err)
			}
			s1 := hist.Begin("p1", v)
			stop := make(chan struct{})
			done1 := make(chan struct{})
			go func() { defer close(done1); s1.WriteUntilDeadline(stop) }()
			released := make(chan struct{})
			go func() {
				defer close(released)
				<-v.Context().Done()
				time.Sleep(800 * time.Millisecond)
				close(stop)
				<-done1
				s1.LetGo()
				_ = v.Release(context.Background())
			}()
			ctx2, cancel2 := context.WithCancel(ctx)
			defer cancel2()
			if last == "p2 gives up then p0" {
				ctx2, cancel2 = context.WithTimeout(ctx, 300*time.Millisecond)
				defer cancel2()
			}
			done2 := lockAsync(ctx2, hist, "p2", p2.l, name)
			waitForHolder(t, addrs, name, p2.c.ID())
			switch last {
			case "p2 gives up then p0":
				t.Logf("p2: %v", <-done2)
			case "p2 closed then p0":
				_ = p2.c.Close(context.Background())
			}
			l3, err := p3.l.Lock(ctx, name)
			if err != nil {
				x1 := s1.Record()
				t.Fatalf("p3's Lock at %v (p1 context ended %v, p1 let go %v): %v", ms(hist.Now()), ms(x1.ContextEnd), ms(x1.LetGo), err)
			}
			s3 := hist.Begin("p3", l3)
			s3.Write(hist.Now())
			s3.LetGo()
			_ = l3.Release(ctx)
			<-released
			x1, x3 := s1.Record(), s3.Record()
			t.Logf("p1 context ended %v, let go %v, deadline %v; p3 granted %v (tokens %d -> %d)",
				ms(x1.ContextEnd), ms(x1.LetGo), ms(x1.Deadline), ms(x3.Granted), x1.Token, x3.Token)
			if x3.Granted < x1.LetGo && x3.Granted < x1.Deadline {
				t.Errorf("p3 was granted %v before p1 let go", ms(x1.LetGo-x3.Granted))
			}
			cancel2()
			if last == "p3 steals" {
				<-done2
			}
			if err := hist.Check(); err != nil {
				t.Logf("sections:\n%v", hist)
				t.Error(err)
			}
		})
	}
}

// TestMixedAckModesInOneChainOfHolders: leases of both kinds in one chain of
// holders. p1 (priority 1, TTL 1s, WithImmediateAck) holds and stops
// writing the moment its context ends (as that option requires). p2
// (priority 2, TTL 1s, default) steals, gets the lease once p1
// acknowledged, holds it, and its code lets go 500ms after its context
// ended. p3 (priority 3, TTL 600ms, WithImmediateAck) steals from p2: p2's
// acknowledgement is the default one, sent at Release ("sent when the
// victim calls Lease.Release"), so p3 must not be granted before p2's
// Release; and tokens p1 < p2 < p3.
func TestMixedAckModesInOneChainOfHolders(t *testing.T) {
	addrs := addrsOf(testenv.StartRedis(t, 3))
	hist := contracttest.NewWriteHistory()
	p1 := mustClient(t, addrs, withTiming(time.Second, 0.01), withPriority(1), with(redlockprio.WithImmediateAck()))
	p2 := mustClient(t, addrs, withTiming(time.Second, 0.01), withPriority(2))
	p3 := mustClient(t, addrs, withTiming(600*time.Millisecond, 0.01), withPriority(3), with(redlockprio.WithImmediateAck()))
	warm(t, p1.l)
	warm(t, p2.l)
	warm(t, p3.l)
	name := uniqueName(t)
	ctx := ctxFor(t, 20*time.Second)
	v1, err := p1.l.TryLock(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	s1 := hist.Begin("p1", v1)
	go func() {
		s1.WriteWhileLive(nil)
		s1.LetGo()
		_ = v1.Release(context.Background())
	}()
	time.Sleep(50 * time.Millisecond)
	t2 := time.Now()
	v2, err := p2.l.Lock(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	s2 := hist.Begin("p2", v2)
	t.Logf("p2 granted after %v", time.Since(t2))
	released2 := make(chan struct{})
	go func() {
		defer close(released2)
		stop := make(chan struct{})
		done := make(chan struct{})
		go func() { defer close(done); s2.WriteUntilDeadline(stop) }()
		<-v2.Context().Done()
		time.Sleep(500 * time.Millisecond)
		close(stop)
		<-done
		s2.LetGo()
		_ = v2.Release(context.Background())
	}()
	time.Sleep(50 * time.Millisecond)
	v3, err := p3.l.Lock(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	s3 := hist.Begin("p3", v3)
	s3.Write(hist.Now())
	s3.LetGo()
	_ = v3.Release(ctx)
	<-released2
	x1, x2, x3 := s1.Record(), s2.Record(), s3.Record()
	t.Logf("p2 context ended %v, let go %v, deadline %v; p3 granted %v; tokens %d %d %d",
		ms(x2.ContextEnd), ms(x2.LetGo), ms(x2.Deadline), ms(x3.Granted), x1.Token, x2.Token, x3.Token)
	if x3.Granted < x2.LetGo && x3.Granted < x2.Deadline {
		t.Errorf("p3 was granted %v before p2 let go", ms(x2.LetGo-x3.Granted))
	}
	if err := hist.Check(); err != nil {
		t.Logf("sections:\n%v", hist)
		t.Error(err)
	}
}

// TestNoticeAfterVictimReleasedEndsThiefWaitAtOnce: V (priority 1, TTL 3s) holds; T
// (priority 2) takes the name, but its theft notice is held (a gate on T's
// PUBLISH) until V has called Release and it has returned. V's code has let
// go before it was told: the acknowledgement "is sent when the victim calls
// Lease.Release [...], when its Locker closes, or when its validity runs
// out, whichever comes first". T's Lock must then return soon after the
// notice goes out (within 500ms), not after V's remaining validity (~3s).
// Variant "V WithImmediateAck": the same with V's Locker acknowledging on
// the context's end.
func TestNoticeAfterVictimReleasedEndsThiefWaitAtOnce(t *testing.T) {
	for _, variant := range []string{"V default", "V WithImmediateAck"} {
		t.Run(variant, func(t *testing.T) {
			addrs := addrsOf(testenv.StartRedis(t, 3))
			var vo []redlockprio.Option
			if variant == "V WithImmediateAck" {
				vo = append(vo, redlockprio.WithImmediateAck())
			}
			v := mustClient(t, addrs, withTiming(3*time.Second, 0.01), withPriority(1), with(vo...))
			th := mustClient(t, addrs, withTiming(600*time.Millisecond, 0.01), withPriority(2))
			warm(t, v.l)
			warm(t, th.l)
			notice := newCmdGate(isTheftNotice)
			t.Cleanup(notice.open)
			for _, rc := range th.rcs {
				rc.AddHook(notice)
			}
			notice.armed.Store(true)
			name := uniqueName(t)
			ctx := ctxFor(t, 15*time.Second)
			vl, err := v.l.TryLock(ctx, name)
			if err != nil {
				t.Fatal(err)
			}
			type res struct {
				l   locks.Lease
				err error
				at  time.Time
			}
			tr := make(chan res, 1)
			go func() {
				l, err := th.l.Lock(ctx, name)
				tr <- res{l, err, time.Now()}
			}()
			waitSeen(t, notice.seen, "T's theft notice")
			waitForHolder(t, addrs, name, th.c.ID())
			rerr := vl.Release(context.Background())
			t.Logf("V's Release: %v", rerr)
			opened := time.Now()
			notice.armed.Store(false)
			notice.open()
			select {
			case r := <-tr:
				if r.err != nil {
					t.Fatalf("T: %v", r.err)
				}
				d := r.at.Sub(opened)
				t.Logf("T's Lock returned %v after its notice went out (token %d after V's %d)", d, r.l.Token(), vl.Token())
				if d > 500*time.Millisecond {
					t.Errorf("T waited %v after the notice for a victim that had already released", d)
				}
				if r.l.Token() <= vl.Token() {
					t.Errorf("TOKEN: T %d after V %d", r.l.Token(), vl.Token())
				}
				_ = r.l.Release(ctx)
			case <-time.After(6 * time.Second):
				t.Fatal("T's Lock did not return")
			}
		})
	}
}

// TestRobbedAttemptDoesNotStallThief is lockbench's mixed-priority
// scenario as a regression case: one client of priority 1 among five of
// priority 0 locks one name over and over on 3 masters, each holding it
// for 100µs. The doc (Priorities and theft): a thief waits for its
// victim's acknowledgement, which a failed attempt sends at once, "so a
// higher priority does not wait for it".
//
// The bug: a lower attempt that won a quorum while one master had not
// answered yet, and that the higher priority robbed before its lease was
// made, gave up counting that master as unknown (it "may have taken a key
// there from a holder it did not tell") and so acknowledged no notice
// about its keys for a whole TTL: the higher priority, which had taken
// the name from those keys, waited the TTL out, and so did everyone else.
// Measured on 3 masters with a 1s TTL, 8 clients, 3s: 85 grants and two
// acknowledgement waits of 1.01s before the fix; 1,217–1,553 grants and
// no wait over 10ms after.
//
// The signature of the bug is an acknowledgement wait of the victim's
// whole TTL (3s here). The bound asserted is a third of it: a victim
// acknowledges when it releases (100µs of work) plus a pub/sub round
// trip; the longest such wait measured is printed on failure. A wait of
// a TTL after one of the clients' calls to a master timed out is the
// documented limit (the attempt did not hear every master), logged, not
// failed.
func TestRobbedAttemptDoesNotStallThief(t *testing.T) {
	const (
		ttl     = 3 * time.Second
		clients = 8
		run     = 3 * time.Second
		hold    = 100 * time.Microsecond
	)
	addrs := addrsOf(testenv.StartRedis(t, 3))
	name := uniqueName(t)
	var (
		mu       sync.Mutex
		ackWaits []time.Duration
		grants   int
		timeouts atomic.Int64
	)
	end := time.Now().Add(run)
	var wg sync.WaitGroup
	for i := range clients {
		prio := 0
		if i == 0 {
			prio = 1
		}
		cl := mustClient(t, addrs, with(redlockprio.WithTTL(ttl), redlockprio.WithPriority(prio)), countingTimeouts(&timeouts))
		warm(t, cl.l)
		stop := cl.l.Observe(func(e driver.Event) {
			if e.Kind == driver.EventAckWait {
				mu.Lock()
				ackWaits = append(ackWaits, e.Duration)
				mu.Unlock()
			}
		})
		t.Cleanup(stop)
		wg.Go(func() {
			for time.Now().Before(end) {
				// A context that outlives the run by more than a TTL: a
				// stall ends in the wait, not in a cancelled Lock.
				ctx, cancel := context.WithTimeout(context.Background(), run+2*ttl)
				l, err := cl.l.Lock(ctx, name)
				cancel()
				if err != nil {
					t.Errorf("client %d: Lock: %v", i, err)
					return
				}
				mu.Lock()
				grants++
				mu.Unlock()
				time.Sleep(hold)
				_ = l.Release(context.Background())
			}
		})
	}
	wg.Wait()
	mu.Lock()
	defer mu.Unlock()
	var longest time.Duration
	for _, d := range ackWaits {
		longest = max(longest, d)
	}
	summary := fmt.Sprintf("%d grants in %v, %d acknowledgement waits, longest %v", grants, run, len(ackWaits), longest.Round(time.Microsecond))
	t.Log(summary)
	if len(ackWaits) == 0 {
		t.Fatalf("no theft happened (%s): the test proves nothing", summary)
	}
	if longest >= ttl/3 {
		if n := timeouts.Load(); n > 0 {
			// The documented limit, not the bug: a call that timed out
			// leaves its master unknown, and the failed attempt answers
			// no notice about its keys until a key it may have taken
			// there would have expired (a CI run, 46 grants: a loaded
			// machine).
			t.Logf("a thief waited %v, after %d calls to a master timed out: the documented wait behind an attempt that did not hear every master", longest, n)
			return
		}
		t.Fatalf("a thief waited %v for its victim's acknowledgement, and no call timed out (TTL %v; bound TTL/3): %s", longest, ttl, summary)
	}
}

// TestFailedAttemptDoesNotStallThief: a lower-priority attempt that
// failed (the name held elsewhere on two masters of three) got the free
// key of the third master, and its cleanup there is slow. A higher
// priority that then displaces that key must not wait for an
// acknowledgement the attempt never gives: the attempt never held the
// name. (It waited the attempt's whole TTL, 3s.)
func TestFailedAttemptDoesNotStallThief(t *testing.T) {
	addrs := addrsOf(testenv.StartRedis(t, 3))
	ctx := ctxFor(t, 15*time.Second)
	delay := &releaseDelay{delay: 2 * time.Second, seen: make(chan struct{})}
	rcs := []*redis.Client{newRedis(addrs[0]), newRedis(addrs[1]), newRedis(addrs[2])}
	rcs[2].AddHook(delay)
	lowC, err := redlockprio.New([]redis.UniversalClient{rcs[0], rcs[1], rcs[2]}, redlockprio.WithPriority(1),
		redlockprio.WithTTL(3*time.Second), redlockprio.WithRenewInterval(900*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	low := lowC.Locker()
	t.Cleanup(func() {
		_ = lowC.Close(context.Background())
		for _, rc := range rcs {
			_ = rc.Close()
		}
	})
	high := mustClient(t, addrs, withPriority(2))
	warm(t, high.l)
	name := uniqueName(t)
	// Another process holds the name on masters 0 and 1, at priority 5.
	plant(t, addrs[0], name, 1, "other", 5)
	plant(t, addrs[1], name, 1, "other", 5)
	tried := make(chan error, 1)
	go func() {
		l, err := low.TryLock(ctx, name)
		if err == nil {
			_ = l.Release(ctx)
		}
		tried <- err
	}()
	select {
	// The attempt failed and cleans up, slowly, on master 2; it may
	// return before master 2's answer comes (decided by masters 0 and 1):
	// its cleanup there comes then, in the background.
	case <-delay.seen:
	case <-ctx.Done():
		t.Fatal("the low attempt never cleaned up")
	}
	if got := holderOf(t, addrs[2], name); !strings.HasPrefix(got, lowC.ID()+":") {
		t.Fatalf("master 2's key is %q's, want the failed attempt's", got)
	}
	unplant(t, addrs[0], name, 1)
	unplant(t, addrs[1], name, 1)
	start := time.Now()
	lease, err := high.l.Lock(ctx, name)
	took := time.Since(start)
	if err != nil {
		t.Fatal(err)
	}
	defer lease.Release(ctx)
	t.Logf("the higher priority got the name in %v", took.Round(time.Millisecond))
	if took > time.Second {
		t.Errorf("the higher priority waited %v for an attempt that never held the name (its TTL 3s)", took.Round(time.Millisecond))
	}
	if err := <-tried; !errors.Is(err, locks.ErrNotAcquired) {
		t.Errorf("the low attempt = %v, want ErrNotAcquired", err)
	}
}

// callSeen says on seen when a script call through one go-redis client
// has returned an error.
type callSeen struct {
	once sync.Once
	seen chan struct{}
	arm  chan struct{} // closed when calls start to count
}

func (h *callSeen) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h *callSeen) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		select {
		case <-h.arm:
			if n := strings.ToLower(cmd.Name()); err != nil && (n == "evalsha" || n == "eval") {
				h.once.Do(func() { close(h.seen) })
			}
		default:
		}
		return err
	}
}

func (h *callSeen) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// TestFailedAttemptWithRefusedMasterAcknowledgesAtOnce: of 5 masters,
// master 4 refuses connections, refused at once (DialerRetries 1, no
// retries). A priority-1 attempt (TTL 3s) fails (the name is held at
// priority 5 on masters 0, 1 and 2); it got master 3's free key, and its
// cleanup there is slow. Masters 0 and 1 are then freed, and a priority-2
// Lock displaces master 3's leftover key. The attempt knows from every
// answer that it took nothing from anyone: master 4 refused the
// connection, so it never got the call. It must acknowledge the notice at
// once. Before the fix, a refused dial counted as "may have granted", the
// attempt remembered that it might have kept a victim's key, never
// acknowledged, and the thief waited out the leftover key's PTTL (3s):
// with 1 of 5 masters down, a higher priority stalled a whole TTL behind
// every failed lower attempt (TestRefusingMinorityDoesNotStallMixedContention).
// Master 4 refuses from the start (its calls end in the first-contact
// check, before the acquire script) or after the Locker verified it (the
// acquire script's own dial is refused).
func TestFailedAttemptWithRefusedMasterAcknowledgesAtOnce(t *testing.T) {
	for _, when := range []string{"from the start", "after first contact"} {
		t.Run(when, func(t *testing.T) {
			servers := testenv.StartRedis(t, 5)
			addrs := addrsOf(servers)
			if when == "from the start" {
				servers[4].Stop()
				addrs[4] = deadAddr(t)
			}
			ctx := ctxFor(t, 15*time.Second)
			delay := &releaseDelay{delay: 2 * time.Second, seen: make(chan struct{})}
			refused := &callSeen{seen: make(chan struct{}), arm: make(chan struct{})}
			var rcs []*redis.Client
			var ms []redis.UniversalClient
			for i, a := range addrs {
				o := clientOptions(a).Simple()
				o.DialerRetries = 1
				rc := redis.NewClient(o)
				switch i {
				case 3:
					rc.AddHook(delay)
				case 4:
					rc.AddHook(refused)
				}
				rcs = append(rcs, rc)
				ms = append(ms, rc)
			}
			lowC, err := redlockprio.New(ms, redlockprio.WithPriority(1),
				redlockprio.WithTTL(3*time.Second), redlockprio.WithRenewInterval(900*time.Millisecond))
			if err != nil {
				t.Fatal(err)
			}
			low := lowC.Locker()
			t.Cleanup(func() {
				_ = lowC.Close(context.Background())
				for _, rc := range rcs {
					_ = rc.Close()
				}
			})
			warm(t, low)
			if when == "after first contact" {
				if err := servers[4].Kill(); err != nil {
					t.Fatal(err)
				}
				// Let the client's pooled connections fail until it dials.
				for i := 0; ; i++ {
					err := rcs[4].Ping(ctx).Err()
					var op *net.OpError
					if errors.As(err, &op) && op.Op == "dial" {
						break
					}
					if i == 100 {
						t.Fatalf("master 4's client never failed to dial: %v", err)
					}
				}
			}
			high := mustClient(t, addrs, withPriority(2))
			warm(t, high.l)
			name := uniqueName(t)
			for _, i := range []int{0, 1, 2} {
				plant(t, addrs[i], name, 1, "other", 5)
			}
			close(refused.arm)
			_, err = low.TryLock(ctx, name)
			if !errors.Is(err, locks.ErrNotAcquired) {
				t.Fatalf("the low attempt = %v, want ErrNotAcquired", err)
			}
			for _, ch := range []chan struct{}{delay.seen, refused.seen} {
				select { // its cleanup on master 3; master 4's refusal
				case <-ch:
				case <-ctx.Done():
					t.Fatal("the low attempt's calls never came")
				}
			}
			time.Sleep(100 * time.Millisecond) // master 4's late answer seen to
			if got := holderOf(t, addrs[3], name); !strings.HasPrefix(got, lowC.ID()+":") {
				t.Fatalf("master 3's key is %q's, want the failed attempt's", got)
			}
			unplant(t, addrs[0], name, 1)
			unplant(t, addrs[1], name, 1)
			start := time.Now()
			lease, err := high.l.Lock(ctx, name)
			took := time.Since(start)
			if err != nil {
				t.Fatal(err)
			}
			defer lease.Release(ctx)
			t.Logf("the higher priority got the name in %v", took.Round(time.Millisecond))
			if took > time.Second {
				t.Errorf("the higher priority waited %v for an attempt that never held the name (its TTL 3s), master 4 refusing connections",
					took.Round(time.Millisecond))
			}
		})
	}
}
