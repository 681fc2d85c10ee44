package amqpsem_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/latchkey-go/latchkey/locks"

	"github.com/latchkey-go/latchkey/amqpsem"
)

// Tests of what operators rely on (issue 18): that status and wait see
// every held removed slot, that one name is one layout's semaphore, that
// acquiring a semaphore that does not exist fails at once, and long
// names.

// pythonName returns a unique name for a Python-layout semaphore of at
// most n slots, padded to length bytes when length > 0, whose queues are
// deleted at cleanup.
func pythonName(t *testing.T, r *raw, length, n int) string {
	t.Helper()
	var b [4]byte
	_, _ = rand.Read(b[:])
	name := "amqpsem-py-" + hex.EncodeToString(b[:])
	if length > 0 {
		name += strings.Repeat("p", length-len(name))
	}
	t.Cleanup(func() {
		for i := 1; i <= n; i++ {
			if q := amqpsem.PythonLayout.Slot(name, i); len(q) <= 255 {
				r.delete(q)
			}
		}
	})
	return name
}

// longCtx is a test context for tests that check every slot number, a
// few seconds each under -race on a loaded machine.
func longCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// holdQueue declares q exclusive on r's connection, as a client holding
// it does (the Python client and this package alike).
func holdQueue(t *testing.T, r *raw, q string) {
	t.Helper()
	if err := r.declare(q, false, true, maxLen0); err != nil {
		t.Fatalf("holding %q: %v", q, err)
	}
}

// Status and WaitReleased find a held removed slot whatever its number:
// slot 80 of a semaphore resized from 100 to 5 (the old default looked
// 64 slots above the new maximum only), and the last slot there can be.
// WaitReleased must not return nil while one is held.
func TestStatusAndWaitSeeEveryRemovedSlot(t *testing.T) {
	u, _ := amqpURL(t)
	name := uniqueName(t, u)
	ctx := longCtx(t)
	a := admin(t, dial(t, u))
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
	if err := a.WaitReleased(ctx, name); err != nil {
		t.Fatalf("WaitReleased once every removed slot is free: %v", err)
	}
	t.Logf("WaitReleased with none held took %v", time.Since(start).Round(time.Millisecond))
}

// WaitReleased polls the held slots it found and returns once their
// holders let go, after checking every slot again.
func TestWaitReleasedEndsWhenHolderLetsGo(t *testing.T) {
	u, _ := amqpURL(t)
	name := uniqueName(t, u)
	ctx := longCtx(t)
	a := admin(t, dial(t, u))
	if err := a.Create(ctx, name, 3); err != nil {
		t.Fatal(err)
	}
	holders := rawConn(t, u)
	q := amqpsem.DefaultLayout.Holder(name, 200)
	holdQueue(t, holders, q)
	if _, err := a.Destroy(ctx, name); err != nil {
		t.Fatal(err)
	}
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
	case <-time.After(30 * time.Second):
		t.Fatal("WaitReleased still waiting 30s after the holder let go")
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
	name := uniqueName(t, u)
	ctx := longCtx(t)
	a := admin(t, dial(t, u))
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
		other, err := admin(t, dial(t, u)).Add(tctx(t), name, 1)
		if err != nil {
			t.Fatalf("Add by another admin after the cancelled wait: %v", err)
		}
		n, err := a.Max(tctx(t), name)
		if err != nil || n != other.After {
			t.Fatalf("Max on the cancelled wait's client = %d, %v, want %d", n, err, other.After)
		}
	}
}

