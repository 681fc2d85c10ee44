package lockotel_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/latchkey-go/latchkey/lockotel"
	"github.com/latchkey-go/latchkey/locks"
	"github.com/latchkey-go/latchkey/locks/memlock"
)

// Nil arguments are errors naming the argument, matching
// locks.ErrInvalidOption, never panics: a nil Locker or Semaphore given
// to a wrapper, and a nil ctx given to a call or to Release.
func TestNilArguments(t *testing.T) {
	var nilCtx context.Context
	ctx := context.Background()
	isErr := func(what string, err error, says string) {
		t.Helper()
		if !errors.Is(err, locks.ErrInvalidOption) || !strings.Contains(err.Error(), says) || !strings.HasPrefix(err.Error(), "lockotel: ") {
			t.Errorf("%s: %v, want a lockotel error matching ErrInvalidOption saying %q", what, err, says)
		}
	}
	l := lockotel.WrapLocker(nil)
	_, err := l.Lock(ctx, "n")
	isErr("WrapLocker(nil).Lock", err, "nil Locker")
	_, err = l.TryLock(ctx, "n")
	isErr("WrapLocker(nil).TryLock", err, "nil Locker")
	s := lockotel.WrapSemaphore(nil)
	_, err = s.Acquire(ctx, "n")
	isErr("WrapSemaphore(nil).Acquire", err, "nil Semaphore")
	_, err = s.TryAcquire(ctx, "n")
	isErr("WrapSemaphore(nil).TryAcquire", err, "nil Semaphore")

	client, err := memlock.New().NewClient()
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close(ctx)
	locker := lockotel.WrapLocker(client.Locker())
	defer locker.Close()
	_, err = locker.Lock(nilCtx, "n")
	isErr("Lock(nil ctx)", err, "nil ctx")
	_, err = locker.TryLock(nilCtx, "n")
	isErr("TryLock(nil ctx)", err, "nil ctx")
	lease, err := locker.Lock(ctx, "n")
	if err != nil {
		t.Fatal(err)
	}
	isErr("Release(nil ctx)", lease.Release(nilCtx), "nil ctx")
	if lease.Context().Err() != nil {
		t.Error("Release(nil ctx) ended the lease")
	}
	if err := lease.Release(ctx); err != nil {
		t.Error(err)
	}
}
