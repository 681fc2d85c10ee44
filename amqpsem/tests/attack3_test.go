package amqpsem_test

// Attack scenarios, third round: the Client refactor (Dial, Locker,
// Semaphore(size), Close(ctx)), batched verification, the reconnecting
// client. Written from the package documentation, against the real broker.
// Each records lease intervals on the process's monotonic clock
// (time.Now's monotonic reading): a lease's interval runs from its Acquire
// returning to its end (the caller's Release call, or its context ending
// as seen by a context.AfterFunc, a bound a little late, never early).

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sort"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/latchkey-go/latchkey/contracttest/testenv"
	"github.com/latchkey-go/latchkey/locks"

	"github.com/latchkey-go/latchkey/amqpsem"
)

// atk3Interval is one held lease.
type atk3Interval struct {
	who        string
	slot       int
	start, end time.Time
	cause      error
}

// atk3Recorder collects lease intervals.
type atk3Recorder struct {
	mu  sync.Mutex
	ivs []*atk3Interval
}

// held records l from now; the interval ends at release (ended called) or
// when l's context ends, whichever comes first.
func (r *atk3Recorder) held(who string, l locks.Lease) (ended func()) {
	iv := &atk3Interval{who: who, slot: l.(locks.SlotLease).Slot(), start: time.Now()}
	r.mu.Lock()
	r.ivs = append(r.ivs, iv)
	r.mu.Unlock()
	end := func() {
		now := time.Now()
		r.mu.Lock()
		if iv.end.IsZero() {
			iv.end = now
			iv.cause = context.Cause(l.Context())
		}
		r.mu.Unlock()
	}
	context.AfterFunc(l.Context(), end)
	return end
}

// overlaps returns descriptions of two intervals on one slot that overlap
// (an open interval ends at the far future), and the most leases live at
// once.
func (r *atk3Recorder) overlaps() (bad []string, most int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	far := time.Now().Add(time.Hour)
	endOf := func(iv *atk3Interval) time.Time {
		if iv.end.IsZero() {
			return far
		}
		return iv.end
	}
	bySlot := map[int][]*atk3Interval{}
	type ev struct {
		at time.Time
		d  int
	}
	var evs []ev
	for _, iv := range r.ivs {
		bySlot[iv.slot] = append(bySlot[iv.slot], iv)
		evs = append(evs, ev{iv.start, 1}, ev{endOf(iv), -1})
	}
	for slot, ivs := range bySlot {
		sort.Slice(ivs, func(i, j int) bool { return ivs[i].start.Before(ivs[j].start) })
		for i := 1; i < len(ivs); i++ {
			if prev := ivs[i-1]; ivs[i].start.Before(endOf(prev)) {
				bad = append(bad, fmt.Sprintf("slot %d: %s from %v while %s held it until %v (%v)",
					slot, ivs[i].who, ivs[i].start.Format("15:04:05.000000"), prev.who, endOf(prev).Format("15:04:05.000000"), prev.cause))
			}
		}
	}
	sort.Slice(evs, func(i, j int) bool {
		if evs[i].at.Equal(evs[j].at) {
			return evs[i].d < evs[j].d
		}
		return evs[i].at.Before(evs[j].at)
	})
	n := 0
	for _, e := range evs {
		n += e.d
		most = max(most, n)
	}
	return bad, most
}

func (r *atk3Recorder) count() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.ivs)
}

