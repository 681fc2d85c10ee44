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

// testHugeName: a 1 MiB name gets an answer whose message is short (a
// name is cut in messages past 200 bytes), never the name once or twice.
func testHugeName(t testing.TB, nh NewHarness) {
	e := newEnv(t, nh)
	defer e.close()
	l := e.newClientLocker()
	name := strings.Repeat("n", 1<<20)
	ctx, cancel := e.opCtx()
	defer cancel()
	lease, err := l.TryLock(ctx, name)
	if err == nil {
		e.mustRelease(lease)
		e.skippedPart("the message of a huge name", "the backend takes a 1 MiB name")
		return
	}
	if n := len(err.Error()); n > 1000 {
		t.Errorf("TryLock of a 1 MiB name: a message of %d bytes, want at most 1000: %.300s…", n, err)
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

// testNilContext: a nil ctx is an answer, not a panic: every call given
// one returns an error matching ErrInvalidOption and does nothing, so
// the name stays free and a lease given Release(nil) stays held.
func testNilContext(t testing.TB, nh NewHarness) {
	e := newEnv(t, nh)
	defer e.close()
	l := e.newClientLocker()
	name := e.name()
	calls := map[string]func(context.Context, string) (locks.Lease, error){"Lock": l.Lock, "TryLock": l.TryLock}
	if e.caps.Semaphore {
		s := e.newClientSemaphore(2)
		calls["Acquire"], calls["TryAcquire"] = s.Acquire, s.TryAcquire
	} else {
		e.skippedPart("Acquire and TryAcquire with a nil ctx", "the backend has no Semaphore")
	}
	for call, f := range calls {
		lease, err := callNoPanic(func() (locks.Lease, error) { return f(nil, name) })
		if lease != nil {
			_ = lease.Release(e.ctx)
			t.Errorf("%s(nil, %q) returned a lease", call, name)
		}
		if !errors.Is(err, locks.ErrInvalidOption) {
			t.Errorf("%s(nil, %q) = %v, want an error matching locks.ErrInvalidOption", call, name, err)
		}
	}
	lease := e.mustTryLock(l, name) // the nil calls held nothing
	_, err := callNoPanic(func() (locks.Lease, error) {
		//lint:ignore SA1012 the nil ctx is the input under test
		return nil, lease.Release(nil)
	})
	if !errors.Is(err, locks.ErrInvalidOption) {
		t.Errorf("Release(nil) = %v, want an error matching locks.ErrInvalidOption", err)
	}
	if lease.Context().Err() != nil {
		t.Fatalf("Release(nil) ended the lease: %v", context.Cause(lease.Context()))
	}
	e.expectHeld(e.newClientLocker(), name, "after Release(nil)")
	e.mustRelease(lease)
}

// callNoPanic calls f, turning a panic into an error.
func callNoPanic(f func() (locks.Lease, error)) (lease locks.Lease, err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("panicked: %v", r)
		}
	}()
	return f()
}
