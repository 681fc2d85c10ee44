package amqpsem_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/latchkey-go/latchkey/locks"

	"github.com/latchkey-go/latchkey/amqpsem"
)

func TestAdminLifecycle(t *testing.T) {
	u, _ := amqpURL(t)
	name := uniqueName(t, u)
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
	name := uniqueName(t, u)
	ctx := tctx(t)
	a := admin(t, dial(t, u))
	if err := a.Create(ctx, name, 2); err != nil {
		t.Fatal(err)
	}
	// A long heartbeat makes the holder's own verification rare, so the
	// test sees the removed slot still held.
	holder := dial(t, u, amqpsem.WithHeartbeat(20*time.Second), amqpsem.WithVerifyInterval(10*time.Second))
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
	name := uniqueName(t, u)
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
	name := uniqueName(t, u)
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
	name := uniqueName(t, u)
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

// TestWithCreate: a Semaphore made WithCreate(n) creates a missing
// semaphore of n slots on its first acquire (and takes slot 1); an
// existing semaphore keeps its size; without WithCreate an acquire of a
// missing semaphore fails with ErrNoSlots and creates nothing.
func TestWithCreate(t *testing.T) {
	u, _ := amqpURL(t)
	ctx := tctx(t)
	c := dial(t, u)
	r := rawConn(t, u)

	missing := uniqueName(t, u)
	if _, err := semaphore(t, c, amqpsem.MaxSemaphoreSize).TryAcquire(ctx, missing); !errors.Is(err, amqpsem.ErrNoSlots) {
		t.Fatalf("TryAcquire without WithCreate of a missing semaphore = %v, want ErrNoSlots", err)
	}
	checkSlots(t, r, missing, 0)

	name := uniqueName(t, u)
	s := semaphore(t, dial(t, u, amqpsem.WithCreate(true)), 2)
	l, err := s.TryAcquire(ctx, name)
	if err != nil {
		t.Fatalf("TryAcquire WithCreate(2) of a missing semaphore: %v", err)
	}
	if slot := l.(*amqpsem.Lease).Slot(); slot != 1 {
		t.Errorf("the creating acquire got slot %d, want 1", slot)
	}
	checkSlots(t, r, name, 2)
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}

	// Another client asking for 3 finds the semaphore and leaves its size.
	if l, err = semaphore(t, dial(t, u, amqpsem.WithCreate(true)), 3).TryAcquire(ctx, name); err != nil {
		t.Fatalf("TryAcquire WithCreate(3) of the 2-slot semaphore: %v", err)
	}
	checkSlots(t, r, name, 2)
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
}
