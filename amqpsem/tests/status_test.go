package amqpsem_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	neturl "net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/latchkey-go/latchkey/contracttest/testenv"
	"github.com/latchkey-go/latchkey/locks"

	"github.com/latchkey-go/latchkey/amqpsem"
)

// Status and WaitReleased find a held removed slot whatever its number:
// slot 80 of a semaphore resized from 100 to 5 (the old default looked
// 64 slots above the new maximum only), and the last slot there can be.
// WaitReleased must not return nil while one is held.
func TestStatusAndWaitSeeEveryRemovedSlot(t *testing.T) {
	u, _ := amqpURL(t)
	name := newName(t, u)
	ctx := longCtx(t)
	a := admin(t, adminDial(t, u))
	if err := a.Create(ctx, name, 100); err != nil {
		t.Fatal(err)
	}
	holders := rawConn(t, u) // holds B[80] and B[MaxSlots], like clients
	far := []int{80, amqpsem.MaxSemaphoreSize}
	for _, i := range far {
		holdQueue(t, holders, amqpsem.DefaultLayout.Holder(name, i))
	}
	if ch, err := a.Resize(ctx, name, 5); err != nil || ch != (amqpsem.Change{Before: 100, After: 5}) {
		t.Fatalf("Resize(5) = %+v, %v", ch, err)
	}
	start := time.Now()
	st, err := a.Status(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	sweep := time.Since(start)
	t.Logf("Status took %v", sweep.Round(time.Millisecond))
	if st.Slots != 5 || len(st.Held) != 0 || !slices.Equal(st.Removed, far) {
		t.Fatalf("Status = %+v; want 5 slots, none held, removed slots %v still held", st, far)
	}
	for _, i := range far {
		// Long enough for a check of every slot, and polls after it.
		short, cancel := context.WithTimeout(ctx, 2*sweep+time.Second)
		err := a.WaitReleased(short, name)
		cancel()
		if !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), strconv.Itoa(i)) {
			t.Fatalf("WaitReleased while slot %d is held = %v; want DeadlineExceeded naming it", i, err)
		}
		holders.delete(amqpsem.DefaultLayout.Holder(name, i))
	}
	start = time.Now()
	wctx, wcancel := context.WithTimeout(ctx, releasedBound(measureSlack(t, u), sweep))
	defer wcancel()
	if err := a.WaitReleased(wctx, name); err != nil {
		t.Fatalf("WaitReleased once every removed slot is free: %v (a check took %v)", err, sweep)
	}
	t.Logf("WaitReleased with none held took %v", time.Since(start).Round(time.Millisecond))
}

// WaitReleased polls the held slots it found and returns once their
// holders let go, after checking every slot again.
func TestWaitReleasedEndsWhenHolderLetsGo(t *testing.T) {
	u, _ := amqpURL(t)
	sl := measureSlack(t, u)
	name := newName(t, u)
	ctx := longCtx(t)
	a := admin(t, adminDial(t, u))
	if err := a.Create(ctx, name, 3); err != nil {
		t.Fatal(err)
	}
	holders := rawConn(t, u)
	q := amqpsem.DefaultLayout.Holder(name, 200)
	holdQueue(t, holders, q)
	if _, err := a.Destroy(ctx, name); err != nil {
		t.Fatal(err)
	}
	check := checkTime(t, ctx, a, name)
	done := make(chan error, 1)
	go func() { done <- a.WaitReleased(ctx, name) }()
	select {
	case err := <-done:
		t.Fatalf("WaitReleased returned %v while slot 200 is held", err)
	case <-time.After(1500 * time.Millisecond):
	}
	holders.delete(q)
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("WaitReleased after the holder let go: %v", err)
		}
	case <-time.After(releasedBound(sl, check)):
		t.Fatalf("WaitReleased still waiting %v after the holder let go (a check took %v; %v)", releasedBound(sl, check), check, sl)
	}
}

