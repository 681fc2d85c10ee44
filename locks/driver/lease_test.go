package driver_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/latchkey-go/latchkey/locks"
	"github.com/latchkey-go/latchkey/locks/driver"
)

func TestLeaseReleaseOnce(t *testing.T) {
	var calls atomic.Int32
	var l *driver.Lease
	l = driver.NewLease(context.Background(), driver.Spec{
		Name: "n", Token: 7, Slot: 2,
		Release: func(ctx context.Context) error {
			calls.Add(1)
			if l := ctx.Value(ctxKey{}); l != nil {
				t.Errorf("release got the acquire context's value")
			}
			// The lease has ended, with its cause, before the broker is told.
			if cause := context.Cause(l.Context()); !errors.Is(cause, locks.ErrReleased) {
				t.Errorf("the broker was told of the release while the lease's cause was %v, want ErrReleased", cause)
			}
			select {
			case <-l.Context().Done():
			default:
				t.Errorf("the broker was told of the release before the lease's context was done")
			}
			return nil
		},
	})
	ctx := l.Context()
	if l.Context() != ctx {
		t.Fatal("Context returned two different contexts for a live lease")
	}
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			if err := l.Release(context.Background()); err != nil {
				t.Errorf("Release: %v", err)
			}
		})
	}
	wg.Wait()
	if n := calls.Load(); n != 1 {
		t.Fatalf("broker release called %d times, want 1", n)
	}
	if cause := context.Cause(l.Context()); !errors.Is(cause, locks.ErrReleased) {
		t.Fatalf("cause = %v, want ErrReleased", cause)
	}
	if l.Token() != 7 || l.Slot() != 2 || l.Name() != "n" || l.Live() {
		t.Fatalf("accessors after release: token %d slot %d name %q live %v", l.Token(), l.Slot(), l.Name(), l.Live())
	}
	if l.Context() != ctx {
		t.Fatal("Context after Release is not the context it returned before")
	}
}

type ctxKey struct{}

func TestLeaseKeepsValuesNotCancellation(t *testing.T) {
	parent, cancel := context.WithCancel(context.WithValue(context.Background(), ctxKey{}, "trace"))
	l := driver.NewLease(parent, driver.Spec{Name: "n"})
	cancel()
	if err := l.Context().Err(); err != nil {
		t.Fatalf("the acquiring call's cancellation ended the lease: %v", err)
	}
	if v := l.Context().Value(ctxKey{}); v != "trace" {
		t.Fatalf("lease context lost the value: %v", v)
	}
	_ = l.Release(context.Background())
}

func TestLeaseDeadline(t *testing.T) {
	var released atomic.Bool
	l := driver.NewLease(context.Background(), driver.Spec{
		Name: "n", Deadline: time.Now().Add(30 * time.Millisecond),
		Release: func(context.Context) error { released.Store(true); return nil },
	})
	ctx := l.Context()
	if !l.Extend(time.Now().Add(80 * time.Millisecond)) {
		t.Fatal("Extend on a live lease reported false")
	}
	select {
	case <-l.Context().Done():
	case <-time.After(5 * time.Second):
		t.Fatal("lease outlived its deadline")
	}
	if cause := context.Cause(l.Context()); !errors.Is(cause, locks.ErrLost) {
		t.Fatalf("cause = %v, want ErrLost", cause)
	}
	if l.Extend(time.Now().Add(time.Hour)) {
		t.Fatal("Extend revived an ended lease")
	}
	if l.Context() != ctx {
		t.Fatal("Context after the lease was lost is not the context it returned before")
	}
	err := l.Release(context.Background())
	if !errors.Is(err, locks.ErrLost) {
		t.Fatalf("Release of a lost lease = %v, want ErrLost", err)
	}
	if !released.Load() {
		t.Fatal("Release of a lost lease did not clean up at the broker")
	}
	if err2 := l.Release(context.Background()); err2 != err {
		t.Fatalf("second Release = %v, want the first's %v", err2, err)
	}
}

func TestLeaseEndIsFinal(t *testing.T) {
	l := driver.NewLease(context.Background(), driver.Spec{Name: "n"})
	if !l.End(driver.Preempted(errors.New("by a higher priority"))) {
		t.Fatal("first End reported false")
	}
	if l.End(driver.Lost(nil)) {
		t.Fatal("second End reported true")
	}
	cause := context.Cause(l.Context())
	if !errors.Is(cause, locks.ErrPreempted) || !errors.Is(cause, locks.ErrLost) {
		t.Fatalf("cause = %v, want ErrPreempted and ErrLost", cause)
	}
}

// renewing returns a registry renewing every lease every 10ms with
// renew, and closes it at the end of the test.
func renewing(t *testing.T, renew func(ctx context.Context, l *driver.Lease) (time.Time, error)) *driver.Registry {
	reg, err := driver.NewRegistry(driver.Config{Backend: "test", RenewEvery: 10 * time.Millisecond,
		Renew: func(ctx context.Context, batch []*driver.Lease) []driver.Renewal {
			out := make([]driver.Renewal, len(batch))
			for i, l := range batch {
				out[i].Until, out[i].Err = renew(ctx, l)
			}
			return out
		}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = reg.Close(context.Background(), nil) })
	return reg
}