// One name, one layout: a create, add, resize or WithCreate of a name
// that has slot queues in the other layout is refused with
// ErrOtherLayout and creates nothing, both ways; Status says which
// layout a name is in.
func TestOneLayoutPerName(t *testing.T) {
	u, _ := amqpURL(t)
	needTransient(t, u)
	ctx := tctx(t)
	c := dial(t, u)
	r := rawConn(t, u)
	def := admin(t, c)
	py := admin(t, c, amqpsem.WithLayout(amqpsem.PythonLayout))

	name := pythonName(t, r, 0, 3)
	if err := py.Create(ctx, name, 2); err != nil {
		t.Fatal(err)
	}
	refused := func(what string, err error) {
		t.Helper()
		if !errors.Is(err, amqpsem.ErrOtherLayout) {
			t.Errorf("%s of a Python-layout semaphore in the default layout = %v, want ErrOtherLayout", what, err)
		}
	}
	refused("Create", def.Create(ctx, name, 3))
	_, err := def.Add(ctx, name, 1)
	refused("Add", err)
	_, err = def.Resize(ctx, name, 3)
	refused("Resize", err)
	_, err = semaphore(t, dial(t, u, amqpsem.WithCreate(true)), 3).TryAcquire(ctx, name)
	refused("TryAcquire WithCreate", err)
	if q := amqpsem.DefaultLayout.Slot(name, 1); r.exists(q) {
		t.Fatalf("a refused change created %q", q)
	}
	_, err = semaphore(t, c, amqpsem.MaxSemaphoreSize).TryAcquire(ctx, name)
	if !errors.Is(err, amqpsem.ErrNoSlots) || !strings.Contains(err.Error(), "python") {
		t.Errorf("TryAcquire in the default layout of a Python-layout semaphore = %v, want ErrNoSlots naming the python layout", err)
	}
	st, err := def.Status(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	if st.Layout != "default" || st.Slots != 0 || len(st.OtherLayouts) != 1 || !strings.HasPrefix(st.OtherLayouts[0], "python") {
		t.Errorf("default-layout Status of a Python-layout semaphore = %+v", st)
	}
	if st, err := py.Status(ctx, name); err != nil || st.Layout != "python" || st.Slots != 2 || len(st.OtherLayouts) != 0 {
		t.Errorf("python-layout Status = %+v, %v", st, err)
	}
	// Destroying in the wrong layout removes nothing.
	if n, err := def.Destroy(ctx, name); err != nil || n != 0 {
		t.Errorf("default-layout Destroy of a Python-layout semaphore = %d, %v", n, err)
	}

	// And the other way round.
	other := uniqueName(t, u)
	if err := def.Create(ctx, other, 2); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		for i := 1; i <= 3; i++ {
			if q := amqpsem.PythonLayout.Slot(other, i); r.exists(q) {
				r.delete(q)
			}
		}
	})
	if err := py.Create(ctx, other, 3); !errors.Is(err, amqpsem.ErrOtherLayout) {
		t.Errorf("Python-layout Create of a default-layout semaphore = %v, want ErrOtherLayout", err)
	}
	if q := amqpsem.PythonLayout.Slot(other, 1); r.exists(q) {
		t.Fatalf("a refused change created %q", q)
	}
	// Resizing within its own layout goes on.
	if ch, err := def.Resize(ctx, other, 3); err != nil || ch.After != 3 {
		t.Errorf("Resize in the semaphore's own layout = %+v, %v", ch, err)
	}
}