// A WaitReleased whose ctx ends during its check of every slot number,
// made holding the administration mutex, returns soon after, lets go of
// the mutex and leaves its client usable. (Its probes' returns, still
// coming from the broker, once filled the probe channel's return buffer:
// the connection's reader then waited for a reader of returns, and the
// mutex's delete, stuck behind it, never ended.)
func TestWaitReleasedCancelledDuringCheck(t *testing.T) {
	u, _ := amqpURL(t)
	name := newName(t, u)
	ctx := longCtx(t)
	a := admin(t, adminDial(t, u))
	if err := a.Create(ctx, name, 3); err != nil {
		t.Fatal(err)
	}
	for _, d := range []time.Duration{300 * time.Millisecond, 700 * time.Millisecond} {
		short, cancel := context.WithTimeout(ctx, d)
		start := time.Now()
		done := make(chan error, 1)
		go func() { done <- a.WaitReleased(short, name) }()
		select {
		case err := <-done:
			if !errors.Is(err, context.DeadlineExceeded) {
				t.Fatalf("WaitReleased with a %v ctx = %v, want DeadlineExceeded", d, err)
			}
			t.Logf("WaitReleased with a %v ctx returned after %v", d, time.Since(start).Round(time.Millisecond))
		case <-time.After(d + 10*time.Second):
			t.Fatalf("WaitReleased with a %v ctx still running after %v", d, time.Since(start).Round(time.Millisecond))
		}
		cancel()
		other, err := admin(t, adminDial(t, u)).Add(tctx(t), name, 1)
		if err != nil {
			t.Fatalf("Add by another admin after the cancelled wait: %v", err)
		}
		n, err := a.Max(tctx(t), name)
		if err != nil || n != other.After {
			t.Fatalf("Max on the cancelled wait's client = %d, %v, want %d", n, err, other.After)
		}
	}
}

// A WaitReleased whose ctx ends after its last poll found no removed slot
// held, during the check of every slot number that would have returned
// nil, says so: it does not report the slots an earlier check found held
// as still held, nor match [locks.ErrNotAcquired]. (It did, and sent the
// diagnosis of a bound too short for two checks after a removed slot
// holder that had let go within a second.)
func TestWaitReleasedErrorSaysWhatLastPollFound(t *testing.T) {
	u, _ := amqpURL(t)
	name := newName(t, u)
	ctx := longCtx(t)
	a := admin(t, adminDial(t, u))
	if err := a.Create(ctx, name, 3); err != nil {
		t.Fatal(err)
	}
	holders := rawConn(t, u)
	q := amqpsem.DefaultLayout.Holder(name, 3)
	holdQueue(t, holders, q)
	if _, err := a.Resize(ctx, name, 2); err != nil {
		t.Fatal(err)
	}
	// The administration mutex (the queue name, in the default layout)
	// is held during each check of every slot number, and only then.
	watch := rawConn(t, u)
	mutex := func(state string) func() bool {
		return func() bool { return watch.state(name) == state }
	}
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	start := time.Now()
	done := make(chan error, 1)
	go func() { done <- a.WaitReleased(wctx, name) }()
	waitFor(t, longWait, "first check of every slot number started", mutex("locked"))
	waitFor(t, longWait, "first check of every slot number over", mutex("absent"))
	holders.delete(q) // after the first check found it: a poll finds it gone
	waitFor(t, longWait, "second check of every slot number started", mutex("locked"))
	cancel()
	err := <-done
	t.Logf("WaitReleased cancelled after %v: %v", time.Since(start).Round(time.Millisecond), err)
	if err == nil {
		t.Skip("the second check of every slot number finished before the cancel reached it: nothing to check")
	}
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("WaitReleased = %v, want an error matching context.Canceled", err)
	}
	if errors.Is(err, locks.ErrNotAcquired) || strings.Contains(err.Error(), "still held") {
		t.Errorf("WaitReleased = %v: reports slot 3 as held after a poll found it free", err)
	}
	if !strings.Contains(err.Error(), "no removed slot was held at the last poll") {
		t.Errorf("WaitReleased = %v: does not say that the last poll found no removed slot held", err)
	}
}

