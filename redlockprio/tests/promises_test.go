package redlockprio_test

// Tests of promises of the package doc that the other tests do not pin
// down (docs/promises.md lists which).

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

	"github.com/latchkey-go/latchkey/contracttest/testenv"
	"github.com/latchkey-go/latchkey/locks"
	"github.com/latchkey-go/latchkey/redlockprio"
)

func fenceKey(name string) string { return "latchkey:{" + name + "}:fence" }

// fenceOf returns the name's fence counter on the master at addr (0 when
// there is none).
func fenceOf(t testing.TB, addr, name string) uint64 {
	t.Helper()
	rc := newRedis(addr)
	defer rc.Close()
	n, err := rc.Get(context.Background(), fenceKey(name)).Uint64()
	if err != nil && !errors.Is(err, redis.Nil) {
		t.Fatalf("GET %s on %s: %v", fenceKey(name), addr, err)
	}
	return n
}

// fencedResource is a resource that refuses writes whose fencing token is
// not above the largest it has accepted, as the package doc asks of the
// resources a lease protects.
type fencedResource struct {
	mu  sync.Mutex
	max uint64
	log []string
}

func (r *fencedResource) write(token uint64, what string) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if token <= r.max {
		return fmt.Errorf("stale token %d (accepted %d already)", token, r.max)
	}
	r.max = token
	r.log = append(r.log, what)
	return nil
}

// expireEarly makes the master at addr expire key now, as a master whose
// clock jumped forward past the key's expiry would, and waits until the
// key is gone.
func expireEarly(t testing.TB, addr, key string) {
	t.Helper()
	rc := newRedis(addr)
	defer rc.Close()
	ctx := context.Background()
	ok, err := rc.PExpire(ctx, key, time.Millisecond).Result()
	if err != nil || !ok {
		t.Fatalf("PEXPIRE %s 1 on %s = %v, %v: the key should be there", key, addr, ok, err)
	}
	for deadline := time.Now().Add(time.Second); ; {
		n, err := rc.Exists(ctx, key).Result() // an access expires it lazily
		if err != nil {
			t.Fatal(err)
		}
		if n == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s still exists on %s a second after PEXPIRE 1", key, addr)
		}
		time.Sleep(time.Millisecond)
	}
}

