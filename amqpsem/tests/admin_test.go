package amqpsem_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/latchkey-go/latchkey/locks"

	"github.com/latchkey-go/latchkey/amqpsem"
)

func TestAdminLifecycle(t *testing.T) {
	u, _ := amqpURL(t)
	name := newName(t, u)
	ctx := tctx(t)
	c := dial(t, u)
	a := admin(t, c)
	r := rawConn(t, u)

	if err := a.Create(ctx, name, 3); err != nil {
		t.Fatalf("Create: %v", err)
	}
	checkSlots(t, r, name, 3)
	if n, err := a.Max(ctx, name); err != nil || n != 3 {
		t.Fatalf("Max = %d, %v; want 3", n, err)
	}
	if err := a.Create(ctx, name, 5); !errors.Is(err, amqpsem.ErrExists) {
		t.Errorf("Create of an existing semaphore = %v, want ErrExists", err)
	}
	if ch, err := a.Add(ctx, name, 2); err != nil || ch != (amqpsem.Change{Before: 3, After: 5}) {
		t.Fatalf("Add(2) = %+v, %v", ch, err)
	}
	checkSlots(t, r, name, 5)
	if ch, err := a.Remove(ctx, name, 1); err != nil || ch != (amqpsem.Change{Before: 5, After: 4}) {
		t.Fatalf("Remove(1) = %+v, %v", ch, err)
	}
	checkSlots(t, r, name, 4)
	if ch, err := a.Resize(ctx, name, 2); err != nil || ch.After != 2 {
		t.Fatalf("Resize(2) = %+v, %v", ch, err)
	}
	checkSlots(t, r, name, 2)
	if _, err := a.Remove(ctx, name, 3); !errors.Is(err, amqpsem.ErrInvalidSlots) {
		t.Errorf("Remove(3) of 2 slots = %v, want ErrInvalidSlots", err)
	}
	checkSlots(t, r, name, 2)
	if n, err := a.Destroy(ctx, name); err != nil || n != 2 {
		t.Fatalf("Destroy = %d, %v; want 2", n, err)
	}
	checkSlots(t, r, name, 0)
	if r.exists(name) {
		t.Errorf("the administration mutex %q outlived the change", name)
	}
}

