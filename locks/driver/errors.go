package driver

import (
	"errors"
	"fmt"

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
	return fmt.Errorf("%s: %s %q: %w", backend, op, name, err)
}
