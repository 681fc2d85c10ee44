package redlockprio_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/latchkey-go/latchkey/contracttest"
	"github.com/latchkey-go/latchkey/contracttest/testenv"
	"github.com/latchkey-go/latchkey/locks"
	"github.com/latchkey-go/latchkey/redlockprio"
)

// TestValidityIsStartPlusTTLMinusDrift checks the validity formula: a
// lease's Deadline is start + TTL − drift, with start taken before the
// step's requests and drift = TTL·factor + 2ms; renewals move it, never
// past the same formula for a renewal started now.
func TestValidityIsStartPlusTTLMinusDrift(t *testing.T) {
	addrs := addrsOf(testenv.StartRedis(t, 3))
	const ttl, renew = 2 * time.Second, 250 * time.Millisecond
	for _, factor := range []float64{0, 0.01, 0.1} {
		t.Run(fmt.Sprint(factor), func(t *testing.T) {
			c := mustClient(t, addrs, with(redlockprio.WithTTL(ttl), redlockprio.WithRenewInterval(renew), redlockprio.WithDriftFactor(factor)))
			drift := time.Duration(float64(ttl)*factor) + 2*time.Millisecond
			ctx := ctxFor(t, 10*time.Second)
			before := time.Now()
			lease, err := c.l.TryLock(ctx, uniqueName(t))
			after := time.Now()
			if err != nil {
				t.Fatal(err)
			}
			defer lease.Release(ctx)
			dl := lease.(*redlockprio.Lease).Deadline()
			lo, hi := before.Add(ttl-drift), after.Add(ttl-drift)
			if dl.Before(lo) || dl.After(hi) {
				t.Errorf("Deadline is start + %v; want start + TTL − drift = start + %v with start in [before, after] (%v wide)",
					dl.Sub(before).Round(time.Microsecond), ttl-drift, after.Sub(before).Round(time.Microsecond))
			}
			// Renewals: at every moment the deadline is at most now + TTL −
			// drift, and it moves forward.
			first := dl
			for end := time.Now().Add(3 * renew); time.Now().Before(end); time.Sleep(10 * time.Millisecond) {
				dl := lease.(*redlockprio.Lease).Deadline()
				now := time.Now()
				if dl.After(now.Add(ttl - drift)) {
					t.Fatalf("Deadline is now + %v, beyond now + TTL − drift = %v", dl.Sub(now), ttl-drift)
				}
			}
			moved := lease.(*redlockprio.Lease).Deadline().Sub(first)
			if moved <= 0 {
				t.Errorf("the deadline did not move in %v of renewals every %v", 3*renew, renew)
			}
			t.Logf("drift %v: initial deadline start + %v..%v; moved %v by renewals", drift,
				dl.Sub(after).Round(time.Microsecond), dl.Sub(before).Round(time.Microsecond), moved.Round(time.Millisecond))
		})
	}
}

