package natsputex

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"time"
)

// commandWaitDelay bounds how long a killed command's leftover children
// may hold its output open.
const commandWaitDelay = time.Second

// runCommand runs command with sh -c, args as $1…, and returns its error
// with the end of its output. The command is killed when ctx ends, with
// the processes it started (on Unix: its process group).
func runCommand(ctx context.Context, command string, env []string, args ...string) error {
	cmd := exec.CommandContext(ctx, "/bin/sh", append([]string{"-c", command, "natslock"}, args...)...)
	cmd.Env = append(os.Environ(), env...)
	cmd.WaitDelay = commandWaitDelay
	killGroupOnCancel(cmd)
	out, err := cmd.CombinedOutput()
	if err != nil {
		msg := strings.TrimSpace(string(out))
		if len(msg) > 200 {
			msg = "…" + msg[len(msg)-200:]
		}
		if msg != "" {
			return fmt.Errorf("%q: %w: %s", command, err, msg)
		}
		return fmt.Errorf("%q: %w", command, err)
	}
	return nil
}

// CommandHealthCheck returns a [HealthCheck] that runs command with
// /bin/sh -c, passing the state ("active" or "standby") as $1 and in the
// environment variable NATSLOCK_STATE; a non-zero exit fails the check.
// The command is killed when the check's context ends (after T), with
// the processes it started (on Unix: its process group).
func CommandHealthCheck(command string) HealthCheck {
	return func(ctx context.Context, s State) error {
		return runCommand(ctx, command, []string{"NATSLOCK_STATE=" + s.String()}, s.String())
	}
}

// CommandService returns a [Service] that runs start and stop with
// /bin/sh -c (an empty command does nothing), for example
// "systemctl start db.service". The start command gets the hold's
// fencing token (see [Service.Start]) in the environment variable
// NATSLOCK_TOKEN and as $1: pass it on to what the service writes to
// (a database column, a file's header), which refuses a token lower than
// the highest it has seen. putex's advice holds: the commands should
// signal a service manager, not be the service, and fencing belongs in
// the service manager's dependencies too. The commands must return: the
// agent waits for them. observe may be nil.
func CommandService(start, stop string, observe func(Event)) Service {
	svc := Service{Observe: observe}
	if start != "" {
		svc.Start = func(ctx context.Context, token uint64) error {
			t := strconv.FormatUint(token, 10)
			return runCommand(ctx, start, []string{"NATSLOCK_TOKEN=" + t}, t)
		}
	}
	if stop != "" {
		svc.Stop = func(ctx context.Context) error { return runCommand(ctx, stop, nil) }
	}
	return svc
}
