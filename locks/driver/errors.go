package driver

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"unicode/utf8"

	"github.com/latchkey-go/latchkey/locks"
)

// Lost returns a lease-end cause that matches [locks.ErrLost] and wraps
// reason.
func Lost(reason error) error {
	if reason == nil {
		return locks.ErrLost
	}
	return fmt.Errorf("%w: %w", locks.ErrLost, reason)
}

// Preempted returns a lease-end cause that matches both
// [locks.ErrPreempted] and [locks.ErrLost] and wraps reason.
func Preempted(reason error) error {
	if reason == nil {
		return fmt.Errorf("%w (%w)", locks.ErrPreempted, locks.ErrLost)
	}
	return fmt.Errorf("%w (%w): %w", locks.ErrPreempted, locks.ErrLost, reason)
}

// InvalidOption returns an error matching [locks.ErrInvalidOption] with a
// formatted explanation, for a backend's WithX option to return.
func InvalidOption(format string, args ...any) error {
	return fmt.Errorf("%w: %s", locks.ErrInvalidOption, fmt.Sprintf(format, args...))
}

// Errorf is the one shape of every error a backend returns from a call:
// the backend, the operation and the name once, then the cause, which it
// wraps ("natsputex: lock \"jobs\": context deadline exceeded"). A
// context's error is wrapped the same way, so errors.Is(err,
// context.DeadlineExceeded) holds. An empty name is left out, and so is a
// name that a [locks.HeldError] in err states already; a nil err gives nil.
func Errorf(backend, op, name string, err error) error {
	if err == nil {
		return nil
	}
	var held *locks.HeldError
	if name == "" || errors.As(err, &held) && held.Name == name {
		return fmt.Errorf("%s: %s: %w", backend, op, err)
	}
	return fmt.Errorf("%s: %s %s: %w", backend, op, ShownName(name), err)
}

// MaxShownName is the longest name, in bytes, that messages quote whole.
const MaxShownName = 200

// ShownName returns name quoted for a message: whole up to
// [MaxShownName] bytes, else cut there (at a rune's start) with its
// length, so that a huge name cannot make a huge error:
// "aaaa…"...(1048576 bytes).
func ShownName(name string) string {
	head, n := CutName(name)
	if n == 0 {
		return strconv.Quote(name)
	}
	return fmt.Sprintf("%q...(%d bytes)", head, n)
}

// CutName returns name's first [MaxShownName] bytes, cut at a rune's
// start, and name's length; or name and 0 when it is short enough to
// show whole.
func CutName(name string) (head string, length int) {
	if len(name) <= MaxShownName {
		return name, 0
	}
	cut := MaxShownName
	for cut > 0 && !utf8.RuneStart(name[cut]) {
		cut--
	}
	return name[:cut], len(name)
}

// CheckContext returns the error of a call given a nil ctx, in the shape
// of [Errorf] and matching [locks.ErrInvalidOption]; nil for any other
// ctx. Every entry point of a backend that takes a ctx checks it first,
// so that a nil ctx is an answer, not a panic later inside a goroutine.
func CheckContext(ctx context.Context, backend, op, name string) error {
	if ctx != nil {
		return nil
	}
	return Errorf(backend, op, name, InvalidOption("nil ctx: pass a context (context.Background() if the call has none)"))
}