// TestNameLengthLimit: names up to 1024 bytes work; longer ones (counted
// in bytes, not characters) give ErrInvalidName from every call, before
// any I/O.
func TestNameLengthLimit(t *testing.T) {
	addrs := addrsOf(testenv.StartRedis(t, 3))
	c := mustClient(t, addrs)
	ctx := ctxFor(t, 10*time.Second)
	prefix := uniqueName(t) + "-"
	longest := prefix + strings.Repeat("x", 1024-len(prefix))
	lease, err := c.l.TryLock(ctx, longest)
	if err != nil {
		t.Fatalf("TryLock of a 1024-byte name: %v", err)
	}
	if err := lease.Release(ctx); err != nil {
		t.Fatal(err)
	}

	// Nothing listens on a fresh port of a closed listener: any I/O would
	// fail with a *QuorumError rather than ErrInvalidName.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := ln.Addr().String()
	_ = ln.Close()
	offline := mustClient(t, []string{dead})
	for _, lc := range []struct {
		what string
		c    *redlockprio.Client
		l    *redlockprio.Locker
	}{{"live masters", c.c, c.l}, {"no master", offline.c, offline.l}} {
		sem, err := lc.c.Semaphore(2)
		if err != nil {
			t.Fatal(err)
		}
		for _, name := range []string{
			prefix + strings.Repeat("x", 1025-len(prefix)),
			prefix + strings.Repeat("x", 1023-len(prefix)) + "é", // 1023 characters, 1025 bytes
			strings.Repeat("y", 1<<20),
		} {
			for call, f := range map[string]func(context.Context, string) (locks.Lease, error){
				"Lock": lc.l.Lock, "TryLock": lc.l.TryLock, "Acquire": sem.Acquire, "TryAcquire": sem.TryAcquire,
			} {
				lease, err := f(ctx, name)
				if !errors.Is(err, locks.ErrInvalidName) {
					if lease != nil {
						_ = lease.Release(ctx)
					}
					t.Errorf("%s: %s of a %d-byte name = %v, want ErrInvalidName", lc.what, call, len(name), err)
				}
			}
		}
	}
}

