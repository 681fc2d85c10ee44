package redlockprio_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"go.uber.org/goleak"

	"github.com/latchkey-go/latchkey/contracttest"
	"github.com/latchkey-go/latchkey/contracttest/testenv"
	"github.com/latchkey-go/latchkey/locks"
	"github.com/latchkey-go/latchkey/redlockprio"
)

// TestCloseKeepsWaitingThiefKeys: closing a Locker whose thief still
// waits for an unreachable victim must not free the name before the
// victim's validity has run out.
func TestCloseKeepsWaitingThiefKeys(t *testing.T) {
	addrs := addrsOf(testenv.StartRedis(t, 3))
	low := mustClient(t, addrs, viaProxies(), withPriority(1))
	high := mustClient(t, addrs, withPriority(5))
	other := mustClient(t, addrs, withPriority(1))
	name := uniqueName(t)
	ctx := ctxFor(t, 10*time.Second)
	victim, err := low.l.TryLock(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	low.cut()
	deadline := victim.(*redlockprio.Lease).Deadline()
	errc := make(chan error, 1)
	go func() {
		l, err := high.l.Lock(ctx, name)
		if err == nil {
			_ = l.Release(ctx)
			err = errors.New("the thief got the name")
		}
		errc <- err
	}()
	waitForHolder(t, addrs, name, high.c.ID())
	if err := high.c.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := <-errc; !errors.Is(err, locks.ErrClosed) {
		t.Errorf("the thief's Lock after Close = %v, want ErrClosed", err)
	}
	lease, err := other.l.Lock(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	got := time.Now()
	defer lease.Release(ctx)
	if victim.Context().Err() == nil {
		t.Fatal("another client got the name while the unreachable victim still held it")
	}
	if got.Before(deadline) {
		t.Errorf("another client got the name %v before the victim's validity deadline", deadline.Sub(got))
	}
}

// TestCloseBoundedWithHungMaster: with one of three masters hung (its
// link open and silent), Close with a context that never ends returns
// within the call timeout plus measured slack, whether the masters'
// go-redis clients bound their calls by the context or (go-redis's
// default) not: it does not wait out go-redis's own dial and read
// timeouts, 5s and more. The master hangs either while the Client holds
// a lease, or before its first Lock, while the Client's subscriptions
// connect to it (go-redis holds a PubSub's lock through the connection's
// handshake, which Close must not wait for). No goroutine of the Client
// is left soon after: with the master still hung when go-redis ends calls
// at their context's deadline, else once the link is restored.
func TestCloseBoundedWithHungMaster(t *testing.T) {
	servers := testenv.StartRedis(t, 3)
	p := testenv.NewProxy(t, servers[0].Addr())
	const callTimeout = 300 * time.Millisecond
	for _, tc := range []struct {
		name    string
		options func(addr string) *redis.Options
		bounded bool // go-redis ends calls at their context's deadline
	}{
		{"go-redis defaults", func(addr string) *redis.Options { return &redis.Options{Addr: addr} }, false},
		{"context timeouts", func(addr string) *redis.Options { return clientOptions(addr).Simple() }, true},
	} {
		for _, before := range []bool{false, true} {
			order := "hung while holding"
			if before {
				order = "hung before Lock"
			}
			t.Run(tc.name+"/"+order, func(t *testing.T) {
				p.Restore()
				ignore := goleak.IgnoreCurrent()
				rcs := []*redis.Client{redis.NewClient(tc.options(p.Addr()))}
				direct := []*redis.Client{redis.NewClient(tc.options(servers[0].Addr()))}
				for _, s := range servers[1:] {
					rcs = append(rcs, redis.NewClient(tc.options(s.Addr())))
					direct = append(direct, redis.NewClient(tc.options(s.Addr())))
				}
				t.Cleanup(func() {
					p.Restore()
					for _, rc := range append(rcs, direct...) {
						_ = rc.Close()
					}
				})
				opts := []redlockprio.Option{redlockprio.WithTTL(3 * time.Second), redlockprio.WithCallTimeout(callTimeout)}
				c, err := redlockprio.New(rcs, opts...)
				if err != nil {
					t.Fatal(err)
				}
				// The round trip measured is a whole TryLock and Release, the
				// steps Close's own release takes before it abandons the hung
				// master's calls; measured on another Client when the
				// master must hang before this one's first call.
				measured := c
				if before {
					if measured, err = redlockprio.New(direct, opts...); err != nil {
						t.Fatal(err)
					}
				}
				ctx := context.Background()
				bound := contracttest.MeasureBound(t, callTimeout, func() error {
					l, err := measured.Locker().TryLock(ctx, t.Name())
					if err != nil {
						return err
					}
					return l.Release(ctx)
				})
				if before {
					if err := measured.Close(ctx); err != nil {
						t.Fatal(err)
					}
					p.BlackHole()
					// The two live masters are a quorum: the Lock is
					// granted, the hung master's subscription still
					// connecting.
					lctx, cancel := context.WithTimeout(ctx, 10*time.Second)
					l, err := c.Locker().Lock(lctx, t.Name()+"/before")
					cancel()
					if err != nil {
						t.Fatal(err)
					}
					if err := l.Release(ctx); err != nil {
						t.Fatal(err)
					}
				} else {
					if _, err := c.Locker().TryLock(ctx, t.Name()+"/held"); err != nil {
						t.Fatal(err)
					}
					p.BlackHole()
				}
				start := time.Now()
				stopWatch := bound.Watch()
				err = c.Close(ctx)
				took := time.Since(start)
				stopWatch()
				// The release of a held lease waits for a quorum, which the
				// two live masters give at once; then the hung master's calls
				// are abandoned after the call timeout.
				bound.Check(t, "Close with a hung master ("+order+")", took)
				if err != nil {
					t.Fatalf("Close: %v", err)
				}
				// The go-redis clients stay open, and so do the proxy's
				// links. Calls that go-redis ends at their deadline end
				// with the master still hung; the others when it answers
				// again (or after go-redis's own timeouts).
				if !tc.bounded {
					p.Restore()
				}
				checkNoLeaks(t, ignore,
					goleak.IgnoreTopFunction("github.com/redis/go-redis/v9/maintnotifications.(*CircuitBreakerManager).cleanupLoop"),
					goleak.IgnoreAnyFunction("github.com/latchkey-go/latchkey/contracttest/testenv.(*Proxy).serve"),
					goleak.IgnoreAnyFunction("github.com/latchkey-go/latchkey/contracttest/testenv.(*Proxy).read"),
					goleak.IgnoreAnyFunction("github.com/latchkey-go/latchkey/contracttest/testenv.(*Proxy).write"))
			})
		}
	}
}

// TestCloseDuringAckWaitKeepsThiefKeys: V (TTL 2s, priority 0, default
// acknowledgement) holds a name and its code keeps writing until its
// validity ends (it never calls Release in time). T (priority 1, TTL
// 600ms) steals and waits for V; 200ms in, T's Client is closed with a
// 20ms context. Docs: T's Lock returns an error matching ErrClosed, Close
// returns by ctx's end (we allow 200ms), and "A theft still waiting for
// its victims [...] leaves its keys at the masters to expire after the
// TTL (a victim may still run until then)". Then W (priority 0, or 2 in
// variant "W steals") Locks: it must not be granted before V's last
// write. Tokens must increase; goleak on T's Client.
func TestCloseDuringAckWaitKeepsThiefKeys(t *testing.T) {
	for _, prioW := range []int{0, 2} {
		t.Run(fmt.Sprintf("W priority %d", prioW), func(t *testing.T) {
			addrs := addrsOf(testenv.StartRedis(t, 3))
			hist := contracttest.NewWriteHistory()
			v := mustClient(t, addrs, withTiming(2*time.Second, 0.01))
			w := mustClient(t, addrs, withTiming(600*time.Millisecond, 0.01), withPriority(prioW))
			warm(t, v.l)
			warm(t, w.l)
			ignore := goleak.IgnoreCurrent()
			th := mustClient(t, addrs, withTiming(600*time.Millisecond, 0.01), withPriority(1))
			warm(t, th.l)
			name := uniqueName(t)
			ctx := ctxFor(t, 20*time.Second)
			vl, err := v.l.TryLock(ctx, name)
			if err != nil {
				t.Fatal(err)
			}
			sv := hist.Begin("V", vl)
			vdone := make(chan struct{})
			go func() {
				defer close(vdone)
				sv.WriteUntilDeadline(nil)
				sv.LetGo()
			}()
			res := make(chan error, 1)
			go func() {
				l, err := th.l.Lock(ctx, name)
				if err == nil {
					s := hist.Begin("T", l)
					s.Write(hist.Now())
					s.LetGo()
					_ = l.Release(context.Background())
					err = errors.New("got the name")
				}
				res <- err
			}()
			<-vl.Context().Done()
			time.Sleep(200 * time.Millisecond)
			cctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
			begun := time.Now()
			cerr := th.c.Close(cctx)
			took := time.Since(begun)
			cancel()
			var lerr error
			select {
			case lerr = <-res:
			case <-time.After(time.Second):
				t.Fatal("T's Lock did not return within 1s of its Client's Close")
			}
			lockTook := time.Since(begun)
			t.Logf("T's Close took %v (%v); T's Lock returned %v after: %v", took, cerr, lockTook, lerr)
			if took > 200*time.Millisecond {
				t.Errorf("Close with a 20ms context took %v", took)
			}
			if !errors.Is(lerr, locks.ErrClosed) {
				t.Errorf("T's Lock = %v, want an error matching ErrClosed", lerr)
			}
			wl, err := w.l.Lock(ctx, name)
			if err != nil {
				t.Fatalf("W's Lock: %v", err)
			}
			sw := hist.Begin("W", wl)
			sw.Write(hist.Now())
			sw.LetGo()
			_ = wl.Release(context.Background())
			<-vdone
			if err := hist.Check(); err != nil {
				t.Logf("sections:\n%v", hist)
				t.Error(err)
			}
			checkNoLeaks(t, ignore)
		})
	}
}

// TestCloseWithShortDeadlineEndsEveryLease: a Client (TTL 600ms) holds
// 20 names, renewed in batches, when masters 0 and 1 are paused; 100ms
// later it is closed with a 50ms context. Docs: Close ends every lease
// (contexts end with ErrLost and ErrClosed), "Every wait is bounded by
// ctx", "the rest finishes in the background". Checked: Close returns
// within 250ms with an error matching context.DeadlineExceeded (or nil);
// every lease's context has ended when Close returns, with ErrClosed or
// (if a renewal round ended it first) ErrLost, never after its validity;
// after the masters resume, no goroutine of the Client is left after 5s.
func TestCloseWithShortDeadlineEndsEveryLease(t *testing.T) {
	servers := testenv.StartRedis(t, 3)
	addrs := addrsOf(servers)
	ignore := goleak.IgnoreCurrent()
	a := mustClient(t, addrs, withTiming(600*time.Millisecond, 0.01))
	ctx := ctxFor(t, 20*time.Second)
	var leases []locks.Lease
	var watches []*leaseWatch
	for i := range 20 {
		l, err := a.l.TryLock(ctx, fmt.Sprintf("%s-%d", uniqueName(t), i))
		if err != nil {
			t.Fatal(err)
		}
		leases = append(leases, l)
		watches = append(watches, watchLease(l))
	}
	time.Sleep(250 * time.Millisecond) // a renewal round or so
	_ = servers[0].Pause()
	_ = servers[1].Pause()
	time.Sleep(100 * time.Millisecond)
	cctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	begun := time.Now()
	err := a.c.Close(cctx)
	took := time.Since(begun)
	cancel()
	t.Logf("Close took %v: %v", took, err)
	if took > 250*time.Millisecond {
		t.Errorf("Close with a 50ms context took %v", took)
	}
	if err != nil && !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Close = %v", err)
	}
	for i, l := range leases {
		if l.Context().Err() == nil {
			t.Errorf("lease %d live after Close", i)
			continue
		}
		if cause := context.Cause(l.Context()); !errors.Is(cause, locks.ErrLost) {
			t.Errorf("lease %d ended with %v, want ErrLost (and ErrClosed)", i, cause)
		}
	}
	time.Sleep(20 * time.Millisecond)
	for i, w := range watches {
		if ended, deadline, _ := w.get(); ended.After(deadline) {
			t.Errorf("lease %d's context ended %v after its validity", i, ended.Sub(deadline))
		}
	}
	_ = servers[0].Resume()
	_ = servers[1].Resume()
	checkNoLeaks(t, ignore)
}

// TestCloseAfterReleaseLeftToBackground: a Client (TTL 3s, renewal every
// 200ms, call timeout 600ms) holds a name when two of its three masters
// hang (black-holed: connections open, silent); a renewal round then
// waits for them. A Release with a 20ms ctx returns ctx's error and
// leaves the release to the background once the round is over; a Close
// right after, with a ctx that never ends, must still return within the
// call timeout of its start (Client.Close: "within the call timeout
// (WithCallTimeout) of its start when masters do not answer ... while it
// held leases"), though it now waits for that background release, and
// return that release's *QuorumError, and leave no goroutine of the
// Client behind.
func TestCloseAfterReleaseLeftToBackground(t *testing.T) {
	servers := testenv.StartRedis(t, 3)
	addrs := addrsOf(servers)
	const callTimeout = 600 * time.Millisecond
	timing := with(redlockprio.WithTTL(3*time.Second), redlockprio.WithRenewInterval(200*time.Millisecond), redlockprio.WithCallTimeout(callTimeout))
	other := mustClient(t, addrs, timing)
	warm(t, other.l)
	ctx := ctxFor(t, 15*time.Second)
	bound := contracttest.MeasureBound(t, callTimeout, func() error {
		l, err := other.l.TryLock(ctx, uniqueName(t)+"/measure")
		if err != nil {
			return err
		}
		return l.Release(ctx)
	})
	ignore := goleak.IgnoreCurrent()
	c := mustClient(t, addrs, timing, viaProxies())
	warm(t, c.l)
	name := uniqueName(t)
	lease, err := c.l.TryLock(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	c.proxies[0].BlackHole()
	c.proxies[1].BlackHole()
	time.Sleep(300 * time.Millisecond) // a round began within 200ms and waits for them
	rctx, rcancel := context.WithTimeout(ctx, 20*time.Millisecond)
	rerr := lease.Release(rctx)
	rcancel()
	if rerr != nil && !errors.Is(rerr, context.DeadlineExceeded) {
		t.Errorf("Release returned %v: neither nil nor ctx's error", rerr)
	}
	start := time.Now()
	stopWatch := bound.Watch()
	cerr := c.c.Close(context.Background())
	took := time.Since(start)
	stopWatch()
	t.Logf("Release: %v; Close took %v: %v", rerr, ms(took), cerr)
	bound.Check(t, "Close after a Release left to the background, two masters hung", took)
	// The background release met one master of three: Close reports it.
	var qe *redlockprio.QuorumError
	if !errors.As(cerr, &qe) {
		t.Errorf("Close = %v, want the background release's *QuorumError", cerr)
	}
	if lease.Context().Err() == nil {
		t.Error("the lease is live after Release and Close")
	}
	c.proxies.Restore()
	checkNoLeaks(t, ignore,
		goleak.IgnoreTopFunction("github.com/redis/go-redis/v9/maintnotifications.(*CircuitBreakerManager).cleanupLoop"),
		goleak.IgnoreAnyFunction("github.com/latchkey-go/latchkey/contracttest/testenv.(*Proxy).serve"),
		goleak.IgnoreAnyFunction("github.com/latchkey-go/latchkey/contracttest/testenv.(*Proxy).read"),
		goleak.IgnoreAnyFunction("github.com/latchkey-go/latchkey/contracttest/testenv.(*Proxy).write"),
		goleak.IgnoreAnyFunction("github.com/latchkey-go/latchkey/contracttest/testenv.(*Proxy).accept"))
}
