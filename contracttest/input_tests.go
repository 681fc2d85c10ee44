package contracttest

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/latchkey-go/latchkey/locks"
)

// testInvalidNames: the empty name and the backend's illegal names give
// ErrInvalidName from every call, and hold nothing.
func testInvalidNames(t testing.TB, nh NewHarness) {
	e := newEnv(t, nh)
	defer e.close()
	l := e.newClientLocker()
	var s locks.Semaphore
	if e.caps.Semaphore {
		s = e.newClientSemaphore(2)
	} else {
		e.skippedPart("Acquire and TryAcquire of invalid names", "the backend has no Semaphore")
	}
	for _, name := range append([]string{""}, e.caps.InvalidNames...) {
		calls := map[string]func(context.Context, string) (locks.Lease, error){"Lock": l.Lock, "TryLock": l.TryLock}
		if s != nil {
			calls["Acquire"], calls["TryAcquire"] = s.Acquire, s.TryAcquire
		}
		for call, f := range calls {
			ctx, cancel := e.opCtx()
			lease, err := f(ctx, name)
			cancel()
			if !errors.Is(err, locks.ErrInvalidName) {
				if lease != nil {
					_ = lease.Release(e.ctx)
				}
				t.Errorf("%s(%q) = %v, want an error matching locks.ErrInvalidName", call, name, err)
			} else if lease != nil {
				t.Errorf("%s(%q) returned a lease with its error", call, name)
			}
		}
	}
}

// testRandomNames: arbitrary names either work or give ErrInvalidName;
// nothing panics.
func testRandomNames(t testing.TB, nh NewHarness) {
	e := newEnv(t, nh)
	defer e.close()
	l := e.newClientLocker()
	rng := rand.New(rand.NewPCG(1, 2))
	alphabet := []rune("aZ09-_./:*>{} \x00\t\n\u00e9\u4e16\U0001F512\ufffd")
	prefix := e.name()
	for i := range 60 {
		var b strings.Builder
		b.WriteString(prefix)
		for range rng.IntN(12) {
			b.WriteRune(alphabet[rng.IntN(len(alphabet))])
		}
		name := b.String()
		if i%10 == 9 {
			name = string([]byte{0xff, 0xfe}) + name
		}
		if i%20 == 19 {
			name = strings.Repeat("x", 300+rng.IntN(2000))
		}
		err := func() (err error) {
			defer func() {
				if p := recover(); p != nil {
					err = fmt.Errorf("panic: %v", p)
				}
			}()
			ctx, cancel := e.opCtx()
			defer cancel()
			lease, err := l.TryLock(ctx, name)
			if err == nil {
				return lease.Release(ctx)
			}
			return err
		}()
		if err != nil && !errors.Is(err, locks.ErrInvalidName) {
			t.Errorf("TryLock(%q) = %v; want success or locks.ErrInvalidName", name, err)
		}
	}
}

// testInvalidOptions: constructors reject option values out of range with
// ErrInvalidOption.
func testInvalidOptions(t testing.TB, nh NewHarness) {
	e := newEnv(t, nh)
	defer e.close()
	oc, ok := e.h.(OptionChecker)
	if !ok {
		t.Skip("the harness checks no options (not an OptionChecker)")
	}
	errs := oc.InvalidOptions(e.ctx)
	if len(errs) == 0 {
		t.Fatal("InvalidOptions returned no errors to check")
	}
	for i, err := range errs {
		if !errors.Is(err, locks.ErrInvalidOption) {
			t.Errorf("invalid option #%d gave %v, want an error matching locks.ErrInvalidOption", i, err)
		}
	}
}
