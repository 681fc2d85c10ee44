package command

import (
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"sync"
)

// A Reaper is a small process (/bin/sh) that outlives this one: if this
// process dies (a kill -9, a crash) while it tracks process groups, it
// runs its stop command, if any, and kills those groups with SIGKILL,
// so that what ran under a lease does not run on after its supervisor
// died, until the lease runs out at the broker and another holder takes
// it. It learns of the death by the end of a pipe, so it acts at once on
// every Unix system; it runs in a process group of its own, so a signal
// to this process's group does not reach it.
//
// What it cannot reach: a process that left its group (a daemon that
// calls setsid, a unit systemd runs) is stopped by the stop command
// only; a reaper killed with this process (kill -9 of both, a cgroup
// killed whole) does nothing; a process paused rather than dead is not
// noticed (fencing tokens are what protect against it). A group whose
// processes had all ended may have had its number reused by then: the
// reaper kills whatever group has that number. Elsewhere than Unix,
// [StartReaper] returns an error.
//
// A Reaper is safe for concurrent use; a nil *Reaper is allowed and
// does nothing.
type Reaper struct {
	mu   sync.Mutex
	w    *os.File // the pipe to the reaper; nil once closed
	cmd  *exec.Cmd
	fail error // the first failed write to the reaper
}

// StartReaper starts a reaper. name (the command's, say "natslock") is
// in its messages, which go to this process's standard error; stop, if
// not empty, is run with /bin/sh -c before the groups are killed.
func StartReaper(name, stop string) (*Reaper, error) {
	r, w, err := os.Pipe()
	if err != nil {
		return nil, fmt.Errorf("command: reaper: %w", err)
	}
	defer r.Close()
	cmd := exec.Command("/bin/sh", "-c", reaperScript, name+"-reaper", name, stop)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = r, os.Stderr, os.Stderr
	if err := reaperGroup(cmd); err != nil {
		w.Close()
		return nil, fmt.Errorf("command: reaper: %w", err)
	}
	if err := cmd.Start(); err != nil {
		w.Close()
		return nil, fmt.Errorf("command: reaper: %w", err)
	}
	return &Reaper{w: w, cmd: cmd}, nil
}

// reaperScript is the reaper: it reads "up <pgid>" (track group pgid),
// "gone <pgid>" (forget it) and "down" (forget every group) until the
// pipe ends, and then, if it tracks a group, runs the stop command ($2)
// and kills the groups. $1 is the name of the command it serves.
const reaperScript = `trap '' INT TERM HUP QUIT
up=
while read -r what pgid; do
	case $what in
	up) up="$up $pgid" ;;
	gone) left=; for g in $up; do [ "$g" = "$pgid" ] || left="$left $g"; done; up=$left ;;
	down) up= ;;
	esac
done
[ -n "$up" ] || exit 0
trap - INT TERM HUP QUIT
if [ -n "$2" ]; then
	echo "$1-reaper: $1 ended with what it ran still up: running the stop command, killing process group(s)$up" >&2
	/bin/sh -c "$2" "$1" || echo "$1-reaper: the stop command failed" >&2
else
	echo "$1-reaper: $1 ended with what it ran still up: killing process group(s)$up" >&2
fi
for g in $up; do kill -KILL "-$g" 2>/dev/null; done
exit 0
`

// Track tells the reaper to kill process group pgid should this process
// die.
func (r *Reaper) Track(pgid int) { r.tell("up " + strconv.Itoa(pgid)) }

// Untrack tells the reaper to forget process group pgid.
func (r *Reaper) Untrack(pgid int) { r.tell("gone " + strconv.Itoa(pgid)) }

// Clear tells the reaper to forget every group: what it tracked is
// stopped (the stop command succeeded).
func (r *Reaper) Clear() { r.tell("down") }

// tell sends one line to the reaper.
func (r *Reaper) tell(line string) {
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
// exit: at once if it tracks no group; after running the stop command
// and killing the groups if it does. It returns the error of a failed
// message to the reaper, if any. Close is idempotent; a nil Reaper
// returns nil.
func (r *Reaper) Close() error {
	if r == nil {
		return nil
	}
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
		return fmt.Errorf("command: reaper: %w", err)
	}
	return nil
}
