package locks

import (
	"errors"
	"fmt"
	"time"
)

// Sentinel errors. Backends wrap them with the call's details and the
// broker's own cause; check them with [errors.Is], never by message text.
var (
	// ErrNotAcquired reports that a TryLock or TryAcquire found the name
	// held elsewhere. Blocking calls never return it for a deadline: they
	// return the context's error instead.
	ErrNotAcquired = errors.New("locks: not acquired")

	// ErrLost is the cause of a lease that ended without Release: it was
	// taken away at the broker, could not be renewed before its validity
	// ran out, or its client was closed or cut off.
	ErrLost = errors.New("locks: lease lost")

	// ErrReleased is the cause of a lease that ended by Release.
	ErrReleased = errors.New("locks: lease released")

	// ErrPreempted is the cause of a lease that a holder of higher priority
	// took. A preemption is also a loss: a cause matching ErrPreempted
	// matches ErrLost too.
	ErrPreempted = errors.New("locks: lease preempted")

	// ErrInvalidName reports a name that is empty or not legal for the
	// backend's broker. It is returned before any I/O.
	ErrInvalidName = errors.New("locks: invalid name")

	// ErrInvalidOption reports an option value out of range. It is returned
	// by the constructor, before any I/O.
	ErrInvalidOption = errors.New("locks: invalid option")

	// ErrClosed reports a call on a Locker or Semaphore whose client has
	// been closed.
	ErrClosed = errors.New("locks: closed")
)

// HeldError is the detailed form of [ErrNotAcquired]: the name is held, by
// whom if the backend knows, and when it may be worth trying again.
// errors.Is(err, ErrNotAcquired) reports true for it.
type HeldError struct {
	Name string
	// Holder identifies the current holder when the backend knows it
	// (a token, a host name); it is empty otherwise.
	Holder string
	// RetryAfter, when positive, is how long the name is known to stay
	// held (for example the holder's remaining TTL). driver.Wait (in locks/driver) sleeps no
	// longer than this before trying again.
	RetryAfter time.Duration
	// Err is the backend's own cause, if any.
	Err error
}

func (e *HeldError) Error() string {
	msg := fmt.Sprintf("locks: not acquired: %q is held", e.Name)
	if e.Holder != "" {
		msg += " by " + e.Holder
	}
	if e.RetryAfter > 0 {
		msg += fmt.Sprintf(" (for up to %v)", e.RetryAfter.Round(time.Millisecond))
	}
	if e.Err != nil {
		msg += ": " + e.Err.Error()
	}
	return msg
}

// Is reports whether target is [ErrNotAcquired].
func (e *HeldError) Is(target error) bool { return target == ErrNotAcquired }

// Unwrap returns the backend's cause.
func (e *HeldError) Unwrap() error { return e.Err }

// invalidOption returns an error matching [ErrInvalidOption] with a
// formatted explanation.
func invalidOption(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrInvalidOption, fmt.Sprintf(format, args...))
}
