package locks_test

import (
	"context"
	"errors"
	"testing"

	"github.com/latchkey-go/latchkey/locks"
	"github.com/latchkey-go/latchkey/locks/memlock"
)

// TestDoLostDuringFn: when the lease is lost while fn runs, fn's context
// ends with the loss, and Do returns fn's error joined with the loss cause,
// so the caller learns that fn's work may not have been exclusive.
func TestDoLostDuringFn(t *testing.T) {
	store := memlock.New()
	l, err := store.NewLocker()
	if err != nil {
		t.Fatal(err)
	}
	errWork := errors.New("work stopped")
	for _, tc := range []struct {
		name  string
		fnErr error
	}{{"fn fails", errWork}, {"fn succeeds", nil}} {
		t.Run(tc.name, func(t *testing.T) {
			const name = "job"
			ran := false
			err := locks.Do(context.Background(), l, name, func(ctx context.Context) error {
				ran = true
				if n := store.Revoke(name); n != 1 {
					t.Errorf("Revoke ended %d leases, want 1", n)
				}
				<-ctx.Done() // memlock's Revoke ends the lease at once
				if cause := context.Cause(ctx); !errors.Is(cause, locks.ErrLost) {
					t.Errorf("fn's context ended with %v, want an error matching ErrLost", cause)
				}
				return tc.fnErr
			})
			if !ran {
				t.Fatal("Do did not run fn")
			}
			if tc.fnErr != nil && !errors.Is(err, tc.fnErr) {
				t.Errorf("Do = %v, want an error matching fn's %v", err, tc.fnErr)
			}
			if !errors.Is(err, locks.ErrLost) {
				t.Errorf("Do = %v, want an error matching ErrLost (the lease was lost while fn ran)", err)
			}
			lease, err := l.TryLock(context.Background(), name)
			if err != nil {
				t.Fatalf("TryLock after Do: %v", err)
			}
			_ = lease.Release(context.Background())
		})
	}
}

// TestDo: without a loss Do returns fn's own result and releases the
// lease; when Lock fails it returns Lock's error without running fn.
func TestDo(t *testing.T) {
	store := memlock.New()
	l, err := store.NewLocker()
	if err != nil {
		t.Fatal(err)
	}
	errWork := errors.New("work failed")
	var leaseCtx context.Context
	err = locks.Do(context.Background(), l, "job", func(ctx context.Context) error {
		leaseCtx = ctx
		if err := ctx.Err(); err != nil {
			t.Errorf("fn's context has ended: %v", context.Cause(ctx))
		}
		return errWork
	})
	if !errors.Is(err, errWork) || errors.Is(err, locks.ErrLost) || errors.Is(err, locks.ErrReleased) {
		t.Errorf("Do = %v, want fn's error alone", err)
	}
	if cause := context.Cause(leaseCtx); !errors.Is(cause, locks.ErrReleased) {
		t.Errorf("after Do, fn's context ended with %v, want ErrReleased (Do releases)", cause)
	}
	if err := locks.Do(context.Background(), l, "job", func(context.Context) error { return nil }); err != nil {
		t.Errorf("Do with a succeeding fn = %v, want nil", err)
	}

	other, err := store.NewLocker()
	if err != nil {
		t.Fatal(err)
	}
	held, err := other.TryLock(context.Background(), "job")
	if err != nil {
		t.Fatalf("TryLock after Do: %v (Do did not release)", err)
	}
	defer held.Release(context.Background())
	cancelled, cancel := context.WithCancel(context.Background())
	cancel()
	err = locks.Do(cancelled, l, "job", func(context.Context) error {
		t.Error("Do ran fn without the lock")
		return nil
	})
	if !errors.Is(err, context.Canceled) {
		t.Errorf("Do with a cancelled context on a held name = %v, want context.Canceled", err)
	}
}
