package contracttest

import (
	"context"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/latchkey-go/latchkey/locks"
)

// Harness connects the suite to one backend on a real broker. The suite
// makes a new Harness for every test and closes it at the end.
type Harness interface {
	// NewClient returns a client on a new connection: two clients behave
	// like two processes.
	NewClient(ctx context.Context) (Client, error)

	// Kill cuts c off the broker abruptly, without a clean release (closing
	// its sockets, or black-holing a proxy in between), like a crashed
	// process. The leases c holds must end on c's side with [locks.ErrLost]
	// within Capabilities().LossDetection; the broker frees them within
	// Capabilities().CrashRecovery.
	Kill(ctx context.Context, c Client) error

	// Capabilities reports what the backend supports and the bounds it
	// promises.
	Capabilities() Capabilities

	// Close frees everything the harness made.
	Close() error
}

// NewHarness makes a Harness for one test. It may call t.Skip when the
// broker is missing (testenv does, except under CI).
type NewHarness func(ctx context.Context, t testing.TB) (Harness, error)

// Client is one process's view of the backend.
type Client interface {
	// Locker returns the client's Locker, or nil if the backend has none.
	Locker() locks.Locker

	// Semaphore returns a Semaphore with size slots per name, creating
	// whatever the broker needs. Backends without semaphores return an
	// error; the suite does not call it unless Capabilities().Semaphore.
	Semaphore(ctx context.Context, size int) (locks.Semaphore, error)

	// Close releases what the client holds and closes its connection,
	// bounded by ctx as the backend's own Close is: the suite checks that
	// a Close whose ctx never ends returns within
	// Capabilities().CloseBound while the broker does not answer.
	Close(ctx context.Context) error
}

// Capabilities describes a backend to the suite.
type Capabilities struct {
	// Fencing is true when leases carry fencing tokens. When false, Token
	// must return 0 and the fencing tests are skipped.
	Fencing bool

	// Semaphore is true when clients make Semaphores.
	Semaphore bool

	// MaxSemaphoreSize is the largest size a client's Semaphore takes (the
	// backend's exported MaxSemaphoreSize); zero means no cap. The suite
	// checks that it is taken and that 0 and one more are refused with
	// [locks.ErrInvalidOption].
	MaxSemaphoreSize int

	// CrashRecovery bounds how long after Kill(holder) another client can
	// hold the holder's names. The suite checks it with a margin of a
	// quarter of the bound plus 250ms for scheduling.
	CrashRecovery time.Duration

	// PauseRecovery bounds how long after a holder process stops running
	// (paused with SIGSTOP: its sockets stay open, it sends nothing)
	// another client can hold its names. Zero means CrashRecovery.
	PauseRecovery time.Duration

	// CancelGrace is how much longer than its context a blocking call may
	// take to return, for backends whose broker calls cannot be
	// interrupted: they wait that long for a call in flight to finish, to
	// undo what it did, so that a cancelled call leaves nothing held.
	CancelGrace time.Duration

	// LossDetection bounds how long a lease takes to end after it was taken
	// away at the broker (Kill, or Revoke where the harness is a Revoker).
	LossDetection time.Duration

	// CloseBound bounds how long a client's Close takes, with a ctx that
	// never ends, while its broker does not answer (its link open and
	// silent): the backend's documented bound, such as a call timeout.
	// Zero skips the check.
	CloseBound time.Duration

	// InvalidNames are names the broker cannot take, beyond the empty name
	// (which every backend rejects). Each must give [locks.ErrInvalidName].
	InvalidNames []string
}

// Revoker is an optional interface that may be implemented by a [Harness]:
// Revoke takes every lease on name away at the broker, as an administrator
// would (deleting the key or queue), without telling the holders.
type Revoker interface {
	Revoke(ctx context.Context, name string) error
}

// PriorityHarness is an optional interface that may be implemented by a
// [Harness] whose backend supports priorities: NewPriorityClient is
// NewClient with the given priority for every request of the client.
type PriorityHarness interface {
	NewPriorityClient(ctx context.Context, priority int) (Client, error)
}

// OptionChecker is an optional interface that may be implemented by a
// [Harness]: InvalidOptions calls the backend's constructors with option
// values out of range and returns the errors they gave, each of which must
// match [locks.ErrInvalidOption].
type OptionChecker interface {
	InvalidOptions(ctx context.Context) []error
}

// LeakFilter is an optional interface that may be implemented by a
// [Harness] whose broker runs inside the test process (an embedded
// server): IgnoreLeaks returns goleak options matching the broker's own
// goroutines, such as the state a server keeps for a crashed client until
// it times out, which the leak checks would otherwise blame on the
// backend. The backend's own goroutines must never match them.
type LeakFilter interface {
	IgnoreLeaks() []goleak.Option
}

// leakOptions returns the goleak options of a check for goroutines started
// after current was taken: current itself plus h's filters.
func leakOptions(current goleak.Option, h Harness) []goleak.Option {
	opts := []goleak.Option{current}
	if f, ok := h.(LeakFilter); ok {
		opts = append(opts, f.IgnoreLeaks()...)
	}
	return opts
}