// TestClockJumpLimit demonstrates a documented limit, not a guarantee:
// Redlock is not safe when a majority of the masters expire keys early,
// as a master whose clock jumps forward does (validity is local time, key
// expiry the masters' time). The test makes two of three masters expire
// the first lease's key at once (PEXPIRE 1, which is what a forward jump
// past the expiry amounts to) and shows that a second client then gets
// the name while the first lease is still live — two holders at once.
// It then shows the mitigation the package offers: the second holder's
// fencing token is higher, so a resource that checks tokens refuses the
// first holder's writes; and the first holder learns of the loss at its
// next renewal, before its deadline.
func TestClockJumpLimit(t *testing.T) {
	addrs := addrsOf(testenv.StartRedis(t, 3))
	// A renewal interval long enough that the first holder does not renew
	// (and so learn that its keys are gone) before the second takes the
	// name.
	const ttl, renew = 3 * time.Second, 900 * time.Millisecond
	opts := []redlockprio.Option{redlockprio.WithTTL(ttl), redlockprio.WithRenewInterval(renew)}
	a, b := mustClient(t, addrs, opts...), mustClient(t, addrs, opts...)
	name := uniqueName(t)
	ctx := ctxFor(t, 10*time.Second)

	first, err := a.l.TryLock(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	defer first.Release(ctx)
	firstDeadline := first.(*redlockprio.Lease).Deadline()
	key := "latchkey:{" + name + "}:1"
	for _, addr := range addrs[:2] { // a majority
		expireEarly(t, addr, key)
	}
	second, err := b.l.TryLock(ctx, name)
	if err != nil {
		t.Fatalf("expected the documented double grant after a majority expired the key early, got %v", err)
	}
	granted := time.Now()
	defer second.Release(ctx)
	if err := context.Cause(first.Context()); err != nil || !granted.Before(firstDeadline) {
		t.Fatalf("the first lease was no longer live when the second was granted (cause %v, deadline in %v): the limit did not show",
			err, firstDeadline.Sub(granted))
	}
	t.Logf("double grant (the documented limit): first lease (token %d) live for %v more when the second (token %d) was granted",
		first.Token(), firstDeadline.Sub(granted).Round(time.Millisecond), second.Token())

	// The mitigation: fencing tokens. The later holder's token is higher,
	// so a fenced resource that has seen it refuses the first holder.
	if second.Token() <= first.Token() {
		t.Fatalf("the second holder's token %d is not above the first's %d: fencing cannot help", second.Token(), first.Token())
	}
	var res fencedResource
	if err := res.write(second.Token(), "second"); err != nil {
		t.Fatalf("the fenced resource refused the current holder: %v", err)
	}
	if err := res.write(first.Token(), "first"); err == nil {
		t.Errorf("the fenced resource accepted a write from the first, stale, holder")
	} else {
		t.Logf("the fenced resource refused the first holder: %v", err)
	}

	// The first holder's next renewal finds its keys gone on a quorum: its
	// lease ends with ErrLost, before its deadline.
	select {
	case <-first.Context().Done():
	case <-time.After(renew + 2*time.Second):
		t.Fatalf("the first lease is still live %v after the second grant", renew+2*time.Second)
	}
	ended := time.Now()
	if cause := context.Cause(first.Context()); !errors.Is(cause, locks.ErrLost) {
		t.Errorf("the first lease ended with %v, want ErrLost", cause)
	}
	if !ended.Before(firstDeadline) {
		t.Errorf("the first lease ended %v after its deadline, not before it", ended.Sub(firstDeadline))
	}
	t.Logf("the first lease ended %v after the second grant (%v before its deadline): %v",
		ended.Sub(granted).Round(time.Millisecond), firstDeadline.Sub(ended).Round(time.Millisecond), context.Cause(first.Context()))
	if err := context.Cause(second.Context()); err != nil {
		t.Errorf("the second lease ended: %v", err)
	}
}

// hungBound is how long a step may take with one master of three hung:
// far below the per-call timeout the tests' clients have (ReadTimeout
// 2s, and TTL/2 = 5s for the calls' contexts below). It is a generous
// scheduling margin, not a performance claim.
const hungBound = 600 * time.Millisecond

// TestHungMinorityDoesNotDelaySteps: with one master of three hung
// (SIGSTOPped, or behind a black hole), a step returns as soon as its
// outcome is decided, not when the hung master's call times out: Lock,
// Release, a Lock of the name just released (whose call to the hung
// master queues behind the release's), and a TryLock of a held name
// (decided once two masters said "held": no quorum can grant).
func TestHungMinorityDoesNotDelaySteps(t *testing.T) {
	servers := testenv.StartRedis(t, 3)
	addrs := addrsOf(servers)
	opts := []redlockprio.Option{redlockprio.WithTTL(10 * time.Second), redlockprio.WithRenewInterval(time.Second)}
	for _, fault := range []string{"SIGSTOP", "black hole"} {
		t.Run(fault, func(t *testing.T) {
			c := mustProxied(t, addrs, opts...)
			other := mustClient(t, addrs, opts...)
			warm(t, c.l) // the inbox is subscribed on every master
			ctx := ctxFor(t, 20*time.Second)
			held := uniqueName(t)
			holder, err := other.l.TryLock(ctx, held)
			if err != nil {
				t.Fatal(err)
			}
			defer holder.Release(ctx)

			switch fault {
			case "SIGSTOP":
				if err := servers[2].Pause(); err != nil {
					t.Fatal(err)
				}
				defer servers[2].Resume()
			default:
				c.proxies[2].BlackHole()
				defer c.proxies[2].Restore()
			}
			timed := func(what string, f func() error) {
				t.Helper()
				start := time.Now()
				err := f()
				took := time.Since(start)
				if err != nil {
					t.Fatalf("%s with a hung master: %v", what, err)
				}
				if took > hungBound {
					t.Errorf("%s took %v with one master of three hung, want at most %v", what, took.Round(time.Millisecond), hungBound)
				}
				t.Logf("%s: %v", what, took.Round(time.Millisecond))
			}
			name := uniqueName(t)
			for i := range 2 {
				var lease locks.Lease
				timed(fmt.Sprintf("Lock #%d", i+1), func() (err error) {
					lease, err = c.l.Lock(ctx, name)
					return err
				})
				timed(fmt.Sprintf("Release #%d", i+1), func() error { return lease.Release(ctx) })
			}
			timed("TryLock of a held name", func() error {
				lease, err := c.l.TryLock(ctx, held)
				if err == nil {
					_ = lease.Release(ctx)
					return errors.New("granted a held name")
				}
				if !errors.Is(err, locks.ErrNotAcquired) {
					return fmt.Errorf("got %w, want ErrNotAcquired", err)
				}
				return nil
			})

			// Once the master is back, the calls left to the background
			// have done their work there: the released name is free, the
			// held one still its holder's.
			if fault == "SIGSTOP" {
				_ = servers[2].Resume()
			} else {
				c.proxies[2].Restore()
			}
			for deadline := time.Now().Add(5 * time.Second); keyExists(t, addrs[2], "latchkey:{"+name+"}:1"); {
				if time.Now().After(deadline) {
					t.Fatalf("the released lease's key is still on the hung master 5s after it came back")
				}
				time.Sleep(10 * time.Millisecond)
			}
			if got, want := holderOf(t, addrs[2], held), holder.(*redlockprio.Lease).HolderID(); got != want {
				t.Errorf("the held name's key on the hung master is %q's, want the holder %q's", got, want)
			}
		})
	}
}

// raiseHook delays or fails, on one go-redis client, the calls of the
// script that raises a fence counter (raiseScript, by its SHA1; see
// scriptOf). The delay applies
// to the EVALSHA only, so that a call that falls back to EVAL (NOSCRIPT)
// is delayed once.
type raiseHook struct {
	delay time.Duration
	fail  bool
}

func isRaise(cmd redis.Cmder) bool {
	return scriptOf(cmd) == "raise"
}

func (h *raiseHook) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h *raiseHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if isRaise(cmd) {
			if h.fail {
				err := errors.New("raiseHook: refused")
				cmd.SetErr(err)
				return err
			}
			if strings.EqualFold(cmd.Name(), "evalsha") { // once per call: not again for the EVAL after NOSCRIPT
				select {
				case <-time.After(h.delay):
				case <-ctx.Done():
					return ctx.Err()
				}
			}
		}
		return next(ctx, cmd)
	}
}

