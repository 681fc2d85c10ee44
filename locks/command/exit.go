package command

import (
	"errors"
	"os"
)

// Exit codes shared by latchkey's commands: natslock, amqpsem and
// redlockrun (natslock uses the first three only). A command run under a
// lease has its own exit status passed on otherwise (see [ExitCode]), so
// these are distinct only from a command that does not use them.
//
// 2 is none of them: it is what the Go runtime exits with on a panic or
// SIGQUIT (which dumps the goroutines), so a usage error must not look
// like a crash.
const (
	// ExitOK: the command ran and succeeded.
	ExitOK = 0
	// ExitError: an error (broker unreachable, the command not found...).
	ExitError = 1
	// ExitUsage: bad flags or arguments. It is sysexits' EX_USAGE, not 2,
	// which the Go runtime exits with on a panic or SIGQUIT.
	ExitUsage = 64
	// ExitNotAcquired: the lock was not acquired (held, with -try; a
	// timeout passed). For the commands that acquire a lease and then run
	// a command under it; a command that does not (natslock) may give 3
	// a meaning of its own.
	ExitNotAcquired = 3
	// ExitLost: the lease was lost while the command ran; the command was
	// sent SIGTERM, and SIGKILL after the grace period.
	ExitLost = 4
)

// ErrStopped is what [Run]'s error matches when its context ended while
// the command ran: the command was stopped (SIGTERM, then SIGKILL after
// the grace period). The error also wraps the context's cause.
var ErrStopped = errors.New("command: stopped, its context ended")

// ExitCode returns the exit code a command that ran another should exit
// with to pass on how it ended: its exit status, or 128+N when it was
// killed by signal N, as shells report it. A nil state gives [ExitError].
func ExitCode(state *os.ProcessState) int {
	if state == nil {
		return ExitError
	}
	if n, ok := killedBy(state); ok {
		return 128 + n
	}
	return state.ExitCode()
}
