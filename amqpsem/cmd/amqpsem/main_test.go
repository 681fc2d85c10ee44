package main_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	neturl "net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/latchkey-go/latchkey/amqpsem"
	"github.com/latchkey-go/latchkey/contracttest/testenv"
	"github.com/latchkey-go/latchkey/locks"
)

// build builds the command and returns its path.
func build(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "amqpsem")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	return bin
}

func uniqueName() string {
	var b [4]byte
	_, _ = rand.Read(b[:])
	return "amqpsem-cmd-" + hex.EncodeToString(b[:])
}

// runner returns functions that run bin with pre before the arguments:
// run returns the output and the exit code; expect fails the test unless
// the exit code is want and the output contains contains.
func runner(t *testing.T, bin string, pre ...string) (run func(args ...string) (string, int), expect func(want int, contains string, args ...string) string) {
	run = func(args ...string) (string, int) {
		t.Helper()
		cmd := exec.Command(bin, append(pre, args...)...)
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
	expect = func(want int, contains string, args ...string) string {
		t.Helper()
		out, code := run(args...)
		if code != want || !strings.Contains(out, contains) {
			t.Fatalf("amqpsem %s: exit %d, output:\n%s\nwant exit %d and %q", strings.Join(args, " "), code, out, want, contains)
		}
		return out
	}
	return run, expect
}

// background is the command running in its own process group, which the
// test's cleanup kills; exited is closed once it has ended, and err is
// then what Wait returned.
type background struct {
	*exec.Cmd
	out    lockedBuffer
	exited chan struct{}
	err    error
}

// start starts bin with args in the background.
func start(t *testing.T, bin string, args ...string) *background {
	t.Helper()
	b := &background{Cmd: exec.Command(bin, args...), exited: make(chan struct{})}
	b.Stdout, b.Stderr = &b.out, &b.out
	b.SysProcAttr = &syscall.SysProcAttr{Setpgid: true} // cleanup kills the group
	if err := b.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		b.err = b.Wait()
		close(b.exited)
	}()
	t.Cleanup(func() {
		_ = syscall.Kill(-b.Process.Pid, syscall.SIGKILL)
		<-b.exited
	})
	return b
}

// waitFile waits up to 10s for the file path, which b's command makes;
// it fails the test if b ends first.
func (b *background) waitFile(t *testing.T, path string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		if _, err := os.Stat(path); err == nil {
			return
		}
		select {
		case <-b.exited:
			t.Fatalf("amqpsem ended (%v) before its command made %s:\n%s", b.err, filepath.Base(path), b.out.String())
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("no %s from the command in 10s:\n%s", filepath.Base(path), b.out.String())
		}
	}
}

// running fails the test if b has ended.
func (b *background) running(t *testing.T) {
	t.Helper()
	select {
	case <-b.exited:
		t.Fatalf("amqpsem ended (%v) while its command ran:\n%s", b.err, b.out.String())
	default:
	}
}

// exitCode waits up to d for b to end and returns its exit code.
func (b *background) exitCode(t *testing.T, d time.Duration) int {
	t.Helper()
	select {
	case <-b.exited:
	case <-time.After(d):
		t.Fatalf("amqpsem still running %v later:\n%s", d, b.out.String())
	}
	var ee *exec.ExitError
	switch {
	case b.err == nil:
		return 0
	case errors.As(b.err, &ee):
		return ee.ExitCode()
	}
	t.Fatalf("amqpsem: %v", b.err)
	return -1
}

// lockedBuffer is a bytes.Buffer safe for concurrent use.
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