func (h *raiseHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// lockerWith makes a Locker over three clients: master 0 direct, master
// 1 with hook, master 2 through px (which the caller may cut). Its call
// timeout, 250ms, leaves room for the hooks' delays.
func lockerWith(t testing.TB, addrs []string, hook redis.Hook, px *testenv.Proxy) *redlockprio.Locker {
	t.Helper()
	rcs := []*redis.Client{newRedis(addrs[0]), newRedis(addrs[1]), newRedis(px.Addr())}
	rcs[1].AddHook(hook)
	lc, err := redlockprio.New([]redis.UniversalClient{rcs[0], rcs[1], rcs[2]},
		redlockprio.WithTTL(testTTL), redlockprio.WithRenewInterval(testRenew), redlockprio.WithCallTimeout(250*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	l := lc.Locker()
	t.Cleanup(func() {
		_ = lc.Close(context.Background())
		for _, rc := range rcs {
			_ = rc.Close()
		}
	})
	return l
}

func setFence(t testing.TB, addr, name string, n uint64) {
	t.Helper()
	rc := newRedis(addr)
	defer rc.Close()
	if err := rc.Set(context.Background(), fenceKey(name), n, 0).Err(); err != nil {
		t.Fatal(err)
	}
}

// TestTokenRecordedOnQuorumBeforeLockReturns: the token is the largest
// counter among the granting masters, and it is on a quorum of masters
// before Lock returns; then it spreads to the others. Master 0 has a high
// counter (it kept counters another master lost), master 2 is cut off, so
// the quorum is masters 0 and 1 and master 1's counter must be raised
// before Lock returns. The raise is slowed down on master 1 so that one
// made in the background, after Lock returned, would be seen missing; and
// when it fails, Lock must fail.
func TestTokenRecordedOnQuorumBeforeLockReturns(t *testing.T) {
	addrs := addrsOf(testenv.StartRedis(t, 3))
	const planted = 1000
	ctx := ctxFor(t, 20*time.Second)

	t.Run("written back", func(t *testing.T) {
		name := uniqueName(t)
		setFence(t, addrs[0], name, planted)
		px := testenv.NewProxy(t, addrs[2])
		hook := &raiseHook{delay: 100 * time.Millisecond}
		l := lockerWith(t, addrs, hook, px)
		warm(t, l)
		px.Cut()
		start := time.Now()
		lease, err := l.Lock(ctx, name)
		if err != nil {
			t.Fatal(err)
		}
		took := time.Since(start)
		defer lease.Release(ctx)
		token := lease.Token()
		if token <= planted {
			t.Fatalf("token %d, not above the counter %d a granting master had", token, planted)
		}
		// Read at once: the quorum {0, 1} must hold the token already.
		for i, addr := range addrs[:2] {
			if got := fenceOf(t, addr, name); got < token {
				t.Errorf("when Lock returned, master %d's counter was %d, below the token %d: the token was not on a quorum", i, got, token)
			}
		}
		t.Logf("token %d (planted %d); Lock took %v with a raise delayed by %v", token, planted, took.Round(time.Millisecond), hook.delay)
		// Then it spreads: master 2, reachable again, gets it from the
		// renewals.
		px.Restore()
		for deadline := time.Now().Add(5 * time.Second); fenceOf(t, addrs[2], name) < token; {
			if time.Now().After(deadline) {
				t.Fatalf("master 2's counter is %d, still below the token %d, 5s after it came back", fenceOf(t, addrs[2], name), token)
			}
			time.Sleep(20 * time.Millisecond)
		}
		if err := context.Cause(lease.Context()); err != nil {
			t.Fatalf("the lease ended: %v", err)
		}
	})

	t.Run("write-back fails", func(t *testing.T) {
		name := uniqueName(t)
		setFence(t, addrs[0], name, planted)
		px := testenv.NewProxy(t, addrs[2])
		l := lockerWith(t, addrs, &raiseHook{fail: true}, px)
		warm(t, l)
		px.Cut()
		lease, err := l.TryLock(ctx, name)
		if err == nil {
			defer lease.Release(ctx)
			t.Fatalf("Lock returned token %d, which only master 0 holds (master 1's counter %d)", lease.Token(), fenceOf(t, addrs[1], name))
		}
		var qe *redlockprio.QuorumError
		if !errors.As(err, &qe) {
			t.Errorf("TryLock = %v, want a *QuorumError", err)
		}
		t.Logf("TryLock failed as it should: %v", err)
		for i, addr := range addrs[:2] {
			if keyExists(t, addr, "latchkey:{"+name+"}:1") {
				t.Errorf("the failed attempt left its key on master %d", i)
			}
		}
	})
}

// TestValidityIsStartPlusTTLMinusDrift checks the validity formula: a
// lease's Deadline is start + TTL − drift, with start taken before the
// step's requests and drift = TTL·factor + 2ms; renewals move it, never
// past the same formula for a renewal started now.
func TestValidityIsStartPlusTTLMinusDrift(t *testing.T) {
	addrs := addrsOf(testenv.StartRedis(t, 3))
	const ttl, renew = 2 * time.Second, 250 * time.Millisecond
	for _, factor := range []float64{0, 0.01, 0.1} {
		t.Run(fmt.Sprint(factor), func(t *testing.T) {
			c := mustClient(t, addrs, redlockprio.WithTTL(ttl), redlockprio.WithRenewInterval(renew), redlockprio.WithDriftFactor(factor))
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

// TestTimedOutTheftKeepsVictimsName: a thief whose context ends before
// the masters' answers arrive has displaced the holder without knowing it
// (so without telling it). Cleaning up, it must not delete the keys it
// took from that holder — "an attempt that does not win a quorum deletes
// whatever it got, except where it displaced a lower priority" — or a
// third client gets the name while the holder still runs. (It did: the
// cleanup deleted them, and a client of the holder's priority got the
// name at once.) Nor may it acknowledge the theft of those kept keys by
// a third client of higher priority: it does not hold them, the holder
// it never told does (it did, and such a client got the name 0.77s
// before the holder's deadline).
func TestTimedOutTheftKeepsVictimsName(t *testing.T) {
	for _, third := range []int{1, 9} {
		t.Run(fmt.Sprintf("third client priority %d", third), func(t *testing.T) {
			testTimedOutTheft(t, third)
		})
	}
}

func testTimedOutTheft(t *testing.T, thirdPriority int) {
	addrs := addrsOf(testenv.StartRedis(t, 3))
	const ttl, renew = 1500 * time.Millisecond, 450 * time.Millisecond
	opts := []redlockprio.Option{redlockprio.WithTTL(ttl), redlockprio.WithRenewInterval(renew)}
	w := mustProxied(t, addrs, append(opts, redlockprio.WithPriority(1))...)
	thief := mustProxied(t, addrs, append(opts, redlockprio.WithPriority(5))...)
	z := mustClient(t, addrs, append(opts, redlockprio.WithPriority(thirdPriority))...)
	warm(t, thief.l)
	warm(t, z.l)
	name := uniqueName(t)
	ctx := ctxFor(t, 10*time.Second)
	victim, err := w.l.TryLock(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	w.cut() // the holder hears nothing and renews nothing: it runs until its deadline
	deadline := victim.(*redlockprio.Lease).Deadline()

	// The thief's requests take 100ms each way; it gives up after 50ms.
	for _, px := range thief.proxies {
		px.Latency(100 * time.Millisecond)
	}
	short, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	lease, err := thief.l.TryLock(short, name)
	cancel()
	if err == nil {
		_ = lease.Release(ctx)
		t.Fatal("the thief got the name within 50ms through 200ms round trips")
	}
	waitForHolder(t, addrs, name, thief.c.ID()) // its requests took the keys all the same
	for _, px := range thief.proxies {
		px.Restore() // the thief hears notices again, at once
	}

	got, err := z.l.Lock(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	at := time.Now()
	defer got.Release(ctx)
	if at.Before(deadline) {
		t.Fatalf("another client (priority %d) got the name %v before the displaced holder's deadline (holder live: %v)",
			thirdPriority, deadline.Sub(at).Round(time.Millisecond), victim.Context().Err() == nil)
	}
	t.Logf("another client (priority %d) got the name %v after the displaced holder's deadline", thirdPriority, at.Sub(deadline).Round(time.Millisecond))
}

// TestFirstLockWithHungMaster: a new Locker's first Lock waits for its
// inbox to be subscribed on a quorum of masters only (a thief's notice
// goes through every master it reaches, and two quorums share one), not
// on every master: a hung minority does not delay it.
func TestFirstLockWithHungMaster(t *testing.T) {
	addrs := addrsOf(testenv.StartRedis(t, 3))
	opts := []redlockprio.Option{redlockprio.WithTTL(10 * time.Second), redlockprio.WithRenewInterval(time.Second)}
	c := mustProxied(t, addrs, opts...)
	c.proxies[2].BlackHole()
	defer c.proxies[2].Restore()
	ctx := ctxFor(t, 10*time.Second)
	start := time.Now()
	lease, err := c.l.Lock(ctx, uniqueName(t))
	took := time.Since(start)
	if err != nil {
		t.Fatal(err)
	}
	defer lease.Release(ctx)
	t.Logf("a new Locker's first Lock with one master of three hung: %v", took.Round(time.Millisecond))
	if took > hungBound {
		t.Errorf("a new Locker's first Lock took %v with one master of three hung, want at most %v (it waited for every inbox subscription)", took.Round(time.Millisecond), hungBound)
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
