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
	"sync"
	"time"
)

// commandWaitDelay bounds how long a killed command's leftover children
// may hold its output open.
const commandWaitDelay = time.Second

// runCommand runs command with sh -c, args as $1…, and returns its error
// with the end of its output. The command is killed when ctx ends, with
// the processes it started (on Unix: its process group). started, if not
// nil, is told the command's process group once it runs.
func runCommand(ctx context.Context, command string, env []string, started func(pgid int), args ...string) error {
	cmd := exec.CommandContext(ctx, "/bin/sh", append([]string{"-c", command, "natslock"}, args...)...)
	cmd.Env = append(os.Environ(), env...)
	cmd.WaitDelay = commandWaitDelay
	killGroupOnCancel(cmd)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Start()
	if err == nil {
		if started != nil {
			started(cmd.Process.Pid)
		}
		err = cmd.Wait()
	}
	if err != nil {
		msg := strings.TrimSpace(out.String())
		if len(msg) > 200 {
			msg = "…" + msg[len(msg)-200:]
		}
		if errors.Is(err, exec.ErrWaitDelay) {
			err = fmt.Errorf("%w (a process it started in the background still holds its output: redirect it)", err)
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
		return runCommand(ctx, command, []string{"NATSLOCK_STATE=" + s.String()}, nil, s.String())
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
// learns of the death by the end of a pipe, so it acts at once on every
// Unix system; it runs in a process group of its own, so a signal to
// this process's group does not reach it. What it cannot reach: a
// service that left its start command's process group (a daemon that
// calls setsid, a unit systemd runs) is stopped by the stop command
// only; a reaper killed with this process (kill -9 of both, a cgroup
// killed whole) does nothing; a process paused rather than dead is not
// noticed (fencing tokens are what protect against it). A group whose
// processes had all ended may have had its number reused by then: the
// reaper kills whatever group has that number. Elsewhere than Unix,
// [StartCommandReaper] returns an error.
//
// A CommandReaper is safe for concurrent use.
type CommandReaper struct {
	mu   sync.Mutex
	w    *os.File // the pipe to the reaper; nil once closed
	cmd  *exec.Cmd
	fail error // the first failed write to the reaper
}

// StartCommandReaper starts a reaper that runs stop (with /bin/sh -c) if
// this process dies while the service is up; its messages go to this
// process's standard error.
func StartCommandReaper(stop string) (*CommandReaper, error) {
	r, w, err := os.Pipe()
	if err != nil {
		return nil, fmt.Errorf("natsputex: reaper: %w", err)
	}
	defer r.Close()
	cmd := exec.Command("/bin/sh", "-c", reaperScript, "natslock-reaper", stop)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = r, os.Stderr, os.Stderr
	if err := ownProcessGroup(cmd); err != nil {
		w.Close()
		return nil, fmt.Errorf("natsputex: reaper: %w", err)
	}
	if err := cmd.Start(); err != nil {
		w.Close()
		return nil, fmt.Errorf("natsputex: reaper: %w", err)
	}
	return &CommandReaper{w: w, cmd: cmd}, nil
}

// reaperScript is the reaper: it reads "up <pgid>" (a start command
// began in process group pgid) and "down" (the service stopped) until
// the pipe ends, and then, if the service may be up, runs the stop
// command ($1) and kills the groups.
const reaperScript = `trap '' INT TERM HUP QUIT
up=
while read -r what pgid; do
	case $what in
	up) up="$up $pgid" ;;
	down) up= ;;
	esac
done
[ -n "$up" ] || exit 0
echo "natslock-reaper: natslock ended with its service up: running the stop command, killing process group(s)$up" >&2
trap - INT TERM HUP QUIT
if [ -n "$1" ]; then /bin/sh -c "$1" natslock || echo "natslock-reaper: the stop command failed" >&2; fi
for g in $up; do kill -KILL "-$g" 2>/dev/null; done
exit 0
`

// tell sends one line to the reaper.
func (r *CommandReaper) tell(line string) {
	if r == nil {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.w == nil {
		return
	}
	if _, err := r.w.WriteString(line + "\n"); err != nil && r.fail == nil {
		r.fail = err
	}
}

// Close tells the reaper this process is ending and waits for it to
// exit: at once if the service is stopped; after running the stop
// command and killing the start commands' groups if it may still be up
// (the last Stop failed). It returns the error of a failed message to
// the reaper, if any. Close is idempotent.
func (r *CommandReaper) Close() error {
	r.mu.Lock()
	w := r.w
	r.w = nil
	r.mu.Unlock()
	if w == nil {
		return nil
	}
	err := w.Close()
	if werr := r.cmd.Wait(); err == nil {
		err = werr
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.fail != nil {
		err = r.fail
	}
	if err != nil {
		return fmt.Errorf("natsputex: reaper: %w", err)
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
			return runCommand(ctx, start, []string{"NATSLOCK_TOKEN=" + t}, func(pgid int) {
				r.tell("up " + strconv.Itoa(pgid))
			}, t)
		}
	}
	svc.Stop = func(ctx context.Context) error {
		if stop != "" {
			if err := runCommand(ctx, stop, nil, nil); err != nil {
				return err
			}
		}
		r.tell("down")
		return nil
	}
	return svc
}