// TestAttack3MixedClientsResize: four clients of one name with different
// heartbeats, verify intervals and Semaphore sizes churn for 6s while an
// administrator resizes the semaphore 3 -> 5 -> 2 -> 4 -> 3. Checks: no
// two leases on one slot overlap (a lease whose slot was removed ends
// before anyone takes the slot again), a Semaphore never holds a slot
// above its size, live leases never exceed the largest C (5), and at the
// end nothing is held.
func TestAttack3MixedClientsResize(t *testing.T) {
	url, _ := amqpURL(t)
	name := atkName("a3mixed")
	atkCleanup(t, url, name)
	type spec struct {
		hb, verify time.Duration
		size       int
	}
	specs := []spec{
		{time.Second, 100 * time.Millisecond, 1},
		{2 * time.Second, 300 * time.Millisecond, 2},
		{time.Second, 0, 3},
		{3 * time.Second, time.Second, amqpsem.MaxSemaphoreSize},
	}
	ctx, cancel := context.WithTimeout(context.Background(), 25*time.Second)
	defer cancel()
	adminClient := atkDial(t, url, "")
	admin := atkAdmin(t, adminClient)
	if err := admin.Create(ctx, name, 3); err != nil {
		t.Fatal(err)
	}
	var rec atk3Recorder
	var acquires, failures, aboveSize atomic.Int64
	stop := time.Now().Add(6 * time.Second)
	var wg sync.WaitGroup
	for i, sp := range specs {
		opts := []amqpsem.Option{amqpsem.WithHeartbeat(sp.hb)}
		if sp.verify > 0 {
			opts = append(opts, amqpsem.WithVerifyInterval(sp.verify))
		}
		c := atkDial(t, url, "", opts...)
		sem, err := c.Semaphore(sp.size)
		if err != nil {
			t.Fatal(err)
		}
		for w := range 2 {
			who := fmt.Sprintf("c%d(size %d).w%d", i, sp.size, w)
			wg.Go(func() {
				for time.Now().Before(stop) {
					actx, acancel := context.WithTimeout(ctx, time.Second)
					l, err := sem.Acquire(actx, name)
					acancel()
					if err != nil {
						if !errors.Is(err, context.DeadlineExceeded) {
							failures.Add(1)
							t.Logf("%s: acquire: %v", who, err)
						}
						continue
					}
					acquires.Add(1)
					ended := rec.held(who, l)
					if s := l.(locks.SlotLease).Slot(); s > sp.size {
						aboveSize.Add(1)
						t.Errorf("%s holds slot %d above its size %d", who, s, sp.size)
					}
					time.Sleep(time.Duration(rand.IntN(40)) * time.Millisecond)
					ended()
					l.Release(context.Background())
				}
			})
		}
	}
	for _, n := range []int{5, 2, 4, 3} {
		time.Sleep(1200 * time.Millisecond)
		if _, err := admin.Resize(ctx, name, n); err != nil {
			t.Errorf("resize to %d: %v", n, err)
		}
	}
	wg.Wait()
	bad, most := rec.overlaps()
	for _, b := range bad {
		t.Error("overlap: " + b)
	}
	if most > 5 {
		t.Errorf("%d leases live at once, more than the largest C (5)", most)
	}
	st, err := admin.Status(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	if len(st.Held) != 0 || len(st.Removed) != 0 {
		t.Errorf("after every release: held %v, removed still held %v", st.Held, st.Removed)
	}
	t.Logf("%d leases (%d acquires, %d non-deadline failures), at most %d live at once, C=%d at the end",
		rec.count(), acquires.Load(), failures.Load(), most, st.Slots)
	if acquires.Load() < 20 {
		t.Errorf("only %d acquires in 6s: no liveness", acquires.Load())
	}
}

// TestAttack3CloseShortDeadline: a client holds every slot of a
// semaphore (verifying every 50ms), has Acquires waiting and a Verify
// loop running, and is closed with a deadline of 0, 5ms or 50ms. Checks:
// Close returns within its deadline plus a second; every lease's context
// has ended with locks.ErrLost and locks.ErrClosed when Close returns;
// the waiting Acquires return errors matching locks.ErrClosed; no holder
// queue is left at the broker within 3s; no goroutine outlives Close
// (goleak, after a grace period, since a late Close finishes in the
// background).
func TestAttack3CloseShortDeadline(t *testing.T) {
	url, _ := amqpURL(t)
	for _, deadline := range []time.Duration{0, 5 * time.Millisecond, 50 * time.Millisecond} {
		t.Run(deadline.String(), func(t *testing.T) {
			name := atkName("a3close")
			atkCleanup(t, url, name)
			raw := atkRaw(t, url)
			setup := atkDial(t, url, "")
			ctx, cancel := context.WithTimeout(context.Background(), 25*time.Second)
			defer cancel()
			if err := atkAdmin(t, setup).Create(ctx, name, 4); err != nil {
				t.Fatal(err)
			}
			before := goleak.IgnoreCurrent()
			dctx, dcancel := context.WithTimeout(ctx, 5*time.Second)
			c, err := amqpsem.Dial(dctx, url, append(testOptions(), amqpsem.WithVerifyInterval(50*time.Millisecond))...)
			dcancel()
			if err != nil {
				t.Fatal(err)
			}
			sem, _ := c.Semaphore(4)
			var leases []locks.Lease
			for range 4 {
				l, err := sem.TryAcquire(ctx, name)
				if err != nil {
					t.Fatal(err)
				}
				leases = append(leases, l)
			}
			waitErrs := make(chan error, 3)
			for range 3 {
				go func() {
					_, err := sem.Acquire(ctx, name)
					waitErrs <- err
				}()
			}
			verifyDone := make(chan struct{})
			go func() {
				defer close(verifyDone)
				for leases[0].(*amqpsem.Lease).Verify(ctx) == nil {
				}
			}()
			time.Sleep(300 * time.Millisecond)
			cctx, ccancel := context.WithTimeout(context.Background(), deadline)
			t0 := time.Now()
			cerr := c.Close(cctx)
			took := time.Since(t0)
			ccancel()
			t.Logf("Close(%v) took %v: %v", deadline, took, cerr)
			if took > deadline+time.Second {
				t.Errorf("Close with a %v deadline took %v", deadline, took)
			}
			for i, l := range leases {
				if l.Context().Err() == nil {
					t.Errorf("lease %d still live after Close returned", i)
					continue
				}
				if cause := context.Cause(l.Context()); !errors.Is(cause, locks.ErrLost) || !errors.Is(cause, locks.ErrClosed) {
					t.Errorf("lease %d ended with %v, want ErrLost and ErrClosed", i, cause)
				}
			}
			for range 3 {
				select {
				case err := <-waitErrs:
					if !errors.Is(err, locks.ErrClosed) {
						t.Errorf("waiting Acquire returned %v, want ErrClosed", err)
					}
				case <-time.After(2 * time.Second):
					t.Fatal("a waiting Acquire did not return within 2s of Close")
				}
			}
			<-verifyDone
			left := atk3HolderQueues(raw, name, 4, 3*time.Second)
			if len(left) > 0 {
				t.Errorf("holder queues left 3s after Close: %v", left)
			}
			leakEnd := time.Now().Add(5 * time.Second)
			for {
				err := goleak.Find(before)
				if err == nil {
					break
				}
				if time.Now().After(leakEnd) {
					t.Errorf("goroutines outlive Close(%v) by 5s: %v", deadline, err)
					break
				}
			}
		})
	}
}

// atk3HolderQueues polls until no holder queue B[1..n] of name exists
// (or d passes) and returns those that still do.
func atk3HolderQueues(raw *atkRawConn, name string, n int, d time.Duration) []string {
	end := time.Now().Add(d)
	for {
		var left []string
		for i := 1; i <= n; i++ {
			q := name + "-" + strconv.Itoa(i) + "-B"
			if s := raw.state(q); s != "absent" {
				left = append(left, q+"="+s)
			}
		}
		if len(left) == 0 || time.Now().After(end) {
			return left
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestAttack3CutMidAcquireMidVerify: a client behind a proxy holds the
// one slot of semaphore S2 (verifying every 50ms) and waits in Acquire
// for semaphore S1, held by another client; a third client waits for S2.
// The proxy cuts every connection. Checks: the S2 lease ends with
// ErrLost and ErrConnectionClosed before the third client holds S2; the
// waiting Acquire returns an error matching ErrConnectionClosed; after
// Restore the client reconnects and acquires S1 once it is released.
func TestAttack3CutMidAcquireMidVerify(t *testing.T) {
	url, host := amqpURL(t)
	s1, s2 := atkName("a3cut1"), atkName("a3cut2")
	atkCleanup(t, url, s1)
	atkCleanup(t, url, s2)
	ctx, cancel := context.WithTimeout(context.Background(), 25*time.Second)
	defer cancel()
	other := atkDial(t, url, "")
	a := atkAdmin(t, other)
	for _, n := range []string{s1, s2} {
		if err := a.Create(ctx, n, 1); err != nil {
			t.Fatal(err)
		}
	}
	osem, _ := other.Semaphore(1)
	h1, err := osem.TryAcquire(ctx, s1)
	if err != nil {
		t.Fatal(err)
	}
	p := testenv.NewProxy(t, host)
	vc := atkDial(t, url, p.Addr(), amqpsem.WithVerifyInterval(50*time.Millisecond))
	vsem, _ := vc.Semaphore(1)
	var rec atk3Recorder
	v2, err := vsem.TryAcquire(ctx, s2)
	if err != nil {
		t.Fatal(err)
	}
	rec.held("cut client", v2)
	third := atkDial(t, url, "")
	tsem, _ := third.Semaphore(1)
	thirdGot := make(chan locks.Lease, 1)
	go func() {
		l, err := tsem.Acquire(ctx, s2)
		if err != nil {
			t.Errorf("third client: %v", err)
			close(thirdGot)
			return
		}
		rec.held("third client", l)
		thirdGot <- l
	}()
	waitErr := make(chan error, 1)
	go func() {
		_, err := vsem.Acquire(ctx, s1)
		waitErr <- err
	}()
	time.Sleep(500 * time.Millisecond)
	t0 := time.Now()
	p.Cut()
	select {
	case err := <-waitErr:
		t.Logf("waiting Acquire returned %v after %v", err, time.Since(t0))
		if !errors.Is(err, amqpsem.ErrConnectionClosed) {
			t.Errorf("waiting Acquire cut mid-wait returned %v, want ErrConnectionClosed", err)
		}
	case <-time.After(5 * time.Second):
		t.Error("waiting Acquire did not return within 5s of the cut")
	}
	select {
	case l := <-thirdGot:
		if l == nil {
			t.FailNow()
		}
		t.Logf("third client took S2 %v after the cut", time.Since(t0))
		defer l.Release(context.Background())
	case <-time.After(8 * time.Second):
		t.Fatal("third client did not take S2 within 8s of the cut")
	}
	if cause := context.Cause(v2.Context()); !errors.Is(cause, locks.ErrLost) || !errors.Is(cause, amqpsem.ErrConnectionClosed) {
		t.Errorf("cut lease ended with %v", cause)
	}
	bad, _ := rec.overlaps()
	for _, b := range bad {
		t.Error("overlap: " + b)
	}
	p.Restore()
	atkWaitConnected(t, vc, 10*time.Second)
	h1.Release(ctx)
	actx, acancel := context.WithTimeout(ctx, 5*time.Second)
	defer acancel()
	l, err := vsem.Acquire(actx, s1)
	if err != nil {
		t.Fatalf("after reconnecting, Acquire of a free S1: %v", err)
	}
	l.Release(ctx)
}

// TestAttack3SilencedVerifyCap: a holder dialed with a 2s heartbeat and
// a verify interval of 10s (the doc caps it at half the heartbeat, 1s)
// holds two slots through two Semaphores of different sizes; its proxy
// black-holes. Checks: both leases end within one heartbeat of the last
// successful verification (2s + 1s + slack) and before a waiter holds
// either slot; the waiter holds both within three heartbeats (6s) plus
// slack.
func TestAttack3SilencedVerifyCap(t *testing.T) {
	url, host := amqpURL(t)
	name := atkName("a3silent")
	atkCleanup(t, url, name)
	ctx, cancel := context.WithTimeout(context.Background(), 25*time.Second)
	defer cancel()
	wc := atkDial(t, url, "")
	if err := atkAdmin(t, wc).Create(ctx, name, 2); err != nil {
		t.Fatal(err)
	}
	p := testenv.NewProxy(t, host)
	hc := atkDial(t, url, p.Addr(), amqpsem.WithHeartbeat(2*time.Second), amqpsem.WithVerifyInterval(10*time.Second))
	var rec atk3Recorder
	var held []locks.Lease
	for _, size := range []int{1, 2} {
		sem, _ := hc.Semaphore(size)
		l, err := sem.TryAcquire(ctx, name)
		if err != nil {
			t.Fatal(err)
		}
		rec.held(fmt.Sprintf("silenced size %d", size), l)
		held = append(held, l)
	}
	wsem, _ := wc.Semaphore(2)
	got := make(chan time.Time, 2)
	for range 2 {
		go func() {
			l, err := wsem.Acquire(ctx, name)
			if err != nil {
				t.Errorf("waiter: %v", err)
				got <- time.Time{}
				return
			}
			rec.held("waiter", l)
			got <- time.Now()
		}()
	}
	time.Sleep(2500 * time.Millisecond) // verifications at the capped interval
	t0 := time.Now()
	p.BlackHole()
	for i := range 2 {
		select {
		case at := <-got:
			t.Logf("waiter %d held a slot %v after the black hole", i, at.Sub(t0))
			if at.Sub(t0) > 6*time.Second+2*time.Second {
				t.Errorf("slot freed %v after the black hole: more than three 2s heartbeats", at.Sub(t0))
			}
		case <-time.After(15 * time.Second):
			t.Fatal("waiter did not acquire within 15s")
		}
	}
	for i, l := range held {
		var ended time.Time
		rec.mu.Lock()
		ended = rec.ivs[i].end
		rec.mu.Unlock()
		if ended.IsZero() {
			t.Errorf("silenced lease %d still live", i)
			continue
		}
		t.Logf("silenced lease %d (slot %d) ended %v after the black hole: %v", i, l.(locks.SlotLease).Slot(), ended.Sub(t0), context.Cause(l.Context()))
		if ended.Sub(t0) > 2*time.Second+time.Second+500*time.Millisecond {
			t.Errorf("silenced lease %d ended %v after the black hole: more than a heartbeat (2s) after its last verification (capped at 1s)", i, ended.Sub(t0))
		}
	}
	bad, _ := rec.overlaps()
	for _, b := range bad {
		t.Error("overlap: " + b)
	}
}

// TestAttack3LateDeclareReply: a client's TryAcquire declares the holder
// queue, but the broker's replies come 1.5s late, after the call's 300ms
// ctx ended; the connection stays up (heartbeats arrive, late). "On
// failure nothing is held": the queue the late declare-ok gives the
// client must be deleted, so another client takes the slot within a few
// seconds, while the first client's connection is still open.
func TestAttack3LateDeclareReply(t *testing.T) {
	url, host := amqpURL(t)
	name := atkName("a3late")
	atkCleanup(t, url, name)
	ctx, cancel := context.WithTimeout(context.Background(), 25*time.Second)
	defer cancel()
	oc := atkDial(t, url, "")
	if err := atkAdmin(t, oc).Create(ctx, name, 1); err != nil {
		t.Fatal(err)
	}
	p := testenv.NewProxy(t, host)
	vc := atkDial(t, url, p.Addr(), amqpsem.WithHeartbeat(5*time.Second))
	vsem, _ := vc.Semaphore(1)
	// Pipeline the probes first, at full speed: the scan sees slot 1 free.
	p.DelayReplies(1500 * time.Millisecond)
	tctx, tcancel := context.WithTimeout(ctx, 300*time.Millisecond)
	l, err := vsem.TryAcquire(tctx, name)
	tcancel()
	if err == nil {
		l.Release(ctx)
		t.Skip("TryAcquire succeeded despite the delay")
	}
	t.Logf("TryAcquire with late replies: %v", err)
	t0 := time.Now()
	osem, _ := oc.Semaphore(1)
	for {
		ol, err := osem.TryAcquire(ctx, name)
		if err == nil {
			t.Logf("other client took the slot %v after the failed TryAcquire; late client connected: %v", time.Since(t0), vc.Connected())
			ol.Release(ctx)
			break
		}
		if time.Since(t0) > 8*time.Second {
			t.Fatalf("slot still held 8s after a TryAcquire that failed (holder queue %s, late client connected %v): %v",
				atkRaw(t, url).state(name+"-1-B"), vc.Connected(), err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	p.Restore()
}

// TestAttack3LostDeleteReply: a holder's Release deletes its queue but the
// delete-ok never comes back (DropReplies). Checks: Release returns within
// its ctx plus a heartbeat (the doc's bound); the slot is free at the
// broker at once (another client takes it); after Restore (which closes
// the connection that lost data) calls made before the client noticed
// fail with errors matching ErrConnectionClosed and locks.ErrClosed, as
// the Client's doc says of calls in flight when the connection is lost;
// the client reconnects and acquires again.
//
// FOUND (fails about one run in two): a call whose first write hits the
// dead socket before amqp091 has marked the connection closed returns the
// raw network error ("probe ...: write tcp ...: write: broken pipe"),
// matching neither ErrConnectionClosed nor locks.ErrClosed, so a caller
// cannot tell it is the connection loss the doc says to retry after.
// session.connErr wraps an error only when conn.IsClosed() is already
// true at that moment.
func TestAttack3LostDeleteReply(t *testing.T) {
	url, host := amqpURL(t)
	name := atkName("a3lostdel")
	atkCleanup(t, url, name)
	ctx, cancel := context.WithTimeout(context.Background(), 25*time.Second)
	defer cancel()
	oc := atkDial(t, url, "")
	if err := atkAdmin(t, oc).Create(ctx, name, 1); err != nil {
		t.Fatal(err)
	}
	p := testenv.NewProxy(t, host)
	vc := atkDial(t, url, p.Addr())
	vsem, _ := vc.Semaphore(1)
	l, err := vsem.TryAcquire(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	p.DropReplies()
	rctx, rcancel := context.WithTimeout(ctx, 300*time.Millisecond)
	t0 := time.Now()
	rerr := l.Release(rctx)
	rcancel()
	took := time.Since(t0)
	t.Logf("Release with the reply lost: %v after %v", rerr, took)
	if took > 300*time.Millisecond+vc.Heartbeat()+500*time.Millisecond {
		t.Errorf("Release took %v: more than its ctx plus a heartbeat", took)
	}
	osem, _ := oc.Semaphore(1)
	ol, err := osem.Acquire(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("other client holds the slot %v after the release", time.Since(t0))
	ol.Release(ctx)
	// Restore closes the connection whose replies were dropped; the client
	// may not have noticed yet when the next calls start. Four at once, so
	// that one is likely to write before the client has seen the EOF.
	p.Restore()
	connected := vc.Connected()
	var cwg sync.WaitGroup
	for k := range 4 {
		cwg.Go(func() {
			l, err := vsem.TryAcquire(ctx, name)
			if err == nil {
				l.Release(ctx)
				return
			}
			if errors.Is(err, locks.ErrNotAcquired) || errors.Is(err, amqpsem.ErrConnectionClosed) && errors.Is(err, locks.ErrClosed) {
				return
			}
			t.Errorf("TryAcquire %d on the dead connection (Connected() was %v) failed with %v, which matches neither ErrConnectionClosed nor locks.ErrClosed", k, connected, err)
		})
	}
	cwg.Wait()
	end := time.Now().Add(10 * time.Second)
	for {
		l2, err := vsem.TryAcquire(ctx, name)
		if err == nil {
			l2.Release(ctx)
			return
		}
		if time.Now().After(end) {
			t.Fatalf("no slot 10s after Restore: %v (connected %v)", err, vc.Connected())
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// TestAttack3WaitReleasedDuringChurn: four clients churn on a 4-slot
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
// the Status loop's scans; see TestAttack3StatusStarvesVerify. Each
// Status took 4 to 10s there, against "about a second, a few under the
// race detector".
func TestAttack3WaitReleasedDuringChurn(t *testing.T) {
	url, _ := amqpURL(t)
	name := atkName("a3churn")
	atkCleanup(t, url, name)
	ctx, cancel := context.WithTimeout(context.Background(), 40*time.Second)
	defer cancel()
	ac := atkDial(t, url, "")
	admin := atkAdmin(t, ac)
	if err := admin.Create(ctx, name, 4); err != nil {
		t.Fatal(err)
	}
	var rec atk3Recorder
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for i := range 4 {
		c := atkDial(t, url, "", amqpsem.WithVerifyInterval(time.Duration(100*(i+1))*time.Millisecond))
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
				ended := rec.held(who, l)
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
	var statusWG sync.WaitGroup
	statusWG.Go(func() {
		for {
			select {
			case <-stopStatus:
				return
			default:
			}
			s0 := time.Now()
			st, err := admin.Status(ctx, name)
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
	statusWG.Wait()
	wctx, wcancel := context.WithTimeout(ctx, 20*time.Second)
	werr := admin.WaitReleased(wctx, name)
	wcancel()
	returned := time.Now()
	rec.mu.Lock()
	for _, iv := range rec.ivs {
		if iv.slot > 2 && (iv.end.IsZero() || iv.end.After(returned)) {
			t.Errorf("WaitReleased returned %v with slot %d held by %s (ended %v)", werr, iv.slot, iv.who, iv.end)
		}
	}
	rec.mu.Unlock()
	close(stop)
	wg.Wait()
	if werr != nil {
		t.Errorf("WaitReleased: %v", werr)
	}
	bad, _ := rec.overlaps()
	for _, b := range bad {
		t.Error("overlap: " + b)
	}
	t.Logf("WaitReleased returned %v after %v; %d leases, %d statuses", werr, returned.Sub(t0), rec.count(), statuses.Load())
}

// TestAttack3CommandWaitChurn: `amqpsem wait` runs while removed slots are
// held and released one after the other by library clients, and while a
// kept slot churns. Checks: it does not exit before the last removed slot
// is released, exits 0 within a few seconds after it, and prints nothing
// alarming.
func TestAttack3CommandWaitChurn(t *testing.T) {
	url, _ := amqpURL(t)
	name := atkName("a3cmdwait")
	atkCleanup(t, url, name)
	ctx, cancel := context.WithTimeout(context.Background(), 28*time.Second)
	defer cancel()
	c := atkDial(t, url, "", amqpsem.WithVerifyInterval(10*time.Second), amqpsem.WithHeartbeat(30*time.Second))
	admin := atkAdmin(t, c)
	if err := admin.Create(ctx, name, 3); err != nil {
		t.Fatal(err)
	}
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
	atkBin(t)
	type res struct {
		out  string
		code int
		at   time.Time
	}
	done := make(chan res, 1)
	go func() {
		out, code := atkRun(t, 25*time.Second, []string{"AMQPSEM_URL=" + url}, "wait", name)
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
		if r.at.Sub(last) > 10*time.Second {
			t.Errorf("wait took %v after the release", r.at.Sub(last))
		}
	case <-time.After(15 * time.Second):
		t.Error("wait did not exit within 15s of the last release")
	}
	<-churn
}

// TestAttack3BatchedVerifyPartialRemoval: one client holds the four slots
// of a semaphore (its leases verified together in one batched round every
// 100ms) and an administrator removes slots 3 and 4. Checks: the leases
// on slots 3 and 4 end with ErrLost and ErrSlotRemoved within a second,
// their holder queues are deleted without Release, and the leases on
// slots 1 and 2, verified in the same rounds, stay live.
func TestAttack3BatchedVerifyPartialRemoval(t *testing.T) {
	url, _ := amqpURL(t)
	name := atkName("a3batch")
	atkCleanup(t, url, name)
	ctx, cancel := context.WithTimeout(context.Background(), 25*time.Second)
	defer cancel()
	c := atkDial(t, url, "", amqpsem.WithVerifyInterval(100*time.Millisecond))
	admin := atkAdmin(t, atkDial(t, url, ""))
	if err := admin.Create(ctx, name, 4); err != nil {
		t.Fatal(err)
	}
	sem, _ := c.Semaphore(4)
	leases := map[int]locks.Lease{}
	for range 4 {
		l, err := sem.TryAcquire(ctx, name)
		if err != nil {
			t.Fatal(err)
		}
		leases[l.(locks.SlotLease).Slot()] = l
	}
	t0 := time.Now()
	if _, err := admin.Resize(ctx, name, 2); err != nil {
		t.Fatal(err)
	}
	for _, s := range []int{3, 4} {
		select {
		case <-leases[s].Context().Done():
			cause := context.Cause(leases[s].Context())
			t.Logf("slot %d ended %v after the resize began: %v", s, time.Since(t0), cause)
			if !errors.Is(cause, locks.ErrLost) || !errors.Is(cause, amqpsem.ErrSlotRemoved) {
				t.Errorf("slot %d ended with %v", s, cause)
			}
		case <-time.After(time.Second + time.Since(t0)):
			t.Errorf("slot %d's lease still live a second after its slot was removed", s)
		}
	}
	raw := atkRaw(t, url)
	end := time.Now().Add(2 * time.Second)
	for _, s := range []int{3, 4} {
		q := name + "-" + strconv.Itoa(s) + "-B"
		for raw.state(q) != "absent" && time.Now().Before(end) {
			time.Sleep(50 * time.Millisecond)
		}
		if st := raw.state(q); st != "absent" {
			t.Errorf("holder queue %s is %s 2s after its lease ended", q, st)
		}
	}
	time.Sleep(500 * time.Millisecond)
	for _, s := range []int{1, 2} {
		if err := leases[s].Context().Err(); err != nil {
			t.Errorf("slot %d (kept) ended: %v", s, context.Cause(leases[s].Context()))
		}
		leases[s].Release(ctx)
	}
}

// TestAttack3ValidityExpiresConnectionAlive: a holder's replies come 2s
// late (its requests still reach the broker at once), so its
// verifications stop succeeding in time. Checks: its lease ends with
// ErrLost within a heartbeat (1s) of its last verification plus slack,
// and its slot is freed soon after (by the queue's delete, which reaches
// the broker at once, or by the client dropping the silent connection:
// in the runs seen, Connected() was already false when the waiter got
// the slot), never before the lease ended.
func TestAttack3ValidityExpiresConnectionAlive(t *testing.T) {
	url, host := amqpURL(t)
	name := atkName("a3valid")
	atkCleanup(t, url, name)
	ctx, cancel := context.WithTimeout(context.Background(), 25*time.Second)
	defer cancel()
	wc := atkDial(t, url, "")
	if err := atkAdmin(t, wc).Create(ctx, name, 1); err != nil {
		t.Fatal(err)
	}
	p := testenv.NewProxy(t, host)
	hc := atkDial(t, url, p.Addr(), amqpsem.WithHeartbeat(time.Second), amqpsem.WithVerifyInterval(200*time.Millisecond))
	hsem, _ := hc.Semaphore(1)
	hl, err := hsem.TryAcquire(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	var rec atk3Recorder
	rec.held("late holder", hl)
	wsem, _ := wc.Semaphore(1)
	got := make(chan time.Time, 1)
	go func() {
		l, err := wsem.Acquire(ctx, name)
		if err != nil {
			t.Errorf("waiter: %v", err)
			got <- time.Time{}
			return
		}
		rec.held("waiter", l)
		got <- time.Now()
		l.Release(context.Background())
	}()
	time.Sleep(500 * time.Millisecond)
	t0 := time.Now()
	p.DelayReplies(2 * time.Second)
	var at time.Time
	select {
	case at = <-got:
	case <-time.After(15 * time.Second):
		t.Fatal("waiter did not acquire within 15s")
	}
	<-hl.Context().Done()
	rec.mu.Lock()
	ended := rec.ivs[0].end
	rec.mu.Unlock()
	t.Logf("late holder's lease ended %v after the delay began (%v); waiter held the slot at %v; holder connected %v",
		ended.Sub(t0), context.Cause(hl.Context()), at.Sub(t0), hc.Connected())
	if ended.Before(t0) {
		t.Logf("the lease ended before the fault: its verifications were already too slow (load)")
	}
	if ended.Sub(t0) > time.Second+200*time.Millisecond+500*time.Millisecond {
		t.Errorf("lease ended %v after its verifications stopped succeeding: more than a heartbeat after the last", ended.Sub(t0))
	}
	// The background delete may need a channel, whose open-ok is 2s late;
	// the broker's heartbeat bound (3s) frees the slot in any case.
	if at.Sub(ended) > 3*time.Second+time.Second {
		t.Errorf("waiter held the slot %v after the lease ended", at.Sub(ended))
	}
	bad, _ := rec.overlaps()
	for _, b := range bad {
		t.Error("overlap: " + b)
	}
	p.Restore()
}

// TestAttack3CloseDuringLateDeclare: a client's Acquire has declared a
// holder queue whose declare-ok is 2s late when the client is closed with
// a 100ms deadline. Checks: Close returns within its deadline plus a
// second, the Acquire returns an error matching locks.ErrClosed (or
// ctx's), and no holder queue is left at the broker 3s later.
func TestAttack3CloseDuringLateDeclare(t *testing.T) {
	url, host := amqpURL(t)
	name := atkName("a3closelate")
	atkCleanup(t, url, name)
	ctx, cancel := context.WithTimeout(context.Background(), 25*time.Second)
	defer cancel()
	raw := atkRaw(t, url)
	if err := atkAdmin(t, atkDial(t, url, "")).Create(ctx, name, 2); err != nil {
		t.Fatal(err)
	}
	p := testenv.NewProxy(t, host)
	vc := atkDial(t, url, p.Addr(), amqpsem.WithHeartbeat(5*time.Second))
	vsem, _ := vc.Semaphore(2)
	p.DelayReplies(2 * time.Second)
	acqErr := make(chan error, 2)
	for range 2 {
		go func() {
			l, err := vsem.Acquire(ctx, name)
			if err == nil {
				t.Errorf("Acquire succeeded on a client being closed: slot %d, live %v", l.(locks.SlotLease).Slot(), l.Context().Err() == nil)
			}
			acqErr <- err
		}()
	}
	time.Sleep(2500 * time.Millisecond) // the probes' replies are in; the declares are at the broker
	cctx, ccancel := context.WithTimeout(ctx, 100*time.Millisecond)
	t0 := time.Now()
	cerr := vc.Close(cctx)
	ccancel()
	t.Logf("Close took %v: %v", time.Since(t0), cerr)
	if time.Since(t0) > 1100*time.Millisecond {
		t.Errorf("Close with a 100ms deadline took %v", time.Since(t0))
	}
	for range 2 {
		select {
		case err := <-acqErr:
			if err != nil && !errors.Is(err, locks.ErrClosed) && !errors.Is(err, context.DeadlineExceeded) {
				t.Errorf("Acquire during Close: %v", err)
			}
		case <-time.After(3 * time.Second):
			t.Error("Acquire did not return within 3s of Close")
		}
	}
	p.Restore()
	if left := atk3HolderQueues(raw, name, 2, 3*time.Second); len(left) > 0 {
		t.Errorf("holder queues left 3s after Close: %v", left)
	}
}

// TestAttack3CreateRaceSizes: clients dialed WithCreate with Semaphores
// of sizes 2 and 5 acquire a missing name at once, eight acquires each.
// Checks: the semaphore is created once, with 2 or 5 slots (never a mix,
// such as 7, or a partial count); the size-2 Semaphore never holds a slot
// above 2; no slot has two overlapping leases; no more leases are live
// than the final C. It logs how long the sixteen acquires took (0.35 to
// 0.61s in quiet runs). SEEN once under load (load average 9 on 2 cores,
// 5s per acquire then, 15s now): 8 of 16 acquires failed with "create
// ...: administration mutex: context deadline exceeded", waiting creators
// queueing for the mutex after the semaphore was made.
func TestAttack3CreateRaceSizes(t *testing.T) {
	url, _ := amqpURL(t)
	name := atkName("a3create")
	atkCleanup(t, url, name)
	ctx, cancel := context.WithTimeout(context.Background(), 25*time.Second)
	defer cancel()
	var rec atk3Recorder
	var wg sync.WaitGroup
	start := make(chan struct{})
	var slowest atomic.Int64
	for _, size := range []int{2, 5} {
		c := atkDial(t, url, "", amqpsem.WithCreate(true))
		sem, _ := c.Semaphore(size)
		for w := range 8 {
			who := fmt.Sprintf("size %d.w%d", size, w)
			wg.Go(func() {
				<-start
				actx, acancel := context.WithTimeout(ctx, 15*time.Second)
				defer acancel()
				a0 := time.Now()
				l, err := sem.Acquire(actx, name)
				if err != nil {
					t.Errorf("%s: %v after %v", who, err, time.Since(a0))
					return
				}
				for d := int64(time.Since(a0)); ; {
					if old := slowest.Load(); d <= old || slowest.CompareAndSwap(old, d) {
						break
					}
				}
				ended := rec.held(who, l)
				if s := l.(locks.SlotLease).Slot(); s > size {
					t.Errorf("%s holds slot %d", who, s)
				}
				time.Sleep(50 * time.Millisecond)
				ended()
				l.Release(context.Background())
			})
		}
	}
	t0 := time.Now()
	close(start)
	wg.Wait()
	took := time.Since(t0)
	slots, err := atkAdmin(t, atkDial(t, url, "")).Max(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	if slots != 2 && slots != 5 {
		t.Errorf("racing creates of sizes 2 and 5 left %d slots", slots)
	}
	bad, most := rec.overlaps()
	for _, b := range bad {
		t.Error("overlap: " + b)
	}
	if most > slots {
		t.Errorf("%d leases live at once on %d slots", most, slots)
	}
	t.Logf("created with %d slots; %d leases (each held 50ms), at most %d live at once; all done in %v, slowest acquire %v",
		slots, rec.count(), most, took, time.Duration(slowest.Load()))
}

// TestAttack3CutMidDeclare: a client's TryAcquire has its declare at the broker
// (seen as a locked B[1]; the replies are held back 1s) when the proxy
// cuts the connection.
// Checks: TryAcquire returns an error matching ErrConnectionClosed and
// locks.ErrClosed (the Client's doc, for calls in flight when the
// connection is lost), holding nothing; another client takes the slot
// at once; after Restore the client reconnects and acquires.
func TestAttack3CutMidDeclare(t *testing.T) {
	url, host := amqpURL(t)
	name := atkName("a3cutdecl")
	atkCleanup(t, url, name)
	ctx, cancel := context.WithTimeout(context.Background(), 25*time.Second)
	defer cancel()
	oc := atkDial(t, url, "")
	if err := atkAdmin(t, oc).Create(ctx, name, 1); err != nil {
		t.Fatal(err)
	}
	p := testenv.NewProxy(t, host)
	vc := atkDial(t, url, p.Addr())
	vsem, _ := vc.Semaphore(1)
	p.DelayReplies(time.Second)
	errc := make(chan error, 1)
	go func() {
		l, err := vsem.TryAcquire(ctx, name)
		if err == nil {
			t.Errorf("TryAcquire succeeded across a cut: live %v", l.Context().Err() == nil)
		}
		errc <- err
	}()
	raw := atkRaw(t, url)
	for deadline := time.Now().Add(10 * time.Second); raw.state(name+"-1-B") != "locked"; { // the declare is at the broker
		if time.Now().After(deadline) {
			t.Fatal("the client's declare never reached the broker")
		}
		time.Sleep(20 * time.Millisecond)
	}
	t0 := time.Now()
	p.Cut()
	select {
	case err := <-errc:
		t.Logf("TryAcquire cut mid-declare: %v after %v", err, time.Since(t0))
		if err != nil && (!errors.Is(err, amqpsem.ErrConnectionClosed) || !errors.Is(err, locks.ErrClosed)) {
			t.Errorf("TryAcquire cut mid-declare returned %v, matching ErrConnectionClosed %v, locks.ErrClosed %v",
				err, errors.Is(err, amqpsem.ErrConnectionClosed), errors.Is(err, locks.ErrClosed))
		}
	case <-time.After(5 * time.Second):
		t.Fatal("TryAcquire did not return within 5s of the cut")
	}
	osem, _ := oc.Semaphore(1)
	actx, acancel := context.WithTimeout(ctx, 3*time.Second)
	ol, err := osem.Acquire(actx, name)
	acancel()
	if err != nil {
		t.Fatalf("other client, after the cut: %v", err)
	}
	t.Logf("other client took the slot %v after the cut", time.Since(t0))
	ol.Release(ctx)
	p.Restore()
	end := time.Now().Add(10 * time.Second)
	for {
		l, err := vsem.TryAcquire(ctx, name)
		if err == nil {
			l.Release(ctx)
			return
		}
		if time.Now().After(end) {
			t.Fatalf("no slot 10s after Restore: %v", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// TestAttack3StatusStarvesVerify: a client (1s heartbeat, verifying every
// 250ms) holds a slot and runs Admin.Status, a scan of 65535 pipelined
// probes, three times in a row on the same connection. Checks: the lease
// stays live (its verification has a channel of its own, "which a long
// scan must not delay"). It passed in isolation (2 runs, scans of 3.6 to
// 5.8s); it is kept as the isolated form of what the churn test saw:
//
// SEEN (under load: load average 9 on 2 cores, other helpers' tests
// running): TestAttack3WaitReleasedDuringChurn's Resize failed with
// "administration mutex lost during the change: validity deadline passed
// without a renewal" while a Status loop ran on the administrator's client.
// The likely cause: the scan's publishes share the connection's socket
// (and amqp091's single writer) with the verifier's probes, which then
// miss the 1s validity. A false loss, not a safety breach.
func TestAttack3StatusStarvesVerify(t *testing.T) {
	url, _ := amqpURL(t)
	name := atkName("a3starve")
	atkCleanup(t, url, name)
	ctx, cancel := context.WithTimeout(context.Background(), 28*time.Second)
	defer cancel()
	c := atkDial(t, url, "")
	admin := atkAdmin(t, c)
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
