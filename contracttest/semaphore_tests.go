package contracttest

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/latchkey-go/latchkey/locks"
)

const semSize = 3

// testSemaphoreLimit: N clients hold a slot at once; the next TryAcquire
// fails with ErrNotAcquired; an Acquire waits and gets a slot after a
// release.
func testSemaphoreLimit(t testing.TB, nh NewHarness) {
	e := newEnv(t, nh)
	defer e.close()
	name := e.name()
	held := e.fillSemaphore(name)
	slots := map[int]bool{}
	for _, lease := range held {
		if sl, ok := lease.(locks.SlotLease); ok {
			if n := sl.Slot(); n < 1 || n > semSize || slots[n] {
				t.Errorf("slot %d: out of 1..%d or given twice", n, semSize)
			}
			slots[sl.Slot()] = true
		}
	}
	if len(slots) != len(held) {
		t.Errorf("%d of %d semaphore leases are locks.SlotLeases: every lease must say its slot", len(slots), len(held))
	}
	extra := e.newClientSemaphore(semSize)
	ctx, cancel := e.opCtx()
	defer cancel()
	if lease, err := extra.TryAcquire(ctx, name); !errors.Is(err, locks.ErrNotAcquired) {
		if err == nil {
			_ = lease.Release(ctx)
		}
		t.Fatalf("TryAcquire with all %d slots held = %v, want locks.ErrNotAcquired", semSize, err)
	}

	got := make(chan locks.Lease, 1)
	errc := make(chan error, 1)
	go func() {
		lease, err := extra.Acquire(ctx, name)
		if err != nil {
			errc <- err
			return
		}
		got <- lease
	}()
	select {
	case lease := <-got:
		_ = lease.Release(ctx)
		t.Fatalf("Acquire returned with all %d slots held", semSize)
	case err := <-errc:
		t.Fatalf("waiting Acquire: %v", err)
	case <-time.After(200 * time.Millisecond):
	}
	e.mustRelease(held[1])
	select {
	case lease := <-got:
		e.mustRelease(lease)
	case err := <-errc:
		t.Fatalf("waiting Acquire after a release: %v", err)
	case <-ctx.Done():
		t.Fatalf("waiting Acquire did not get the freed slot within %v", opTimeout)
	}
	e.mustRelease(held[0])
	e.mustRelease(held[2])
}

// semSectionFor is how long each critical section of SemaphoreExclusion
// lasts: long next to a broker's round trips, so that contenders are
// mostly inside their sections, where a semaphore that admits too many
// lets them overlap.
const semSectionFor = 20 * time.Millisecond

// testSemaphoreExclusion: more clients than slots take turns; never more
// than N hold at once, and more than one do hold at once at some point.
func testSemaphoreExclusion(t testing.TB, nh NewHarness) {
	e := newEnv(t, nh)
	defer e.close()
	h := NewHistory(semSize)
	race(e, e.name(), semSectionFor, h, nil, func(int) func(context.Context, string) (locks.Lease, error) {
		return e.newClientSemaphore(semSize).Acquire
	})
	if err := h.Check(); err != nil {
		t.Fatalf("semaphore limit broken: %v", err)
	}
	if h.Peak() < 2 {
		t.Errorf("at most %d of %d contenders held a slot at once; a semaphore of %d should admit more", h.Peak(), contenders, semSize)
	}
}

// testSemaphoreCancellation: an Acquire whose context ends while every
// slot is held returns ctx's error and holds nothing; so does an Acquire
// with a context already cancelled, even with a slot free. Afterwards all
// N slots can still be taken.
func testSemaphoreCancellation(t testing.TB, nh NewHarness) {
	e := newEnv(t, nh)
	defer e.close()
	name := e.name()
	held := e.fillSemaphore(name)
	waiter := e.newClientSemaphore(semSize)
	acquire := func(ctx context.Context) (locks.Lease, error) { return waiter.Acquire(ctx, name) }

	e.expectEndsWithContext("Acquire", "got a slot from Acquire while every slot was held", acquire)
	e.mustRelease(held[0])
	e.expectCancelledFails("Acquire", acquire)
	for _, lease := range held[1:] {
		e.mustRelease(lease)
	}

	// Nothing of the cancelled calls may stay held: N slots are free.
	held = held[:0]
	for i := range semSize {
		ctx, cancel := e.opCtx()
		lease, err := e.newClientSemaphore(semSize).TryAcquire(ctx, name)
		cancel()
		if err != nil {
			t.Errorf("after the cancelled Acquires and every release, TryAcquire #%d of %d slots: %v", i+1, semSize, err)
			break
		}
		held = append(held, lease)
	}
	for _, lease := range held {
		e.mustRelease(lease)
	}
}

// testSemaphoreSizes: a Semaphore of the backend's largest size is made,
// and sizes 0 and one past it are refused with ErrInvalidOption.
func testSemaphoreSizes(t testing.TB, nh NewHarness) {
	e := newEnv(t, nh)
	defer e.close()
	if !e.caps.Semaphore {
		t.Skip("the backend has no semaphores")
	}
	c := e.newClient()
	bad := []int{0, -1}
	if max := e.caps.MaxSemaphoreSize; max > 0 {
		if _, err := c.Semaphore(e.ctx, max); err != nil {
			t.Errorf("Semaphore(%d), the stated largest size: %v", max, err)
		}
		bad = append(bad, max+1)
	} else {
		e.skippedPart("the largest size", "Capabilities.MaxSemaphoreSize is 0 (no cap stated)")
	}
	for _, size := range bad {
		if _, err := c.Semaphore(e.ctx, size); !errors.Is(err, locks.ErrInvalidOption) {
			t.Errorf("Semaphore(%d) = %v, want an error matching locks.ErrInvalidOption", size, err)
		}
	}
}
