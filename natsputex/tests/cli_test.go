package natsputex_test

// natslock's command line: usage, exit codes, verbosity.

import (
	"bytes"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/latchkey-go/latchkey/contracttest/cmdtest"
)

// TestNatslockCLI: --help prints the usage on standard output and exits
// 0, and says that commands must return and what each exit code means;
// --version prints the version on standard output; a usage error exits
// 64 (not 2, which a SIGQUIT or a panic gives) with a message on
// standard error that says what is wrong, before any connection.
func TestNatslockCLI(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs natslock")
	}
	bin := buildNatslock(t)
	runIt := func(args ...string) (stdout, stderr string, code int) {
		var o, e bytes.Buffer
		cmd := exec.Command(bin, args...)
		cmd.Stdout, cmd.Stderr = &o, &e
		code = cmdtest.ExitCode(t, cmd.Run())
		return o.String(), e.String(), code
	}

	for _, help := range []string{"--help", "-h", "-help"} {
		out, errOut, code := runIt(help)
		if code != 0 || errOut != "" {
			t.Errorf("natslock %s: exit %d, stderr %q; want 0 and nothing on stderr", help, code, errOut)
		}
		for _, want := range []string{"Usage:", "must return", "Exit codes:", "64", "NATSLOCK_TOKEN", "-reconnect-wait", "-max-reconnects", "-tls-ca", "-version", "-log-format", "-metrics-addr", "latchkey_natslock_takeovers_total"} {
			if !strings.Contains(out, want) {
				t.Errorf("natslock %s: the usage on stdout does not say %q", help, want)
			}
		}
	}
	out, errOut, code := runIt("--version")
	if code != 0 || errOut != "" || !strings.HasPrefix(out, "natslock ") {
		t.Errorf("natslock --version: exit %d, stdout %q, stderr %q; want 0 and \"natslock <version>\" on stdout", code, out, errOut)
	}

	const url = "nats://127.0.0.1:1" // nothing listens: a natslock that connected would exit 1
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{url, "b", "k"}, "want 4 arguments"},
		{[]string{url, "b", "k", "tok", "extra"}, "want 4 arguments"},
		{[]string{"-nosuchflag", url, "b", "k", "tok"}, "nosuchflag"},
		{[]string{"-r", "soon", url, "b", "k", "tok"}, "-r"},
		{[]string{"-v", "-q", url, "b", "k", "tok"}, "-v and -q"},
		{[]string{"-reconnect-wait", "0s", url, "b", "k", "tok"}, "-reconnect-wait"},
		{[]string{"-max-reconnects", "-2", url, "b", "k", "tok"}, "-max-reconnects"},
		{[]string{"-tls-cert", "c.pem", url, "b", "k", "tok"}, "-tls-key"},
		{[]string{"--log-format", "xml", url, "b", "k", "tok"}, "--log-format"},
		{[]string{"--metrics-addr", "9090", url, "b", "k", "tok"}, "--metrics-addr"},
	} {
		out, errOut, code := runIt(tc.args...)
		if code != 64 || out != "" {
			t.Errorf("natslock %q: exit %d, stdout %q; want 64 and nothing on stdout", tc.args, code, out)
		}
		if !strings.Contains(errOut, tc.want) || !strings.Contains(errOut, "--help") {
			t.Errorf("natslock %q said %q, want a message about %s and a pointer to --help", tc.args, errOut, tc.want)
		}
	}
}

// TestNatslockVerbosity: -v also logs each command with its duration;
// -q logs only failures and changes of phase (a standby's "the key is
// held" comes while it is standby already); by default natslock logs
// every event of the Supervisor.
func TestNatslockVerbosity(t *testing.T) {
	bin, url, bucket := natslockEnv(t, "natslockverb")
	const key = "spof-service"
	a := startNatslock(t, bin, url, bucket, key, "node-a", "-v")
	waitFor(t, 10*time.Second, "node-a starts its service", func() bool { return a.lastState() == "start" })
	quiet := startNatslock(t, bin, url, bucket, key, "node-q", "-q")
	normal := startNatslock(t, bin, url, bucket, key, "node-n")
	waitFor(t, 10*time.Second, "the default node says who holds the key", func() bool { return strings.Contains(normal.logs(), "standby: the key is held") })
	time.Sleep(3 * testR) // node-q has had as many strokes
	for _, want := range [][]string{
		{`level=DEBUG msg="health check succeeded"`, " state=active duration="},
		{`level=DEBUG msg="start command succeeded"`, " fencing_token=", " duration="},
		{`level=DEBUG msg="stop command succeeded"`, " duration="},
	} {
		found := false
		for line := range strings.Lines(a.logs()) {
			found = found || strings.Contains(line, want[0]) && strings.Contains(line, want[1]) && strings.Contains(line, want[len(want)-1])
		}
		if !found {
			t.Errorf("with -v, natslock does not log a line with %q", want)
		}
	}
	if strings.Contains(quiet.logs(), "standby: the key is held") || strings.Contains(quiet.logs(), "health check") || strings.Contains(quiet.logs(), "level=INFO") {
		t.Errorf("with -q, natslock logs a standby's routine events:\n%s", quiet.logs())
	}
	if strings.Contains(normal.logs(), "level=DEBUG") || strings.Contains(normal.logs(), "health check succeeded") {
		t.Errorf("by default, natslock logs each command:\n%s", normal.logs())
	}
}