// TestWaitReleasedSeesSlotTakenWhileGrown: a wait is running for a removed slot
// (9, C=5); meanwhile the semaphore grows to 10, a holder takes slot 6 or 8
// while it exists (a library Semaphore whose slots 1..5 are taken, or a
// non-linear holder of another implementation), and the semaphore shrinks
// back to 5: slot 6 / 8 is now a held removed slot. WaitReleased must not
// return nil while it is held, even though C is 5 at every poll it makes.
//
// The waiter's traffic goes through a fault proxy that holds it while the
// semaphore is grown and shrunk back: whatever it sends meanwhile reaches
// the broker after the shrink, so C is 5 at every poll it makes, as the
// test intends. (A poll that saw C = 10 could rightly end the wait: no
// removed slot was held then; see TestWaitReleasedEndsWhenGrownBack.)
func TestWaitReleasedSeesSlotTakenWhileGrown(t *testing.T) {
	url, host := amqpURL(t)
	for _, lib := range []bool{true, false} {
		t.Run(fmt.Sprintf("library=%v", lib), func(t *testing.T) {
			name := newName(t, url)
			c := adminDial(t, url)
			a := admin(t, c)
			ctx, cancel := context.WithTimeout(context.Background(), 50*time.Second)
			defer cancel()
			if err := a.Create(ctx, name, 10); err != nil {
				t.Fatal(err)
			}
			h9 := rawConn(t, url)
			if err := h9.hold(name + "-9-B"); err != nil {
				t.Fatal(err)
			}
			if _, err := a.Resize(ctx, name, 5); err != nil {
				t.Fatal(err)
			}
			p := testenv.NewProxy(t, host)
			// A long heartbeat: the held traffic must not cost the waiter
			// its connection.
			a2 := admin(t, dial(t, url, through(p), amqpsem.WithHeartbeat(60*time.Second)))
			done := waitReleasedInBackground(a2, name, longWait)
			time.Sleep(4 * time.Second) // let the full scan finish
			select {
			case err := <-done:
				t.Fatalf("WaitReleased returned %v while slot 9 was held", err)
			default:
			}
			// A check of every slot may hold the administration mutex:
			// let it end before holding the waiter's traffic, or the
			// resizes would wait for its release, held in the proxy.
			waitMutexFree(t, h9, name, 20*time.Second)
			p.Latency(time.Hour)
			if _, err := a.Resize(ctx, name, 10); err != nil {
				t.Fatal(err)
			}
			var held string
			var lease locks.Lease
			if lib {
				// Only this package's clients: one with slow verifications
				// (every 30s) takes slots 1..6 and keeps 6.
				lc, err := amqpsem.Dial(ctx, url, amqpsem.WithHeartbeat(60*time.Second), amqpsem.WithVerifyInterval(30*time.Second))
				if err != nil {
					t.Fatal(err)
				}
				defer lc.Close(context.Background())
				s, _ := lc.Semaphore(amqpsem.MaxSemaphoreSize)
				var first []locks.Lease
				for range 6 {
					lease, err = s.TryAcquire(ctx, name)
					if err != nil {
						t.Fatal(err)
					}
					first = append(first, lease)
				}
				for _, l := range first[:5] {
					l.Release(ctx)
				}
				held = fmt.Sprintf("%s-%d-B", name, lease.(*amqpsem.Lease).Slot())
			} else {
				held = name + "-8-B"
				if err := rawConn(t, url).hold(held); err != nil {
					t.Fatal(err)
				}
			}
			if _, err := a.Resize(ctx, name, 5); err != nil {
				t.Fatal(err)
			}
			p.Restore() // the held polls reach the broker: C is 5
			if err := h9.drop(name + "-9-B"); err != nil {
				t.Fatal(err)
			}
			select {
			case err := <-done:
				lost := "n/a"
				if lease != nil {
					lost = fmt.Sprint(context.Cause(lease.Context()))
				}
				t.Fatalf("WaitReleased returned %v while removed slot queue %s was still held (state %s, lease end: %s)",
					err, held, h9.state(held), lost)
			case <-time.After(12 * time.Second): // a poll finds slot 9 free, then a check of every slot (4-5s under -race)
			}
		})
	}
}

// TestWaitReleasedSeesNewlyRemovedSlots: while a wait runs for slot 9 (C=5), C drops
// to 2 with slot 4 held: the doc says newly removed slots are checked too.
func TestWaitReleasedSeesNewlyRemovedSlots(t *testing.T) {
	url, _ := amqpURL(t)
	sl := measureSlack(t, url)
	name := newName(t, url)
	c := adminDial(t, url)
	a := admin(t, c)
	ctx := longCtx(t)
	if err := a.Create(ctx, name, 10); err != nil {
		t.Fatal(err)
	}
	h := rawConn(t, url)
	for _, q := range []string{"-9-B", "-4-B"} {
		if err := h.hold(name + q); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := a.Resize(ctx, name, 5); err != nil {
		t.Fatal(err)
	}
	check := checkTime(t, ctx, a, name)
	a2 := admin(t, adminDial(t, url))
	done := waitReleasedInBackground(a2, name, longWait)
	time.Sleep(3 * time.Second)
	if _, err := a.Resize(ctx, name, 2); err != nil {
		t.Fatal(err)
	}
	time.Sleep(500 * time.Millisecond)
	h.drop(name + "-9-B")
	select {
	case err := <-done:
		t.Errorf("WaitReleased returned %v while removed slot 4 was held", err)
	case <-time.After(3 * time.Second):
	}
	h.drop(name + "-4-B")
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("WaitReleased: %v", err)
		}
	case <-time.After(releasedBound(sl, check)):
		t.Errorf("WaitReleased did not return within %v after every removed slot was freed (a check took %v; %v)", releasedBound(sl, check), check, sl)
	}
}

