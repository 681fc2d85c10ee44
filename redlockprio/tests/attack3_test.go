package redlockprio_test

// Attack round 3, on the Client refactor: Close bounded by its context,
// the batched renewal, thefts' acknowledgement waits, Locker and
// Semaphore on one name, mixed clients under a pausing master.

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/latchkey-go/latchkey/contracttest/testenv"
	"github.com/latchkey-go/latchkey/locks"
	"github.com/latchkey-go/latchkey/locks/driver"
	"github.com/latchkey-go/latchkey/redlockprio"
)

// atk3Leaks waits up to 5s for the goroutines not in ignore to end and
// fails t with those left. The Client's background work after a Close
// whose context ended is bounded by call timeouts and publish timeouts
// (at most max(TTL/2, 1s)), so 5s is generous.
func atk3Leaks(t *testing.T, ignore goleak.Option) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		err := goleak.Find(ignore,
			goleak.IgnoreTopFunction("github.com/redis/go-redis/v9/internal/pool.(*ConnPool).reaper"),
			// a master restarted by the test: testenv's process goroutines
			goleak.IgnoreAnyFunction("github.com/latchkey-go/latchkey/contracttest/testenv.(*redisProc).start.func1"),
			goleak.IgnoreAnyFunction("os/exec.(*Cmd).Start.func2"))
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Errorf("goroutines outlive Close by 5s: %v", err)
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// atk3Client is a Client on addrs without proxies, whose go-redis clients
// are closed at the end of the test (after the Client).
func atk3Client(t *testing.T, addrs []string, opts ...redlockprio.Option) *client {
	t.Helper()
	return mustClient(t, addrs, opts...)
}

// TestAttack3CloseWithEndedContextReleases: a Client (TTL 3s) holds 5
// names on 3 masters, another Client waits on each with Lock; the holder
// is closed with a context that has already ended (variant "canceled")
// or ends 1ms after Close begins (variant "1ms"). Docs: Close "ends every
// lease [...] and releases them at the masters [...] Every wait is bounded
// by ctx: when ctx ends first, Close returns an error matching ctx.Err()
// and the rest finishes in the background". So the waiters must get the
// names soon after Close (we allow 1s), not when the keys expire (3s).
// goleak: no goroutine of either Client outlives their Close by 5s.
//
// REGRESSION TEST, FAILS at b080ddf (3 runs): "canceled" 4-5 of 5 names,
// "1ms" 0-2 of 5, are got by the waiters only after ~2.7s, when the keys
// expire. Cause: Registry.Close returns at ctx's end before its release
// goroutines have issued their calls; Client.Close then sets closedFlag,
// runOnWorker refuses, and each release's callMasters makes no call
// (ErrClosed for every master): the keys are never deleted.
func TestAttack3CloseWithEndedContextReleases(t *testing.T) {
	for _, variant := range []string{"canceled", "1ms"} {
		t.Run(variant, func(t *testing.T) {
			addrs := addrsOf(testenv.StartRedis(t, 3))
			ignore := goleak.IgnoreCurrent()
			h := atk3Client(t, addrs, atkOpts(3*time.Second, 0.01, 0)...)
			w := atk3Client(t, addrs, atkOpts(3*time.Second, 0.01, 0)...)
			ctx := ctxFor(t, 20*time.Second)
			const n = 5
			var names []string
			for i := range n {
				name := fmt.Sprintf("%s-%d", uniqueName(t), i)
				if _, err := h.l.TryLock(ctx, name); err != nil {
					t.Fatal(err)
				}
				names = append(names, name)
			}
			type got struct {
				at  time.Time
				err error
			}
			res := make(chan got, n)
			for _, name := range names {
				go func() {
					l, err := w.l.Lock(ctx, name)
					at := time.Now()
					if err == nil {
						_ = l.Release(context.Background())
					}
					res <- got{at, err}
				}()
			}
			time.Sleep(300 * time.Millisecond) // the waiters are subscribed and polling
			cctx, cancel := context.WithCancel(context.Background())
			if variant == "canceled" {
				cancel()
			} else {
				cctx, cancel = context.WithTimeout(context.Background(), time.Millisecond)
			}
			begun := time.Now()
			err := h.c.Close(cctx)
			took := time.Since(begun)
			cancel()
			t.Logf("Close took %v: %v", took, err)
			if !errors.Is(err, context.Canceled) && !errors.Is(err, context.DeadlineExceeded) && err != nil {
				t.Errorf("Close = %v, want nil or ctx's error", err)
			}
			slow := 0
			for range n {
				g := <-res
				if g.err != nil {
					t.Errorf("waiter: %v", g.err)
					continue
				}
				d := g.at.Sub(begun)
				t.Logf("waiter got the name %v after Close began", d)
				if d > time.Second {
					slow++
				}
			}
			if slow > 0 {
				t.Errorf("%d of %d names were not released by Close with an ended context: the waiters got them only when the keys expired (TTL 3s)", slow, n)
			}
			_ = w.c.Close(context.Background())
			atk3Leaks(t, ignore)
		})
	}
}

