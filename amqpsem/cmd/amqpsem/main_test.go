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
	"testing"
	"time"

	"github.com/latchkey-go/latchkey/contracttest/testenv"
)

// TestCommand builds the command and drives a semaphore through its
// life, checking output and exit codes.
func TestCommand(t *testing.T) {
	url := testenv.AMQPURL(t)
	bin := filepath.Join(t.TempDir(), "amqpsem")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	var b [4]byte
	_, _ = rand.Read(b[:])
	name := "amqpsem-cmd-" + hex.EncodeToString(b[:])
	run := func(args ...string) (string, int) {
		t.Helper()
		cmd := exec.Command(bin, append([]string{"--url", url, "--heartbeat", "2s"}, args...)...)
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
	expect := func(want int, contains string, args ...string) string {
		t.Helper()
		out, code := run(args...)
		if code != want || !strings.Contains(out, contains) {
			t.Fatalf("amqpsem %s: exit %d, output:\n%s\nwant exit %d and %q", strings.Join(args, " "), code, out, want, contains)
		}
		return out
	}
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