// semaphore returns a Semaphore on a connection of its own to url: a
// client other than the command.
func semaphore(t *testing.T, url string) *amqpsem.Semaphore {
	t.Helper()
	c, err := amqpsem.Dial(t.Context(), url, amqpsem.WithConnectionName("amqpsem cmd test: "+t.Name()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close(context.Background()) })
	s, err := c.Semaphore(amqpsem.MaxSemaphoreSize)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// TestCommand builds the command and drives a semaphore through its
// life, checking output and exit codes.
func TestCommand(t *testing.T) {
	url := testenv.AMQPURL(t)
	bin := build(t)
	name := uniqueName()
	run, expect := runner(t, bin, "--url", url, "--heartbeat", "2s")
	t.Cleanup(func() { run("destroy", name) })

	expect(0, "Usage:", "--help")
	expect(0, "-log-format", "--help")
	expect(0, "64 usage error", "--help")
	expect(64, "missing NAME", "status")
	expect(64, "bad slot count", "create", name, "0")
	expect(64, "invalid name", "create", "amq.nope", "2")
	expect(1, "", "--url", "amqp://guest:guest@127.0.0.1:1/", "status", name)

	expect(0, "created "+name+" with 2 slots", "create", name, "2")
	expect(1, "exists", "create", name, "2")
	expect(0, "2 slots, 0 held", "status", name)

	// A slot is held while the command runs; the command sees it.
	flag := filepath.Join(t.TempDir(), "ran")
	out := expect(0, "slot=1", "acquire", name, "--", "/bin/sh", "-c",
		`echo slot=$AMQPSEM_SLOT; "$0" --url "$1" status "$2" > "$3"`, bin, url, name, flag)
	_ = out
	inside, err := os.ReadFile(flag)
	if err != nil || !strings.Contains(string(inside), "slot 1: held") {
		t.Fatalf("status while acquired: %q, %v", inside, err)
	}
	expect(0, "0 held", "status", name)
	expect(7, "", "acquire", name, "--", "/bin/sh", "-c", "exit 7")

	// Both slots held by two background commands: --try fails with 3.
	hold := func() *exec.Cmd {
		cmd := exec.Command(bin, "--url", url, "acquire", name, "--", "/bin/sh", "-c", "sleep 30")
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
		return cmd
	}
	h1, h2 := hold(), hold()
	deadline := time.Now().Add(10 * time.Second)
	for {
		out, _ := run("status", name)
		if strings.Contains(out, "2 held") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the two holders did not get their slots:\n%s", out)
		}
		time.Sleep(50 * time.Millisecond)
	}
	expect(3, "not acquired", "--try", "acquire", name, "--", "true")
	expect(3, "deadline", "--timeout", "300ms", "acquire", name, "--", "true")

	// Remove a held slot: status shows it removed and still held; wait
	// times out until its holder ends (SIGTERM is forwarded and released).
	expect(0, "from 2 to 1 slot", "resize", name, "-1")
	out = expect(0, "removed, still held", "status", name)
	_ = out
	expect(3, "", "--timeout", "300ms", "wait", name)
	for _, h := range []*exec.Cmd{h1, h2} {
		_ = h.Process.Signal(os.Interrupt)
	}
	expect(0, "no removed slot", "--timeout", "10s", "wait", name)
	expect(0, "from 1 to 3 slots", "resize", name, "+2")
	expect(0, "from 3 to 2 slots", "resize", name, "2")
	expect(64, "", "resize", name, "-5")
	expect(0, "destroyed "+name+" (2 slots)", "destroy", name)
	expect(0, "no removed slot", "--timeout", "30s", "wait", name)
	expect(1, "no semaphore", "status", name)
}

// Bad names, flags and TLS settings are usage errors (exit 64, sysexits'
// EX_USAGE, not 2, the Go runtime's code on a panic or SIGQUIT), found
// before connecting: the broker here is unreachable.
func TestUsageBeforeDial(t *testing.T) {
	bin := build(t)
	const down = "amqp://guest:guest@127.0.0.1:1/"
	_, expect := runner(t, bin)
	expect(1, " level=ERROR msg=failed command=status name=fine error=", "--url", down, "status", "fine")
	expect(64, "--log-format", "--url", down, "--log-format", "xml", "status", "fine")
	// --log-format json: one JSON object a line, with its fields.
	out := expect(1, `"level":"ERROR"`, "--url", down, "--log-format", "json", "status", "fine")
	var line map[string]any
	if err := json.Unmarshal([]byte(strings.TrimSpace(out)), &line); err != nil {
		t.Errorf("--log-format json: the output is not one JSON object: %v\n%s", err, out)
	} else if line["command"] != "status" || line["name"] != "fine" || line["error"] == nil || line["error"] == "" || line["time"] == nil {
		t.Errorf("--log-format json: the line lacks time, command, name or error: %v", line)
	}
	expect(64, "invalid name", "--url", down, "create", "amq.nope", "2")
	expect(64, "invalid name", "--url", down, "status", "looks-like-a-slot-1-A")
	expect(64, "invalid name", "--url", down, "--layout", "python", "acquire", "jobs-B-2", "--", "true")
	expect(64, "--connect-timeout", "--url", down, "--connect-timeout", "0s", "status", "fine")
	expect(64, "--timeout", "--url", down, "--timeout", "-1s", "status", "fine")
	expect(64, "--grace", "--url", down, "--grace", "-1s", "acquire", "fine", "--", "true")
	expect(64, "heartbeat", "--url", down, "--heartbeat", "500ms", "status", "fine")
	expect(64, "--url", "--url", "http://not-amqp/", "status", "fine")
	// TLS flags with an amqp:// URL would be ignored.
	expect(64, "amqps://", "--url", down, "--tls-insecure", "status", "fine")
	expect(64, "amqps://", "--url", down, "--tls-server-name", "rabbit", "status", "fine")
	// A key without its certificate, or the reverse.
	const downTLS = "amqps://guest:guest@127.0.0.1:1/"
	expect(64, "--tls-cert and --tls-key", "--url", downTLS, "--tls-key", "key.pem", "status", "fine")
	expect(64, "--tls-cert and --tls-key", "--url", downTLS, "--tls-cert", "cert.pem", "status", "fine")
	expect(1, "", "--url", downTLS, "--tls-insecure", "status", "fine")
}