// TestCommandWaitSeesSlotTakenWhileGrown: the command's wait, run while the
// semaphore grows and shrinks back with a new holder of a slot above the
// final size. "wait NAME: wait until no removed slot is held, whatever its
// number". As in TestWaitReleasedSeesSlotTakenWhileGrown, the command's traffic
// is held in a fault proxy while the semaphore grows and shrinks back, so
// that C is 5 at every poll it makes.
func TestCommandWaitSeesSlotTakenWhileGrown(t *testing.T) {
	url, host := amqpURL(t)
	name := newName(t, url)
	c := adminDial(t, url)
	a := admin(t, c)
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Second)
	defer cancel()
	if err := a.Create(ctx, name, 10); err != nil {
		t.Fatal(err)
	}
	h9 := rawConn(t, url)
	if err := h9.hold(name + "-9-B"); err != nil {
		t.Fatal(err)
	}
	if _, err := a.Resize(ctx, name, 5); err != nil {
		t.Fatal(err)
	}
	type res struct {
		out  string
		code int
	}
	done := make(chan res, 1)
	commandBin(t)
	p := testenv.NewProxy(t, host)
	via, err := neturl.Parse(url)
	if err != nil {
		t.Fatal(err)
	}
	via.Host = p.Addr()
	go func() {
		out, code := runCommand(t, 40*time.Second, []string{"AMQPSEM_URL=" + via.String()}, "--heartbeat", "60s", "wait", name)
		done <- res{out, code}
	}()
	time.Sleep(3 * time.Second) // the full scan
	waitMutexFree(t, h9, name, 20*time.Second)
	p.Latency(time.Hour)
	if _, err := a.Resize(ctx, name, 10); err != nil {
		t.Fatal(err)
	}
	if err := rawConn(t, url).hold(name + "-8-B"); err != nil {
		t.Fatal(err)
	}
	if _, err := a.Resize(ctx, name, 5); err != nil {
		t.Fatal(err)
	}
	p.Restore()
	if err := h9.drop(name + "-9-B"); err != nil {
		t.Fatal(err)
	}
	select {
	case r := <-done:
		t.Errorf("command wait exited %d while removed slot 8 was held (%s): %s", r.code, h9.state(name+"-8-B"), r.out)
	case <-time.After(10 * time.Second): // a poll finds slot 9 free, then a check of every slot
	}
}

// TestStatusSeesLastSlotOfLongName: for names so long that few slots fit, a
// holder of the last slot that fits (above C) is found by Status and
// WaitReleased.
func TestStatusSeesLastSlotOfLongName(t *testing.T) {
	url, _ := amqpURL(t)
	for _, tc := range []struct {
		layout amqpsem.Layout
		n      int
		holder func(string, int) string
	}{
		{amqpsem.DefaultLayout, 250, func(n string, i int) string { return fmt.Sprintf("%s-%d-B", n, i) }},
		{amqpsem.PythonLayout, 251, func(n string, i int) string { return fmt.Sprintf("%s-B-%d", n, i) }},
	} {
		t.Run(tc.layout.Name, func(t *testing.T) {
			base := freshName(t)
			name := base + strings.Repeat("y", tc.n-len(base))
			limit := tc.layout.SlotLimit(name)
			t.Logf("%d-byte name: SlotLimit %d", len(name), limit)
			destroyAtCleanup(t, url, name)
			c := adminDial(t, url)
			a := admin(t, c, amqpsem.WithLayout(tc.layout))
			ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
			defer cancel()
			if err := a.Create(ctx, name, 2); err != nil {
				t.Fatal(err)
			}
			h := rawConn(t, url)
			if err := h.hold(tc.holder(name, limit)); err != nil {
				t.Fatal(err)
			}
			st, err := a.Status(ctx, name)
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(st.Removed, []int{limit}) {
				t.Errorf("Status = %+v, want removed [%d]", st, limit)
			}
			wctx, wcancel := context.WithTimeout(ctx, 2*time.Second)
			if err := a.WaitReleased(wctx, name); err == nil {
				t.Errorf("WaitReleased nil while slot %d held", limit)
			}
			wcancel()
		})
	}
}

