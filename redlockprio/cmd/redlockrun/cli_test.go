package main_test

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/latchkey-go/latchkey/contracttest/cmdtest"
)

// TestCLI: the command-line convention every command keeps, and every
// bad command line refused in one line, exit 64, before any I/O
// (nothing listens on port 1: a redlockrun that dialled would exit 1).
func TestCLI(t *testing.T) {
	bin := cmdtest.Build(t, ".")
	down := []string{"-addrs", "127.0.0.1:1"}
	with := func(args ...string) []string { return append(append([]string{}, down...), args...) }
	missing := filepath.Join(t.TempDir(), "missing")
	cmdtest.CheckConvention(t, bin, []cmdtest.Case{
		{Name: "no command", Args: with("name"), Want: "want NAME -- COMMAND"},
		{Name: "no --", Args: with("name", "true"), Want: "want NAME -- COMMAND"},
		{Args: with("-grace", "-1s", "name", "--", "true"), Want: "-grace"},
		{Args: with("-timeout", "soon", "name", "--", "true"), Want: "-timeout"},
		{Args: with("-log-format", "xml", "name", "--", "true"), Want: "-log-format"},
		{Args: []string{"-addrs", "not an addr", "name", "--", "true"}, Want: `"not an addr"`},
		{Args: []string{"-addrs", "127.0.0.1", "name", "--", "true"}, Want: "missing port"},
		{Args: []string{"-addrs", "127.0.0.1:99999", "name", "--", "true"}, Want: "bad port"},
		{Args: []string{"-addrs", "http://127.0.0.1:1", "name", "--", "true"}, Want: "http://"},
		{Args: []string{"-addrs", "redis://127.0.0.1:1/notadb", "name", "--", "true"}, Want: "notadb"},
		{Args: []string{"-addrs", ",", "name", "--", "true"}, Want: "no master"},
		{Name: "two masters", Args: []string{"-addrs", "127.0.0.1:1,127.0.0.1:2", "name", "--", "true"}, Want: "two"},
		{Name: "tls flag without TLS", Args: with("-tls-ca", "ca.pem", "name", "--", "true"), Want: "-tls"},
		{Name: "tls with redis URL", Args: []string{"-tls", "-addrs", "redis://127.0.0.1:1", "name", "--", "true"}, Want: "rediss://"},
		{Name: "cert without key", Args: with("-tls", "-tls-cert", "c.pem", "name", "--", "true"), Want: "-tls-key"},
		{Name: "missing CA file", Args: with("-tls", "-tls-ca", missing, "name", "--", "true"), Want: "-tls-ca"},
		{Name: "missing password file", Args: with("-password-file", missing, "name", "--", "true"), Want: "-password-file"},
		{Name: "bad name", Args: with("bad{name}", "--", "true"), Want: "bad{name}"},
		{Name: "long name cut", Args: with(strings.Repeat("n", 300)+"{", "--", "true"), Want: "...(301 bytes)"},
		// After I/O: one ERROR line naming the master, exit 1; no
		// go-redis line without -v.
		{Name: "refused", Args: with("name", "--", "true"), Exit: 1, Want: "127.0.0.1:1", Lines: 1},
		{Name: "refused URL", Args: []string{"-addrs", "redis://:pw@127.0.0.1:1", "name", "--", "true"}, Exit: 1, Want: "127.0.0.1:1", Lines: 1},
	})
}

// The library's errors read "redlockprio: op: cause" after the
// command's name, without package locks' internal "locks: " prefix.
func TestNoInternalPrefix(t *testing.T) {
	bin := cmdtest.Build(t, ".")
	for _, args := range [][]string{
		{"-addrs", "127.0.0.1:1", "bad{name}", "--", "true"},
		{"-addrs", "127.0.0.1:1,127.0.0.1:2", "name", "--", "true"},
	} {
		out, code := cmdtest.Run(t, bin, args...)
		if code != 64 || !strings.Contains(out, "redlockrun: redlockprio: ") || strings.Contains(out, "locks: ") {
			t.Errorf("%q: exit %d, want 64 and one line without \"locks: \":\n%s", args, code, out)
		}
	}
}

