//go:build unix

package cmdtest_test

import (
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/latchkey-go/latchkey/contracttest/cmdtest"
)

// fatalT is the test's testing.TB, except that Fatal and Fatalf record
// the message and end the goroutine, as the testing package's do, without
// failing the test.
type fatalT struct {
	testing.TB
	msg string
}

func (f *fatalT) Helper() {}

func (f *fatalT) Fatal(args ...any) {
	f.msg = fmt.Sprint(args...)
	runtime.Goexit()
}

func (f *fatalT) Fatalf(format string, args ...any) {
	f.msg = fmt.Sprintf(format, args...)
	runtime.Goexit()
}

// fatal runs check with a fatalT on its own goroutine and returns what it
// stopped with, "" if it returned.
func fatal(t *testing.T, check func(t testing.TB)) string {
	t.Helper()
	f := &fatalT{TB: t}
	done := make(chan struct{})
	go func() {
		defer close(done)
		check(f)
	}()
	<-done
	return f.msg
}

// mustFail fails t unless check stops with a message containing want.
func mustFail(t *testing.T, want string, check func(t testing.TB)) {
	t.Helper()
	if msg := fatal(t, check); msg == "" || !strings.Contains(msg, want) {
		t.Errorf("stopped with %q, want a failure saying %q", msg, want)
	}
}

const sh = "/bin/sh"

func TestBuild(t *testing.T) {
	bin := cmdtest.Build(t, "testdata/greet")
	if filepath.Base(bin) != "greet" {
		t.Errorf("the program is named %q, want greet", filepath.Base(bin))
	}
	cmdtest.Expect(t, bin, 0, "hello a b\n", "a", "b")
	mustFail(t, "go build", func(t testing.TB) { cmdtest.Build(t, "testdata/missing") })
}

func TestUniqueName(t *testing.T) {
	a, b := cmdtest.UniqueName("x-"), cmdtest.UniqueName("x-")
	if a == b || len(a) != len("x-")+8 || !strings.HasPrefix(a, "x-") {
		t.Errorf("UniqueName: %q then %q, want x- and 8 hexadecimal digits, not twice the same", a, b)
	}
}

func TestRun(t *testing.T) {
	out, code := cmdtest.Run(t, sh, "-c", "echo one; echo two >&2; exit 3")
	if code != 3 || out != "one\ntwo\n" {
		t.Errorf("Run: %q, exit %d; want one and two, exit 3", out, code)
	}
	if out, code := cmdtest.Run(t, sh, "-c", "kill -KILL $$"); code != -1 {
		t.Errorf("Run of a program killed by a signal: exit %d (%q), want -1", code, out)
	}
	out, code = cmdtest.RunEnv(t, sh, []string{"CMDTEST_A=1", "CMDTEST_A=2"}, "-c", `echo "$CMDTEST_A"`)
	if code != 0 || out != "2\n" {
		t.Errorf("RunEnv: %q, exit %d; want the later entry, 2, exit 0", out, code)
	}
	mustFail(t, "no-such-program", func(t testing.TB) { cmdtest.Run(t, "/no-such-program") })
}

func TestExpect(t *testing.T) {
	if out := cmdtest.Expect(t, sh, 4, "b", "-c", "echo abc; exit 4"); out != "abc\n" {
		t.Errorf("Expect returned %q, want the output", out)
	}
	cmdtest.Expect(t, sh, 0, "", "-c", "true")
	mustFail(t, "want exit 0", func(t testing.TB) { cmdtest.Expect(t, sh, 0, "", "-c", "exit 1") })
	mustFail(t, `want exit 0 and "x"`, func(t testing.TB) { cmdtest.Expect(t, sh, 0, "x", "-c", "echo y") })
}

func TestBuffer(t *testing.T) {
	var b cmdtest.Buffer
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			for range 100 {
				_, _ = b.Write([]byte("x"))
				_ = b.String()
			}
		})
	}
	wg.Wait()
	if n := len(b.String()); n != 400 {
		t.Errorf("%d bytes after 400 writes of one", n)
	}
}

func TestStart(t *testing.T) {
	dir := t.TempDir()
	started := filepath.Join(dir, "started")
	p := cmdtest.Start(t, sh, "-c", `trap 'echo bye; exit 5' TERM; touch "$0"; while :; do sleep 0.05; done`, started)
	p.WaitFile(t, started)
	p.Running(t)
	if err := p.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if code := p.ExitCode(t, 10*time.Second); code != 5 || !strings.Contains(p.Out.String(), "bye") {
		t.Errorf("exit %d with output %q, want 5 and bye", code, p.Out.String())
	}
	select {
	case <-p.Exited():
	default:
		t.Error("Exited is not closed after ExitCode returned")
	}
	mustFail(t, "ended", p.Running)
	mustFail(t, "ended", func(t testing.TB) { p.WaitFile(t, filepath.Join(dir, "never")) })

	slow := cmdtest.Start(t, sh, "-c", "sleep 60")
	mustFail(t, "still running", func(t testing.TB) { slow.ExitCode(t, 50*time.Millisecond) })
}

// The test's cleanup kills the program's whole group, and waits for the
// program.
func TestStartCleanup(t *testing.T) {
	pidFile := filepath.Join(t.TempDir(), "pid")
	var p *cmdtest.Process
	t.Run("started", func(t *testing.T) {
		p = cmdtest.Start(t, sh, "-c", `sleep 60 & echo $! > "$0.tmp"; mv "$0.tmp" "$0"; wait`, pidFile)
		p.WaitFile(t, pidFile)
	})
	select {
	case <-p.Exited():
	default:
		t.Fatal("the program still runs after its test's cleanup")
	}
	cmdtest.WaitGone(t, cmdtest.ReadPid(t, pidFile), 10*time.Second)
}

func TestReadPid(t *testing.T) {
	path := filepath.Join(t.TempDir(), "pid")
	if err := os.WriteFile(path, []byte(" 123\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if pid := cmdtest.ReadPid(t, path); pid != 123 {
		t.Errorf("ReadPid: %d, want 123", pid)
	}
	if err := os.WriteFile(path, []byte("12x"), 0o600); err != nil {
		t.Fatal(err)
	}
	mustFail(t, "12x", func(t testing.TB) { cmdtest.ReadPid(t, path) })
	mustFail(t, "no such file", func(t testing.TB) { cmdtest.ReadPid(t, path+".missing") })
}

func TestWaitGone(t *testing.T) {
	p := cmdtest.Start(t, sh, "-c", "exec sleep 60")
	pid := p.Process.Pid
	mustFail(t, "still alive", func(t testing.TB) { cmdtest.WaitGone(t, pid, 50*time.Millisecond) })
	// WaitGone killed it; once reaped, it is gone.
	if code := p.ExitCode(t, 10*time.Second); code != -1 {
		t.Errorf("the process WaitGone killed exited %d, want -1 (a signal)", code)
	}
	cmdtest.WaitGone(t, pid, 10*time.Second)
}

// A program built on locks/command's CLI keeps the convention, and its
// rows, usage errors, are checked.
func TestCheckConvention(t *testing.T) {
	bin := cmdtest.Build(t, "testdata/conform")
	cmdtest.CheckConvention(t, bin, []cmdtest.Case{
		{Name: "no argument", Want: "want one argument"},
		{Args: []string{"x"}, Want: `"x" is not a number`},
	})
	if out, errOut, code := cmdtest.RunSplit(t, bin, nil, "7"); code != 0 || out != "7\n" || errOut != "" {
		t.Errorf("conform 7: exit %d, stdout %q, stderr %q", code, out, errOut)
	}
}
