package main_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
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

	"github.com/redis/go-redis/v9"

	"github.com/latchkey-go/latchkey/contracttest/testenv"
)

// build builds the command and returns its path.
func build(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "redlockrun")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	return bin
}

func uniqueName() string {
	var b [4]byte
	_, _ = rand.Read(b[:])
	return "redlockrun-" + hex.EncodeToString(b[:])
}

// masters starts three Redis masters and returns their -addrs and
// clients of them.
func masters(t *testing.T) (string, []*redis.Client) {
	t.Helper()
	var addrs []string
	var clients []*redis.Client
	for _, s := range testenv.StartRedis(t, 3) {
		addrs = append(addrs, s.Addr())
		c := redis.NewClient(&redis.Options{Addr: s.Addr()})
		t.Cleanup(func() { _ = c.Close() })
		clients = append(clients, c)
	}
	return strings.Join(addrs, ","), clients
}

// runSync runs bin with args and returns its output and exit code.
func runSync(t *testing.T, bin string, args ...string) (string, int) {
	t.Helper()
	cmd := exec.Command(bin, args...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	var ee *exec.ExitError
	switch {
	case err == nil:
		return out.String(), 0
	case errors.As(err, &ee):
		return out.String(), ee.ExitCode()
	}
	t.Fatalf("running %v: %v", args, err)
	return "", -1
}

// expect runs bin and fails the test unless it exits with want and its
// output contains contains.
func expect(t *testing.T, bin string, want int, contains string, args ...string) string {
	t.Helper()
	out, code := runSync(t, bin, args...)
	if code != want || !strings.Contains(out, contains) {
		t.Fatalf("redlockrun %s: exit %d, output:\n%s\nwant exit %d and %q", strings.Join(args, " "), code, out, want, contains)
	}
	return out
}

// holder is redlockrun running in the background, in a process group of
// its own that the test's cleanup kills.
type holder struct {
	*exec.Cmd
	out    lockedBuffer
	exited chan struct{}
	err    error
}

func startHolder(t *testing.T, bin string, args ...string) *holder {
	t.Helper()
	h := &holder{Cmd: exec.Command(bin, args...), exited: make(chan struct{})}
	h.Stdout, h.Stderr = &h.out, &h.out
	h.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := h.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { h.err = h.Wait(); close(h.exited) }()
	t.Cleanup(func() {
		_ = syscall.Kill(-h.Process.Pid, syscall.SIGKILL)
		<-h.exited
	})
	return h
}

// exitCode waits up to d for h to end and returns its exit code.
func (h *holder) exitCode(t *testing.T, d time.Duration) int {
	t.Helper()
	select {
	case <-h.exited:
	case <-time.After(d):
		t.Fatalf("redlockrun still running %v later:\n%s", d, h.out.String())
	}
	var ee *exec.ExitError
	if errors.As(h.err, &ee) {
		return ee.ExitCode()
	}
	if h.err != nil {
		t.Fatal(h.err)
	}
	return 0
}

type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}

// waitFile waits up to 10s for path, failing if h ends first.
func waitFile(t *testing.T, h *holder, path string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		if _, err := os.Stat(path); err == nil {
			return
		}
		select {
		case <-h.exited:
			t.Fatalf("redlockrun ended (%v) before its command made %s:\n%s", h.err, filepath.Base(path), h.out.String())
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("no %s after 10s:\n%s", filepath.Base(path), h.out.String())
		}
	}
}