// TestWaitReleasedEndsWhenGrownBack: while a wait runs for removed slot 9 (C=5), the
// semaphore grows back to 10: slot 9 is no longer removed. "WaitReleased
// waits until no slot of name above its current maximum C is held".
func TestWaitReleasedEndsWhenGrownBack(t *testing.T) {
	url, _ := amqpURL(t)
	sl := measureSlack(t, url)
	name := newName(t, url)
	a := admin(t, adminDial(t, url))
	ctx := longCtx(t)
	if err := a.Create(ctx, name, 10); err != nil {
		t.Fatal(err)
	}
	if err := rawConn(t, url).hold(name + "-9-B"); err != nil {
		t.Fatal(err)
	}
	if _, err := a.Resize(ctx, name, 5); err != nil {
		t.Fatal(err)
	}
	check := checkTime(t, ctx, a, name)
	done := waitReleasedInBackground(admin(t, adminDial(t, url)), name, longWait)
	time.Sleep(3 * time.Second)
	if _, err := a.Resize(ctx, name, 10); err != nil {
		t.Fatal(err)
	}
	t0 := time.Now()
	select {
	case err := <-done:
		t.Logf("WaitReleased after growing back: %v after %v", err, time.Since(t0))
		if err != nil {
			t.Errorf("WaitReleased: %v", err)
		}
	case <-time.After(releasedBound(sl, check)):
		// Returning takes a check of every slot number under the
		// administration mutex.
		t.Errorf("WaitReleased still waiting %v after C grew to 10 (slot 9 held, not removed; a check took %v; %v)", releasedBound(sl, check), check, sl)
	}
}

// TestWaitReleasedWithAcquiresRacingRemoval: clients acquire and release a semaphore while
// an administrator removes most of its slots and waits. When WaitReleased
// returns nil, no live lease may hold a slot above the maximum; no two
// leases may ever hold one slot at once.
func TestWaitReleasedWithAcquiresRacingRemoval(t *testing.T) {
	url, _ := amqpURL(t)
	sl := measureSlack(t, url)
	name := newName(t, url)
	ctx := longCtx(t)
	admin := admin(t, adminDial(t, url))
	if err := admin.Create(ctx, name, 8); err != nil {
		t.Fatal(err)
	}
	rec := newLeaseHistory(8)
	var (
		mu   sync.Mutex
		live = map[*amqpsem.Lease]bool{}
	)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for w := range 6 {
		c := dial(t, url)
		s, _ := c.Semaphore(amqpsem.MaxSemaphoreSize)
		who := fmt.Sprintf("client %d", w)
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				l, err := s.TryAcquire(ctx, name)
				if err != nil {
					time.Sleep(time.Duration(5+rand.IntN(20)) * time.Millisecond)
					continue
				}
				lease := l.(*amqpsem.Lease)
				exit := rec.enter(who, l)
				mu.Lock()
				live[lease] = true
				mu.Unlock()
				time.Sleep(time.Duration(10+rand.IntN(300)) * time.Millisecond)
				exit()
				mu.Lock()
				delete(live, lease)
				mu.Unlock()
				l.Release(ctx)
			}
		})
	}
	// Measured during the churn: six clients' scans slow a check down
	// (a CI run: 9s before the churn, over 22s during it).
	check := checkTime(t, ctx, admin, name)
	for round := range 1 {
		if _, err := admin.Remove(ctx, name, 6); err != nil {
			t.Fatal(err)
		}
		// A wait that found a holder returns only after a second check
		// of every slot number, once the holders (each holds up to 310ms)
		// let go.
		wctx, wcancel := context.WithTimeout(ctx, releasedBound(sl, check)+310*time.Millisecond)
		err := admin.WaitReleased(wctx, name)
		wcancel()
		c, _ := admin.Max(ctx, name)
		mu.Lock()
		for l := range live {
			if l.Slot() > c && l.Context().Err() == nil {
				t.Errorf("round %d: WaitReleased returned %v while a live lease holds removed slot %d (max %d)", round, err, l.Slot(), c)
			}
		}
		mu.Unlock()
		if err != nil {
			t.Errorf("round %d: WaitReleased: %v", round, err)
		}
		if _, err := admin.Resize(ctx, name, 8); err != nil {
			t.Fatal(err)
		}
	}
	close(stop)
	wg.Wait()
	rec.check(t)
	lost := 0
	for _, s := range rec.all.Spans() {
		if s.Ended != "" {
			lost++
		}
	}
	t.Logf("%d critical sections, %d ended by the lease ending first", rec.all.Len(), lost)
}