// acquire exits with 128+N when its command is killed by signal N, as
// shells report it.
func TestAcquireSignalled(t *testing.T) {
	url := testenv.AMQPURL(t)
	bin := build(t)
	name := uniqueName()
	run, expect := runner(t, bin, "--url", url, "--heartbeat", "2s")
	t.Cleanup(func() { run("destroy", name) })
	expect(0, "created", "create", name, "1")
	expect(128+int(syscall.SIGTERM), "", "acquire", name, "--", "/bin/sh", "-c", "kill -TERM $$")
	expect(128+int(syscall.SIGKILL), "", "acquire", name, "--", "/bin/sh", "-c", "kill -KILL $$")
}

// When the slot is lost, acquire sends its command SIGTERM, then SIGKILL
// after --grace, and exits with 4.
func TestAcquireLostKills(t *testing.T) {
	url := testenv.AMQPURL(t)
	bin := build(t)
	name := uniqueName()
	run, expect := runner(t, bin, "--url", url, "--heartbeat", "1s")
	t.Cleanup(func() { run("destroy", name) })
	expect(0, "created", "create", name, "1")

	started := filepath.Join(t.TempDir(), "started")
	h := start(t, bin, "--url", url, "--heartbeat", "1s", "--grace", "300ms", "acquire", name, "--",
		"/bin/sh", "-c", `trap "" TERM; touch "$0"; exec sleep 60`, started)
	h.waitFile(t, started)
	// The command ignores SIGTERM; destroying the semaphore takes its slot.
	expect(0, "destroyed", "destroy", name)
	if code := h.exitCode(t, 20*time.Second); code != 4 {
		t.Fatalf("acquire ended with %d, want exit 4\n%s", code, h.out.String())
	}
	if !strings.Contains(h.out.String(), "killing") {
		t.Errorf("no word of the kill in the output:\n%s", h.out.String())
	}
}

// TestAcquireSignalForwarded checks the usage text's "SIGINT/SIGTERM are
// forwarded to CMD (the slot is held until it exits)" and "acquire
// otherwise exits with CMD's own exit status". CMD traps the signal, says
// so, and exits 5 only when the test lets it: while it runs on after the
// signal, another client's TryAcquire finds every slot held and amqpsem has
// not ended; once it exits, amqpsem exits 5 and the slot is free. The
// signal goes to amqpsem's process alone, so CMD sees it only if amqpsem
// forwards it.
func TestAcquireSignalForwarded(t *testing.T) {
	url := testenv.AMQPURL(t)
	bin := build(t)
	other := semaphore(t, url)
	for _, tc := range []struct {
		name string
		sig  syscall.Signal
	}{{"SIGINT", syscall.SIGINT}, {"SIGTERM", syscall.SIGTERM}} {
		t.Run(tc.name, func(t *testing.T) {
			name := uniqueName()
			run, expect := runner(t, bin, "--url", url)
			t.Cleanup(func() { run("destroy", name) })
			expect(0, "created", "create", name, "1")

			dir := t.TempDir()
			started, got, release := filepath.Join(dir, "started"), filepath.Join(dir, "got-signal"), filepath.Join(dir, "release")
			h := start(t, bin, "--url", url, "acquire", name, "--", "/bin/sh", "-c",
				`trap 'touch "$1"; while [ ! -e "$2" ]; do sleep 0.05; done; exit 5' INT TERM
				touch "$0"; while :; do sleep 0.05; done`, started, got, release)
			h.waitFile(t, started)
			if err := h.Process.Signal(tc.sig); err != nil {
				t.Fatal(err)
			}
			h.waitFile(t, got)

			// CMD has the signal and runs on: the slot is still held.
			if l, err := other.TryAcquire(t.Context(), name); !errors.Is(err, amqpsem.ErrAllHeld) {
				if err == nil {
					_ = l.Release(t.Context())
				}
				t.Fatalf("TryAcquire while CMD runs on after %s: %v, want every slot held", tc.name, err)
			}
			h.running(t)

			if err := os.WriteFile(release, nil, 0o600); err != nil {
				t.Fatal(err)
			}
			if code := h.exitCode(t, 10*time.Second); code != 5 {
				t.Fatalf("amqpsem exited %d after CMD exited 5:\n%s", code, h.out.String())
			}
			l, err := other.TryAcquire(t.Context(), name)
			if err != nil {
				t.Fatalf("the slot is not free once amqpsem has exited: %v", err)
			}
			_ = l.Release(t.Context())
		})
	}
}