// Acquire of a semaphore that has no slots fails at once with ErrNoSlots
// (not ErrNotAcquired) instead of waiting for its context; so does a
// waiting Acquire when the semaphore is destroyed. WithCreate creates it.
func TestAcquireWithoutSlotsFailsAtOnce(t *testing.T) {
	u, _ := amqpURL(t)
	ctx := tctx(t)
	c := dial(t, u)
	s := semaphore(t, c, amqpsem.MaxSemaphoreSize)

	missing := uniqueName(t, u)
	wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	start := time.Now()
	_, err := s.Acquire(wctx, missing)
	if !errors.Is(err, amqpsem.ErrNoSlots) || errors.Is(err, locks.ErrNotAcquired) || time.Since(start) > 5*time.Second {
		t.Fatalf("Acquire of a missing semaphore = %v after %v; want ErrNoSlots (not ErrNotAcquired) at once", err, time.Since(start))
	}
	if _, err := s.TryAcquire(ctx, missing); !errors.Is(err, amqpsem.ErrNoSlots) || errors.Is(err, locks.ErrNotAcquired) {
		t.Fatalf("TryAcquire of a missing semaphore = %v; want ErrNoSlots, not ErrNotAcquired", err)
	}

	// A waiter of a semaphore destroyed under it stops waiting.
	name := uniqueName(t, u)
	a := admin(t, c)
	if err := a.Create(ctx, name, 1); err != nil {
		t.Fatal(err)
	}
	held, err := semaphore(t, dial(t, u), amqpsem.MaxSemaphoreSize).TryAcquire(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	defer held.Release(ctx)
	done := make(chan error, 1)
	go func() {
		l, err := s.Acquire(wctx, name)
		if err == nil {
			_ = l.Release(ctx)
		}
		done <- err
	}()
	time.Sleep(300 * time.Millisecond)
	if _, err := a.Destroy(ctx, name); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		if !errors.Is(err, amqpsem.ErrNoSlots) {
			t.Fatalf("waiting Acquire of a destroyed semaphore = %v, want ErrNoSlots", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("a waiting Acquire still waits 5s after its semaphore was destroyed")
	}

	created := uniqueName(t, u)
	l, err := semaphore(t, dial(t, u, amqpsem.WithCreate(true)), 1).Acquire(wctx, created)
	if err != nil {
		t.Fatalf("Acquire WithCreate of a missing semaphore: %v", err)
	}
	_ = l.Release(ctx)
}

// Names of 248 to 251 bytes in the Python layout, which the Python client
// uses, are accepted with as many slots as their queue names allow; a
// name whose first slot queue would be too long is refused.
func TestLongPythonNames(t *testing.T) {
	u, _ := amqpURL(t)
	needTransient(t, u)
	ctx := tctx(t)
	r := rawConn(t, u)
	c := dial(t, u, amqpsem.WithLayout(amqpsem.PythonLayout))
	py := admin(t, c)
	for _, tc := range []struct{ length, limit int }{{248, 9999}, {249, 999}, {250, 99}, {251, 9}} {
		name := pythonName(t, r, tc.length, 3)
		if got := amqpsem.PythonLayout.SlotLimit(name); got != tc.limit {
			t.Errorf("SlotLimit of a %d-byte name = %d, want %d", tc.length, got, tc.limit)
		}
		if err := py.Create(ctx, name, 3); err != nil {
			t.Errorf("Create of a %d-byte Python-layout name: %v", tc.length, err)
			continue
		}
		l, err := semaphore(t, c, amqpsem.MaxSemaphoreSize).TryAcquire(ctx, name)
		if err != nil {
			t.Errorf("TryAcquire of a %d-byte name: %v", tc.length, err)
			continue
		}
		if st, err := py.Status(ctx, name); err != nil || st.Slots != 3 || !slices.Equal(st.Held, []int{1}) {
			t.Errorf("Status of a %d-byte name = %+v, %v", tc.length, st, err)
		}
		_ = l.Release(ctx)
	}
	long := pythonName(t, r, 251, 10)
	if _, err := py.Resize(ctx, long, 10); !errors.Is(err, amqpsem.ErrInvalidSlots) {
		t.Errorf("10 slots on a 251-byte Python-layout name = %v, want ErrInvalidSlots", err)
	}
	if q := amqpsem.PythonLayout.Slot(long, 1); r.exists(q) {
		t.Errorf("a refused resize created %q", q)
	}
	tooLong := strings.Repeat("p", 252)
	if err := py.Create(ctx, tooLong, 1); !errors.Is(err, locks.ErrInvalidName) {
		t.Errorf("Create of a 252-byte Python-layout name (its slot queue would be 256 bytes) = %v, want ErrInvalidName", err)
	}
}