// TestLockerNeverClosesClients: closing a Locker — with a lease, a
// semaphore slot and a waiting Lock, so that its renewal, pub/sub and
// release calls have all used the clients — leaves the go-redis clients
// it was given open: each still answers PING, and a new Locker over them
// works (and finds the names Close released free).
func TestLockerNeverClosesClients(t *testing.T) {
	for _, n := range []int{1, 3} {
		t.Run(fmt.Sprintf("%d master(s)", n), func(t *testing.T) {
			c := mustClient(t, addrsOf(testenv.StartRedis(t, n)))
			l := c.c // closed below, and its clients only at the end of the test
			ctx := ctxFor(t, 10*time.Second)
			name := uniqueName(t)
			if _, err := l.Locker().Lock(ctx, name); err != nil {
				t.Fatal(err)
			}
			sem, err := l.Semaphore(2)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := sem.Acquire(ctx, name+"-sem"); err != nil {
				t.Fatal(err)
			}
			waiting := make(chan error, 1)
			go func() {
				lease, err := l.Locker().Lock(ctx, name) // held: waits on the release channel
				if err == nil {
					_ = lease.Release(ctx)
				}
				waiting <- err
			}()
			time.Sleep(2 * testRenew) // renewals, and the waiter subscribed
			if err := l.Close(ctx); err != nil {
				t.Fatal(err)
			}
			select {
			case err := <-waiting:
				if !errors.Is(err, locks.ErrClosed) {
					t.Errorf("the Lock waiting during Close = %v, want ErrClosed", err)
				}
			case <-time.After(5 * time.Second):
				t.Fatal("the waiting Lock did not return after Close")
			}

			var ms []redis.UniversalClient
			for i, rc := range c.rcs {
				if err := rc.Ping(ctx).Err(); err != nil {
					t.Errorf("master %d's client after Locker.Close: PING = %v", i, err)
				}
				ms = append(ms, rc)
			}
			l2C, err := redlockprio.New(ms)
			if err != nil {
				t.Fatal(err)
			}
			l2 := l2C.Locker()
			defer l2C.Close(context.Background())
			lease, err := l2.TryLock(ctx, name)
			if err != nil {
				t.Fatalf("a new Locker over the same clients: TryLock of the name the closed Locker held = %v", err)
			}
			if err := lease.Release(ctx); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// newRedisWithoutContextTimeout returns a go-redis client that does not
// end calls at their context's deadline (ContextTimeoutEnabled unset):
// only its read and write timeouts, of two seconds, end a call to a hung
// master.
func newRedisWithoutContextTimeout(addr string) *redis.Client {
	return redis.NewClient(&redis.Options{
		Addr:         addr,
		MaxRetries:   -1,
		DialTimeout:  time.Second,
		ReadTimeout:  2 * time.Second,
		WriteTimeout: 2 * time.Second,
	})
}

// TestDeadlineWithoutContextTimeout: with clients that do not honour
// context deadlines (ContextTimeoutEnabled unset), the Locker still stops
// waiting at the step's deadline: with one master, paused, and with three
// masters, two paused, Lock, TryLock and Release given a context with a
// deadline of 300ms return within 1s, half the clients' read timeout,
// which is what ends the calls to the paused masters; Lock and TryLock
// with an error matching the context's. (Lock and TryLock wait up to the
// call timeout, 300ms here, past the deadline for the deletion of what
// their attempt may hold: see the package doc.) A PING on a paused
// master's client with the same deadline shows that the client itself
// waits longer than that.
func TestDeadlineWithoutContextTimeout(t *testing.T) {
	const (
		deadline = 300 * time.Millisecond
		timeout  = 2 * time.Second // the clients' read timeout
		// bound is the longest a step may take: far enough past the
		// deadline for a loaded machine (scheduling, not performance),
		// far enough from the read timeout to tell them apart.
		bound = timeout / 2
	)
	for _, tc := range []struct{ masters, paused int }{{1, 1}, {3, 2}} {
		t.Run(fmt.Sprintf("%d of %d masters paused", tc.paused, tc.masters), func(t *testing.T) {
			servers := testenv.StartRedis(t, tc.masters)
			var ms []redis.UniversalClient
			for _, s := range servers {
				rc := newRedisWithoutContextTimeout(s.Addr())
				t.Cleanup(func() { _ = rc.Close() })
				ms = append(ms, rc)
			}
			// A long TTL: the held lease must not be lost before its
			// Release below.
			lc, err := redlockprio.New(ms, redlockprio.WithTTL(10*time.Second), redlockprio.WithRenewInterval(3*time.Second),
				redlockprio.WithCallTimeout(deadline))
			if err != nil {
				t.Fatal(err)
			}
			l := lc.Locker()
			t.Cleanup(func() { _ = lc.Close(context.Background()) }) // after the masters resume (defer below)
			warm(t, l)                                               // the inbox is subscribed: the steps are what is timed
			ctx := ctxFor(t, 10*time.Second)
			held, err := l.TryLock(ctx, uniqueName(t))
			if err != nil {
				t.Fatal(err)
			}

			for _, s := range servers[:tc.paused] {
				if err := s.Pause(); err != nil {
					t.Fatal(err)
				}
				defer s.Resume()
			}
			// The premise: the client itself does not stop at the deadline.
			premise := make(chan time.Duration, 1)
			go func() {
				pctx, cancel := context.WithTimeout(context.Background(), deadline)
				defer cancel()
				start := time.Now()
				_ = ms[0].Ping(pctx).Err()
				premise <- time.Since(start)
			}()

			// timed runs call with a deadline; its error must match the
			// context's, or for a Release (whose ctx only bounds the wait)
			// be nil or match it.
			timed := func(what string, call func(context.Context) error, nilOK bool) {
				t.Helper()
				cctx, cancel := context.WithTimeout(ctx, deadline)
				defer cancel()
				start := time.Now()
				err := call(cctx)
				took := time.Since(start)
				t.Logf("%s: %v after %v", what, err, took.Round(time.Millisecond))
				if took > bound {
					t.Errorf("%s took %v with a deadline of %v, want at most %v", what, took.Round(time.Millisecond), deadline, bound)
				}
				if took >= deadline-10*time.Millisecond {
					// The client's own timer for the same deadline may fire
					// first (seen in a CI run under -race): let cctx's end
					// before its error is compared.
					<-cctx.Done()
				}
				if !(nilOK && err == nil) && !errors.Is(err, cctx.Err()) {
					t.Errorf("%s = %v, want an error matching the context's (%v)", what, err, cctx.Err())
				}
			}
			for _, call := range []struct {
				what string
				f    func(context.Context, string) (locks.Lease, error)
			}{{"Lock", l.Lock}, {"TryLock", l.TryLock}} {
				timed(call.what, func(ctx context.Context) error {
					lease, err := call.f(ctx, uniqueName(t))
					if err == nil {
						_ = lease.Release(context.Background())
						return errors.New("granted with no quorum of masters answering")
					}
					return err
				}, false)
			}
			// Release: the keys on the paused masters expire after the TTL.
			timed("Release", held.Release, true)

			if took := <-premise; took < bound {
				t.Fatalf("PING of a paused master with a %v deadline returned after %v: the client honours deadlines, the test shows nothing", deadline, took)
			} else {
				t.Logf("the client's own PING of a paused master with a %v deadline returned after %v", deadline, took.Round(time.Millisecond))
			}
		})
	}
}

// TestConcurrentLocksOfOneLockerNeverOverlap: "Lock is safe for concurrent use",
// "Each lease still gets its own id [...] so that two leases never pass for
// one another". Four goroutines share one Locker (priority 0, retrying
// clients) and loop Lock/work/Release on one name, with a second Locker
// (priority 1, MaxRetries -1, WithImmediateAck) stealing now and then;
// both Lockers' links to master 2 add 20ms each way, and the name's fence
// counter on one master is raised by 1000 every 150ms. 3s. Checked: no
// overlap, tokens increasing in grant order.
func TestConcurrentLocksOfOneLockerNeverOverlap(t *testing.T) {
	addrs := addrsOf(testenv.StartRedis(t, 3))
	name := uniqueName(t)
	hist := contracttest.NewWriteHistory()
	shared := mustClient(t, addrs, viaProxies(), retrying(), withTiming(600*time.Millisecond, 0.01))
	hi := mustClient(t, addrs, viaProxies(), withTiming(600*time.Millisecond, 0.01), withPriority(1), with(redlockprio.WithImmediateAck()))
	warm(t, shared.l)
	warm(t, hi.l)
	shared.proxies[2].Latency(20 * time.Millisecond)
	hi.proxies[2].Latency(20 * time.Millisecond)
	setFence(t, addrs[0], name, 500)
	end := time.Now().Add(3 * time.Second)
	var wg sync.WaitGroup
	var mu sync.Mutex
	errs := map[string]int{}
	n := 0
	run := func(who string, l *redlockprio.Locker, work, pause time.Duration) {
		for time.Now().Before(end) {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			lease, err := l.Lock(ctx, name)
			cancel()
			if err != nil {
				mu.Lock()
				errs[fmt.Sprintf("%s: %v", who, shortErr(err))]++
				mu.Unlock()
				continue
			}
			s := hist.Begin(who, lease)
			stop := make(chan struct{})
			tm := time.AfterFunc(work, func() { close(stop) })
			s.WriteWhileLive(stop)
			tm.Stop()
			s.LetGo()
			_ = lease.Release(context.Background())
			mu.Lock()
			n++
			mu.Unlock()
			time.Sleep(pause)
		}
	}
	for i := range 4 {
		wg.Go(func() { run(fmt.Sprintf("g%d", i), shared.l, 5*time.Millisecond, time.Millisecond) })
	}
	wg.Go(func() { run("hi", hi.l, 3*time.Millisecond, 60*time.Millisecond) })
	stopBump := make(chan struct{})
	bumped := make(chan struct{})
	go func() {
		defer close(bumped)
		tk := time.NewTicker(150 * time.Millisecond)
		defer tk.Stop()
		for k := 1; ; k++ {
			select {
			case <-stopBump:
				return
			case <-tk.C:
				bumpFence(addrs[k%3], name, 1000)
			}
		}
	}()
	wg.Wait()
	close(stopBump)
	<-bumped
	t.Logf("%d grants; errors %v", n, errs)
	if err := hist.Check(); err != nil {
		t.Logf("sections:\n%v", hist)
		t.Error(err)
	}
}
