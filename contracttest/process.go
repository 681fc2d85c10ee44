package contracttest

import (
	"bufio"
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/latchkey-go/latchkey/locks"
)

// ProcessHarness is an optional interface that may be implemented by a
// [Harness] whose clients can also run in another process, for the tests
// that pause a holder with SIGSTOP. ChildEnv returns the environment
// variables (KEY=value) from which the backend's [NewChildLocker], in a
// child process running the same test binary, makes a client on the same
// broker with the same settings as NewClient.
//
// The backend's test package must then run its tests through [Main].
type ProcessHarness interface {
	ChildEnv() []string
}

// NewChildLocker makes the Locker of a holder process from the environment
// that [ProcessHarness.ChildEnv] gave it; closeFn frees it.
type NewChildLocker func(ctx context.Context) (l locks.Locker, closeFn func() error, err error)

// holderEnv names the variable that makes a test binary a holder process:
// its value is the name to hold.
const holderEnv = "LOCKS_CONTRACTTEST_HOLDER"

// holderLifetime bounds a holder process, should its parent vanish.
const holderLifetime = 2 * time.Minute

// Main is the TestMain of a backend whose Harness is a [ProcessHarness]:
//
//	func TestMain(m *testing.M) { contracttest.Main(m, newChildLocker) }
//
// In a holder process started by the suite it runs the holder and exits;
// otherwise it runs the tests.
func Main(m *testing.M, newLocker NewChildLocker) {
	if name := os.Getenv(holderEnv); name != "" {
		os.Exit(runHolder(name, newLocker, os.Stdin, os.Stdout))
	}
	os.Exit(m.Run())
}

// runHolder is the holder process: it locks name, says "held TOKEN", then
// every 2ms does what careful user code does before each write: checks
// the lease's context and says "write TOKEN" if it is live, "ended CAUSE"
// (and stops) if not. It also stops when stdin closes. Lines go to out.
func runHolder(name string, newLocker NewChildLocker, in io.Reader, out io.Writer) int {
	ctx, cancel := context.WithTimeout(context.Background(), holderLifetime)
	defer cancel()
	go func() { // the parent closes stdin to stop the holder
		_, _ = io.Copy(io.Discard, in)
		cancel()
	}()
	l, closeFn, err := newLocker(ctx)
	if err != nil {
		fmt.Fprintf(out, "error making the locker: %v\n", err)
		return 1
	}
	defer func() { _ = closeFn() }()
	l = childDefect().apply(l)
	lease, err := l.Lock(ctx, name)
	if err != nil {
		fmt.Fprintf(out, "error locking %q: %v\n", name, err)
		return 1
	}
	deadline := func() int64 { // wall clock, 0 for none
		if d, ok := lease.(interface{ Deadline() time.Time }); ok && !d.Deadline().IsZero() {
			return d.Deadline().UnixNano()
		}
		return 0
	}
	fmt.Fprintf(out, "held %d %d\n", lease.Token(), deadline())
	tick := time.NewTicker(2 * time.Millisecond)
	defer tick.Stop()
	for ctx.Err() == nil {
		if lease.Context().Err() != nil {
			cause := context.Cause(lease.Context())
			fmt.Fprintf(out, "ended lost=%t %v\n", errors.Is(cause, locks.ErrLost), cause)
			break
		}
		fmt.Fprintf(out, "write %d %d\n", lease.Token(), deadline())
		select {
		case <-tick.C:
		case <-ctx.Done():
		}
	}
	<-ctx.Done() // wait for the parent to close stdin
	return 0
}

// HolderProcess is a client holding one name in a child process (the test
// binary run again, through [Main]), for tests that pause or kill a real
// process. Its methods are for the test's goroutine.
type HolderProcess struct {
	cmd   *exec.Cmd
	stdin io.WriteCloser
	lines chan string
	done  chan struct{}
}

// StartHolder starts a holder process on name with env added to the
// test's environment (typically [ProcessHarness.ChildEnv], read by the
// [NewChildLocker] given to [Main]), and waits until it holds the name. It
// returns the lease's token and, when the lease has one, its validity
// deadline on the wall clock (the process shares the machine's). The
// caller stops the process with Stop, before any leak check.
//
// The process says, a line each: "write TOKEN DEADLINE" every 2ms while
// its lease is live (checked just before; see [ParseWrite]), then "ended
// lost=BOOL CAUSE".
func StartHolder(t testing.TB, env []string, name string) (p *HolderProcess, token uint64, deadline time.Time) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(append(os.Environ(), env...), holderEnv+"="+name)
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatalf("starting the holder process: %v", err)
	}
	p = &HolderProcess{cmd: cmd, stdin: stdin, lines: make(chan string, 1<<16), done: make(chan struct{})}
	go func() {
		defer close(p.done)
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			p.lines <- sc.Text()
		}
		close(p.lines)
	}()
	line, ok := p.Next(opTimeout)
	var ns int64
	if ok {
		_, err = fmt.Sscanf(line, "held %d %d", &token, &ns)
	}
	if !ok || err != nil {
		p.Stop()
		t.Fatalf("the holder process did not take %q: %q (%v)", name, line, err)
	}
	if ns != 0 {
		deadline = time.Unix(0, ns)
	}
	return p, token, deadline
}

// ParseWrite parses a holder process's "write TOKEN DEADLINE" line: the
// token it would write with and its lease's deadline then (zero if none).
func ParseWrite(line string) (token uint64, deadline time.Time, err error) {
	var ns int64
	if _, err := fmt.Sscanf(line, "write %d %d", &token, &ns); err != nil {
		return 0, time.Time{}, fmt.Errorf("not a holder's write: %q", line)
	}
	if ns != 0 {
		deadline = time.Unix(0, ns)
	}
	return token, deadline, nil
}