// TestAttack3VictimClientClosesDuringTheft: V (TTL 3s, priority 0,
// default acknowledgement) holds a name; its code has stopped working.
// T (priority 1, TTL 600ms) steals it and waits for V's acknowledgement,
// which the docs say is sent "when the victim calls Release [...], when
// its Client closes, or when its validity runs out, whichever comes
// first". Once V's lease context has ended (the notice arrived), V's
// Client is closed with a context that is live ("background"), already
// canceled ("canceled"), or ends 1ms after Close begins ("1ms"). T's Lock
// must return soon after V's Close (we allow 1s), not at V's validity
// (~3s).
//
// REGRESSION TEST, FAILS at b080ddf in variant "canceled" (3 of 3 runs:
// T waits ~3.0s, V's whole validity; "background" and "1ms" pass). Cause:
// notice's acknowledgement goroutine waits for holderDone, which V's
// release closes in a goroutine of Registry.Close that has not run yet
// when Close, its ctx over, closes c.done and sets closed: the goroutine
// returns on c.done without publishing, or its publish's goTracked is
// refused. Safety holds (T waits V's validity out); the documented
// "acknowledges [...] when its Client closes" does not.
func TestAttack3VictimClientClosesDuringTheft(t *testing.T) {
	for _, variant := range []string{"background", "canceled", "1ms"} {
		t.Run(variant, func(t *testing.T) {
			addrs := addrsOf(testenv.StartRedis(t, 3))
			v := atk3Client(t, addrs, atkOpts(3*time.Second, 0.01, 0)...)
			th := atk3Client(t, addrs, atkOpts(600*time.Millisecond, 0.01, 1)...)
			warm(t, th.l)
			name := uniqueName(t)
			ctx := ctxFor(t, 20*time.Second)
			vl, err := v.l.TryLock(ctx, name)
			if err != nil {
				t.Fatal(err)
			}
			type got struct {
				at    time.Time
				lease locks.Lease
				err   error
			}
			res := make(chan got, 1)
			go func() {
				l, err := th.l.Lock(ctx, name)
				res <- got{time.Now(), l, err}
			}()
			select {
			case <-vl.Context().Done():
			case <-time.After(3 * time.Second):
				t.Fatal("V was not told of the theft within 3s")
			}
			if !errors.Is(context.Cause(vl.Context()), locks.ErrPreempted) {
				t.Fatalf("V's lease ended with %v, want ErrPreempted", context.Cause(vl.Context()))
			}
			cctx, cancel := context.WithCancel(context.Background())
			switch variant {
			case "canceled":
				cancel()
			case "1ms":
				cctx, cancel = context.WithTimeout(context.Background(), time.Millisecond)
			}
			begun := time.Now()
			cerr := v.c.Close(cctx)
			cancel()
			g := <-res
			if g.err != nil {
				t.Fatalf("T's Lock: %v", g.err)
			}
			_ = g.lease.Release(context.Background())
			d := g.at.Sub(begun)
			t.Logf("V's Close: %v; T's Lock returned %v after V's Close began (V's deadline was %v after)",
				cerr, d, vl.(*redlockprio.Lease).Deadline().Sub(begun))
			if d > time.Second {
				t.Errorf("T waited %v after V's Client closed: no acknowledgement was sent at Close, T waited out V's validity", d)
			}
		})
	}
}

// atk3Watch records, for a lease, when its context ended and the
// validity deadline it had then.
type atk3Watch struct {
	mu       sync.Mutex
	ended    time.Time
	deadline time.Time
	cause    error
}

func watchLease(l locks.Lease) *atk3Watch {
	w := &atk3Watch{}
	go func() {
		<-l.Context().Done()
		now := time.Now()
		w.mu.Lock()
		w.ended, w.deadline, w.cause = now, l.(*redlockprio.Lease).Deadline(), context.Cause(l.Context())
		w.mu.Unlock()
	}()
	return w
}

