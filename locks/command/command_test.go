//go:build unix

package command_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/latchkey-go/latchkey/locks"
	"github.com/latchkey-go/latchkey/locks/command"
	"github.com/latchkey-go/latchkey/locks/memlock"
)

// TestMain doubles as the helper process of TestReaperKill9: with
// COMMAND_TEST_HELPER set, the test binary runs a command under a
// reaper and waits to be killed.
func TestMain(m *testing.M) {
	if pidFile := os.Getenv("COMMAND_TEST_HELPER"); pidFile != "" {
		os.Exit(helper(pidFile))
	}
	os.Exit(m.Run())
}

// helper starts a reaper and runs a shell that writes its pid to pidFile
// and sleeps; it never returns before it is killed.
func helper(pidFile string) int {
	r, err := command.StartReaper("helper", "")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	cmd := exec.Command("/bin/sh", "-c", `sleep 60 & echo $! > "$0.tmp"; mv "$0.tmp" "$0"; wait`, pidFile)
	err = command.Run(context.Background(), cmd, command.Options{Reaper: r})
	fmt.Fprintln(os.Stderr, "helper: command ended:", err)
	return 1
}

// sh returns an unstarted /bin/sh -c script with args as $0, $1...
func sh(script string, args ...string) *exec.Cmd {
	return exec.Command("/bin/sh", append([]string{"-c", script}, args...)...)
}

// waitFile waits up to 10s for path to exist.
func waitFile(t *testing.T, path string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		if _, err := os.Stat(path); err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("no %s after 10s", filepath.Base(path))
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// readPid reads the process id in path.
func readPid(t *testing.T, path string) int {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		t.Fatal(err)
	}
	return pid
}

// alive reports whether process pid exists (a zombie counts as gone
// once reaped by its parent; the callers' processes are reparented to
// init, which reaps them).
func alive(pid int) bool { return syscall.Kill(pid, 0) == nil }

