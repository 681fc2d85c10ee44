package amqpsem_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/latchkey-go/latchkey/locks"
	"github.com/latchkey-go/latchkey/locks/driver"

	"github.com/latchkey-go/latchkey/amqpsem"
)

// TestSemaphoreSizeCapsSlots: a Semaphore's size caps the slots it takes
// (the stored count stays the broker's): Semaphore(2) of a 3-slot
// semaphore takes slots 1 and 2, then finds every slot it may take held,
// while a Semaphore of MaxSemaphoreSize takes slot 3. WithCreate never
// resizes an existing semaphore.
func TestSemaphoreSizeCapsSlots(t *testing.T) {
	u, _ := amqpURL(t)
	name := uniqueName(t, u)
	ctx := tctx(t)
	r := rawConn(t, u)
	if err := admin(t, dial(t, u)).Create(ctx, name, 3); err != nil {
		t.Fatal(err)
	}
	small := semaphore(t, dial(t, u, amqpsem.WithCreate(true)), 2)
	for want := 1; want <= 2; want++ {
		l, err := small.TryAcquire(ctx, name)
		if err != nil {
			t.Fatalf("TryAcquire %d of Semaphore(2): %v", want, err)
		}
		if got := l.(*amqpsem.Lease).Slot(); got != want {
			t.Errorf("Semaphore(2) took slot %d, want %d", got, want)
		}
	}
	if l, err := small.TryAcquire(ctx, name); !errors.Is(err, amqpsem.ErrAllHeld) {
		if err == nil {
			t.Errorf("Semaphore(2) took slot %d of 3 with slots 1 and 2 held", l.(*amqpsem.Lease).Slot())
		} else {
			t.Errorf("third TryAcquire of Semaphore(2) = %v, want ErrAllHeld", err)
		}
	}
	checkSlots(t, r, name, 3)
	l, err := semaphore(t, dial(t, u), amqpsem.MaxSemaphoreSize).TryAcquire(ctx, name)
	if err != nil {
		t.Fatalf("TryAcquire of Semaphore(MaxSemaphoreSize) with slot 3 free: %v", err)
	}
	if got := l.(*amqpsem.Lease).Slot(); got != 3 {
		t.Errorf("Semaphore(MaxSemaphoreSize) took slot %d, want 3", got)
	}
	for _, size := range []int{0, -1, amqpsem.MaxSemaphoreSize + 1} {
		if _, err := dial(t, u).Semaphore(size); !errors.Is(err, locks.ErrInvalidOption) {
			t.Errorf("Semaphore(%d) = %v, want ErrInvalidOption", size, err)
		}
	}
}

// TestCloseEndsLeasesAndWaiters: Close(ctx) ends every lease with a cause
// matching ErrLost and ErrClosed and deletes its queue, makes a waiting
// Lock return an error matching ErrClosed, makes later calls fail with
// ErrClosed, and returns nil when called again.
func TestCloseEndsLeasesAndWaiters(t *testing.T) {
	u, _ := amqpURL(t)
	name := uniqueName(t, u)
	ctx := tctx(t)
	r := rawConn(t, u)
	c, err := amqpsem.Dial(ctx, u, testOptions()...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close(context.Background()) })
	lease, err := c.Locker().TryLock(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	other := dial(t, u).Locker()
	held, err := other.TryLock(ctx, name+"-other")
	if err != nil {
		t.Fatal(err)
	}
	defer held.Release(ctx)
	waiting := make(chan error, 1)
	go func() {
		_, err := c.Locker().Lock(ctx, name+"-other")
		waiting <- err
	}()
	time.Sleep(200 * time.Millisecond) // let it wait
	if err := c.Close(ctx); err != nil {
		t.Fatalf("Close: %v", err)
	}
	cause := context.Cause(lease.Context())
	if !errors.Is(cause, locks.ErrLost) || !errors.Is(cause, locks.ErrClosed) {
		t.Errorf("lease cause after Close = %v, want ErrLost and ErrClosed", cause)
	}
	if r.exists(name) {
		t.Errorf("queue %q still exists after Close", name)
	}
	select {
	case err := <-waiting:
		if !errors.Is(err, locks.ErrClosed) {
			t.Errorf("waiting Lock after Close = %v, want ErrClosed", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("a waiting Lock still waits 5s after Close")
	}
	if _, err := c.Locker().TryLock(ctx, name); !errors.Is(err, locks.ErrClosed) {
		t.Errorf("TryLock after Close = %v, want ErrClosed", err)
	}
	if err := c.Close(ctx); err != nil {
		t.Errorf("second Close = %v, want nil", err)
	}
}

// TestCloseBoundedByContext: Close with a context that has ended returns
// an error matching it at once; the connection goes all the same.
func TestCloseBoundedByContext(t *testing.T) {
	u, _ := amqpURL(t)
	name := uniqueName(t, u)
	ctx := tctx(t)
	c, err := amqpsem.Dial(ctx, u, testOptions()...)
	if err != nil {
		t.Fatal(err)
	}
	lease, err := c.Locker().TryLock(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	ended, cancel := context.WithCancel(ctx)
	cancel()
	start := time.Now()
	err = c.Close(ended)
	if !errors.Is(err, context.Canceled) {
		t.Errorf("Close(ended ctx) = %v, want context.Canceled", err)
	}
	if d := time.Since(start); d > time.Second {
		t.Errorf("Close(ended ctx) took %v", d)
	}
	if !errors.Is(context.Cause(lease.Context()), locks.ErrClosed) {
		t.Errorf("lease cause = %v, want ErrClosed", context.Cause(lease.Context()))
	}
	// The broker frees the queue once the socket is gone.
	l, err := dial(t, u).Locker().Lock(ctx, name)
	if err != nil {
		t.Fatalf("Lock after the closed client's socket went: %v", err)
	}
	_ = l.Release(ctx)
}

// TestVerifyFailedEvent: a verification that finds a lease's slot
// removed reports EventVerifyFailed to the Semaphore's observers.
func TestVerifyFailedEvent(t *testing.T) {
	u, _ := amqpURL(t)
	name := uniqueName(t, u)
	ctx := tctx(t)
	a := admin(t, dial(t, u))
	if err := a.Create(ctx, name, 1); err != nil {
		t.Fatal(err)
	}
	s := semaphore(t, dial(t, u), amqpsem.MaxSemaphoreSize)
	var (
		mu     sync.Mutex
		events []driver.Event
	)
	stop := s.Observe(func(e driver.Event) {
		if e.Kind == driver.EventVerifyFailed {
			mu.Lock()
			events = append(events, e)
			mu.Unlock()
		}
	})
	defer stop()
	l, err := s.TryAcquire(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := a.Destroy(ctx, name); err != nil {
		t.Fatal(err)
	}
	select {
	case <-l.Context().Done():
	case <-time.After(5 * time.Second):
		t.Fatal("the lease of a destroyed semaphore lives on 5s later")
	}
	if cause := context.Cause(l.Context()); !errors.Is(cause, amqpsem.ErrSlotRemoved) {
		t.Errorf("cause = %v, want ErrSlotRemoved", cause)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(events) != 1 || events[0].Name != name || !errors.Is(events[0].Err, amqpsem.ErrSlotRemoved) {
		t.Errorf("EventVerifyFailed events = %+v, want one for %q with ErrSlotRemoved", events, name)
	}
	if err := a.WaitReleased(ctx, name); err != nil {
		t.Errorf("WaitReleased after the holder let go: %v", err)
	}
}
