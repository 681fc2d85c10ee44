package main_test

import (
	"context"
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

// With one of three masters hung (it accepts connections and never
// answers), redlockrun runs its command at once and exits within the
// call timeout (1s, of the default -ttl) after it, plus the time of the
// same run on three live masters and 500ms of slack.
func TestExitWithHungMaster(t *testing.T) {
	bin := cmdtest.Build(t, ".")
	live, _ := masters(t)
	begin := time.Now()
	cmdtest.Expect(t, bin, 0, "", "-addrs", live, cmdtest.UniqueName("redlockrun-"), "--", "true")
	slack := time.Since(begin) + 500*time.Millisecond
	const callTimeout = time.Second
	addrs := strings.Join(append(strings.Split(live, ",")[:2], silentListener(t)), ",")
	begin = time.Now()
	cmdtest.Expect(t, bin, 0, "", "-addrs", addrs, cmdtest.UniqueName("redlockrun-"), "--", "true")
	if took := time.Since(begin); took > callTimeout+slack {
		t.Errorf("with a hung master redlockrun took %v, want at most the call timeout %v + slack %v", took, callTimeout, slack)
	}
}