// TestWaitReleasedDuringChurn: four clients churn on a 4-slot
// semaphore, Status runs in a loop, an administrator resizes it to 2, then
// (the Status loop stopped) calls WaitReleased. Checks: every Status is
// consistent (Held within 1..Slots, Slots from 2 to 4, Removed above
// Slots); when WaitReleased returns
// nil, every lease on slot 3 or 4 has ended; no slot has two overlapping
// leases.
//
// SEEN once in four runs under load (load average 9 on 2 cores): the
// Resize failed, "administration mutex lost during the change: validity
// deadline passed without a renewal", its client (1s heartbeat) running
// the Status loop's scans; see TestStatusScansDoNotStarveVerify. Each
// Status took 4 to 10s there, against "about a second, a few under the
// race detector".
//
// SEEN twice in six CI runs: WaitReleased failed with "removed slots [3]
// still held" after a fixed 20s. Nothing held slot 3 that long: its holder
// let go at its next verification, the wait's poll then found no removed
// slot held, and its ctx ended during the second check of every slot
// number (two checks are documented once holders were found; each took 9
// to 11s here on a loaded 2-core machine, 8 to 10s under -race); the error
// reported the first check's finding.
// The wait's bound is now measured (releasedBound), and the error says
// what the last poll found (TestWaitReleasedErrorSaysWhatLastPollFound).
func TestWaitReleasedDuringChurn(t *testing.T) {
	url, _ := amqpURL(t)
	sl := measureSlack(t, url)
	name := newName(t, url)
	ctx := longCtx(t)
	ac := adminDial(t, url)
	admin := admin(t, ac)
	if err := admin.Create(ctx, name, 4); err != nil {
		t.Fatal(err)
	}
	check := checkTime(t, ctx, admin, name) // before the churn: it takes long
	rec := newLeaseHistory(4)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	const verifyMax = 400 * time.Millisecond // the churners' longest verify interval
	for i := range 4 {
		c := dial(t, url, amqpsem.WithVerifyInterval(verifyMax*time.Duration(i+1)/4))
		sem, _ := c.Semaphore(amqpsem.MaxSemaphoreSize)
		who := fmt.Sprintf("churn%d", i)
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				actx, acancel := context.WithTimeout(ctx, 500*time.Millisecond)
				l, err := sem.Acquire(actx, name)
				acancel()
				if err != nil {
					continue
				}
				ended := rec.enter(who, l)
				select { // hold long: removed slots stay held for a while
				case <-time.After(time.Duration(200+rand.IntN(800)) * time.Millisecond):
				case <-l.Context().Done():
				}
				ended()
				l.Release(context.Background())
			}
		})
	}
	var statuses atomic.Int64
	stopStatus := make(chan struct{})
	// Status calls end when the loop stops: a scan takes seconds on a
	// loaded machine (22s seen), and WaitReleased must have the broker.
	statusCtx, endStatus := context.WithCancel(ctx)
	defer endStatus()
	var statusWG sync.WaitGroup
	statusWG.Go(func() {
		for {
			select {
			case <-stopStatus:
				return
			default:
			}
			s0 := time.Now()
			st, err := admin.Status(statusCtx, name)
			if err != nil && statusCtx.Err() != nil {
				return // stopped
			}
			if err != nil {
				t.Errorf("status after %v: %v", time.Since(s0), err)
				return
			}
			t.Logf("status took %v: %+v", time.Since(s0), st)
			statuses.Add(1)
			if st.Slots < 2 || st.Slots > 4 { // 3 between the resize's two deletes
				t.Errorf("status: %d slots", st.Slots)
			}
			for _, h := range st.Held {
				if h < 1 || h > st.Slots {
					t.Errorf("status: held %d outside 1..%d", h, st.Slots)
				}
			}
			for _, r := range st.Removed {
				if r <= st.Slots {
					t.Errorf("status: removed %d not above %d", r, st.Slots)
				}
			}
		}
	})
	time.Sleep(time.Second)
	r0 := time.Now()
	if _, err := admin.Resize(ctx, name, 2); err != nil {
		t.Fatal(err)
	}
	t0 := time.Now()
	t.Logf("resize took %v", t0.Sub(r0))
	close(stopStatus) // each Status is a full scan: let WaitReleased have the broker
	endStatus()
	statusWG.Wait()
	// A holder of slot 3 or 4 lets go at its next verification at the
	// latest (new acquires do not take them), then WaitReleased returns
	// within releasedBound.
	bound := verifyMax + releasedBound(sl, check)
	wctx, wcancel := context.WithTimeout(ctx, bound)
	werr := admin.WaitReleased(wctx, name)
	wcancel()
	returned, returnedH := time.Now(), rec.all.Now()
	close(stop)
	wg.Wait()
	// Every section has ended now: one that ended after WaitReleased
	// returned was live when it did.
	for _, s := range []int{3, 4} {
		for _, sp := range rec.slot(s).Spans() {
			if sp.Exit > returnedH {
				t.Errorf("WaitReleased returned %v with slot %d held by %s (ended %v after)", werr, s, sp.Who, sp.Exit-returnedH)
			}
		}
	}
	if werr != nil {
		t.Errorf("WaitReleased (bound %v: a check took %v; %v): %v", bound, check, sl, werr)
	}
	rec.check(t)
	t.Logf("WaitReleased returned %v after %v; %d leases, %d statuses", werr, returned.Sub(t0), rec.all.Len(), statuses.Load())
}

