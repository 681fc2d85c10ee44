//go:build unix

package cmdtest

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// Build builds the main package in the directory dir (relative to the
// test's working directory: "." for the package under test) with go build
// into t.TempDir(), and returns the program's path. The program is named
// after the directory, as go build names it. A failed build fails the test.
func Build(t testing.TB, dir string) string {
	t.Helper()
	abs, err := filepath.Abs(dir)
	if err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(t.TempDir(), filepath.Base(abs))
	if out, err := exec.Command("go", "build", "-o", bin, abs).CombinedOutput(); err != nil {
		t.Fatalf("go build %s: %v\n%s", dir, err, out)
	}
	return bin
}

// UniqueName returns prefix followed by 8 random hexadecimal digits (32
// random bits): a name for what a test makes on a broker, which no other
// test or run is likely to use. It is safe for concurrent use.
func UniqueName(prefix string) string {
	var b [4]byte
	_, _ = rand.Read(b[:])
	return prefix + hex.EncodeToString(b[:])
}

// ExitCode returns the exit code that err, returned by [exec.Cmd.Run] or
// [exec.Cmd.Wait], stands for: 0 for nil, and the code of an
// [*exec.ExitError] (-1 when a signal ended the process). Any other error
// (the program could not be started, its output not copied) fails the
// test.
func ExitCode(t testing.TB, err error) int {
	t.Helper()
	var ee *exec.ExitError
	switch {
	case err == nil:
		return 0
	case errors.As(err, &ee):
		return ee.ExitCode()
	}
	t.Fatal(err)
	return -1
}

// Run runs the program bin with args and waits for it to exit, with no
// time limit. It returns what the program wrote to its standard output and
// standard error, in the order written, and its exit code (see
// [ExitCode]).
func Run(t testing.TB, bin string, args ...string) (out string, code int) {
	t.Helper()
	return RunEnv(t, bin, nil, args...)
}

// RunEnv is [Run] with env (KEY=value entries) added to the test's
// environment; a later entry wins over the environment's.
func RunEnv(t testing.TB, bin string, env []string, args ...string) (out string, code int) {
	t.Helper()
	cmd := exec.Command(bin, args...)
	if env != nil {
		cmd.Env = append(os.Environ(), env...)
	}
	var b bytes.Buffer
	cmd.Stdout, cmd.Stderr = &b, &b
	code = ExitCode(t, cmd.Run())
	return b.String(), code
}

// Expect runs bin with args as [Run] does, fails the test unless the exit
// code is want and the output contains contains (any output contains ""),
// and returns the output.
func Expect(t testing.TB, bin string, want int, contains string, args ...string) string {
	t.Helper()
	out, code := Run(t, bin, args...)
	if code != want || !strings.Contains(out, contains) {
		t.Fatalf("%s %s: exit %d, output:\n%s\nwant exit %d and %q", filepath.Base(bin), strings.Join(args, " "), code, out, want, contains)
	}
	return out
}

// Buffer holds what a program writes, for a test to read while the
// program still writes: its Write and String are safe for concurrent use.
// The zero value is an empty Buffer ready to use.
type Buffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

// Write appends p to the buffer; it never fails.
func (b *Buffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

// String returns what has been written so far.
func (b *Buffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}

// Process is a program that [Start] started in the background. Its Cmd
// has been started and is waited for already: signal it through
// Cmd.Process (Signal, Kill), never call its Start, Run or Wait. Its
// methods are for the goroutine running the test.
//
// The program counts as exited once it has exited and its output has
// closed: a process it started that still holds its standard output or
// standard error keeps it from counting as exited, as [exec.Cmd.Wait] does.
type Process struct {
	*exec.Cmd

	// Out is what the program has written so far to its standard output
	// and standard error, in the order written.
	Out Buffer

	exited chan struct{}
	err    error // what Wait returned, once exited is closed
}

// Start starts the program bin with args in the background, in a process
// group of its own. The test's cleanup kills that group with SIGKILL (the
// program and whatever it started that stayed in its group) and waits for
// the program to exit. A program that cannot be started fails the test.
func Start(t testing.TB, bin string, args ...string) *Process {
	t.Helper()
	p := &Process{Cmd: exec.Command(bin, args...), exited: make(chan struct{})}
	p.Stdout, p.Stderr = &p.Out, &p.Out
	p.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := p.Cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		p.err = p.Wait()
		close(p.exited)
	}()
	t.Cleanup(func() {
		_ = syscall.Kill(-p.Process.Pid, syscall.SIGKILL)
		<-p.exited
	})
	return p
}

// Exited returns a channel that is closed once the program has exited.
func (p *Process) Exited() <-chan struct{} { return p.exited }

// WaitFile waits up to 10s for path to exist, as the program or a command
// it runs makes it. It fails the test if the program exits first, or if
// the 10s run out.
func (p *Process) WaitFile(t testing.TB, path string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		if _, err := os.Stat(path); err == nil {
			return
		}
		select {
		case <-p.exited:
			t.Fatalf("%s ended (%v) before its command made %s:\n%s", p.name(), p.err, filepath.Base(path), p.Out.String())
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("no %s from %s's command in 10s:\n%s", filepath.Base(path), p.name(), p.Out.String())
		}
	}
}

// Running fails the test if the program has exited.
func (p *Process) Running(t testing.TB) {
	t.Helper()
	select {
	case <-p.exited:
		t.Fatalf("%s ended (%v) while its command ran:\n%s", p.name(), p.err, p.Out.String())
	default:
	}
}

// ExitCode waits up to d for the program to exit and returns its exit
// code, as the package's [ExitCode] reads it. It fails the test if the
// program still runs after d.
func (p *Process) ExitCode(t testing.TB, d time.Duration) int {
	t.Helper()
	select {
	case <-p.exited:
	case <-time.After(d):
		t.Fatalf("%s still running %v later:\n%s", p.name(), d, p.Out.String())
	}
	return ExitCode(t, p.err)
}

// name is the program's name, for messages.
func (p *Process) name() string { return filepath.Base(p.Path) }

// ReadPid returns the process id that the file path holds (surrounding
// white space is ignored). A file that cannot be read or does not hold a
// number fails the test.
func ReadPid(t testing.TB, path string) int {
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

// WaitGone waits up to d for the process pid to be gone: kill(pid, 0)
// fails, so a zombie that its parent has not reaped yet is not gone. If the
// process is still there after d, WaitGone kills it with SIGKILL and fails
// the test.
func WaitGone(t testing.TB, pid int, d time.Duration) {
	t.Helper()
	deadline := time.Now().Add(d)
	for syscall.Kill(pid, 0) == nil {
		if time.Now().After(deadline) {
			_ = syscall.Kill(pid, syscall.SIGKILL)
			t.Fatalf("process %d still alive %v later", pid, d)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
