package natsputex

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"time"

	"github.com/latchkey-go/latchkey/locks/command"
)

// commandWaitDelay bounds how long a command's leftover children may
// hold its output open.
const commandWaitDelay = time.Second

// runCommand runs cmdline with sh -c, args as $1…, and returns its error
// with the end of its output. It runs in a process group of its own,
// killed when ctx ends, with the processes the command started; what it
// leaves running in the group after it returns (a service) is left
// alone. reaper, if not nil, tracks the group.
func runCommand(ctx context.Context, cmdline string, env []string, reaper *command.Reaper, args ...string) error {
	cmd := exec.Command("/bin/sh", append([]string{"-c", cmdline, "natslock"}, args...)...)
	cmd.Env = append(os.Environ(), env...)
	cmd.WaitDelay = commandWaitDelay
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := command.Run(ctx, cmd, command.Options{Reaper: reaper, KeepGroup: true})
	if errors.Is(err, command.ErrStopped) {
		// Killed when ctx ended: report how it ended, or ctx's error.
		err = ctx.Err()
		if st := cmd.ProcessState; st != nil && !st.Success() {
			err = &exec.ExitError{ProcessState: st}
		}
	}
	if err == nil {
		return nil
	}
	msg := strings.TrimSpace(out.String())
	if len(msg) > 200 {
		msg = "…" + msg[len(msg)-200:]
	}
	if errors.Is(err, exec.ErrWaitDelay) {
		err = fmt.Errorf("%w (a process it started in the background still holds its output: redirect it)", err)
	}
	if msg != "" {
		return fmt.Errorf("%q: %w: %s", cmdline, err, msg)
	}
	return fmt.Errorf("%q: %w", cmdline, err)
}

// CommandHealthCheck returns a [HealthCheck] that runs command with
// /bin/sh -c, passing the state ("active" or "standby") as $1 and in the
// environment variable NATSLOCK_STATE; a non-zero exit fails the check.
// The command is killed when the check's context ends (after T), with
// the processes it started (on Unix: its process group).
func CommandHealthCheck(command string) HealthCheck {
	return func(ctx context.Context, s State) error {
		return runCommand(ctx, command, []string{"NATSLOCK_STATE=" + s.String()}, nil, s.String())
	}
}

// CommandService returns a [Service] that runs start and stop with
// /bin/sh -c (an empty command does nothing), for example
// "systemctl start db.service". The start command gets the hold's
// fencing token (see [Service.Start]) in the environment variables
// NATSLOCK_TOKEN and LOCK_TOKEN (as every command run under a lease
// gets it, see package locks/command) and as $1: pass it on to what the service writes to
// (a database column, a file's header), which refuses a token lower than
// the highest it has seen. putex's advice holds: the commands should
// signal a service manager, not be the service, and fencing belongs in
// the service manager's dependencies too. The commands must return: the
// agent waits for them, and a process a command leaves in the
// background must redirect its output, or the command counts as failed
// a second after it returns. observe may be nil.
func CommandService(start, stop string, observe func(Event)) Service {
	return (*CommandReaper)(nil).Service(start, stop, observe)
}

// A CommandReaper is a small process (/bin/sh) that outlives this one:
// if this process dies while the service of a [CommandReaper.Service]
// may be up (a kill -9, a crash), it runs the stop command and kills the
// process groups of the start commands that ran since the last stop
// that succeeded, with whatever they left running in the background. It
// is a [command.Reaper] (see there what it cannot reach); elsewhere than
// Unix, [StartCommandReaper] returns an error.
//
// A CommandReaper is safe for concurrent use.
type CommandReaper struct {
	r *command.Reaper
}

// StartCommandReaper starts a reaper that runs stop (with /bin/sh -c) if
// this process dies while the service is up; its messages go to this
// process's standard error.
func StartCommandReaper(stop string) (*CommandReaper, error) {
	r, err := command.StartReaper("natslock", stop)
	if err != nil {
		return nil, fmt.Errorf("natsputex: %w", err)
	}
	return &CommandReaper{r: r}, nil
}

// reaper returns the command.Reaper, nil for a nil CommandReaper.
func (r *CommandReaper) reaper() *command.Reaper {
	if r == nil {
		return nil
	}
	return r.r
}

// Close tells the reaper this process is ending and waits for it to
// exit: at once if the service is stopped; after running the stop
// command and killing the start commands' groups if it may still be up
// (the last Stop failed). It returns the error of a failed message to
// the reaper, if any. Close is idempotent.
func (r *CommandReaper) Close() error {
	if err := r.reaper().Close(); err != nil {
		return fmt.Errorf("natsputex: %w", err)
	}
	return nil
}

// Service is [CommandService] with the reaper told of each start command
// and each stop that succeeds. A nil reaper is allowed: no reaper.
func (r *CommandReaper) Service(start, stop string, observe func(Event)) Service {
	svc := Service{Observe: observe}
	if start != "" {
		svc.Start = func(ctx context.Context, token uint64) error {
			t := strconv.FormatUint(token, 10)
			env := []string{"NATSLOCK_TOKEN=" + t, command.EnvToken + "=" + t}
			return runCommand(ctx, start, env, r.reaper(), t)
		}
	}
	svc.Stop = func(ctx context.Context) error {
		if stop != "" {
			if err := runCommand(ctx, stop, nil, nil); err != nil {
				return err
			}
		}
		r.reaper().Clear()
		return nil
	}
	return svc
}