// Removing a held slot leaves its holder in place until it lets go; its
// verification then fails, its lease ends with ErrLost, and it deletes its
// holder queue, which ends the administrator's wait.
func TestRemoveHeldSlot(t *testing.T) {
	u, _ := amqpURL(t)
	name := newName(t, u)
	ctx := longCtx(t)
	a := admin(t, dial(t, u))
	if err := a.Create(ctx, name, 2); err != nil {
		t.Fatal(err)
	}
	// A long heartbeat makes the holder's own verification rare (every
	// 30s, half the broker's 60s), so the test sees the removed slot still
	// held: its Status, a check of every slot number, took over 10s under
	// load here.
	holder := dial(t, u, amqpsem.WithHeartbeat(60*time.Second), amqpsem.WithVerifyInterval(30*time.Second))
	s := semaphore(t, holder, amqpsem.MaxSemaphoreSize)
	l1, err := s.TryAcquire(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	l2, err := s.TryAcquire(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	if ch, err := a.Remove(ctx, name, 1); err != nil || ch.After != 1 {
		t.Fatalf("Remove(1) = %+v, %v", ch, err)
	}
	st, err := a.Status(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	if st.Slots != 1 || len(st.Held) != 1 || st.Held[0] != 1 || len(st.Removed) != 1 || st.Removed[0] != 2 {
		t.Fatalf("Status after removing held slot 2 = %+v", st)
	}
	if l2.Context().Err() != nil {
		t.Fatalf("the removed slot's lease ended before verifying: %v", context.Cause(l2.Context()))
	}
	short, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	err = a.WaitReleased(short, name)
	cancel()
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("WaitReleased while slot 2 is held = %v, want DeadlineExceeded", err)
	}
	err = l2.(*amqpsem.Lease).Verify(ctx)
	if !errors.Is(err, locks.ErrLost) || !errors.Is(err, amqpsem.ErrSlotRemoved) {
		t.Fatalf("Verify of a removed slot = %v, want ErrLost and ErrSlotRemoved", err)
	}
	if cause := context.Cause(l2.Context()); !errors.Is(cause, locks.ErrLost) {
		t.Fatalf("cause = %v, want ErrLost", cause)
	}
	if err := a.WaitReleased(ctx, name); err != nil {
		t.Fatalf("WaitReleased after the holder let go: %v", err)
	}
	if err := l2.Release(ctx); !errors.Is(err, locks.ErrLost) {
		t.Errorf("Release of the lost lease = %v, want ErrLost", err)
	}
	if err := l1.(*amqpsem.Lease).Verify(ctx); err != nil {
		t.Errorf("the other slot's lease: %v", err)
	}
}

func TestOvershoot(t *testing.T) {
	u, _ := amqpURL(t)
	name := newName(t, u)
	ctx := tctx(t)
	c := dial(t, u)
	r := rawConn(t, u)
	if err := admin(t, c).Create(ctx, name, 2); err != nil {
		t.Fatal(err)
	}
	// Strays above a gap, as a failed ascending delete or a manual change
	// leaves them: the maximum does not see them.
	for _, i := range []int{4, 6} {
		if err := r.declare(amqpsem.DefaultLayout.Slot(name, i), true, false, maxLen0); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() {
		for i := 1; i <= 6; i++ {
			r.delete(amqpsem.DefaultLayout.Slot(name, i))
		}
	})
	if n, _ := admin(t, c).Max(ctx, name); n != 2 {
		t.Fatalf("Max with strays above a gap = %d, want 2", n)
	}
	// Without overshoot, adding one slot joins the stray at 4.
	plain := admin(t, c)
	if ch, err := plain.Add(ctx, name, 1); err != nil || ch.After != 3 {
		t.Fatalf("Add = %+v, %v", ch, err)
	}
	if n, _ := plain.Max(ctx, name); n != 4 {
		t.Fatalf("Max after Add without overshoot = %d, want 4 (the stray joined)", n)
	}
	over := admin(t, c, amqpsem.WithOvershoot(4))
	if ch, err := over.Add(ctx, name, 1); err != nil || ch != (amqpsem.Change{Before: 4, After: 5}) {
		t.Fatalf("Add with overshoot = %+v, %v", ch, err)
	}
	if !r.exists(amqpsem.DefaultLayout.Slot(name, 5)) || r.exists(amqpsem.DefaultLayout.Slot(name, 6)) {
		t.Fatalf("overshoot did not prune the stray at 6, or lost slot 5")
	}
	checkSlots(t, r, name, 5)
}

func TestAscendingDelete(t *testing.T) {
	u, _ := amqpURL(t)
	name := newName(t, u)
	ctx := tctx(t)
	c := dial(t, u)
	r := rawConn(t, u)
	a := admin(t, c, amqpsem.WithAscendingDelete(true))
	if err := a.Create(ctx, name, 5); err != nil {
		t.Fatal(err)
	}
	if ch, err := a.Remove(ctx, name, 2); err != nil || ch.After != 3 {
		t.Fatalf("Remove = %+v, %v", ch, err)
	}
	checkSlots(t, r, name, 3)
	if n, err := a.Destroy(ctx, name); err != nil || n != 3 {
		t.Fatalf("Destroy = %d, %v", n, err)
	}
	checkSlots(t, r, name, 0)
}

// Two administrators adding slots at once are serialised by the mutex:
// no addition is lost.
func TestAdminsSerialised(t *testing.T) {
	u, _ := amqpURL(t)
	name := newName(t, u)
	ctx := tctx(t)
	const admins, adds = 3, 5
	var wg sync.WaitGroup
	for range admins {
		a := admin(t, dial(t, u))
		wg.Go(func() {
			for range adds {
				if _, err := a.Add(ctx, name, 1); err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	n, err := admin(t, dial(t, u)).Max(ctx, name)
	if err != nil || n != admins*adds {
		t.Fatalf("Max after %d concurrent additions = %d, %v", admins*adds, n, err)
	}
	checkSlots(t, rawConn(t, u), name, admins*adds)
}

// TestMutexIsSemaphoreAdminMutex: a Mutex on N is semaphore N's
// administration mutex: while it is held, administration of N waits.
func TestMutexIsSemaphoreAdminMutex(t *testing.T) {
	u, _ := amqpURL(t)
	name := newName(t, u)
	ctx := tctx(t)
	m := dial(t, u).Locker()
	held, err := m.TryLock(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	a := admin(t, dial(t, u))
	short, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
	err = a.Create(short, name, 2)
	cancel()
	if err == nil {
		t.Fatal("Create of semaphore N succeeded while the Mutex on N was held")
	}
	if err := held.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if err := a.Create(ctx, name, 2); err != nil {
		t.Fatalf("Create after the Mutex on N was released: %v", err)
	}
}

// deletions consumes A[1..n] of name on a connection of its own, each
// with its slot number as consumer tag, and returns a function that
// waits for want cancel notifications (the broker cancels a consumer when
// its queue is deleted) and returns the slots in the order their queues
// were deleted.
func deletions(t *testing.T, u, name string, n int) func(want int) []int {
	t.Helper()
	r := rawConn(t, u)
	ch, err := r.conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	cancels := ch.NotifyCancel(make(chan string, n))
	for i := 1; i <= n; i++ {
		if _, err := ch.Consume(amqpsem.DefaultLayout.Slot(name, i), strconv.Itoa(i), true, false, false, false, nil); err != nil {
			t.Fatal(err)
		}
	}
	return func(want int) []int {
		t.Helper()
		var got []int
		timeout := time.After(10 * time.Second)
		for len(got) < want {
			select {
			case tag := <-cancels:
				i, _ := strconv.Atoi(tag)
				got = append(got, i)
			case <-timeout:
				t.Fatalf("%d deletions seen in 10s, want %d: %v", len(got), want, got)
			}
		}
		select {
		case tag := <-cancels:
			t.Fatalf("a slot deleted beyond the %d expected: %s (after %v)", want, tag, got)
		case <-time.After(200 * time.Millisecond):
		}
		return got
	}
}

// Remove and Destroy delete slot queues in descending order, each delete
// waiting for its delete-ok; WithAscendingDelete ("Swiss cheese")
// deletes them in ascending order. The order is the one the broker
// cancelled the queues' consumers in.
func TestDeleteOrder(t *testing.T) {
	u, _ := amqpURL(t)
	ctx := tctx(t)
	c := dial(t, u)
	for _, tc := range []struct {
		ascending       bool
		remove, destroy []int
	}{
		{false, []int{6, 5, 4}, []int{3, 2, 1}},
		{true, []int{4, 5, 6}, []int{1, 2, 3}},
	} {
		name := newName(t, u)
		a := admin(t, c, amqpsem.WithAscendingDelete(tc.ascending))
		if err := a.Create(ctx, name, 6); err != nil {
			t.Fatal(err)
		}
		deleted := deletions(t, u, name, 6)
		if ch, err := a.Remove(ctx, name, 3); err != nil || ch != (amqpsem.Change{Before: 6, After: 3}) {
			t.Fatalf("Remove(3) = %+v, %v", ch, err)
		}
		if got := deleted(3); !slices.Equal(got, tc.remove) {
			t.Errorf("ascending=%v: Remove(3) of 6 deleted slots in the order %v, want %v", tc.ascending, got, tc.remove)
		}
		if n, err := a.Destroy(ctx, name); err != nil || n != 3 {
			t.Fatalf("Destroy = %d, %v", n, err)
		}
		if got := deleted(3); !slices.Equal(got, tc.destroy) {
			t.Errorf("ascending=%v: Destroy of 3 deleted slots in the order %v, want %v", tc.ascending, got, tc.destroy)
		}
	}
}

// Remove of more slots than there are is refused and changes nothing,
// where the specification clamps to 0 (a documented deviation); Resize
// to 0 and Destroy remove them all.
func TestRemoveMoreThanThereAreRefused(t *testing.T) {
	u, _ := amqpURL(t)
	name := newName(t, u)
	ctx := tctx(t)
	a := admin(t, dial(t, u))
	r := rawConn(t, u)
	if err := a.Create(ctx, name, 3); err != nil {
		t.Fatal(err)
	}
	if ch, err := a.Remove(ctx, name, 4); !errors.Is(err, amqpsem.ErrInvalidSlots) || ch.After != 3 {
		t.Fatalf("Remove(4) of 3 = %+v, %v; want ErrInvalidSlots and no change", ch, err)
	}
	checkSlots(t, r, name, 3)
	if ch, err := a.Resize(ctx, name, 0); err != nil || ch != (amqpsem.Change{Before: 3, After: 0}) {
		t.Fatalf("Resize(0) = %+v, %v", ch, err)
	}
	checkSlots(t, r, name, 0)
}

// TestConcurrentRelativeResizesAllApplied: two library administrators and the
// command change one semaphore by relative amounts at once. Changes are
// "serialised at the broker by its mutex, across clients": the result must
// be the initial size plus every change, with no slot queue left above it.
func TestConcurrentRelativeResizesAllApplied(t *testing.T) {
	url, _ := amqpURL(t)
	name := newName(t, url)
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Second)
	defer cancel()
	a1 := admin(t, dial(t, url))
	a2 := admin(t, dial(t, url), amqpsem.WithAscendingDelete(true))
	if err := a1.Create(ctx, name, 20); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	total := 20
	var errs []error
	note := func(d int, err error) {
		mu.Lock()
		defer mu.Unlock()
		if err != nil {
			errs = append(errs, err)
			return
		}
		total += d
	}
	for i := range 6 {
		wg.Go(func() {
			_, err := a1.Add(ctx, name, 3)
			note(3, err)
		})
		wg.Go(func() {
			_, err := a2.Remove(ctx, name, 2)
			note(-2, err)
		})
		if i%2 == 0 {
			wg.Go(func() {
				out, code := runCommand(t, 30*time.Second, []string{"AMQPSEM_URL=" + url}, "resize", name, "-1")
				if code != 0 {
					note(0, fmt.Errorf("command: %d %s", code, out))
				} else {
					note(-1, nil)
				}
			})
		}
	}
	wg.Wait()
	if len(errs) > 0 {
		t.Fatalf("changes failed: %v", errs)
	}
	got, err := a1.Max(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	if got != total {
		t.Errorf("after concurrent relative changes Max = %d, want %d", got, total)
	}
	raw := rawConn(t, url)
	for i := got + 1; i <= got+25; i++ {
		if st := raw.state(fmt.Sprintf("%s-%d-A", name, i)); st != "absent" {
			t.Errorf("slot queue %d above the maximum %d is %s", i, got, st)
		}
	}
}

// TestResizeUnderMixedClientsKeepsSlotsExclusive: four clients of one name with different
// heartbeats, verify intervals and Semaphore sizes churn for 6s while an
// administrator resizes the semaphore 3 -> 5 -> 2 -> 4 -> 3. Checks: no
// two leases on one slot overlap (a lease whose slot was removed ends
// before anyone takes the slot again), a Semaphore never holds a slot
// above its size, live leases never exceed the largest C (5), and at the
// end nothing is held.
func TestResizeUnderMixedClientsKeepsSlotsExclusive(t *testing.T) {
	url, _ := amqpURL(t)
	name := newName(t, url)
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
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	adminClient := dial(t, url)
	admin := admin(t, adminClient)
	if err := admin.Create(ctx, name, 3); err != nil {
		t.Fatal(err)
	}
	rec := newLeaseHistory(5) // the largest C
	var acquires, failures, aboveSize atomic.Int64
	stop := time.Now().Add(6 * time.Second)
	var wg sync.WaitGroup
	for i, sp := range specs {
		opts := []amqpsem.Option{amqpsem.WithHeartbeat(sp.hb)}
		if sp.verify > 0 {
			opts = append(opts, amqpsem.WithVerifyInterval(sp.verify))
		}
		c := dial(t, url, opts...)
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
					ended := rec.enter(who, l)
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
	rec.check(t)
	most := rec.all.Peak()
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
		rec.all.Len(), acquires.Load(), failures.Load(), most, st.Slots)
	if acquires.Load() < 20 {
		t.Errorf("only %d acquires in 6s: no liveness", acquires.Load())
	}
}

// TestBatchedVerifyEndsOnlyRemovedSlots: one client holds the four slots
// of a semaphore (its leases verified together in one batched round every
// 100ms) and an administrator removes slots 3 and 4. Checks: the leases
// on slots 3 and 4 end with ErrLost and ErrSlotRemoved within a second,
// their holder queues are deleted without Release, and the leases on
// slots 1 and 2, verified in the same rounds, stay live.
func TestBatchedVerifyEndsOnlyRemovedSlots(t *testing.T) {
	url, _ := amqpURL(t)
	name := newName(t, url)
	ctx, cancel := context.WithTimeout(context.Background(), 25*time.Second)
	defer cancel()
	c := dial(t, url, amqpsem.WithVerifyInterval(100*time.Millisecond))
	admin := admin(t, dial(t, url))
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
	raw := rawConn(t, url)
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
