package driver_test

import (
	"context"
	"errors"
	"math"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/latchkey-go/latchkey/locks"
	"github.com/latchkey-go/latchkey/locks/driver"
)

var natsLike = driver.NameRule{
	What:   "key",
	MaxLen: 64,
	Char: func(r rune) bool {
		return r == '-' || r == '_' || r == '.' || r >= '0' && r <= '9' || r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z'
	},
	Extra: func(s string) error {
		if strings.HasPrefix(s, ".") || strings.HasSuffix(s, ".") {
			return errors.New("must not start or end with '.'")
		}
		return nil
	},
}

func TestNameRule(t *testing.T) {
	for name, ok := range map[string]bool{
		"orders":                true,
		"a.b-c_d":               true,
		"":                      false,
		".a":                    false,
		"a b":                   false,
		strings.Repeat("x", 65): false,
		"\xff":                  false,
	} {
		err := natsLike.Check(name)
		if ok != (err == nil) || err != nil && !errors.Is(err, locks.ErrInvalidName) {
			t.Errorf("Check(%q) = %v", name, err)
		}
	}
	var any driver.NameRule
	if err := any.Check("tab\there"); !errors.Is(err, locks.ErrInvalidName) {
		t.Errorf("zero rule accepted a control character: %v", err)
	}
	if err := any.Check("ünïcode 🔒"); err != nil {
		t.Errorf("zero rule rejected printable unicode: %v", err)
	}
}

func FuzzNameRule(f *testing.F) {
	for _, s := range []string{"", "a", "a.b", "..", "\x00", "\xff\xfe", "🔒"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, name string) {
		for _, r := range []driver.NameRule{{}, natsLike} {
			err := r.Check(name)
			if err != nil && !errors.Is(err, locks.ErrInvalidName) {
				t.Fatalf("Check(%q) = %v: not ErrInvalidName", name, err)
			}
			if err == nil && (name == "" || !utf8.ValidString(name)) {
				t.Fatalf("Check(%q) accepted an empty or invalid name", name)
			}
		}
	})
}

func TestOptionHelpers(t *testing.T) {
	if err := driver.Positive("ttl", 0); !errors.Is(err, locks.ErrInvalidOption) || !strings.Contains(err.Error(), "ttl") {
		t.Errorf("Positive(0) = %v", err)
	}
	if err := driver.Positive("ttl", time.Second); err != nil {
		t.Error(err)
	}
	for _, f := range []float64{-0.1, 1, math.NaN(), math.Inf(1)} {
		if err := driver.Fraction("drift", f); !errors.Is(err, locks.ErrInvalidOption) {
			t.Errorf("Fraction(%v) = %v", f, err)
		}
	}
	if err := driver.Fraction("drift", 0.01); err != nil {
		t.Error(err)
	}
	type opts struct{ n int }
	type option func(*opts) error
	var o opts
	err := driver.Apply(&o, []option{nil, func(o *opts) error { o.n = 1; return nil }, func(*opts) error { return driver.InvalidOption("bad") }})
	if !errors.Is(err, locks.ErrInvalidOption) || o.n != 1 {
		t.Errorf("Apply = %v, n = %d", err, o.n)
	}
}

func TestHeldError(t *testing.T) {
	cause := errors.New("key exists")
	err := error(&locks.HeldError{Name: "jobs", Holder: "host-a", RetryAfter: 1500 * time.Millisecond, Err: cause})
	if !errors.Is(err, locks.ErrNotAcquired) || !errors.Is(err, cause) {
		t.Fatalf("HeldError does not match its sentinel or cause: %v", err)
	}
	want := `locks: not acquired: "jobs" is held by host-a (for up to 1.5s): key exists`
	if err.Error() != want {
		t.Fatalf("Error() = %q, want %q", err.Error(), want)
	}
}

// TestNilContextIsAnError: Release and Close given a nil ctx return an
// error matching ErrInvalidOption in the one shape, and do nothing, so a
// call with a real ctx then works.
func TestNilContextIsAnError(t *testing.T) {
	reg, err := driver.NewRegistry(driver.Config{Backend: "test"})
	if err != nil {
		t.Fatal(err)
	}
	released := make(chan struct{}, 1)
	l, err := reg.NewLease(context.Background(), driver.Spec{Name: "jobs", Release: func(context.Context) error {
		released <- struct{}{}
		return nil
	}})
	if err != nil {
		t.Fatal(err)
	}
	//lint:ignore SA1012 the nil ctx is the input under test
	err = l.Release(nil)
	if !errors.Is(err, locks.ErrInvalidOption) || err.Error() != `test: release "jobs": locks: invalid option: nil ctx: pass a context (context.Background() if the call has none)` {
		t.Fatalf("Release(nil) = %v, want ErrInvalidOption in the one shape", err)
	}
	if !l.Live() {
		t.Fatal("Release(nil) ended the lease")
	}
	//lint:ignore SA1012 the nil ctx is the input under test
	if err := reg.Close(nil, nil); !errors.Is(err, locks.ErrInvalidOption) {
		t.Fatalf("Close(nil) = %v, want ErrInvalidOption", err)
	}
	if reg.Closed() {
		t.Fatal("Close(nil) closed the registry")
	}
	if err := l.Release(context.Background()); err != nil {
		t.Fatalf("Release after Release(nil): %v", err)
	}
	select {
	case <-released:
	default:
		t.Fatal("the lease was not released at the broker")
	}
	if err := reg.Close(context.Background(), nil); err != nil {
		t.Fatal(err)
	}
}

// TestShownNameCutsLongNames: names up to 200 bytes are quoted whole; a
// longer one is cut at a rune's start, with its length, in Errorf's
// messages and in NameRule's.
func TestShownNameCutsLongNames(t *testing.T) {
	if got := driver.ShownName("jobs"); got != `"jobs"` {
		t.Fatalf("ShownName(jobs) = %s", got)
	}
	long := strings.Repeat("é", 1<<19) // 1 MiB, two bytes a rune
	got := driver.ShownName(long)
	if want := `"` + strings.Repeat("é", 100) + `"...(1048576 bytes)`; got != want {
		t.Fatalf("ShownName of 1 MiB = %.60s…, want %.60s…", got, want)
	}
	err := driver.Errorf("test", "lock", long, errors.New("no"))
	if n := len(err.Error()); n > 400 {
		t.Fatalf("Errorf quoted a 1 MiB name in %d bytes", n)
	}
	err = driver.NameRule{MaxLen: 10}.Check(long)
	if n := len(err.Error()); n > 400 || !errors.Is(err, locks.ErrInvalidName) {
		t.Fatalf("NameRule.Check of a 1 MiB name: %d bytes, %v", n, errors.Is(err, locks.ErrInvalidName))
	}
}