// waitGone fails unless process pid is gone within d.
func waitGone(t *testing.T, pid int, d time.Duration) {
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

// TestUsage: usage errors exit 64 (sysexits' EX_USAGE, not 2, the Go
// runtime's code on a panic or SIGQUIT) before any I/O, --help exits 0 and
// documents the exit codes.
func TestUsage(t *testing.T) {
	bin := build(t)
	expect(t, bin, 0, "Exit codes", "--help")
	expect(t, bin, 0, "64 usage error", "--help")
	expect(t, bin, 0, "-log-format", "--help")
	expect(t, bin, 64, "want NAME -- COMMAND", "name")
	expect(t, bin, 64, "want NAME -- COMMAND", "name", "true")
	expect(t, bin, 64, "", "-nosuchflag", "name", "--", "true")
	expect(t, bin, 64, "-grace", "-grace", "-1s", "name", "--", "true")
	// Two masters without -two-masters; a bad name: both before any I/O
	// (nothing listens on port 1).
	expect(t, bin, 64, "", "-addrs", "127.0.0.1:1,127.0.0.1:2", "name", "--", "true")
	expect(t, bin, 64, "", "-addrs", "127.0.0.1:1", "bad{name}", "--", "true")
	expect(t, bin, 64, "-log-format", "-log-format", "xml", "name", "--", "true")
	expect(t, bin, 1, " level=ERROR msg=failed name=name error=", "-addrs", "127.0.0.1:1", "name", "--", "true")
	out := expect(t, bin, 1, `"level":"ERROR"`, "-log-format", "json", "-addrs", "127.0.0.1:1", "name", "--", "true")
	// go-redis's own messages (failed dials) come through the logger too.
	errors := 0
	for l := range strings.Lines(out) {
		var line map[string]any
		if err := json.Unmarshal([]byte(l), &line); err != nil {
			t.Errorf("-log-format json: a line is not a JSON object: %v: %q", err, l)
			continue
		}
		if line["name"] != "name" || line["time"] == nil || line["msg"] == "" {
			t.Errorf("-log-format json: a line lacks time, name or msg: %v", line)
		}
		if line["level"] == "ERROR" {
			errors++
			if e, _ := line["error"].(string); !strings.Contains(e, "127.0.0.1:1") {
				t.Errorf("-log-format json: the error line does not say which master failed: %v", line)
			}
		}
	}
	if errors != 1 {
		t.Errorf("-log-format json: %d ERROR lines, want 1:\n%s", errors, out)
	}
}

// TestRun: the command's environment and exit status, contention with
// -try and -timeout, and the lock free again after.
func TestRun(t *testing.T) {
	bin := build(t)
	addrs, _ := masters(t)
	name := uniqueName()
	out := expect(t, bin, 7, "name="+name, "-addrs", addrs, name, "--", "/bin/sh", "-c", `echo "name=$LOCK_NAME token=$LOCK_TOKEN slot=$LOCK_SLOT"; exit 7`)
	// LOCK_SLOT is the lease's Slot(): 0 for a lock once redlockprio
	// takes the one shape (issue 19), 1 before.
	if !strings.Contains(out, "slot=") || strings.Contains(out, "token=0 ") || !strings.Contains(out, "token=") {
		t.Errorf("environment: %q", out)
	}
	out2 := expect(t, bin, 0, "token=", "-addrs", addrs, name, "--", "/bin/sh", "-c", `echo "token=$LOCK_TOKEN"`)
	first, _ := strconv.Atoi(strings.Fields(strings.SplitN(out, "token=", 2)[1])[0])
	second, _ := strconv.Atoi(strings.TrimSpace(strings.SplitN(out2, "token=", 2)[1]))
	if first < 1 || second <= first {
		t.Errorf("tokens %d then %d: want increasing", first, second)
	}
	expect(t, bin, 128+int(syscall.SIGTERM), "", "-addrs", addrs, name, "--", "/bin/sh", "-c", "kill -TERM $$")

	started := filepath.Join(t.TempDir(), "started")
	h := startHolder(t, bin, "-addrs", addrs, name, "--", "/bin/sh", "-c", `touch "$0"; exec sleep 60`, started)
	waitFile(t, h, started)
	expect(t, bin, 3, "", "-addrs", addrs, "-try", name, "--", "true")
	expect(t, bin, 3, "", "-addrs", addrs, "-timeout", "300ms", name, "--", "true")

	// A signal to redlockrun goes to its command: sleep dies of it, and
	// redlockrun exits as it did, releasing the lock.
	if err := h.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if code := h.exitCode(t, 10*time.Second); code != 128+int(syscall.SIGTERM) {
		t.Fatalf("redlockrun exited %d after SIGTERM, want its command's 143:\n%s", code, h.out.String())
	}
	expect(t, bin, 0, "", "-addrs", addrs, "-try", name, "--", "true")
}

// TestLost: when the lock's keys vanish from the masters, the command is
// sent SIGTERM, then SIGKILL after -grace, and redlockrun exits 4.
func TestLost(t *testing.T) {
	bin := build(t)
	addrs, clients := masters(t)
	name := uniqueName()
	started := filepath.Join(t.TempDir(), "started")
	h := startHolder(t, bin, "-addrs", addrs, "-ttl", "1s", "-grace", "300ms", name, "--",
		"/bin/sh", "-c", `trap "" TERM; echo $$ > "$0.tmp"; mv "$0.tmp" "$0"; while :; do sleep 0.05; done`, started)
	waitFile(t, h, started)
	pid := readPid(t, started)
	for _, c := range clients {
		if err := c.FlushAll(context.Background()).Err(); err != nil {
			t.Fatal(err)
		}
	}
	if code := h.exitCode(t, 20*time.Second); code != 4 {
		t.Fatalf("redlockrun exited %d after its lock vanished, want 4:\n%s", code, h.out.String())
	}
	if out := h.out.String(); !strings.Contains(out, `level=ERROR msg="lock lost while the command ran" name=`) || !strings.Contains(out, " token=") || !strings.Contains(out, "killing") {
		t.Errorf("no word of the loss and the kill:\n%s", out)
	}
	waitGone(t, pid, 5*time.Second)
}

// TestKill9: a redlockrun killed outright leaves no command running: its
// reaper kills the command's group at once.
func TestKill9(t *testing.T) {
	bin := build(t)
	addrs, _ := masters(t)
	started := filepath.Join(t.TempDir(), "started")
	h := startHolder(t, bin, "-addrs", addrs, uniqueName(), "--",
		"/bin/sh", "-c", `echo $$ > "$0.tmp"; mv "$0.tmp" "$0"; exec sleep 60`, started)
	waitFile(t, h, started)
	pid := readPid(t, started)
	if err := h.Process.Kill(); err != nil { // redlockrun alone, not its group
		t.Fatal(err)
	}
	waitGone(t, pid, 5*time.Second)
	time.Sleep(100 * time.Millisecond)
	if !strings.Contains(h.out.String(), "redlockrun-reaper") {
		t.Errorf("the reaper said nothing:\n%s", h.out.String())
	}
}