// waitGone fails the test unless process pid is gone within d.
func waitGone(t *testing.T, pid int, d time.Duration) {
	t.Helper()
	deadline := time.Now().Add(d)
	for alive(pid) {
		if time.Now().After(deadline) {
			_ = syscall.Kill(pid, syscall.SIGKILL)
			t.Fatalf("process %d still alive after %v", pid, d)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestExitCodes pins the documented codes every command shares: the
// usage code is sysexits' EX_USAGE, never 2, which the Go runtime exits
// with on a panic or SIGQUIT.
func TestExitCodes(t *testing.T) {
	for _, tc := range []struct {
		name      string
		got, want int
	}{
		{"ExitOK", command.ExitOK, 0},
		{"ExitError", command.ExitError, 1},
		{"ExitNotAcquired", command.ExitNotAcquired, 3},
		{"ExitLost", command.ExitLost, 4},
		{"ExitUsage", command.ExitUsage, 64},
	} {
		if tc.got != tc.want {
			t.Errorf("%s = %d, want %d", tc.name, tc.got, tc.want)
		}
	}
}

func TestExitCodePassedOn(t *testing.T) {
	for _, tc := range []struct {
		script string
		want   int
	}{
		{"exit 0", 0},
		{"exit 7", 7},
		{"kill -TERM $$", 128 + int(syscall.SIGTERM)},
		{"kill -KILL $$", 128 + int(syscall.SIGKILL)},
	} {
		cmd := sh(tc.script)
		err := command.Run(t.Context(), cmd, command.Options{})
		if errors.Is(err, command.ErrStopped) {
			t.Fatalf("%q: %v", tc.script, err)
		}
		if got := command.ExitCode(cmd.ProcessState); got != tc.want {
			t.Errorf("%q: exit code %d, want %d (err %v)", tc.script, got, tc.want, err)
		}
	}
	if got := command.ExitCode(nil); got != command.ExitError {
		t.Errorf("ExitCode(nil) = %d, want %d", got, command.ExitError)
	}
}

func TestNotStarted(t *testing.T) {
	cmd := exec.Command(filepath.Join(t.TempDir(), "missing"))
	err := command.Run(t.Context(), cmd, command.Options{})
	if err == nil || errors.Is(err, command.ErrStopped) || cmd.ProcessState != nil {
		t.Fatalf("Run of a missing program: %v", err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	marker := filepath.Join(t.TempDir(), "ran")
	err = command.Run(ctx, sh(`touch "$0"`, marker), command.Options{})
	if !errors.Is(err, command.ErrStopped) || !errors.Is(err, context.Canceled) {
		t.Fatalf("Run with an ended context: %v, want ErrStopped and context.Canceled", err)
	}
	if _, err := os.Stat(marker); err == nil {
		t.Fatal("the command ran under an ended context")
	}
}

// A command that exits on SIGTERM is stopped without SIGKILL; one that
// ignores it is killed after the grace period, with its whole group.
func TestStoppedWhenContextEnds(t *testing.T) {
	dir := t.TempDir()
	t.Run("term", func(t *testing.T) {
		started := filepath.Join(dir, "started-term")
		ctx, cancel := context.WithCancelCause(t.Context())
		cmd := sh(`trap 'exit 9' TERM; touch "$0"; while :; do sleep 0.05; done`, started)
		go func() { waitFile(t, started); cancel(errors.New("lost it")) }()
		var logged bytes.Buffer
		err := command.Run(ctx, cmd, command.Options{Grace: 10 * time.Second, Logf: func(f string, a ...any) { fmt.Fprintf(&logged, f, a...) }})
		if !errors.Is(err, command.ErrStopped) || !strings.Contains(err.Error(), "lost it") {
			t.Fatalf("Run: %v, want ErrStopped with the cause", err)
		}
		if got := command.ExitCode(cmd.ProcessState); got != 9 {
			t.Errorf("exit code %d, want 9 (the trap ran)", got)
		}
		if logged.Len() != 0 {
			t.Errorf("killed though it exited on SIGTERM: %s", logged.String())
		}
	})
	t.Run("kill", func(t *testing.T) {
		started, child := filepath.Join(dir, "started-kill"), filepath.Join(dir, "child")
		ctx, cancel := context.WithCancel(t.Context())
		cmd := sh(`trap '' TERM; sh -c 'trap "" TERM; echo $$ > "$0"; exec sleep 60' "$1" & touch "$0"; wait`, started, child)
		go func() { waitFile(t, started); waitFile(t, child); cancel() }()
		const grace = 300 * time.Millisecond
		var killed bool
		begin := time.Now()
		err := command.Run(ctx, cmd, command.Options{Grace: grace, Logf: func(string, ...any) { killed = true }})
		if !errors.Is(err, command.ErrStopped) {
			t.Fatalf("Run: %v, want ErrStopped", err)
		}
		if took := time.Since(begin); !killed || took < grace {
			t.Errorf("killed %v after %v, want a kill after the %v grace", killed, took, grace)
		}
		if got := command.ExitCode(cmd.ProcessState); got != 128+int(syscall.SIGKILL) {
			t.Errorf("exit code %d, want SIGKILL's", got)
		}
		waitGone(t, readPid(t, child), 5*time.Second)
	})
}

// Caught signals go to the command's group; the command's exit status
// comes back.
func TestSignalForwarded(t *testing.T) {
	for _, sig := range []syscall.Signal{syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP} {
		t.Run(sig.String(), func(t *testing.T) {
			started := filepath.Join(t.TempDir(), "started")
			sigs := command.CatchSignals()
			defer sigs.Stop()
			cmd := sh(`trap 'exit 5' INT TERM HUP; touch "$0"; while :; do sleep 0.05; done`, started)
			go func() {
				waitFile(t, started)
				_ = syscall.Kill(os.Getpid(), sig)
			}()
			err := command.Run(t.Context(), cmd, command.Options{Signals: sigs})
			if got := command.ExitCode(cmd.ProcessState); got != 5 {
				t.Fatalf("exit code %d (%v), want 5 from the trap", got, err)
			}
		})
	}
}

// A signal while waiting ends the wait's context, and is forwarded to
// the command should it run all the same.
func TestSignalsContext(t *testing.T) {
	sigs := command.CatchSignals()
	defer sigs.Stop()
	ctx, cancel := sigs.Context(t.Context())
	_ = syscall.Kill(os.Getpid(), syscall.SIGHUP)
	select {
	case <-ctx.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("SIGHUP did not end the wait's context")
	}
	cancel()
	if cause := context.Cause(ctx); cause == nil || !strings.Contains(cause.Error(), "hangup") {
		t.Errorf("cause %v, want the signal named", cause)
	}
	// The kept signal reaches the command as it starts: before or after
	// its trap is set.
	cmd := sh(`trap 'exit 6' HUP; while :; do sleep 0.05; done`)
	_ = command.Run(t.Context(), cmd, command.Options{Signals: sigs})
	if got := command.ExitCode(cmd.ProcessState); got != 6 && got != 128+int(syscall.SIGHUP) {
		t.Fatalf("exit code %d, want 6 or SIGHUP's: the signal kept for the command", got)
	}

	// Once cancelled, the context no longer takes signals.
	ctx, cancel = sigs.Context(t.Context())
	cancel()
	if !errors.Is(context.Cause(ctx), context.Canceled) {
		t.Errorf("cancelled wait's cause: %v", context.Cause(ctx))
	}
}

// What a command leaves in its group dies with it, unless KeepGroup.
func TestLeftoversKilled(t *testing.T) {
	for _, keep := range []bool{false, true} {
		t.Run(fmt.Sprint("keep=", keep), func(t *testing.T) {
			pidFile := filepath.Join(t.TempDir(), "pid")
			var out bytes.Buffer
			cmd := sh(`sleep 60 & echo $! > "$0"; echo bye`, pidFile)
			cmd.Stdout = &out // the leftover holds it open: WaitDelay ends the wait
			begin := time.Now()
			if err := command.Run(t.Context(), cmd, command.Options{KeepGroup: keep}); err != nil && !errors.Is(err, exec.ErrWaitDelay) {
				t.Fatal(err)
			}
			if took := time.Since(begin); took > 10*time.Second {
				t.Errorf("Run took %v: the leftover held it", took)
			}
			pid := readPid(t, pidFile)
			if keep {
				if !alive(pid) {
					t.Fatal("KeepGroup: the leftover was killed")
				}
				_ = syscall.Kill(pid, syscall.SIGKILL)
				return
			}
			waitGone(t, pid, 5*time.Second)
			if !strings.Contains(out.String(), "bye") {
				t.Errorf("output %q, want bye", out.String())
			}
		})
	}
}

// A kill -9 of the supervising process: its reaper kills the command's
// group at once.
func TestReaperKill9(t *testing.T) {
	pidFile := filepath.Join(t.TempDir(), "pid")
	h := exec.Command(os.Args[0], "-test.run=^$")
	h.Env = append(os.Environ(), "COMMAND_TEST_HELPER="+pidFile)
	var out bytes.Buffer
	h.Stderr = &out
	if err := h.Start(); err != nil {
		t.Fatal(err)
	}
	waitFile(t, pidFile)
	child := readPid(t, pidFile)
	if !alive(child) {
		t.Fatal("the helper's command is not running")
	}
	if err := h.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	_ = h.Wait()
	waitGone(t, child, 5*time.Second)
	time.Sleep(100 * time.Millisecond) // the reaper's message
	if !strings.Contains(out.String(), "helper-reaper: helper ended") {
		t.Errorf("the reaper said nothing: %q", out.String())
	}
	// The helper's reaper has no stop command: it does not claim to run one.
	if strings.Contains(out.String(), "stop command") {
		t.Errorf("a reaper without a stop command speaks of one: %q", out.String())
	}
}

// Reaper.Close with nothing tracked returns at once; a nil Reaper is a
// no-op.
func TestReaperClose(t *testing.T) {
	r, err := command.StartReaper("test", "exit 1")
	if err != nil {
		t.Fatal(err)
	}
	r.Track(1 << 22) // no such group
	r.Untrack(1 << 22)
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
	if err := r.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	var none *command.Reaper
	none.Track(1)
	if err := none.Close(); err != nil {
		t.Fatal(err)
	}
}

// RunLease: the lease's name, token and slot in the environment, the
// command's code passed on, and ExitLost when the lease is revoked.
func TestRunLease(t *testing.T) {
	store := memlock.New()
	c, err := store.NewClient()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close(context.Background()) })
	lease, err := c.Locker().Lock(t.Context(), "job")
	if err != nil {
		t.Fatal(err)
	}
	defer lease.Release(context.Background())

	var out bytes.Buffer
	cmd := sh(`echo "$LOCK_NAME $LOCK_TOKEN $LOCK_SLOT"; exit 3`)
	cmd.Stdout = &out
	code, err := command.RunLease(lease, cmd, command.Options{})
	if code != 3 || err != nil {
		t.Fatalf("RunLease: %d, %v; want 3, nil", code, err)
	}
	if want := fmt.Sprintf("job %d 0\n", lease.Token()); out.String() != want {
		t.Errorf("environment %q, want %q", out.String(), want)
	}

	started := filepath.Join(t.TempDir(), "started")
	go func() { waitFile(t, started); store.Revoke("job") }()
	code, err = command.RunLease(lease, sh(`touch "$0"; exec sleep 60`, started), command.Options{Grace: time.Second})
	if code != command.ExitLost || !errors.Is(err, command.ErrStopped) || !errors.Is(err, locks.ErrLost) {
		t.Fatalf("RunLease of a revoked lease: %d, %v; want ExitLost and ErrLost", code, err)
	}
}
