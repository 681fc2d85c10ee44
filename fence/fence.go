package fence

import (
	"errors"
	"fmt"
	"math"

	"github.com/latchkey-go/latchkey/locks"
)

// Sentinel errors. Guards wrap them with the call's details; check them
// with [errors.Is], never by message text.
var (
	// ErrStale reports a write refused because a later holder of the
	// lease's name (a larger token) has already written. The write
	// changed nothing. [*StaleError] carries the details.
	ErrStale = errors.New("fence: stale fencing token")

	// ErrNoToken reports a lease whose Token is 0: its backend makes no
	// fencing tokens (amqpsem), so no guard can tell it from a stale one.
	// Every guard refuses it before any I/O.
	ErrNoToken = errors.New("fence: lease has no fencing token")

	// ErrInvalid reports bad input to a guard (a nil database, client,
	// lease or function, an empty name, a token a store cannot hold). It
	// is returned before any I/O. An empty name also matches
	// [locks.ErrInvalidName].
	ErrInvalid = errors.New("fence: invalid argument")
)

// Lease is what a guard needs of a lease: its name and its fencing token.
// Every [locks.Lease] is one; [Token] makes one from stored values.
type Lease interface {
	Name() string
	Token() uint64
}

var _ Lease = locks.Lease(nil)

// Token returns a [Lease] with the given name and token, for a writer that
// carries them apart from the lease (in a message, across a process).
func Token(name string, token uint64) Lease { return tokenLease{name, token} }

type tokenLease struct {
	name  string
	token uint64
}

func (l tokenLease) Name() string  { return l.name }
func (l tokenLease) Token() uint64 { return l.token }

// StaleError is the detailed form of [ErrStale]: the write with Token on
// Name was refused because Newest, a larger token, had already written.
// errors.Is(err, ErrStale) reports true for it.
type StaleError struct {
	Name   string
	Token  uint64 // the refused lease's token
	Newest uint64 // the largest token that has written to Name
}

// Error says which name refused which token, and the newest.
func (e *StaleError) Error() string {
	return fmt.Sprintf("fence: stale fencing token: %q written by token %d, refused token %d", e.Name, e.Newest, e.Token)
}

// Is reports whether target is [ErrStale].
func (e *StaleError) Is(target error) bool { return target == ErrStale }

// Check returns lease's name and token, or an error matching [ErrInvalid]
// (a nil lease or an empty name, which also matches
// [locks.ErrInvalidName]) or [ErrNoToken] (a zero token). Guards call it
// before any I/O; who prefixes the error ("sqlfence").
func Check(who string, lease Lease) (name string, token uint64, err error) {
	if lease == nil {
		return "", 0, fmt.Errorf("%s: %w: nil lease", who, ErrInvalid)
	}
	name, token = lease.Name(), lease.Token()
	if name == "" {
		return "", 0, fmt.Errorf("%s: %w: %w: empty lease name", who, ErrInvalid, locks.ErrInvalidName)
	}
	if token == 0 {
		return "", 0, fmt.Errorf("%s: %q: %w (the backend makes none; see the fence package doc)", who, name, ErrNoToken)
	}
	return name, token, nil
}

// CheckInt64 is [Check] for stores that keep tokens as signed 64-bit
// integers (SQL BIGINT): a token above [math.MaxInt64] is refused with
// [ErrInvalid].
func CheckInt64(who string, lease Lease) (name string, token int64, err error) {
	name, t, err := Check(who, lease)
	if err != nil {
		return "", 0, err
	}
	if t > math.MaxInt64 {
		return "", 0, fmt.Errorf("%s: %q: %w: token %d does not fit a BIGINT", who, name, ErrInvalid, t)
	}
	return name, int64(t), nil
}
