package main_test

import (
	"context"
	"encoding/json"
	"errors"
	neturl "net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/latchkey-go/latchkey/amqpsem"
	"github.com/latchkey-go/latchkey/contracttest/cmdtest"
	"github.com/latchkey-go/latchkey/contracttest/testenv"
	"github.com/latchkey-go/latchkey/locks"
)

// uniqueName returns a semaphore name no other test uses.
func uniqueName() string { return cmdtest.UniqueName("amqpsem-cmd-") }

// runner returns functions that run bin with pre before the arguments:
// run is [cmdtest.Run], expect [cmdtest.Expect].
func runner(t *testing.T, bin string, pre ...string) (run func(args ...string) (string, int), expect func(want int, contains string, args ...string) string) {
	with := func(args []string) []string { return append(slices.Clone(pre), args...) }
	run = func(args ...string) (string, int) {
		t.Helper()
		return cmdtest.Run(t, bin, with(args)...)
	}
	expect = func(want int, contains string, args ...string) string {
		t.Helper()
		return cmdtest.Expect(t, bin, want, contains, with(args)...)
	}
	return run, expect
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
	bin := cmdtest.Build(t, ".")
	name := uniqueName()
	run, expect := runner(t, bin, "--url", url, "--heartbeat", "2s")
	t.Cleanup(func() { run("destroy", name) })

	expect(0, "Usage:", "--help")
	expect(0, "-log-format", "--help")
	expect(0, "Exit codes", "--help")
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
	hold := func() *cmdtest.Process {
		// A 60s heartbeat: the holders verify their slots every 20s, so
		// neither learns of the removal below before the test ends it (by
		// default, every 3.3s: one did, now and then, and "status" no
		// longer showed its slot).
		return cmdtest.Start(t, bin, "--url", url, "--heartbeat", "60s", "acquire", name, "--", "/bin/sh", "-c", "sleep 30")
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
	for _, h := range []*cmdtest.Process{h1, h2} {
		_ = h.Process.Signal(os.Interrupt)
	}
	expect(0, "no removed slot", "--timeout", "10s", "wait", name)
	expect(0, "from 1 to 3 slots", "resize", name, "+2")
	expect(0, "from 3 to 2 slots", "resize", name, "2")
	// Found once the broker answered: an error, not a usage error.
	expect(1, "cannot remove 5 slots of 2", "resize", name, "-5")
	expect(0, "destroyed "+name+" (2 slots)", "destroy", name)
	expect(0, "no removed slot", "--timeout", "30s", "wait", name)
	expect(1, "no semaphore", "status", name)
}

// Bad names, flags and TLS settings are usage errors (exit 64, sysexits'
// EX_USAGE, not 2, the Go runtime's code on a panic or SIGQUIT), found
// before connecting: the broker here is unreachable.
func TestUsageBeforeDial(t *testing.T) {
	bin := cmdtest.Build(t, ".")
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
	bin := cmdtest.Build(t, ".")
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
	bin := cmdtest.Build(t, ".")
	name := uniqueName()
	run, expect := runner(t, bin, "--url", url, "--heartbeat", "1s")
	t.Cleanup(func() { run("destroy", name) })
	expect(0, "created", "create", name, "1")

	started := filepath.Join(t.TempDir(), "started")
	h := cmdtest.Start(t, bin, "--url", url, "--heartbeat", "1s", "--grace", "300ms", "acquire", name, "--",
		"/bin/sh", "-c", `trap "" TERM; touch "$0"; exec sleep 60`, started)
	h.WaitFile(t, started)
	// The command ignores SIGTERM; destroying the semaphore takes its slot.
	expect(0, "destroyed", "destroy", name)
	if code := h.ExitCode(t, 20*time.Second); code != 4 {
		t.Fatalf("acquire ended with %d, want exit 4\n%s", code, h.Out.String())
	}
	if !strings.Contains(h.Out.String(), "killing") {
		t.Errorf("no word of the kill in the output:\n%s", h.Out.String())
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
	bin := cmdtest.Build(t, ".")
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
			h := cmdtest.Start(t, bin, "--url", url, "acquire", name, "--", "/bin/sh", "-c",
				`trap 'touch "$1"; while [ ! -e "$2" ]; do sleep 0.05; done; exit 5' INT TERM
				touch "$0"; while :; do sleep 0.05; done`, started, got, release)
			h.WaitFile(t, started)
			if err := h.Process.Signal(tc.sig); err != nil {
				t.Fatal(err)
			}
			h.WaitFile(t, got)

			// CMD has the signal and runs on: the slot is still held.
			if l, err := other.TryAcquire(t.Context(), name); !errors.Is(err, amqpsem.ErrAllHeld) {
				if err == nil {
					_ = l.Release(t.Context())
				}
				t.Fatalf("TryAcquire while CMD runs on after %s: %v, want every slot held", tc.name, err)
			}
			h.Running(t)

			if err := os.WriteFile(release, nil, 0o600); err != nil {
				t.Fatal(err)
			}
			if code := h.ExitCode(t, 10*time.Second); code != 5 {
				t.Fatalf("amqpsem exited %d after CMD exited 5:\n%s", code, h.Out.String())
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
	bin := cmdtest.Build(t, ".")
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
			h := cmdtest.Start(t, bin, append(tc.args, "acquire", name, "--", "/bin/sh", "-c", `touch "$0"; exec sleep 60`, started)...)
			h.WaitFile(t, started)
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
			if code := h.ExitCode(t, 10*time.Second); code != 4 {
				t.Fatalf("resumed amqpsem exited %d, want 4 (slot lost):\n%s", code, h.Out.String())
			}
		})
	}
}
