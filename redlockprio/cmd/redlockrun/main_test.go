package main_test

import (
	"context"
	"encoding/json"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/latchkey-go/latchkey/contracttest/cmdtest"
	"github.com/latchkey-go/latchkey/contracttest/testenv"
)

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

// TestUsage: usage errors exit 64 (sysexits' EX_USAGE, not 2, the Go
// runtime's code on a panic or SIGQUIT) before any I/O, --help exits 0 and
// documents the exit codes.
func TestUsage(t *testing.T) {
	bin := cmdtest.Build(t, ".")
	cmdtest.Expect(t, bin, 0, "Exit codes", "--help")
	cmdtest.Expect(t, bin, 0, "64 usage error", "--help")
	cmdtest.Expect(t, bin, 0, "-log-format", "--help")
	cmdtest.Expect(t, bin, 64, "want NAME -- COMMAND", "name")
	cmdtest.Expect(t, bin, 64, "want NAME -- COMMAND", "name", "true")
	cmdtest.Expect(t, bin, 64, "", "-nosuchflag", "name", "--", "true")
	cmdtest.Expect(t, bin, 64, "-grace", "-grace", "-1s", "name", "--", "true")
	// Two masters without -two-masters; a bad name: both before any I/O
	// (nothing listens on port 1).
	cmdtest.Expect(t, bin, 64, "", "-addrs", "127.0.0.1:1,127.0.0.1:2", "name", "--", "true")
	cmdtest.Expect(t, bin, 64, "", "-addrs", "127.0.0.1:1", "bad{name}", "--", "true")
	cmdtest.Expect(t, bin, 64, "-log-format", "-log-format", "xml", "name", "--", "true")
	cmdtest.Expect(t, bin, 1, " level=ERROR msg=failed name=name error=", "-addrs", "127.0.0.1:1", "name", "--", "true")
	out := cmdtest.Expect(t, bin, 1, `"level":"ERROR"`, "-log-format", "json", "-addrs", "127.0.0.1:1", "name", "--", "true")
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
	bin := cmdtest.Build(t, ".")
	addrs, _ := masters(t)
	name := cmdtest.UniqueName("redlockrun-")
	out := cmdtest.Expect(t, bin, 7, "name="+name, "-addrs", addrs, name, "--", "/bin/sh", "-c", `echo "name=$LOCK_NAME token=$LOCK_TOKEN slot=$LOCK_SLOT"; exit 7`)
	// LOCK_SLOT is the lease's Slot(): 0 for a lock once redlockprio
	// takes the one shape (issue 19), 1 before.
	if !strings.Contains(out, "slot=") || strings.Contains(out, "token=0 ") || !strings.Contains(out, "token=") {
		t.Errorf("environment: %q", out)
	}
	out2 := cmdtest.Expect(t, bin, 0, "token=", "-addrs", addrs, name, "--", "/bin/sh", "-c", `echo "token=$LOCK_TOKEN"`)
	first, _ := strconv.Atoi(strings.Fields(strings.SplitN(out, "token=", 2)[1])[0])
	second, _ := strconv.Atoi(strings.TrimSpace(strings.SplitN(out2, "token=", 2)[1]))
	if first < 1 || second <= first {
		t.Errorf("tokens %d then %d: want increasing", first, second)
	}
	cmdtest.Expect(t, bin, 128+int(syscall.SIGTERM), "", "-addrs", addrs, name, "--", "/bin/sh", "-c", "kill -TERM $$")

	started := filepath.Join(t.TempDir(), "started")
	h := cmdtest.Start(t, bin, "-addrs", addrs, name, "--", "/bin/sh", "-c", `touch "$0"; exec sleep 60`, started)
	h.WaitFile(t, started)
	cmdtest.Expect(t, bin, 3, "", "-addrs", addrs, "-try", name, "--", "true")
	cmdtest.Expect(t, bin, 3, "", "-addrs", addrs, "-timeout", "300ms", name, "--", "true")

	// A signal to redlockrun goes to its command: sleep dies of it, and
	// redlockrun exits as it did, releasing the lock.
	if err := h.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if code := h.ExitCode(t, 10*time.Second); code != 128+int(syscall.SIGTERM) {
		t.Fatalf("redlockrun exited %d after SIGTERM, want its command's 143:\n%s", code, h.Out.String())
	}
	cmdtest.Expect(t, bin, 0, "", "-addrs", addrs, "-try", name, "--", "true")
}

// TestLost: when the lock's keys vanish from the masters, the command is
// sent SIGTERM, then SIGKILL after -grace, and redlockrun exits 4.
func TestLost(t *testing.T) {
	bin := cmdtest.Build(t, ".")
	addrs, clients := masters(t)
	name := cmdtest.UniqueName("redlockrun-")
	started := filepath.Join(t.TempDir(), "started")
	h := cmdtest.Start(t, bin, "-addrs", addrs, "-ttl", "1s", "-grace", "300ms", name, "--",
		"/bin/sh", "-c", `trap "" TERM; echo $$ > "$0.tmp"; mv "$0.tmp" "$0"; while :; do sleep 0.05; done`, started)
	h.WaitFile(t, started)
	pid := cmdtest.ReadPid(t, started)
	for _, c := range clients {
		if err := c.FlushAll(context.Background()).Err(); err != nil {
			t.Fatal(err)
		}
	}
	if code := h.ExitCode(t, 20*time.Second); code != 4 {
		t.Fatalf("redlockrun exited %d after its lock vanished, want 4:\n%s", code, h.Out.String())
	}
	if out := h.Out.String(); !strings.Contains(out, `level=ERROR msg="lock lost while the command ran" name=`) || !strings.Contains(out, " token=") || !strings.Contains(out, "killing") {
		t.Errorf("no word of the loss and the kill:\n%s", out)
	}
	cmdtest.WaitGone(t, pid, 5*time.Second)
}

// TestKill9: a redlockrun killed outright leaves no command running: its
// reaper kills the command's group at once.
func TestKill9(t *testing.T) {
	bin := cmdtest.Build(t, ".")
	addrs, _ := masters(t)
	started := filepath.Join(t.TempDir(), "started")
	h := cmdtest.Start(t, bin, "-addrs", addrs, cmdtest.UniqueName("redlockrun-"), "--",
		"/bin/sh", "-c", `echo $$ > "$0.tmp"; mv "$0.tmp" "$0"; exec sleep 60`, started)
	h.WaitFile(t, started)
	pid := cmdtest.ReadPid(t, started)
	if err := h.Process.Kill(); err != nil { // redlockrun alone, not its group
		t.Fatal(err)
	}
	cmdtest.WaitGone(t, pid, 5*time.Second)
	time.Sleep(100 * time.Millisecond)
	if !strings.Contains(h.Out.String(), "redlockrun-reaper") {
		t.Errorf("the reaper said nothing:\n%s", h.Out.String())
	}
}
