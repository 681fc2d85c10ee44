package memlock_test

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/latchkey-go/latchkey/locks"
	"github.com/latchkey-go/latchkey/locks/driver"
	"github.com/latchkey-go/latchkey/locks/memlock"
)

// The full contract is proven by contracttest (TestMemlock there); these
// tests cover what is memlock's own: Expire, Revoke, Kill and bad input.

func newLocker(t *testing.T, s *memlock.Store, opts ...memlock.Option) *memlock.Client {
	t.Helper()
	c, err := s.NewClient(append([]memlock.Option{memlock.WithTTL(200 * time.Millisecond)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close(context.Background()) })
	return c
}

func TestExpireIsNoticedAtRenewal(t *testing.T) {
	s := memlock.New()
	a, b := newLocker(t, s), newLocker(t, s)
	ctx := context.Background()
	lease, err := a.Locker().TryLock(ctx, "job")
	if err != nil {
		t.Fatal(err)
	}
	s.Expire("job")
	next, err := b.Locker().TryLock(ctx, "job")
	if err != nil {
		t.Fatalf("TryLock after Expire: %v", err)
	}
	defer next.Release(ctx)
	select {
	case <-lease.Context().Done():
	case <-time.After(5 * time.Second):
		t.Fatal("the expired holder never noticed")
	}
	if cause := context.Cause(lease.Context()); !errors.Is(cause, locks.ErrLost) {
		t.Fatalf("cause = %v", cause)
	}
	if next.Token() <= lease.Token() {
		t.Fatalf("tokens %d then %d", lease.Token(), next.Token())
	}
}

func TestRevokeEndsAtOnce(t *testing.T) {
	s := memlock.New()
	c := newLocker(t, s)
	sem, _ := c.Semaphore(2)
	ctx := context.Background()
	l1, _ := sem.TryAcquire(ctx, "pool")
	l2, _ := sem.TryAcquire(ctx, "pool")
	if n := s.Revoke("pool"); n != 2 {
		t.Fatalf("Revoke ended %d leases, want 2", n)
	}
	for _, l := range []locks.Lease{l1, l2} {
		if !errors.Is(context.Cause(l.Context()), locks.ErrLost) {
			t.Fatalf("lease not lost after Revoke: %v", context.Cause(l.Context()))
		}
	}
}

func TestKillKeepsTheNameUntilTTL(t *testing.T) {
	s := memlock.New()
	a, b := newLocker(t, s), newLocker(t, s)
	ctx := context.Background()
	lease, _ := a.Locker().TryLock(ctx, "job")
	_ = a.Kill()
	if !errors.Is(context.Cause(lease.Context()), locks.ErrLost) {
		t.Fatal("a killed client's lease did not end on its side")
	}
	if _, err := b.Locker().TryLock(ctx, "job"); !errors.Is(err, locks.ErrNotAcquired) {
		t.Fatalf("TryLock right after Kill = %v; the store should keep a dead holder until its TTL", err)
	}
	if _, err := a.Locker().TryLock(ctx, "other"); !errors.Is(err, locks.ErrClosed) {
		t.Fatalf("a killed client's TryLock = %v, want ErrClosed", err)
	}
	wctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	next, err := b.Locker().Lock(wctx, "job")
	if err != nil {
		t.Fatalf("Lock after the dead holder's TTL: %v", err)
	}
	_ = next.Release(ctx)
}

func TestSemaphorePriorityTakesLowest(t *testing.T) {
	s := memlock.New()
	low, mid, high := newLocker(t, s, memlock.WithPriority(1)), newLocker(t, s, memlock.WithPriority(2)), newLocker(t, s, memlock.WithPriority(9))
	ctx := context.Background()
	semOf := func(c *memlock.Client) *memlock.Semaphore { s, _ := c.Semaphore(2); return s }
	lLow, _ := semOf(low).TryAcquire(ctx, "pool")
	lMid, _ := semOf(mid).TryAcquire(ctx, "pool")
	lHigh, err := semOf(high).TryAcquire(ctx, "pool")
	if err != nil {
		t.Fatalf("high priority TryAcquire on a full pool: %v", err)
	}
	defer lHigh.Release(ctx)
	if !errors.Is(context.Cause(lLow.Context()), locks.ErrPreempted) || lMid.Context().Err() != nil {
		t.Fatalf("want the lowest priority preempted: low %v, mid %v", context.Cause(lLow.Context()), context.Cause(lMid.Context()))
	}
}

func TestBadInput(t *testing.T) {
	s := memlock.New()
	for _, opt := range []memlock.Option{memlock.WithTTL(0), memlock.WithRenewInterval(-1), memlock.WithBackoff(locks.Backoff{})} {
		if _, err := s.NewClient(opt); !errors.Is(err, locks.ErrInvalidOption) {
			t.Errorf("NewClient with a bad option = %v", err)
		}
	}
	c := newLocker(t, s)
	if _, err := c.Semaphore(-3); !errors.Is(err, locks.ErrInvalidOption) {
		t.Errorf("Semaphore(-3) = %v", err)
	}
	if _, err := c.Locker().Lock(context.Background(), ""); !errors.Is(err, locks.ErrInvalidName) {
		t.Errorf("Lock(\"\") = %v", err)
	}
}

func FuzzNames(f *testing.F) {
	for _, s := range []string{"", "job", "a/b.c", "\x00", "\xff", "🔒 lock"} {
		f.Add(s)
	}
	store := memlock.New()
	c, err := store.NewClient()
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(func() { _ = c.Close(context.Background()) })
	f.Fuzz(func(t *testing.T, name string) {
		lease, err := c.Locker().TryLock(context.Background(), name)
		switch {
		case err == nil:
			if lease.Name() != name {
				t.Fatalf("lease.Name() = %q, want %q", lease.Name(), name)
			}
			if err := lease.Release(context.Background()); err != nil {
				t.Fatal(err)
			}
		case !errors.Is(err, locks.ErrInvalidName):
			t.Fatalf("TryLock(%q) = %v; want a lease or ErrInvalidName", name, err)
		}
	})
}

// Close ends the client's leases with ErrLost and ErrClosed, frees their
// names at once, makes a waiting Lock return ErrClosed, and is
// idempotent.
func TestCloseEndsEverything(t *testing.T) {
	s := memlock.New()
	a, b := newLocker(t, s), newLocker(t, s)
	ctx := context.Background()
	lease, err := a.Locker().TryLock(ctx, "job")
	if err != nil {
		t.Fatal(err)
	}
	waited := make(chan error, 1)
	go func() {
		_, err := a.Locker().Lock(ctx, "job")
		waited <- err
	}()
	time.Sleep(20 * time.Millisecond)
	if err := a.Close(ctx); err != nil {
		t.Fatal(err)
	}
	cause := context.Cause(lease.Context())
	if !errors.Is(cause, locks.ErrLost) || !errors.Is(cause, locks.ErrClosed) {
		t.Fatalf("cause after Close: %v, want ErrLost and ErrClosed", cause)
	}
	select {
	case err := <-waited:
		if !errors.Is(err, locks.ErrClosed) {
			t.Fatalf("a Lock waiting during Close returned %v, want ErrClosed", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("a Lock waiting during Close did not return")
	}
	if _, err := a.Locker().TryLock(ctx, "other"); !errors.Is(err, locks.ErrClosed) {
		t.Fatalf("TryLock after Close: %v, want ErrClosed", err)
	}
	if err := a.Close(ctx); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	next, err := b.Locker().TryLock(ctx, "job")
	if err != nil {
		t.Fatalf("the closed client's name is not free: %v", err)
	}
	_ = next.Release(ctx)
}

// A lock's lease has Slot 0, a semaphore's 1..N; sizes are capped; errors
// name the backend, the operation and the name once.
func TestSlotsAndErrors(t *testing.T) {
	s := memlock.New()
	c := newLocker(t, s)
	ctx := context.Background()
	lease, err := c.Locker().TryLock(ctx, "job")
	if err != nil {
		t.Fatal(err)
	}
	defer lease.Release(ctx)
	if slot := lease.(locks.SlotLease).Slot(); slot != 0 {
		t.Errorf("a lock's Slot() = %d, want 0", slot)
	}
	_, err = c.Locker().TryLock(ctx, "job")
	if want := `memlock: trylock: `; err == nil || !strings.HasPrefix(err.Error(), want) || strings.Count(err.Error(), `"job"`) != 1 {
		t.Errorf("TryLock of a held name: %v, want it to start %q and name it once (the HeldError does)", err, want)
	}
	sem, err := c.Semaphore(memlock.MaxSemaphoreSize)
	if err != nil {
		t.Fatal(err)
	}
	sl, err := sem.TryAcquire(ctx, "pool")
	if err != nil {
		t.Fatal(err)
	}
	defer sl.Release(ctx)
	if slot := sl.(locks.SlotLease).Slot(); slot != 1 {
		t.Errorf("a semaphore's first Slot() = %d, want 1", slot)
	}
	if _, err := c.Semaphore(memlock.MaxSemaphoreSize + 1); !errors.Is(err, locks.ErrInvalidOption) {
		t.Errorf("Semaphore(MaxSemaphoreSize+1) = %v, want ErrInvalidOption", err)
	}
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if _, err := c.Locker().Lock(cctx, "job"); !errors.Is(err, context.Canceled) || !strings.HasPrefix(err.Error(), `memlock: lock "job": `) {
		t.Errorf("Lock with a cancelled context: %v", err)
	}
}

// The client renews its leases in rounds: a lease outlives many TTLs.
func TestRenewedInRounds(t *testing.T) {
	s := memlock.New()
	c := newLocker(t, s) // 200ms TTL
	ctx := context.Background()
	var leases []locks.Lease
	for _, name := range []string{"a", "b", "c"} {
		l, err := c.Locker().TryLock(ctx, name)
		if err != nil {
			t.Fatal(err)
		}
		leases = append(leases, l)
	}
	var rounds atomic.Int32
	stop := c.Locker().Observe(func(e driver.Event) {
		if e.Kind == driver.EventRenewRound && e.Leases == 3 {
			rounds.Add(1)
		}
	})
	defer stop()
	time.Sleep(time.Second)
	for _, l := range leases {
		if err := l.Context().Err(); err != nil {
			t.Fatalf("lease %s ended: %v", l.Name(), context.Cause(l.Context()))
		}
		_ = l.Release(ctx)
	}
	if rounds.Load() < 2 {
		t.Errorf("%d renewal rounds of all 3 leases in 1s at a 200ms TTL, want several", rounds.Load())
	}
}