func TestRenewal(t *testing.T) {
	// Renewed every 10ms, a validity of 250ms outlasts a loaded
	// machine's scheduling delays.
	const validity = 250 * time.Millisecond
	var renewals atomic.Int32
	fail := make(chan error, 1)
	reg := renewing(t, func(ctx context.Context, _ *driver.Lease) (time.Time, error) {
		if _, ok := ctx.Deadline(); !ok {
			t.Error("renew context has no deadline")
		}
		renewals.Add(1)
		select {
		case err := <-fail:
			return time.Time{}, err
		default:
			return time.Now().Add(validity), nil
		}
	})
	l, err := reg.NewLease(context.Background(), driver.Spec{Name: "n", Deadline: time.Now().Add(validity)})
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(3 * validity) // three deadlines: only renewals keep it alive
	if !l.Live() {
		t.Fatalf("lease ended despite renewals: %v", context.Cause(l.Context()))
	}
	fail <- driver.Lost(errors.New("key changed"))
	select {
	case <-l.Context().Done():
	case <-time.After(5 * time.Second):
		t.Fatal("a renewal returning ErrLost did not end the lease")
	}
	if err := l.Release(context.Background()); !errors.Is(err, locks.ErrLost) {
		t.Fatalf("Release = %v", err)
	}
	if renewals.Load() < 3 {
		t.Fatalf("only %d renewals", renewals.Load())
	}
}

func TestRenewalTransientErrorsHitDeadline(t *testing.T) {
	reg := renewing(t, func(context.Context, *driver.Lease) (time.Time, error) {
		return time.Time{}, errors.New("broker unreachable")
	})
	l, err := reg.NewLease(context.Background(), driver.Spec{Name: "n", Deadline: time.Now().Add(60 * time.Millisecond)})
	if err != nil {
		t.Fatal(err)
	}
	select {
	case <-l.Context().Done():
	case <-time.After(5 * time.Second):
		t.Fatal("failing renewals did not let the deadline end the lease")
	}
	if cause := context.Cause(l.Context()); !errors.Is(cause, locks.ErrLost) {
		t.Fatalf("cause = %v", cause)
	}
	_ = l.Release(context.Background())
}

// TestLeaseErrChecksDeadline shows that a lease past its deadline reads
// as ended on the first check, without waiting for its timer: what a
// process resumed after SIGSTOP relies on before its next write.
func TestLeaseErrChecksDeadline(t *testing.T) {
	for i := range 100 {
		l := driver.NewLease(context.Background(), driver.Spec{Name: "n", Deadline: time.Now().Add(-time.Millisecond)})
		if l.Context().Err() == nil {
			t.Fatalf("run %d: a lease past its deadline reads as live", i)
		}
		if cause := context.Cause(l.Context()); !errors.Is(cause, locks.ErrLost) {
			t.Fatalf("run %d: cause %v, want ErrLost", i, cause)
		}
		select {
		case <-l.Context().Done():
		default:
			t.Fatalf("run %d: Err reports the end but Done is open", i)
		}
		if l.Live() {
			t.Fatalf("run %d: Live after the deadline", i)
		}
	}
}

// TestRenewalAfterRelease: a lease released by another goroutine while
// its backend is still registering it is never renewed (and races with
// nothing, under -race).
func TestRenewalAfterRelease(t *testing.T) {
	var renewedReleased atomic.Bool
	reg := renewing(t, func(_ context.Context, l *driver.Lease) (time.Time, error) {
		if !l.Live() {
			renewedReleased.Store(true)
		}
		return time.Now().Add(time.Minute), nil
	})
	for range 100 {
		l, err := reg.NewLease(context.Background(), driver.Spec{Name: "n", Deadline: time.Now().Add(time.Minute)})
		if err != nil {
			t.Fatal(err)
		}
		var wg sync.WaitGroup
		wg.Go(func() { _ = l.Release(context.Background()) })
		wg.Wait()
		if l.Live() {
			t.Fatal("the lease is live after Release")
		}
	}
	time.Sleep(30 * time.Millisecond)
	if renewedReleased.Load() {
		t.Fatal("a released lease was handed to a renewal round")
	}
}

// TestLeaseReleaseAfterLossFails: Release of a lease lost earlier
// reports the loss even when the cleanup at the broker fails too, so that
// Do never drops the loss cause.
func TestLeaseReleaseAfterLossFails(t *testing.T) {
	unreachable := errors.New("broker unreachable")
	l := driver.NewLease(context.Background(), driver.Spec{
		Name:    "n",
		Release: func(context.Context) error { return unreachable },
	})
	l.End(driver.Lost(errors.New("key deleted")))
	err := l.Release(context.Background())
	if !errors.Is(err, locks.ErrLost) || !errors.Is(err, unreachable) {
		t.Fatalf("Release after a loss, cleanup failing: %v; want an error matching ErrLost and the cleanup's error", err)
	}
}