func (w *atk3Watch) get() (ended, deadline time.Time, cause error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.ended, w.deadline, w.cause
}

// TestAttack3BatchRenewalMinorityFaults: one Client (TTL 600ms) holds 60
// Locker leases and 4 Semaphore(3) leases, renewed in one batch. Phase 1:
// master 0 is paused (SIGSTOP) for 250ms (well under the TTL, so that its keys
// do not expire meanwhile: with 400ms, 14 of 60 keys expired there, and
// a lease whose key a master lost stays on a bare quorum for its life,
// the documented limit); phase 2: master 1 is restarted empty,
// then 1s passes. Docs: "a paused or hung minority costs a step
// nothing when the live masters agree"; the keys stand on a quorum, so no
// lease may end, and another Client's TryLock must find each name held.
// Phase 3: masters 0 and 2 are paused: every lease must end with ErrLost
// before its validity deadline ("the lease ends with ErrLost before its
// validity runs out"). Then the masters resume and the Client closes
// within 3s; goleak.
func TestAttack3BatchRenewalMinorityFaults(t *testing.T) {
	servers := testenv.StartRedis(t, 3)
	addrs := addrsOf(servers)
	ignore := goleak.IgnoreCurrent()
	a := atk3Client(t, addrs, atkOpts(600*time.Millisecond, 0.01, 0)...)
	b := atk3Client(t, addrs, atkOpts(600*time.Millisecond, 0.01, 0)...)
	rounds := make(chan time.Duration, 1000)
	stop := a.l.Observe(func(e driver.Event) {
		if e.Kind == driver.EventRenewRound {
			select {
			case rounds <- e.Duration:
			default:
			}
		}
	})
	defer stop()
	sem, err := a.c.Semaphore(3)
	if err != nil {
		t.Fatal(err)
	}
	ctx := ctxFor(t, 25*time.Second)
	var leases []locks.Lease
	var names []string
	for i := range 60 {
		name := fmt.Sprintf("%s-%d", uniqueName(t), i)
		l, err := a.l.TryLock(ctx, name)
		if err != nil {
			t.Fatal(err)
		}
		if s := l.(*redlockprio.Lease).Slot(); s != 0 {
			t.Errorf("a Locker's lease has Slot %d, want 0", s)
		}
		leases, names = append(leases, l), append(names, name)
	}
	for i := range 4 {
		l, err := sem.TryAcquire(ctx, fmt.Sprintf("%s-sem-%d", uniqueName(t), i))
		if err != nil {
			t.Fatal(err)
		}
		if s := l.(*redlockprio.Lease).Slot(); s < 1 || s > 3 {
			t.Errorf("a Semaphore(3)'s lease has Slot %d", s)
		}
		leases = append(leases, l)
	}
	watches := make([]*atk3Watch, len(leases))
	for i, l := range leases {
		watches[i] = watchLease(l)
	}
	live := func(phase string) {
		dead := 0
		for i, l := range leases {
			if l.Context().Err() != nil {
				dead++
				if dead <= 3 {
					_, _, cause := watches[i].get()
					t.Errorf("%s: lease %d (%s) ended: %v", phase, i, l.Name(), cause)
				}
			}
		}
		t.Logf("%s: %d of %d leases live", phase, len(leases)-dead, len(leases))
	}
	probe := func(phase string) {
		for _, name := range names[:10] {
			pctx, cancel := context.WithTimeout(ctx, 2*time.Second)
			l, err := b.l.TryLock(pctx, name)
			cancel()
			if err == nil {
				t.Errorf("%s: another Client got %s (its holder's lease live at the grant: %v)", phase, name, leases[slicesIndex(names, name)].Context().Err() == nil)
				_ = l.Release(context.Background())
			} else if !errors.Is(err, locks.ErrNotAcquired) {
				t.Logf("%s: probe TryLock: %v", phase, err)
			}
		}
	}

	if err := servers[0].Pause(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(250 * time.Millisecond)
	live("master 0 paused 250ms")
	probe("master 0 paused")
	if err := servers[0].Resume(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(300 * time.Millisecond) // a renewal round reaches master 0 again
	if got := len(namesOn(t, addrs[0], names)); got != len(names) {
		t.Errorf("after the pause, master 0 holds the keys of %d of %d names", got, len(names))
	}
	if err := servers[1].Restart(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(time.Second)
	live("master 1 restarted empty, 1s")
	probe("master 1 restarted")

	_ = servers[0].Pause()
	_ = servers[2].Pause()
	pausedAt := time.Now()
	time.Sleep(1500 * time.Millisecond)
	late, alive := 0, 0
	var latest time.Duration
	for i, l := range leases {
		if l.Context().Err() == nil {
			alive++
			continue
		}
		ended, deadline, cause := watches[i].get()
		if ended.IsZero() {
			time.Sleep(10 * time.Millisecond)
			ended, deadline, cause = watches[i].get()
		}
		if !errors.Is(cause, locks.ErrLost) {
			t.Errorf("lease %d ended with %v, want ErrLost", i, cause)
		}
		latest = max(latest, ended.Sub(pausedAt))
		if ended.After(deadline) {
			late++
			if late <= 3 {
				t.Errorf("lease %d's context ended %v after its validity deadline", i, ended.Sub(deadline))
			}
		}
	}
	t.Logf("quorum paused: %d leases still live after 1.5s, %d ended late; last end %v after the pause", alive, late, latest)
	if alive > 0 {
		t.Errorf("%d leases outlived a paused majority by 1.5s (TTL 600ms)", alive)
	}
	_ = servers[0].Resume()
	_ = servers[2].Resume()
	var worst time.Duration
	n := len(rounds)
	for range n {
		worst = max(worst, <-rounds)
	}
	t.Logf("%d renewal rounds, longest %v", n, worst)
	cctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	begun := time.Now()
	if err := a.c.Close(cctx); err != nil {
		t.Errorf("Close: %v", err)
	}
	t.Logf("Close took %v", time.Since(begun))
	_ = b.c.Close(cctx)
	stop()
	atk3Leaks(t, ignore)
}

// TestAttack3CloseDuringAckWait: V (TTL 2s, priority 0, default
// acknowledgement) holds a name and its code keeps writing until its
// validity ends (it never calls Release in time). T (priority 1, TTL
// 600ms) steals and waits for V; 200ms in, T's Client is closed with a
// 20ms context. Docs: T's Lock returns an error matching ErrClosed, Close
// returns by ctx's end (we allow 200ms), and "A theft still waiting for
// its victims [...] leaves its keys at the masters to expire after the
// TTL (a victim may still run until then)". Then W (priority 0, or 2 in
// variant "W steals") Locks: it must not be granted before V's last
// write. Tokens must increase; goleak on T's Client.
func TestAttack3CloseDuringAckWait(t *testing.T) {
	for _, prioW := range []int{0, 2} {
		t.Run(fmt.Sprintf("W priority %d", prioW), func(t *testing.T) {
			addrs := addrsOf(testenv.StartRedis(t, 3))
			clk := newAtkClock()
			v := atk3Client(t, addrs, atkOpts(2*time.Second, 0.01, 0)...)
			w := atk3Client(t, addrs, atkOpts(600*time.Millisecond, 0.01, prioW)...)
			warm(t, v.l)
			warm(t, w.l)
			ignore := goleak.IgnoreCurrent()
			th := atk3Client(t, addrs, atkOpts(600*time.Millisecond, 0.01, 1)...)
			warm(t, th.l)
			name := uniqueName(t)
			ctx := ctxFor(t, 20*time.Second)
			vl, err := v.l.TryLock(ctx, name)
			if err != nil {
				t.Fatal(err)
			}
			sv := clk.begin("V", vl)
			vdone := make(chan struct{})
			go func() {
				defer close(vdone)
				clk.workIgnoringContext(sv, vl, nil)
				clk.end(sv, vl)
			}()
			res := make(chan error, 1)
			go func() {
				l, err := th.l.Lock(ctx, name)
				if err == nil {
					s := clk.begin("T", l)
					clk.write(s, clk.now())
					clk.end(s, l)
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
			sw := clk.begin("W", wl)
			clk.write(sw, clk.now())
			clk.end(sw, wl)
			_ = wl.Release(context.Background())
			<-vdone
			if clk.check(t) > 0 {
				clk.dump(t)
			}
			atk3Leaks(t, ignore)
		})
	}
}

func slicesIndex(names []string, name string) int {
	for i, n := range names {
		if n == name {
			return i
		}
	}
	return -1
}

// namesOn returns the names whose lock key exists on the master at addr.
func namesOn(t testing.TB, addr string, names []string) []string {
	t.Helper()
	var out []string
	for _, n := range names {
		if keyExists(t, addr, "latchkey:{"+n+"}:1") {
			out = append(out, n)
		}
	}
	return out
}

// TestAttack3LockerAndSemaphoreOnOneName: a Locker (Client A) and
// Semaphores of other Clients share one name on 3 masters. The docs say
// a Locker's lease has Slot 0, a Semaphore's 1 to size, "Semaphores of
// different sizes may share a name: each counts only its first size
// slots", and tokens are "strictly greater for every later holder of the
// name" (one counter per name). Checked: slots; tokens increase in grant
// order across the Locker and the Semaphores; a Semaphore(1) is refused
// while the Locker holds; then a Semaphore(2) of priority 1 (Client D)
// takes a slot while both are held, and whoever it displaced must have
// let go first: A's code writes until it calls Release, 300ms after its
// context ended; B's likewise. Logged: whether the Locker's holder and a
// Semaphore's hold the name at once (the docs do not say).
func TestAttack3LockerAndSemaphoreOnOneName(t *testing.T) {
	addrs := addrsOf(testenv.StartRedis(t, 3))
	clk := newAtkClock()
	a := atk3Client(t, addrs, atkOpts(2*time.Second, 0.01, 0)...)
	b := atk3Client(t, addrs, atkOpts(600*time.Millisecond, 0.01, 0)...)
	c := atk3Client(t, addrs, atkOpts(600*time.Millisecond, 0.01, 0)...)
	d := atk3Client(t, addrs, atkOpts(600*time.Millisecond, 0.01, 1)...)
	name := uniqueName(t)
	ctx := ctxFor(t, 20*time.Second)
	la, err := a.l.TryLock(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	if s := la.(*redlockprio.Lease).Slot(); s != 0 {
		t.Errorf("Locker's lease: Slot %d, want 0", s)
	}
	holders := map[string]locks.Lease{"A (Locker)": la}
	semB, _ := b.c.Semaphore(2)
	lb, err := semB.TryAcquire(ctx, name)
	if err == nil {
		holders["B (Semaphore(2))"] = lb
		t.Logf("B's Semaphore(2) got slot %d while A's Locker holds the name: a Locker counts as slot 1 of a Semaphore (undocumented)", lb.(*redlockprio.Lease).Slot())
		if lb.Token() <= la.Token() {
			t.Errorf("B's token %d is not above A's %d", lb.Token(), la.Token())
		}
	} else {
		t.Logf("B's Semaphore(2) refused while A's Locker holds: %v", err)
	}
	semC, _ := c.c.Semaphore(1)
	if lc, err := semC.TryAcquire(ctx, name); err == nil {
		t.Errorf("C's Semaphore(1) got slot %d while A's Locker holds the name", lc.(*redlockprio.Lease).Slot())
		_ = lc.Release(context.Background())
	} else if !errors.Is(err, locks.ErrNotAcquired) {
		t.Errorf("C's Semaphore(1): %v", err)
	}
	var wg sync.WaitGroup
	for who, l := range holders {
		s := clk.begin(who, l)
		wg.Go(func() {
			stop := make(chan struct{})
			go func() {
				<-l.Context().Done()
				time.Sleep(300 * time.Millisecond)
				close(stop)
			}()
			clk.workIgnoringContext(s, l, stop)
			clk.end(s, l)
			_ = l.Release(context.Background())
		})
	}
	semD, _ := d.c.Semaphore(2)
	ld, err := semD.Acquire(ctx, name)
	if err != nil {
		t.Fatalf("D's Acquire: %v", err)
	}
	sd := clk.begin("D (Semaphore(2), priority 1)", ld)
	clk.write(sd, clk.now())
	clk.end(sd, ld)
	displaced := map[string]bool{}
	for who, l := range holders {
		if errors.Is(context.Cause(l.Context()), locks.ErrPreempted) {
			displaced[who] = true
			t.Logf("%s (slot %d) was displaced: %v", who, l.(*redlockprio.Lease).Slot(), context.Cause(l.Context()))
		}
	}
	if len(displaced) == 0 {
		t.Errorf("D got a slot of a full Semaphore(2) without displacing anyone")
	}
	_ = ld.Release(context.Background())
	for who, l := range holders {
		if !displaced[who] {
			_ = l.Release(context.Background())
		}
	}
	wg.Wait()
	// The holder D displaced must have let go before D's grant.
	for _, s := range clk.secs {
		if x := clk.snap(s); displaced[x.who] && x.lastWrite > sd.granted {
			t.Errorf("OVERLAP: %s wrote %v after D was granted", x.who, ms(x.lastWrite-sd.granted))
		}
	}
	if ld.Token() <= la.Token() || (lb != nil && ld.Token() <= lb.Token()) {
		t.Errorf("D's token %d is not above the earlier holders'", ld.Token())
	}
	clk.dump(t)
}

// atk3Mixed is one contender of TestAttack3MixedClientsChaos.
type atk3Mixed struct {
	who       string
	ttl       time.Duration
	drift     float64
	prio      int
	callTO    time.Duration // 0: the default
	immediate bool
}

// TestAttack3MixedClientsChaos: five Lockers on one name and 3 masters,
// each through its own proxies, with different TTLs (300ms to 1.5s),
// drift factors (0 to 0.1), priorities (0 to 3), call timeouts and
// acknowledgement modes, loop Lock → work → Release for 8s. Holders with
// WithImmediateAck stop writing when their context ends; the others write
// until they Release (or their validity ends), as the docs allow. Every
// ~500ms a fault: a master paused for 150ms, one client's replies from a
// master delayed by 80ms for 300ms, or dropped for 300ms. Checked: no
// write after a later holder's grant (one monotonic clock), tokens
// strictly increasing in grant order, no context ending after its
// validity deadline. Logged: grants per contender.
func TestAttack3MixedClientsChaos(t *testing.T) {
	servers := testenv.StartRedis(t, 3)
	addrs := addrsOf(servers)
	clk := newAtkClock()
	cfg := []atk3Mixed{
		{"p0-600ms", 600 * time.Millisecond, 0.01, 0, 0, false},
		{"p1-1.5s-imm", 1500 * time.Millisecond, 0.05, 1, 0, true},
		{"p2-400ms-cto50", 400 * time.Millisecond, 0.1, 2, 50 * time.Millisecond, false},
		{"p0-800ms-imm", 800 * time.Millisecond, 0, 0, 0, true},
		{"p3-300ms", 300 * time.Millisecond, 0.01, 3, 0, false},
	}
	name := uniqueName(t)
	var lockers []*atk2Locker
	for _, m := range cfg {
		more := []redlockprio.Option{}
		if m.callTO > 0 {
			more = append(more, redlockprio.WithCallTimeout(m.callTO))
		}
		if m.immediate {
			more = append(more, redlockprio.WithImmediateAck())
		}
		lockers = append(lockers, newAtk2Locker(t, addrs, false, atkOpts(m.ttl, m.drift, m.prio, more...)...))
	}
	runFor := 8 * time.Second
	end := time.Now().Add(runFor)
	var wg sync.WaitGroup
	grants := make([]int, len(cfg))
	errs := make([]int, len(cfg))
	for i, m := range cfg {
		wg.Go(func() {
			for time.Now().Before(end) {
				ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
				l, err := lockers[i].l.Lock(ctx, name)
				cancel()
				if err != nil {
					errs[i]++
					time.Sleep(10 * time.Millisecond)
					continue
				}
				grants[i]++
				s := clk.begin(m.who, l)
				stop := make(chan struct{})
				go func() {
					time.Sleep(time.Duration(10+rand.IntN(50)) * time.Millisecond)
					close(stop)
				}()
				if m.immediate {
					clk.workWhileLive(s, l, stop)
				} else {
					clk.workIgnoringContext(s, l, stop)
				}
				clk.end(s, l)
				_ = l.Release(context.Background())
				time.Sleep(time.Duration(rand.IntN(20)) * time.Millisecond)
			}
		})
	}
	faults := 0
	for time.Now().Add(600 * time.Millisecond).Before(end) {
		time.Sleep(time.Duration(300+rand.IntN(300)) * time.Millisecond)
		k := rand.IntN(3)
		px := lockers[rand.IntN(len(lockers))].proxies[k]
		switch faults % 3 {
		case 0:
			_ = servers[k].Pause()
			time.Sleep(150 * time.Millisecond)
			_ = servers[k].Resume()
		case 1:
			px.DelayReplies(80 * time.Millisecond)
			time.Sleep(300 * time.Millisecond)
			px.Restore()
		case 2:
			px.DropReplies()
			time.Sleep(300 * time.Millisecond)
			px.Restore()
		}
		faults++
	}
	wg.Wait()
	for i, m := range cfg {
		t.Logf("%-16s grants %4d, failed Locks %d", m.who, grants[i], errs[i])
	}
	t.Logf("%d faults, %d sections", faults, len(clk.secs))
	if bad := clk.check(t); bad > 0 {
		clk.dump(t)
	}
}

// TestAttack3CloseShortDeadlinePausedMajority: a Client (TTL 600ms) holds
// 20 names, renewed in batches, when masters 0 and 1 are paused; 100ms
// later it is closed with a 50ms context. Docs: Close ends every lease
// (contexts end with ErrLost and ErrClosed), "Every wait is bounded by
// ctx", "the rest finishes in the background". Checked: Close returns
// within 250ms with an error matching context.DeadlineExceeded (or nil);
// every lease's context has ended when Close returns, with ErrClosed or
// (if a renewal round ended it first) ErrLost, never after its validity;
// after the masters resume, no goroutine of the Client is left after 5s.
func TestAttack3CloseShortDeadlinePausedMajority(t *testing.T) {
	servers := testenv.StartRedis(t, 3)
	addrs := addrsOf(servers)
	ignore := goleak.IgnoreCurrent()
	a := atk3Client(t, addrs, atkOpts(600*time.Millisecond, 0.01, 0)...)
	ctx := ctxFor(t, 20*time.Second)
	var leases []locks.Lease
	var watches []*atk3Watch
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
	atk3Leaks(t, ignore)
}

// TestAttack3ReleaseRepliesLost: H holds a name on 3 masters through
// proxies; W (another Client) waits in Lock. H's replies from masters 0
// and 1 are dropped (the requests still run there) when H releases.
// Docs: Release "returns once a quorum of masters has answered [...] or
// a *QuorumError when fewer than a quorum answered"; the release script
// deletes the key and publishes on every master it reaches, and waiters
// "retry at once when a quorum of masters has announced the same
// release". Checked: H's Release returns within 1s (a *QuorumError is
// fine); W gets the name within 1s of the Release (not at the TTL, 3s);
// W's token is above H's.
func TestAttack3ReleaseRepliesLost(t *testing.T) {
	addrs := addrsOf(testenv.StartRedis(t, 3))
	h := newAtk2Locker(t, addrs, false, atkOpts(3*time.Second, 0.01, 0)...)
	w := atk3Client(t, addrs, atkOpts(3*time.Second, 0.01, 0)...)
	// The release script is loaded on every master first: otherwise the
	// EVALSHA's NOSCRIPT answer is what gets lost, the script never runs
	// there, and the keys stay until the TTL, as the docs say of a
	// QuorumError (W then got the name after 2.7s).
	warm(t, h.l)
	ctx := ctxFor(t, 20*time.Second)
	name := uniqueName(t)
	hl, err := h.l.TryLock(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	type got struct {
		at    time.Time
		lease locks.Lease
		err   error
	}
	res := make(chan got, 1)
	go func() {
		l, err := w.l.Lock(ctx, name)
		res <- got{time.Now(), l, err}
	}()
	time.Sleep(300 * time.Millisecond)
	h.proxies[0].DropReplies()
	h.proxies[1].DropReplies()
	begun := time.Now()
	relErr := hl.Release(ctx)
	took := time.Since(begun)
	var qe *redlockprio.QuorumError
	t.Logf("H's Release took %v: %v (QuorumError: %v)", took, relErr, errors.As(relErr, &qe))
	if took > time.Second {
		t.Errorf("H's Release took %v", took)
	}
	g := <-res
	if g.err != nil {
		t.Fatalf("W's Lock: %v", g.err)
	}
	d := g.at.Sub(begun)
	t.Logf("W got the name %v after H's Release began; tokens H %d, W %d", d, hl.Token(), g.lease.Token())
	if d > time.Second {
		t.Errorf("W got the name only %v after H's Release", d)
	}
	if g.lease.Token() <= hl.Token() {
		t.Errorf("W's token %d is not above H's %d", g.lease.Token(), hl.Token())
	}
	_ = g.lease.Release(context.Background())
	h.proxies[0].Restore()
	h.proxies[1].Restore()
}

// TestAttack3TheftNoticeDelayed: V (TTL 1s, priority 0) holds a name
// through proxies whose replies (pub/sub pushes included) are delayed by
// 150ms (variant "V immediate": WithImmediateAck, V writes while its
// context is live; variant "V default": V writes until it calls Release,
// 100ms after its context ended). T (priority 1, TTL 600ms) steals. The
// notice reaches V 150ms late; T must not be granted before V's last
// write, and T's token must be above V's. T's wait is logged.
func TestAttack3TheftNoticeDelayed(t *testing.T) {
	for _, immediate := range []bool{true, false} {
		t.Run(map[bool]string{true: "V immediate", false: "V default"}[immediate], func(t *testing.T) {
			addrs := addrsOf(testenv.StartRedis(t, 3))
			clk := newAtkClock()
			var more []redlockprio.Option
			if immediate {
				more = append(more, redlockprio.WithImmediateAck())
			}
			v := newAtk2Locker(t, addrs, false, atkOpts(time.Second, 0.01, 0, more...)...)
			th := atk3Client(t, addrs, atkOpts(600*time.Millisecond, 0.01, 1)...)
			warm(t, v.l)
			warm(t, th.l)
			ctx := ctxFor(t, 20*time.Second)
			name := uniqueName(t)
			vl, err := v.l.TryLock(ctx, name)
			if err != nil {
				t.Fatal(err)
			}
			sv := clk.begin("V", vl)
			stop := make(chan struct{})
			vdone := make(chan struct{})
			go func() {
				defer close(vdone)
				if immediate {
					clk.workWhileLive(sv, vl, stop)
				} else {
					go func() {
						<-vl.Context().Done()
						time.Sleep(100 * time.Millisecond)
						close(stop)
					}()
					clk.workIgnoringContext(sv, vl, stop)
				}
				clk.end(sv, vl)
				_ = vl.Release(context.Background())
			}()
			testenv.Proxies(v.proxies).DelayReplies(150 * time.Millisecond)
			time.Sleep(20 * time.Millisecond)
			begun := time.Now()
			tl, err := th.l.Lock(ctx, name)
			if err != nil {
				t.Fatal(err)
			}
			st := clk.begin("T", tl)
			clk.write(st, clk.now())
			clk.end(st, tl)
			t.Logf("T's Lock took %v", time.Since(begun))
			_ = tl.Release(context.Background())
			if immediate {
				close(stop)
			}
			<-vdone
			testenv.Proxies(v.proxies).Restore()
			if clk.check(t) > 0 {
				clk.dump(t)
			}
		})
	}
}

// TestAttack3ThiefRenewsWhileWaiting: V (TTL 3s, priority 0, default
// acknowledgement) holds a name and lets go (Release) 1.5s after its
// context ended; T (priority 1, TTL 300ms, so its renewal interval is
// ~97ms) steals and waits, and master 0 is paused for 200ms during the
// wait. Docs: "the thief keeps renewing its keys while it waits". Checked:
// T's Lock returns after V's Release; T's lease is live then, with a
// deadline ahead; it stays live for 1s more (renewed); V's last write
// precedes T's grant; tokens increase.
func TestAttack3ThiefRenewsWhileWaiting(t *testing.T) {
	servers := testenv.StartRedis(t, 3)
	addrs := addrsOf(servers)
	clk := newAtkClock()
	v := atk3Client(t, addrs, atkOpts(3*time.Second, 0.01, 0)...)
	th := atk3Client(t, addrs, atkOpts(300*time.Millisecond, 0.01, 1)...)
	warm(t, th.l)
	ctx := ctxFor(t, 20*time.Second)
	name := uniqueName(t)
	vl, err := v.l.TryLock(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	sv := clk.begin("V", vl)
	stop := make(chan struct{})
	go func() {
		<-vl.Context().Done()
		time.Sleep(1500 * time.Millisecond)
		close(stop)
	}()
	vdone := make(chan struct{})
	go func() {
		defer close(vdone)
		clk.workIgnoringContext(sv, vl, stop)
		clk.end(sv, vl)
		_ = vl.Release(context.Background())
	}()
	go func() {
		<-vl.Context().Done()
		time.Sleep(500 * time.Millisecond)
		_ = servers[0].Pause()
		time.Sleep(200 * time.Millisecond)
		_ = servers[0].Resume()
	}()
	begun := time.Now()
	tl, err := th.l.Lock(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	st := clk.begin("T", tl)
	clk.write(st, clk.now())
	waited := time.Since(begun)
	ahead := time.Until(tl.(*redlockprio.Lease).Deadline())
	t.Logf("T waited %v; its deadline is %v ahead at the grant", waited, ahead)
	if tl.Context().Err() != nil || ahead < 50*time.Millisecond {
		t.Errorf("T's lease at its grant: %v, deadline %v ahead", context.Cause(tl.Context()), ahead)
	}
	time.Sleep(time.Second)
	if err := tl.Context().Err(); err != nil {
		t.Errorf("T's lease ended within 1s of its grant: %v", context.Cause(tl.Context()))
	}
	clk.write(st, clk.now())
	clk.end(st, tl)
	_ = tl.Release(context.Background())
	<-vdone
	if clk.check(t) > 0 {
		clk.dump(t)
	}
}
