package main_test

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/latchkey-go/latchkey/contracttest/testenv"
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

// TestCommand builds the command and drives a semaphore through its
// life, checking output and exit codes.
func TestCommand(t *testing.T) {
	url := testenv.AMQPURL(t)
	bin := build(t)
	name := uniqueName()
	run, expect := runner(t, bin, "--url", url, "--heartbeat", "2s")
	t.Cleanup(func() { run("destroy", name) })

	expect(0, "Usage:", "--help")
	expect(2, "Usage:", "status")
	expect(2, "bad slot count", "create", name, "0")
	expect(2, "invalid name", "create", "amq.nope", "2")
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
	expect(0, "from 2 to 1 slots", "resize", name, "-1")
	out = expect(0, "removed, still held", "status", name)
	_ = out
	expect(3, "", "--timeout", "300ms", "wait", name)
	for _, h := range []*exec.Cmd{h1, h2} {
		_ = h.Process.Signal(os.Interrupt)
	}
	expect(0, "no removed slot", "--timeout", "10s", "wait", name)
	expect(0, "from 1 to 3 slots", "resize", name, "+2")
	expect(0, "from 3 to 2 slots", "resize", name, "2")
	expect(2, "", "resize", name, "-5")
	expect(0, "destroyed "+name+" (2 slots)", "destroy", name)
	expect(0, "0 slots", "status", name)
}

// Bad names, flags and TLS settings are usage errors (exit 2), found
// before connecting: the broker here is unreachable.
func TestUsageBeforeDial(t *testing.T) {
	bin := build(t)
	const down = "amqp://guest:guest@127.0.0.1:1/"
	_, expect := runner(t, bin)
	expect(1, "", "--url", down, "status", "fine")
	expect(2, "invalid name", "--url", down, "create", "amq.nope", "2")
	expect(2, "invalid name", "--url", down, "status", "looks-like-a-slot-1-A")
	expect(2, "invalid name", "--url", down, "--layout", "python", "acquire", "jobs-B-2", "--", "true")
	expect(2, "--beyond", "--url", down, "--beyond", "-1", "status", "fine")
	expect(2, "--timeout", "--url", down, "--timeout", "-1s", "status", "fine")
	expect(2, "--grace", "--url", down, "--grace", "-1s", "acquire", "fine", "--", "true")
	expect(2, "heartbeat", "--url", down, "--heartbeat", "500ms", "status", "fine")
	expect(2, "--url", "--url", "http://not-amqp/", "status", "fine")
	// TLS flags with an amqp:// URL would be ignored.
	expect(2, "amqps://", "--url", down, "--tls-insecure", "status", "fine")
	expect(2, "amqps://", "--url", down, "--tls-server-name", "rabbit", "status", "fine")
	// A key without its certificate, or the reverse.
	const downTLS = "amqps://guest:guest@127.0.0.1:1/"
	expect(2, "--tls-cert and --tls-key", "--url", downTLS, "--tls-key", "key.pem", "status", "fine")
	expect(2, "--tls-cert and --tls-key", "--url", downTLS, "--tls-cert", "cert.pem", "status", "fine")
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
	cmd := exec.Command(bin, "--url", url, "--heartbeat", "1s", "--grace", "300ms", "acquire", name, "--",
		"/bin/sh", "-c", `trap "" TERM; touch "$0"; exec sleep 60`, started)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true} // cleanup kills the group
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	var waitErr error
	go func() {
		waitErr = cmd.Wait()
		close(exited)
	}()
	t.Cleanup(func() {
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		<-exited
	})
	deadline := time.Now().Add(10 * time.Second)
	for {
		if _, err := os.Stat(started); err == nil {
			break
		}
		select {
		case <-exited:
			t.Fatalf("acquire ended before its command started: %v\n%s", waitErr, out.String())
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatal("the command did not start in 10s")
		}
	}
	// The command ignores SIGTERM; destroying the semaphore takes its slot.
	expect(0, "destroyed", "destroy", name)
	select {
	case <-exited:
		var ee *exec.ExitError
		if !errors.As(waitErr, &ee) || ee.ExitCode() != 4 {
			t.Fatalf("acquire ended with %v, want exit 4\n%s", waitErr, out.String())
		}
		if !strings.Contains(out.String(), "killing") {
			t.Errorf("no word of the kill in the output:\n%s", out.String())
		}
	case <-time.After(20 * time.Second):
		t.Fatalf("acquire still running 20s after its slot was removed (its command ignores SIGTERM)")
	}
}
