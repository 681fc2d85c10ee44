package redlockprio_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/latchkey-go/latchkey/contracttest"
	"github.com/latchkey-go/latchkey/contracttest/testenv"
	"github.com/latchkey-go/latchkey/locks"
	"github.com/latchkey-go/latchkey/redlockprio"
)

// TestSemaphoreTheftInLosingSlotTellsVictim: a semaphore acquisition
// wins slot 2 and, on one master, displaced the holder of slot 1, a slot
// it does not keep. That holder must hear of it before anyone else gets
// slot 1.
func TestSemaphoreTheftInLosingSlotTellsVictim(t *testing.T) {
	addrs := addrsOf(testenv.StartRedis(t, 3))
	ctx := ctxFor(t, 30*time.Second)
	// The scenario needs all three of the thief's answers: on a loaded
	// machine the third may come after the grace for stragglers (its
	// TryAcquire then fails as held), and it is set up again on a fresh
	// name.
	for try := 1; ; try++ {
		if theftInLosingSlot(t, ctx, addrs) {
			return
		}
		if try == 5 {
			t.Fatal("five tries: the thief's third answer came after the grace every time")
		}
	}
}

// theftInLosingSlot runs TestSemaphoreTheftInLosingSlotTellsVictim on a
// fresh name; it returns false when the thief's TryAcquire missed an
// answer in its grace.
func theftInLosingSlot(t *testing.T, ctx context.Context, addrs []string) bool {
	name := uniqueName(t)
	// The victim holds slot 1 (a lock's key) on masters 0 and 1 only.
	v := mustClient(t, addrs, viaProxies(), withPriority(1), with(redlockprio.WithTTL(3*time.Second), redlockprio.WithRenewInterval(900*time.Millisecond)))
	v.proxies[2].Cut()
	victim, err := v.l.Lock(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	// Higher priorities hold slot 2 on master 0 and slot 1 on master 2.
	plant(t, addrs[0], name, 2, "h", 9)
	plant(t, addrs[2], name, 1, "x", 9)
	thief := mustClient(t, addrs, withPriority(5))
	sem, err := thief.c.Semaphore(2)
	if err != nil {
		t.Fatal(err)
	}
	// Slot 2 on masters 1 and 2 (free), slot 1 on master 0 (the victim's).
	lease, err := sem.TryAcquire(ctx, name)
	var he *locks.HeldError
	if errors.As(err, &he) && strings.Contains(err.Error(), "no answer within the grace") {
		t.Logf("the thief missed an answer: %v", err)
		return false
	}
	if err != nil {
		t.Fatal(err)
	}
	defer lease.Release(ctx)
	if s := lease.(*redlockprio.Lease).Slot(); s != 2 {
		t.Fatalf("the thief got slot %d, want 2", s)
	}
	unplant(t, addrs[2], name, 1)
	other := mustClient(t, addrs, withPriority(1))
	l2, err := other.l.Lock(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	defer l2.Release(ctx)
	if victim.Context().Err() == nil {
		t.Fatal("another client got slot 1 while its displaced holder still believed it held it")
	}
	return true
}

// TestSemaphoreTheftChainKeepsAtMostSizeHolders: a semaphore of 2 slots. V1 (priority
// 1, TTL 3s) and V2 (priority 1, TTL 300ms or 3s) hold both slots; V1 is
// cut off and writes while its context is live; V2 is cut off too or
// healthy. T (priority 2, TTL 400ms) steals a slot and waits; then H1 and
// H2 (priority 3, TTL 300ms) acquire at once. At no time may more than 2
// holders write ("at most size leases per name at once [...] with the
// same guarantees as a lock").
func TestSemaphoreTheftChainKeepsAtMostSizeHolders(t *testing.T) {
	for _, how := range []string{"both victims cut off", "V2 short and healthy"} {
		t.Run(how, func(t *testing.T) {
			addrs := addrsOf(testenv.StartRedis(t, 3))
			hist := contracttest.NewWriteHistory()
			v1 := mustClient(t, addrs, viaProxies(), withTiming(3*time.Second, 0.01), withPriority(1))
			v2ttl := 3 * time.Second
			if how != "both victims cut off" {
				v2ttl = 300 * time.Millisecond
			}
			v2 := mustClient(t, addrs, viaProxies(), withTiming(v2ttl, 0.01), withPriority(1))
			tc := mustClient(t, addrs, withTiming(400*time.Millisecond, 0.05), withPriority(2))
			h1 := mustClient(t, addrs, withTiming(300*time.Millisecond, 0.1), withPriority(3))
			h2 := mustClient(t, addrs, withTiming(300*time.Millisecond, 0), withPriority(3))
			for _, c := range []*client{v1, v2, tc, h1, h2} {
				warm(t, c.l)
			}
			name := uniqueName(t)
			ctx := ctxFor(t, 20*time.Second)
			var wg sync.WaitGroup
			hold := func(who string, c *client, cut func(), ignore bool) {
				sem, err := c.c.Semaphore(2)
				if err != nil {
					t.Fatal(err)
				}
				l, err := sem.Acquire(ctx, name)
				if err != nil {
					t.Errorf("%s: %v", who, err)
					return
				}
				s := hist.Begin(who, l)
				stop := make(chan struct{})
				wg.Go(func() {
					if ignore {
						time.AfterFunc(500*time.Millisecond, func() { close(stop) })
						s.WriteUntilDeadline(stop)
					} else {
						s.WriteWhileLive(stop)
					}
					s.LetGo()
					_ = l.Release(context.Background())
				})
				if cut != nil {
					cut()
				}
				t.Logf("%s holds slot %d token %d", who, l.(interface{ Slot() int }).Slot(), l.Token())
			}
			hold("V1", v1, v1.cut, false)
			if how == "both victims cut off" {
				hold("V2", v2, v2.cut, false)
			} else {
				hold("V2", v2, nil, true)
			}
			wg.Go(func() {
				tctx, cancel := context.WithTimeout(ctx, 8*time.Second)
				defer cancel()
				sem, _ := tc.c.Semaphore(2)
				l, err := sem.Acquire(tctx, name)
				if err != nil {
					t.Logf("T: %v", err)
					return
				}
				s := hist.Begin("T", l)
				t.Logf("T granted slot %d", l.(interface{ Slot() int }).Slot())
				s.Write(hist.Now())
				s.LetGo()
				_ = l.Release(context.Background())
			})
			time.Sleep(300 * time.Millisecond)
			for _, h := range []struct {
				who string
				c   *client
			}{{"H1", h1}, {"H2", h2}} {
				wg.Go(func() {
					sem, _ := h.c.c.Semaphore(2)
					l, err := sem.Acquire(ctx, name)
					if err != nil {
						t.Errorf("%s: %v", h.who, err)
						return
					}
					s := hist.Begin(h.who, l)
					t.Logf("%s granted slot %d", h.who, l.(interface{ Slot() int }).Slot())
					stop := make(chan struct{})
					time.AfterFunc(100*time.Millisecond, func() { close(stop) })
					s.WriteWhileLive(stop)
					s.LetGo()
					_ = l.Release(context.Background())
				})
			}
			wg.Wait()
			t.Logf("sections:\n%v", hist)
			n, at := hist.Peak()
			t.Logf("at most %d holders at once (at %v)", n, ms(at))
			if n > 2 {
				t.Errorf("%d holders of a 2-slot semaphore wrote at once (at %v)", n, ms(at))
			}
		})
	}
}

// TestSemaphoreTokensIncreasePerSlotOverSlowLinks: a semaphore of 2 slots on 3
// masters, five Lockers (priorities 0, 0, 1, 2, 3; TTLs 600ms–1s; two with
// retrying clients; two WithImmediateAck), whose links to master 2 are
// slow (25ms each way, or replies 300ms late, past the call timeout), while
// the name's fence counter on one master is raised by 1000 every 150ms. The
// docs: a Semaphore has "the same guarantees as a lock: [...] fencing tokens
// per name", and "Lease.Token is strictly greater for every later holder of
// a name". Checked: per slot, no overlap and tokens increasing in grant
// order; at most 2 sections at once; and for any two leases where the
// second's Acquire was called after the first's returned, a greater token.
func TestSemaphoreTokensIncreasePerSlotOverSlowLinks(t *testing.T) {
	addrs := addrsOf(testenv.StartRedis(t, 3))
	name := uniqueName(t)
	workers := []stormWorker{
		{"s0p0", 0, 600 * time.Millisecond, false, false, 25 * time.Millisecond, false},
		{"s1p0r", 0, time.Second, true, false, 300 * time.Millisecond, true},
		{"s2p1ri", 1, 600 * time.Millisecond, true, true, 25 * time.Millisecond, false},
		{"s3p2", 2, 800 * time.Millisecond, false, false, 300 * time.Millisecond, true},
		{"s4p3i", 3, 600 * time.Millisecond, false, true, 25 * time.Millisecond, false},
	}
	hist := contracttest.NewWriteHistory() // Check compares the sections of each slot
	type rec struct {
		who           string
		called, gotAt time.Duration
		token         uint64
		slot          int
	}
	var mu sync.Mutex
	var recs []rec
	var sems []*redlockprio.Semaphore
	for _, w := range workers {
		var more []redlockprio.Option
		if w.immediate {
			more = append(more, redlockprio.WithImmediateAck())
		}
		opts := []clientOption{viaProxies(), withTiming(w.ttl, 0.01), withPriority(w.prio), with(more...)}
		if w.retries {
			opts = append(opts, retrying())
		}
		a := mustClient(t, addrs, opts...)
		warm(t, a.l)
		if w.delay2 {
			a.proxies[2].DelayReplies(w.slow2)
		} else {
			a.proxies[2].Latency(w.slow2)
		}
		s, err := a.c.Semaphore(2)
		if err != nil {
			t.Fatal(err)
		}
		sems = append(sems, s)
	}
	setFence(t, addrs[0], name, 500)
	end := time.Now().Add(5 * time.Second)
	var wg sync.WaitGroup
	errs := map[string]int{}
	for i, w := range workers {
		wg.Go(func() {
			r := rand.New(rand.NewPCG(uint64(i), 9))
			for time.Now().Before(end) {
				ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
				called := hist.Now()
				l, err := sems[i].Acquire(ctx, name)
				cancel()
				if err != nil {
					mu.Lock()
					errs[fmt.Sprintf("%s: %v", w.name, shortErr(err))]++
					mu.Unlock()
					time.Sleep(5 * time.Millisecond)
					continue
				}
				s := hist.Begin(w.name, l)
				mu.Lock()
				recs = append(recs, rec{w.name, called, s.Record().Granted, l.Token(), l.(locks.SlotLease).Slot()})
				mu.Unlock()
				stop := make(chan struct{})
				tm := time.AfterFunc(time.Duration(3+r.IntN(20))*time.Millisecond, func() { close(stop) })
				s.WriteWhileLive(stop)
				tm.Stop()
				s.LetGo()
				_ = l.Release(context.Background())
				time.Sleep(time.Duration(r.IntN(6)) * time.Millisecond)
			}
		})
	}
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
	t.Logf("%d grants; errors %v", len(recs), errs)
	if err := hist.Check(); err != nil {
		t.Logf("sections:\n%v", hist)
		t.Error(err)
	}
	if c, at := hist.Peak(); c > 2 {
		t.Errorf("%d sections at once at %v on a semaphore of 2", c, ms(at))
	}
	sort.Slice(recs, func(i, j int) bool { return recs[i].gotAt < recs[j].gotAt })
	bad := 0
	for i, a := range recs {
		for _, b := range recs[i+1:] {
			if b.called > a.gotAt && b.token <= a.token {
				bad++
				if bad <= 10 {
					t.Errorf("TOKEN: %s (slot %d) called Acquire at %v, after %s's (slot %d, token %d) returned at %v, and got token %d",
						b.who, b.slot, ms(b.called), a.who, a.slot, a.token, ms(a.gotAt), b.token)
				}
			}
		}
	}
}

// TestSemaphoreWriteBackOnLosingSlotKeepsTokensIncreasing: a semaphore of 2 slots on 3
// masters; counters 100, 0, 0. Slot 2 is held on masters 0 and 1 by a
// priority 9, slot 1 on master 2 by a priority 0 (planted). A (priority 1)
// gets slot 1 on masters 0 (counter 101) and 1 (counter 1), and the free
// slot 2 on master 2: it keeps slot 1, token 101, to be written back to
// master 1 or 2. Its write-backs are held. B (priority 2; its call to
// master 0 held) takes slot 1 on master 1 (from A) and on master 2 (from
// the planted holder), counters 2 and 2: granted slot 1, token 2. Then
// A's write-back reaches master 2, where A still has a key — in slot 2,
// not the slot it keeps — and then master 1 (B's now). The docs: "counts a
// master only if that same script finds the attempt's key still there"; "An
// attempt robbed before its write-back reached a quorum fails"; "Lease.Token
// is strictly greater for every later holder of a name". If A's Acquire
// returns, its token 101 must be below that of B, who holds slot 1 after it.
func TestSemaphoreWriteBackOnLosingSlotKeepsTokensIncreasing(t *testing.T) {
	addrs := addrsOf(testenv.StartRedis(t, 3))
	ctx := ctxFor(t, 25*time.Second)
	name := uniqueName(t)
	opts := []redlockprio.Option{
		redlockprio.WithTTL(4 * time.Second), redlockprio.WithRenewInterval(1200 * time.Millisecond),
		redlockprio.WithCallTimeout(1900 * time.Millisecond),
	}
	a := mustClient(t, addrs, with(opts...), withPriority(1))
	b := mustClient(t, addrs, with(opts...), withPriority(2))
	warm(t, a.l)
	warm(t, b.l)
	aRaise1 := newCmdGate(runsScript("raise"))
	aRaise2 := newCmdGate(runsScript("raise"))
	aClean := newCmdGate(runsScript("release"))
	bAcq0 := newCmdGate(runsScript("acquire"))
	bNotice := newCmdGate(isTheftNotice)
	gates := []*cmdGate{aRaise1, aRaise2, aClean, bAcq0, bNotice}
	t.Cleanup(func() {
		for _, g := range gates {
			g.open()
		}
	})
	a.rcs[1].AddHook(aRaise1)
	a.rcs[2].AddHook(aRaise2)
	for _, rc := range a.rcs {
		rc.AddHook(aClean)
	}
	b.rcs[0].AddHook(bAcq0)
	for _, rc := range b.rcs {
		rc.AddHook(bNotice)
	}
	aClean.open()
	for _, g := range gates {
		g.armed.Store(true)
	}
	setFence(t, addrs[0], name, 100)
	plantFor(t, addrs[0], name, 2, "y", 9, 20*time.Second)
	plantFor(t, addrs[1], name, 2, "y", 9, 20*time.Second)
	plantFor(t, addrs[2], name, 1, "x", 0, 1500*time.Millisecond)
	semA, _ := a.c.Semaphore(2)
	semB, _ := b.c.Semaphore(2)

	type res struct {
		l   locks.Lease
		err error
		at  time.Time
	}
	aRes := make(chan res, 1)
	go func() {
		l, err := semA.Acquire(ctx, name)
		aRes <- res{l, err, time.Now()}
	}()
	select {
	case <-aRaise1.seen:
	case <-aRaise2.seen:
	case r := <-aRes:
		t.Fatalf("A's Acquire returned without a write-back: %v", r.err)
	case <-time.After(10 * time.Second):
		t.Fatal("no write-back by A")
	}
	for i, addr := range addrs {
		t.Logf("after A's acquire: master %d slot1 %q slot2 %q fence %d", i,
			holderOfSlot(t, addr, name, 1), holderOfSlot(t, addr, name, 2), fenceOf(t, addr, name))
	}
	bRes := make(chan res, 1)
	go func() {
		l, err := semB.Acquire(ctx, name)
		bRes <- res{l, err, time.Now()}
	}()
	deadline := time.Now().Add(10 * time.Second)
	for !(strings.HasPrefix(holderOfSlot(t, addrs[1], name, 1), b.c.ID()+":") &&
		strings.HasPrefix(holderOfSlot(t, addrs[2], name, 1), b.c.ID()+":")) {
		if time.Now().After(deadline) {
			for i, addr := range addrs {
				t.Logf("master %d slot1 %q slot2 %q", i, holderOfSlot(t, addr, name, 1), holderOfSlot(t, addr, name, 2))
			}
			t.Fatal("B did not take slot 1 on masters 1 and 2")
		}
		time.Sleep(2 * time.Millisecond)
	}
	waitSeen(t, bNotice.seen, "B's theft notice")
	for i, addr := range addrs {
		t.Logf("after B's acquire: master %d slot1 %q slot2 %q fence %d", i,
			holderOfSlot(t, addr, name, 1), holderOfSlot(t, addr, name, 2), fenceOf(t, addr, name))
	}
	// A's write-back to master 2 (its slot-2 key), then to master 1.
	aRaise2.armed.Store(false)
	aRaise2.open()
	time.Sleep(100 * time.Millisecond)
	aRaise1.armed.Store(false)
	aRaise1.open()
	for i, g := range []*cmdGate{aRaise1, aRaise2} {
		select {
		case <-g.seen:
			t.Logf("A's write-back to master %d was sent", i+1)
		default:
			t.Logf("A sent no write-back to master %d", i+1)
		}
	}
	var ar res
	select {
	case ar = <-aRes:
		t.Logf("A's Acquire returned: %v", ar.err)
	case <-aClean.seen:
		t.Logf("A gave its attempt up (cleanup seen)")
	case <-time.After(5 * time.Second):
		t.Logf("A's Acquire still waiting")
	}
	bAcq0.armed.Store(false)
	bAcq0.open()
	bNotice.armed.Store(false)
	bNotice.open()
	if ar.l != nil {
		t.Logf("A holds slot %d token %d", ar.l.(locks.SlotLease).Slot(), ar.l.Token())
		go func() { <-ar.l.Context().Done(); _ = ar.l.Release(context.Background()) }()
	}
	var br res
	select {
	case br = <-bRes:
	case <-time.After(15 * time.Second):
		t.Fatal("B's Acquire did not return")
	}
	if br.err != nil {
		t.Fatalf("B: %v", br.err)
	}
	t.Logf("B holds slot %d token %d", br.l.(locks.SlotLease).Slot(), br.l.Token())
	if ar.l != nil && ar.l.(locks.SlotLease).Slot() == br.l.(locks.SlotLease).Slot() && ar.at.Before(br.at) && br.l.Token() <= ar.l.Token() {
		t.Errorf("TOKEN: A held slot %d with token %d, then B held it with token %d", ar.l.(locks.SlotLease).Slot(), ar.l.Token(), br.l.Token())
	}
	_ = br.l.Release(ctx)
	if ar.l == nil {
		select {
		case ar = <-aRes:
			if ar.err == nil {
				t.Logf("A later got slot %d token %d", ar.l.(locks.SlotLease).Slot(), ar.l.Token())
				if ar.l.Token() <= br.l.Token() {
					t.Errorf("TOKEN: A got %d after B's %d", ar.l.Token(), br.l.Token())
				}
				_ = ar.l.Release(ctx)
			} else {
				t.Logf("A: %v", ar.err)
			}
		case <-time.After(10 * time.Second):
			t.Error("A's Acquire did not return after B released")
		}
	}
}

// TestLockerAndSemaphoresShareOneName: a Locker (Client A) and
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
func TestLockerAndSemaphoresShareOneName(t *testing.T) {
	addrs := addrsOf(testenv.StartRedis(t, 3))
	hist := contracttest.NewWriteHistory()
	a := mustClient(t, addrs, withTiming(2*time.Second, 0.01))
	b := mustClient(t, addrs, withTiming(600*time.Millisecond, 0.01))
	c := mustClient(t, addrs, withTiming(600*time.Millisecond, 0.01))
	d := mustClient(t, addrs, withTiming(600*time.Millisecond, 0.01), withPriority(1))
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
		s := hist.Begin(who, l)
		wg.Go(func() {
			stop := make(chan struct{})
			go func() {
				<-l.Context().Done()
				time.Sleep(300 * time.Millisecond)
				close(stop)
			}()
			s.WriteUntilDeadline(stop)
			s.LetGo()
			_ = l.Release(context.Background())
		})
	}
	semD, _ := d.c.Semaphore(2)
	ld, err := semD.Acquire(ctx, name)
	if err != nil {
		t.Fatalf("D's Acquire: %v", err)
	}
	sd := hist.Begin("D (Semaphore(2), priority 1)", ld)
	sd.Write(hist.Now())
	sd.LetGo()
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
	gd := sd.Record().Granted
	for _, x := range hist.Records() {
		if displaced[x.Who] && x.LastWrite > gd {
			t.Errorf("OVERLAP: %s wrote %v after D was granted", x.Who, ms(x.LastWrite-gd))
		}
	}
	if ld.Token() <= la.Token() || (lb != nil && ld.Token() <= lb.Token()) {
		t.Errorf("D's token %d is not above the earlier holders'", ld.Token())
	}
	t.Logf("sections:\n%v", hist)
}