// A password in a URL is never printed, even when the URL is refused.
func TestPasswordNotPrinted(t *testing.T) {
	bin := cmdtest.Build(t, ".")
	const secret = "s3cretPw"
	for _, addrs := range []string{"redis://:" + secret + "@127.0.0.1:1", "redis://u:" + secret + "@127.0.0.1:1/x", "rediss://u:" + secret + "@127.0.0.1:1"} {
		out, code := cmdtest.Run(t, bin, "-v", "-addrs", addrs, "name", "--", "true")
		if code == 0 || strings.Contains(out, secret) {
			t.Errorf("-addrs %s: exit %d, printed the password:\n%s", addrs, code, out)
		}
	}
}

// -log-format json: every line, go-redis's too (-v), is one JSON object
// with time, msg and name; one ERROR line names the failed master.
func TestLogJSON(t *testing.T) {
	bin := cmdtest.Build(t, ".")
	out := cmdtest.Expect(t, bin, 1, `"level":"ERROR"`, "-v", "-log-format", "json", "-addrs", "127.0.0.1:1", "name", "--", "true")
	errors, redis := 0, 0
	for l := range strings.Lines(out) {
		var line map[string]any
		if err := json.Unmarshal([]byte(l), &line); err != nil {
			t.Errorf("a line is not a JSON object: %v: %q", err, l)
			continue
		}
		if line["name"] != "name" || line["time"] == nil || line["msg"] == "" {
			t.Errorf("a line lacks time, name or msg: %v", line)
		}
		if line["source"] == "go-redis" {
			redis++
		}
		if line["level"] == "ERROR" {
			errors++
			if e, _ := line["error"].(string); !strings.Contains(e, "127.0.0.1:1") {
				t.Errorf("the error line does not say which master failed: %v", line)
			}
		}
	}
	if errors != 1 || redis == 0 {
		t.Errorf("%d ERROR lines and %d of go-redis, want 1 and some (-v):\n%s", errors, redis, out)
	}
}

// -timeout bounds the whole acquisition, dials and handshakes included:
// against masters that accept connections and never answer, redlockrun
// exits 3 by -timeout plus the slack of starting a process, not after
// go-redis's own dial and read timeouts.
func TestTimeoutSilentMasters(t *testing.T) {
	bin := cmdtest.Build(t, ".")
	addr := silentListener(t)
	addrs := strings.Join([]string{addr, addr, addr}, ",")
	// The slack: what a run refused at once (exit 64, no I/O) takes here.
	begin := time.Now()
	cmdtest.Run(t, bin, "-addrs", addrs, "bad{name}", "--", "true")
	slack := time.Since(begin) + 500*time.Millisecond
	for _, timeout := range []time.Duration{300 * time.Millisecond, 2 * time.Second} {
		begin := time.Now()
		out, code := cmdtest.Run(t, bin, "-addrs", addrs, "-timeout", timeout.String(), "name", "--", "true")
		took := time.Since(begin)
		if code != 3 || took > timeout+slack || strings.Contains(out, "level=ERROR") {
			t.Errorf("-timeout %v against silent masters: exit %d after %v (bound %v + slack %v), want 3 and no ERROR line:\n%s", timeout, code, took, timeout, slack, out)
		}
	}
}

// A master's call timeout is not -timeout: without -timeout, masters
// whose TLS handshake never ends make redlockrun fail (exit 1, one ERROR
// line naming the master), not report "-timeout passed" (exit 3).
func TestCallTimeoutIsAnError(t *testing.T) {
	bin := cmdtest.Build(t, ".")
	addr := silentListener(t)
	for _, args := range [][]string{
		{"-try", "-addrs", "rediss://" + addr},
		{"-tls", "-addrs", addr},
	} {
		// -ttl 2s: a call timeout of 200ms.
		out, code := cmdtest.Run(t, bin, append(args, "-ttl", "2s", "name", "--", "true")...)
		if code != 1 || strings.Contains(out, "-timeout") || !strings.Contains(out, "level=ERROR") || !strings.Contains(out, addr) || strings.Count(out, "\n") != 1 {
			t.Errorf("%q against a master that never answers: exit %d, want 1 and one ERROR line naming %s, no -timeout:\n%s", args, code, addr, out)
		}
	}
}

// writeFile writes data to a new file in dir and returns its path.
func writeFile(t *testing.T, dir, name, data string) string {
	t.Helper()
	path := filepath.Join(dir, name)
	if err := os.WriteFile(path, []byte(data), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}
