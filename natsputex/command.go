package natsputex

import (
	"context"
	"fmt"
	"os"
	"os/exec"
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
// "systemctl start db.service". putex's advice holds: the commands should
// signal a service manager, not be the service, and fencing belongs in
// the service manager's dependencies too. observe may be nil.
func CommandService(start, stop string, observe func(Event)) Service {
	svc := Service{Observe: observe}
	if start != "" {
		svc.Start = func(ctx context.Context) error { return runCommand(ctx, start, nil) }
	}
	if stop != "" {
		svc.Stop = func(ctx context.Context) error { return runCommand(ctx, stop, nil) }
	}
	return svc
}
