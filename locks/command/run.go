package command

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"time"

	"github.com/latchkey-go/latchkey/locks"
)

// DefaultWaitDelay is the [exec.Cmd.WaitDelay] [Run] sets when a command
// has none: how long, after the command exits, what it left running may
// hold its output pipes open before Run stops reading them.
const DefaultWaitDelay = time.Second

// Options say how [Run] treats a command. The zero Options sends SIGKILL
// right after SIGTERM, forwards no signal and keeps no reaper.
type Options struct {
	// Grace is how long the command's group has to exit after SIGTERM,
	// once the context has ended, before it is sent SIGKILL.
	Grace time.Duration

	// Signals, if not nil, are forwarded to the command's group while it
	// runs.
	Signals *Signals

	// Reaper, if not nil, tracks the command's group while it runs (and
	// after, with KeepGroup).
	Reaper *Reaper

	// KeepGroup leaves what the command started in its group running
	// after it exits (a start command that leaves a service in the
	// background); its Reaper keeps tracking the group. By default the
	// group is killed once the command has exited.
	KeepGroup bool

	// Logf, if not nil, is told of the SIGKILL sent after the grace
	// period.
	Logf func(format string, args ...any)
}

// Run starts cmd, which must not have been started, in a process group
// of its own and waits for it to exit. Signals caught by o.Signals are
// forwarded to the group meanwhile. When ctx ends first, the group is
// sent SIGTERM, then SIGKILL if the command has not exited o.Grace
// later, and Run returns, once the command has exited, an error
// matching [ErrStopped] and the context's cause. Otherwise it returns
// what [exec.Cmd.Wait] returned; either way cmd.ProcessState then says
// how the command ended ([ExitCode]). Unless o.KeepGroup, the group is
// killed (SIGKILL) after the command exits, before Run returns. Run
// sets cmd.WaitDelay to [DefaultWaitDelay] if it is zero. A ctx that
// has ended already gives [ErrStopped] without starting cmd.
func Run(ctx context.Context, cmd *exec.Cmd, o Options) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("%w: %w", ErrStopped, context.Cause(ctx))
	}
	if err := ownGroup(cmd); err != nil {
		return err
	}
	if cmd.WaitDelay == 0 {
		cmd.WaitDelay = DefaultWaitDelay
	}
	if err := cmd.Start(); err != nil {
		return err
	}
	o.Reaper.Track(cmd.Process.Pid)
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	err := supervise(ctx, cmd.Process, done, o)
	if !o.KeepGroup {
		_ = signalGroup(cmd.Process, os.Kill)
		o.Reaper.Untrack(cmd.Process.Pid)
	}
	return err
}

// supervise forwards signals to p's group, stops it when ctx ends, and
// returns when done delivers the command's end.
func supervise(ctx context.Context, p *os.Process, done <-chan error, o Options) error {
	ctxDone := ctx.Done()
	var kill <-chan time.Time
	var stopped error
	for {
		select {
		case err := <-done:
			if stopped != nil {
				return stopped
			}
			return err
		case sig := <-o.Signals.caught():
			_ = signalGroup(p, sig)
		case <-ctxDone:
			ctxDone = nil
			stopped = fmt.Errorf("%w: %w", ErrStopped, context.Cause(ctx))
			_ = signalGroup(p, terminate)
			t := time.NewTimer(o.Grace)
			defer t.Stop()
			kill = t.C
		case <-kill:
			kill = nil
			if o.Logf != nil {
				o.Logf("the command did not exit %v after SIGTERM: killing it", o.Grace)
			}
			_ = signalGroup(p, os.Kill)
		}
	}
}

// RunLease runs cmd under lease with [Run], under the lease's context,
// adding [Env] to its environment, and returns the exit code to exit
// with: the command's own ([ExitCode]) when it ran to its end;
// [ExitLost], with an error matching [ErrStopped] and the lease's cause,
// when the lease ended first; [ExitError] with the error when it could
// not run. RunLease neither releases the lease nor stops o.Signals.
func RunLease(lease locks.Lease, cmd *exec.Cmd, o Options) (int, error) {
	if cmd.Env == nil {
		cmd.Env = os.Environ()
	}
	cmd.Env = append(cmd.Env, Env(lease)...)
	err := Run(lease.Context(), cmd, o)
	switch {
	case errors.Is(err, ErrStopped):
		return ExitLost, err
	case cmd.ProcessState != nil:
		return ExitCode(cmd.ProcessState), nil
	case err != nil:
		return ExitError, err
	}
	return ExitOK, nil
}

// Environment variables [Env] sets.
const (
	EnvName  = "LOCK_NAME"  // the lease's name
	EnvToken = "LOCK_TOKEN" // its fencing token (0: the backend has none)
	EnvSlot  = "LOCK_SLOT"  // its slot, 1..N, 0 for a lock
)

// Env returns the environment a command run under lease gets:
// LOCK_NAME, LOCK_TOKEN and, when the lease implements
// [locks.SlotLease], LOCK_SLOT.
func Env(lease locks.Lease) []string {
	env := []string{
		EnvName + "=" + lease.Name(),
		EnvToken + "=" + strconv.FormatUint(lease.Token(), 10),
	}
	if s, ok := lease.(locks.SlotLease); ok {
		env = append(env, EnvSlot+"="+strconv.Itoa(s.Slot()))
	}
	return env
}