// TestCommandWaitDuringChurn: `amqpsem wait` runs while removed slots are
// held and released one after the other by library clients, and while a
// kept slot churns. Checks: it does not exit before the last removed slot
// is released, exits 0 within a few seconds after it, and prints nothing
// alarming.
func TestCommandWaitDuringChurn(t *testing.T) {
	url, _ := amqpURL(t)
	sl := measureSlack(t, url)
	name := newName(t, url)
	ctx := longCtx(t)
	// The holder verifies every 30s (half the broker's 60s heartbeat): its
	// removed slots stay held until the test releases them.
	c := dial(t, url, amqpsem.WithVerifyInterval(30*time.Second), amqpsem.WithHeartbeat(60*time.Second))
	admin := admin(t, c)
	if err := admin.Create(ctx, name, 3); err != nil {
		t.Fatal(err)
	}
	check := checkTime(t, ctx, admin, name) // before the leases: it takes long
	sem, _ := c.Semaphore(3)
	var leases []locks.Lease
	for range 3 {
		l, err := sem.TryAcquire(ctx, name)
		if err != nil {
			t.Fatal(err)
		}
		leases = append(leases, l)
	}
	if _, err := admin.Resize(ctx, name, 1); err != nil {
		t.Fatal(err)
	}
	commandBin(t)
	type res struct {
		out  string
		code int
		at   time.Time
	}
	done := make(chan res, 1)
	go func() {
		out, code := runCommand(t, longWait, []string{"AMQPSEM_URL=" + url}, "wait", name)
		done <- res{out, code, time.Now()}
	}()
	churn := make(chan struct{})
	go func() { // slot 1 is released and taken again meanwhile
		defer close(churn)
		leases[0].Release(ctx)
		for range 10 {
			l, err := sem.Acquire(ctx, name)
			if err != nil {
				return
			}
			time.Sleep(100 * time.Millisecond)
			l.Release(ctx)
		}
	}()
	time.Sleep(2 * time.Second)
	leases[1].Release(ctx)
	time.Sleep(2 * time.Second)
	select {
	case r := <-done:
		t.Fatalf("wait exited %d while slot 3 (removed) was held: %s", r.code, r.out)
	default:
	}
	last := time.Now()
	leases[2].Release(ctx)
	select {
	case r := <-done:
		t.Logf("wait exited %d %v after the last removed slot's release: %s", r.code, r.at.Sub(last), r.out)
		if r.code != 0 {
			t.Errorf("wait exited %d", r.code)
		}
		if b := releasedBound(sl, check); r.at.Sub(last) > b {
			t.Errorf("wait took %v after the release: more than %v (a check took %v; %v)", r.at.Sub(last), b, check, sl)
		}
	case <-time.After(2 * releasedBound(sl, check)):
		t.Errorf("wait did not exit within %v of the last release (a check took %v; %v)", 2*releasedBound(sl, check), check, sl)
	}
	<-churn
}

// scanDialer counts the connections a client dials; with refuse, it
// refuses every connection after the first (the client's own).
type scanDialer struct {
	attempts atomic.Int64
	refuse   bool
}

func (d *scanDialer) option() amqpsem.Option {
	return amqpsem.WithDial(func(ctx context.Context, network, addr string) (net.Conn, error) {
		if n := d.attempts.Add(1); d.refuse && n > 1 {
			return nil, errors.New("scanDialer: refused")
		}
		var nd net.Dialer
		return nd.DialContext(ctx, network, addr)
	})
}

// scanClient dials a client through d with a 1s heartbeat and a 100ms
// verify interval, creates a semaphore of 3 slots and returns an Admin of
// the client, the semaphore's name and a lease of one of its slots held by
// the same client.
func scanClient(t *testing.T, ctx context.Context, d *scanDialer) (*amqpsem.Admin, string, *amqpsem.Lease) {
	t.Helper()
	url, _ := amqpURL(t)
	name := newName(t, url)
	c, err := amqpsem.Dial(ctx, url, append(testOptions(),
		amqpsem.WithHeartbeat(time.Second), amqpsem.WithVerifyInterval(100*time.Millisecond), d.option())...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close(context.Background()) })
	a := admin(t, c)
	if err := a.Create(ctx, name, 3); err != nil {
		t.Fatal(err)
	}
	sem, err := c.Semaphore(3)
	if err != nil {
		t.Fatal(err)
	}
	l, err := sem.Acquire(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	return a, name, l.(*amqpsem.Lease)
}