// Next returns the process's next line, or false after limit or at its end.
func (p *HolderProcess) Next(limit time.Duration) (string, bool) {
	select {
	case line, ok := <-p.lines:
		return line, ok
	case <-time.After(limit):
		return "", false
	}
}

// Drain returns the lines that arrive until none has for quiet.
func (p *HolderProcess) Drain(quiet time.Duration) []string {
	var lines []string
	for {
		line, ok := p.Next(quiet)
		if !ok {
			return lines
		}
		lines = append(lines, line)
	}
}

// ResumedWrites reads a resumed holder's lines until its lease ends and
// returns the writes it made first. The test fails if the lease does not
// end, ends otherwise than with ErrLost, or if the holder writes more than
// once (once is the check-then-write it had begun before the pause): then
// it stops reading at the second write.
func (p *HolderProcess) ResumedWrites(t testing.TB) []string {
	t.Helper()
	var writes []string
	for {
		line, ok := p.Next(opTimeout)
		if !ok {
			t.Fatalf("the resumed holder never saw its lease end")
		}
		if strings.HasPrefix(line, "ended ") {
			if !strings.HasPrefix(line, "ended lost=true") {
				t.Errorf("the resumed holder's lease ended, but not with ErrLost: %q", line)
			}
			break
		}
		writes = append(writes, line)
		if len(writes) > 1 {
			t.Errorf("the resumed holder wrote again before it saw its lease had ended (allowed: the one write it had decided on before the pause)")
			return writes
		}
	}
	t.Logf("the resumed holder wrote %d times before it saw its lease had ended", len(writes))
	return writes
}

// Signal sends sig to the process: SIGSTOP pauses it, SIGCONT resumes it.
func (p *HolderProcess) Signal(sig syscall.Signal) error { return p.cmd.Process.Signal(sig) }

// Stop resumes the process if paused, closes its stdin (it releases and
// exits) and waits for it, killing it if it does not exit in time.
func (p *HolderProcess) Stop() {
	_ = p.Signal(syscall.SIGCONT)
	_ = p.stdin.Close()
	select {
	case <-p.done:
	case <-time.After(opTimeout):
		_ = p.cmd.Process.Kill()
		<-p.done
	}
	_ = p.cmd.Wait()
}

// testPausedHolder: a holder process paused with SIGSTOP past its lease's
// validity loses the name to another client; when it runs again its
// lease's context has ended before it writes anything more (at most the
// one write it had decided on before the pause), and a fenced resource
// rejects that write's token.
func testPausedHolder(t testing.TB, nh NewHarness) {
	e := newEnv(t, nh)
	defer e.close()
	ph, ok := e.h.(ProcessHarness)
	if !ok {
		t.Skip("the harness cannot run a client in another process (no ProcessHarness)")
	}
	recovery := cmp.Or(e.caps.PauseRecovery, e.caps.CrashRecovery)
	if recovery <= 0 {
		t.Skip("no PauseRecovery or CrashRecovery bound stated")
	}
	name := e.name()
	if !e.caps.Fencing {
		e.skippedPart("the fenced resource's refusal of the resumed holder's write", "the backend has no fencing tokens")
	}
	var fence FencedResource
	p, token, _ := StartHolder(t, ph.ChildEnv(), name)
	defer p.Stop()
	write := func(who, line string) error {
		if !e.caps.Fencing {
			return nil
		}
		tok, _, err := ParseWrite(line)
		if err != nil {
			return fmt.Errorf("holder said %q", line)
		}
		return fence.Write(who, tok)
	}
	for range 3 {
		line, ok := p.Next(opTimeout)
		if !ok || !strings.HasPrefix(line, "write ") {
			t.Fatalf("the holder process, before the pause: %q", line)
		}
		if err := write("holder", line); err != nil {
			t.Fatalf("a write of the live holder was refused: %v", err)
		}
	}
	if err := p.Signal(syscall.SIGSTOP); err != nil {
		t.Fatalf("SIGSTOP: %v", err)
	}
	paused := time.Now()
	for _, line := range p.Drain(100 * time.Millisecond) { // said before the pause
		if err := write("holder", line); err != nil {
			t.Fatalf("a write said before the pause was refused: %v", err)
		}
	}

	b := e.newClientLocker()
	ctx, cancel := context.WithTimeout(e.ctx, bound(recovery))
	lease, err := b.Lock(ctx, name)
	cancel()
	if err != nil {
		t.Fatalf("with the holder paused, Lock(%q) failed after %v (stated bound %v): %v", name, time.Since(paused).Round(time.Millisecond), recovery, err)
	}
	t.Logf("a paused holder's lock came back after %v (stated bound %v)", time.Since(paused).Round(time.Millisecond), recovery)
	if e.caps.Fencing {
		if lease.Token() <= token {
			t.Errorf("the successor's token %d is not above the paused holder's %d", lease.Token(), token)
		}
		if err := fence.Write("successor", lease.Token()); err != nil {
			t.Fatalf("the successor's write was refused: %v", err)
		}
	}

	if err := p.Signal(syscall.SIGCONT); err != nil {
		t.Fatalf("SIGCONT: %v", err)
	}
	for _, line := range p.ResumedWrites(t) {
		if err := write("holder", line); e.caps.Fencing && err == nil {
			t.Errorf("the fenced resource accepted the resumed holder's %q after the successor wrote", line)
		}
	}
	e.mustRelease(lease)
}
