package amqpsem

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/latchkey-go/latchkey/locks"
)

// A nil ctx is an error naming ctx, matching locks.ErrInvalidOption, at
// every entry point: never a panic, and nothing done (the lease is still
// held, the client still open).
func TestNilContext(t *testing.T) {
	var nilCtx context.Context
	if _, err := Dial(nilCtx, "amqp://guest:guest@127.0.0.1:1/"); !nilCtxErr(err) {
		t.Errorf("Dial(nil): %v, want an error matching ErrInvalidOption naming ctx", err)
	}
	c, _, ctx := internalClient(t)
	s, err := c.Semaphore(2)
	if err != nil {
		t.Fatal(err)
	}
	a, err := c.Admin()
	if err != nil {
		t.Fatal(err)
	}
	name := "amqpsem-nilctx-" + strings.ReplaceAll(t.Name(), "/", "-")
	calls := map[string]func() error{
		"Lock":       func() error { _, err := c.Locker().Lock(nilCtx, name); return err },
		"TryLock":    func() error { _, err := c.Locker().TryLock(nilCtx, name); return err },
		"Acquire":    func() error { _, err := s.Acquire(nilCtx, name); return err },
		"TryAcquire": func() error { _, err := s.TryAcquire(nilCtx, name); return err },
		"Max":        func() error { _, err := a.Max(nilCtx, name); return err },
		"Create":     func() error { return a.Create(nilCtx, name, 1) },
		"Status":     func() error { _, err := a.Status(nilCtx, name); return err },
		"Close":      func() error { return c.Close(nilCtx) },
	}
	for what, call := range calls {
		if err := call(); !nilCtxErr(err) {
			t.Errorf("%s(nil): %v, want an error matching ErrInvalidOption naming ctx", what, err)
		}
	}
	l, err := c.Locker().TryLock(ctx, name)
	if err != nil {
		t.Fatalf("TryLock after the nil calls (the client must still be open): %v", err)
	}
	if err := l.Release(nilCtx); !nilCtxErr(err) {
		t.Errorf("Release(nil): %v, want an error matching ErrInvalidOption naming ctx", err)
	}
	if l.Context().Err() != nil {
		t.Error("Release(nil) ended the lease")
	}
	if err := l.Release(ctx); err != nil {
		t.Errorf("Release: %v", err)
	}
}

// nilCtxErr reports whether err is the error of a nil ctx.
func nilCtxErr(err error) bool {
	return errors.Is(err, locks.ErrInvalidOption) && strings.Contains(err.Error(), "nil ctx")
}