// scanRound runs a Status and a WaitReleased of name at once, on a, and
// checks their answers: the semaphore has 3 slots, slot is held, nothing
// removed is held.
func scanRound(t *testing.T, ctx context.Context, a *amqpsem.Admin, name string, slot int) {
	t.Helper()
	var wg sync.WaitGroup
	wg.Go(func() {
		st, err := a.Status(ctx, name)
		switch {
		case err != nil:
			t.Errorf("Status: %v", err)
		case st.Slots != 3 || !slices.Equal(st.Held, []int{slot}) || len(st.Removed) > 0:
			t.Errorf("Status = %+v, want 3 slots, slot %d held, none removed", st, slot)
		}
	})
	wg.Go(func() {
		if err := a.WaitReleased(ctx, name); err != nil {
			t.Errorf("WaitReleased: %v", err)
		}
	})
	wg.Wait()
}

// TestStatusScansKeepLeasesLive: a client holds a slot with a 1s heartbeat
// and a 100ms verify interval while its own Admin runs Status and
// WaitReleased, each of which probes every slot number (65535 probes),
// round after round. The scans' probes go over connections of their own
// (one dialled per scan), so the lease's verifications, and the
// administration mutex's during WaitReleased's check, are not queued
// behind them: the lease stays live throughout, and every wait returns
// nil.
func TestStatusScansKeepLeasesLive(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	var d scanDialer
	a, name, lease := scanClient(t, ctx, &d)
	before := d.attempts.Load()
	start := time.Now()
	rounds := 0
	for rounds < 3 && (rounds < 1 || time.Since(start) < 6*time.Second) {
		scanRound(t, ctx, a, name, lease.Slot())
		rounds++
		if err := context.Cause(lease.Context()); err != nil {
			t.Fatalf("lease lost after %d rounds of scans (%v): %v", rounds, time.Since(start), err)
		}
		if t.Failed() {
			return
		}
	}
	t.Logf("%d rounds of a Status and a WaitReleased at once in %v", rounds, time.Since(start))
	if got, want := d.attempts.Load()-before, int64(2*rounds); got < want {
		t.Errorf("%d connections dialled for %d scans: the scans' probes did not go over connections of their own", got, want)
	}
	if err := lease.Release(ctx); err != nil {
		t.Errorf("release after the scans: %v", err)
	}
}

// TestStatusScanDialRefused: when the scan's own connection cannot be
// dialled, Status and WaitReleased fall back on the client's connection
// and answer as they would on their own.
func TestStatusScanDialRefused(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	d := scanDialer{refuse: true}
	a, name, lease := scanClient(t, ctx, &d)
	before := d.attempts.Load()
	scanRound(t, ctx, a, name, lease.Slot())
	if got := d.attempts.Load() - before; got < 2 {
		t.Errorf("%d connection attempts for 2 scans, want at least 2", got)
	}
}

// TestStatusScansDoNotStarveVerify: a client (1s heartbeat, verifying every
// 250ms) holds a slot and runs Admin.Status, a scan of 65535 pipelined
// probes, three times in a row on the same connection. Checks: the lease
// stays live (its verification has a channel of its own, "which a long
// scan must not delay"). It passed in isolation (2 runs, scans of 3.6 to
// 5.8s); it is kept as the isolated form of what the churn test saw:
//
// SEEN (under load: load average 9 on 2 cores, other helpers' tests
// running): TestWaitReleasedDuringChurn's Resize failed with
// "administration mutex lost during the change: validity deadline passed
// without a renewal" while a Status loop ran on the administrator's client.
// The likely cause: the scan's publishes share the connection's socket
// (and amqp091's single writer) with the verifier's probes, which then
// miss the 1s validity. A false loss, not a safety breach.
func TestStatusScansDoNotStarveVerify(t *testing.T) {
	url, _ := amqpURL(t)
	name := newName(t, url)
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	c := dial(t, url)
	admin := admin(t, c)
	if err := admin.Create(ctx, name, 2); err != nil {
		t.Fatal(err)
	}
	sem, _ := c.Semaphore(2)
	l, err := sem.TryAcquire(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Release(context.Background())
	mutex, err := c.Locker().TryLock(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	defer mutex.Release(context.Background())
	for i := range 3 {
		s0 := time.Now()
		if _, err := admin.Status(ctx, name); err != nil {
			t.Fatal(err)
		}
		t.Logf("status %d took %v", i, time.Since(s0))
		if l.Context().Err() != nil || mutex.Context().Err() != nil {
			break
		}
	}
	if err := l.Context().Err(); err != nil {
		t.Errorf("slot lease lost during Status scans on its client: %v", context.Cause(l.Context()))
	}
	if err := mutex.Context().Err(); err != nil {
		t.Errorf("mutex lease lost during Status scans on its client: %v", context.Cause(mutex.Context()))
	}
}
