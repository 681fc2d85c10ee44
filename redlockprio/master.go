package redlockprio

import (
	"context"
	"errors"
	"net"
	"sync/atomic"

	"github.com/redis/go-redis/v9"
)

// master is one independent Redis master (or cluster).
type master struct {
	index int
	addr  string
	c     redis.UniversalClient

	// deadlines says the client ends a call at its context's deadline
	// (ContextTimeoutEnabled), so that a call may run on the caller's
	// goroutine without outliving the caller's wait.
	deadlines bool

	// oneShot says the client makes one attempt per command (no retries,
	// no cluster redirects): a dial error it returns then means the
	// command was never sent (see sendErr).
	oneShot bool

	renewScript atomic.Int32 // scriptUnknown, scriptLoading or scriptLoaded

	// verified says the master is known to be a server of its own (see
	// Client.verify): only then do its grants count.
	verified atomic.Bool
}

// runScript runs s by SHA on c, falling back to EVAL (which loads it) on
// NOSCRIPT.
func runScript(ctx context.Context, s *redis.Script, c redis.UniversalClient, keys []string, args ...any) (any, error) {
	return s.Run(ctx, c, keys, args...).Result()
}

// isClosed reports whether err says the client itself was closed.
func isClosed(err error) bool {
	return errors.Is(err, redis.ErrClosed)
}

// notSentError is the error of a call that never reached its master:
// the master took nothing from it.
type notSentError struct{ err error }

func (e *notSentError) Error() string { return e.err.Error() }
func (e *notSentError) Unwrap() error { return e.err }

// unsent marks err, if not nil, as the error of a call that was never
// sent.
func unsent(err error) error {
	if err == nil {
		return nil
	}
	return &notSentError{err: err}
}

// sendErr classifies the error of one command sent through m's client:
// a dial that failed (refused, unreachable, timed out: *net.OpError with
// Op "dial", which go-redis also returns at once while its pool remembers
// the last dial failure) or no connection from the pool means the command
// was never written, when the client makes one attempt per command. A
// client that retries may have written it on an earlier attempt whose
// error it does not return: its errors stay unclassified (the master may
// have run the command).
func (m *master) sendErr(err error) error {
	if err == nil || !m.oneShot {
		return err
	}
	var op *net.OpError
	if errors.As(err, &op) && op.Op == "dial" || errors.Is(err, redis.ErrPoolTimeout) || errors.Is(err, redis.ErrPoolExhausted) {
		return unsent(err)
	}
	return err
}

// notSent reports whether err says a call never reached its master, so
// that the master certainly took nothing from it: the step ended before
// the call was made (a failed verification, the wait for an earlier call
// about the name), the dial failed (see sendErr), or the client was
// closed. Every other error leaves the master's state unknown: the call
// may have run there, its answer lost.
func notSent(err error) bool {
	var ns *notSentError
	return errors.As(err, &ns) || isClosed(err)
}