// TestAcquireHeartbeat checks the --heartbeat flag's "AMQP heartbeat asked
// for (a heartbeat in --url wins): a holder cut off without a close keeps
// its slot for 2 to 3 of these" through the command: the command has no
// other output of its heartbeat. amqpsem holds the only slot with a 1s
// heartbeat, asked for with --heartbeat 1s, or with heartbeat=1 in --url
// against --heartbeat 60s; the test stops amqpsem (SIGSTOP; CMD, a
// child in the same group, runs on) so its connection goes silent, and
// another client must get the slot after at least 1s and within
// 3 heartbeats + 1.5s. Had the 1s not reached the connection, the slot
// would stay held for 20s at the default 10s (or 120s at 60s). Resumed,
// amqpsem finds its slot lost and exits 4.
func TestAcquireHeartbeat(t *testing.T) {
	url := testenv.AMQPURL(t)
	bin := build(t)
	other := semaphore(t, url)
	u, err := neturl.Parse(url)
	if err != nil {
		t.Fatal(err)
	}
	q := u.Query()
	q.Set("heartbeat", "1")
	u.RawQuery = q.Encode()
	const hb = time.Second
	for _, tc := range []struct {
		name string
		args []string
	}{
		{"flag", []string{"--url", url, "--heartbeat", "1s"}},
		{"url wins", []string{"--url", u.String(), "--heartbeat", "60s"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			name := uniqueName()
			run, expect := runner(t, bin, "--url", url)
			t.Cleanup(func() { run("destroy", name) })
			expect(0, "created", "create", name, "1")

			started := filepath.Join(t.TempDir(), "started")
			h := start(t, bin, append(tc.args, "acquire", name, "--", "/bin/sh", "-c", `touch "$0"; exec sleep 60`, started)...)
			h.waitFile(t, started)
			if _, err := other.TryAcquire(t.Context(), name); !errors.Is(err, amqpsem.ErrAllHeld) {
				t.Fatalf("TryAcquire while amqpsem holds the slot: %v, want every slot held", err)
			}

			if err := h.Process.Signal(syscall.SIGSTOP); err != nil {
				t.Fatal(err)
			}
			stopped := time.Now()
			deadline := stopped.Add(3*hb + 1500*time.Millisecond)
			for {
				l, err := other.TryAcquire(t.Context(), name)
				if err == nil {
					took := time.Since(stopped)
					_ = l.Release(t.Context())
					if took < hb {
						t.Fatalf("the slot of a holder silent for %v came back already", took)
					}
					t.Logf("the slot came back %v after amqpsem stopped", took.Round(10*time.Millisecond))
					break
				}
				if !errors.Is(err, locks.ErrNotAcquired) {
					t.Fatal(err)
				}
				if time.Now().After(deadline) {
					t.Fatalf("the slot is still held %v after amqpsem stopped, with a 1s heartbeat asked for", time.Since(stopped).Round(10*time.Millisecond))
				}
				time.Sleep(50 * time.Millisecond)
			}

			if err := h.Process.Signal(syscall.SIGCONT); err != nil {
				t.Fatal(err)
			}
			if code := h.exitCode(t, 10*time.Second); code != 4 {
				t.Fatalf("resumed amqpsem exited %d, want 4 (slot lost):\n%s", code, h.out.String())
			}
		})
	}
}
