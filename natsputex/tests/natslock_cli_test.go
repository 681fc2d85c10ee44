package natsputex_test

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

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
		for _, want := range []string{"Usage:", "must return", "Exit codes:", "64", "NATSLOCK_TOKEN", "-reconnect-wait", "-max-reconnects", "-version", "-log-format", "-metrics-addr", "latchkey_natslock_takeovers_total"} {
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
		{[]string{"-tlscert", "c.pem", url, "b", "k", "tok"}, "-tlskey"},
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

// TestNatslockStartToken: the start command gets the fencing token, the
// revision of the write that won the key, in $NATSLOCK_TOKEN and as $1.
func TestNatslockStartToken(t *testing.T) {
	bin, url, bucket := natslockEnv(t, "natslocktok")
	const key = "spof-service"
	writes := watchWrites(t, url, bucket, key)
	tokFile := filepath.Join(t.TempDir(), "token")
	p := startNatslock(t, bin, url, bucket, key, "node-a",
		"-start", fmt.Sprintf(`echo "$NATSLOCK_TOKEN $1" > '%s'`, tokFile))
	var got string
	waitFor(t, 10*time.Second, "the start command runs", func() bool {
		b, _ := os.ReadFile(tokFile)
		got = strings.TrimSpace(string(b))
		return got != ""
	})
	waitFor(t, 2*time.Second, "the test's watch sees node-a's write", func() bool { _, ok := writes.firstBy("node-a"); return ok })
	w, _ := writes.firstBy("node-a")
	if want := fmt.Sprintf("%d %d", w.rev, w.rev); got != want {
		t.Errorf("the start command got $NATSLOCK_TOKEN $1 = %q, want %q (the revision of the write that won the key)", got, want)
	}
	_ = p
}

// TestNatslockKill9: a natslock killed with SIGKILL leaves no service
// running: its reaper runs the stop command and kills what the start
// command left in the background, at once, not T later.
func TestNatslockKill9(t *testing.T) {
	requireNanoDate(t)
	bin, url, bucket := natslockEnv(t, "natslockkill")
	const key = "spof-service"
	pidFile := filepath.Join(t.TempDir(), "pid")
	p := startNatslock(t, bin, url, bucket, key, "node-a",
		"-start", fmt.Sprintf(`echo "start $(date +%%s%%N)" >> "$STATE"; sh -c 'echo $$ > %s; exec sleep 60' > /dev/null 2>&1 &`, pidFile),
		"-stop", `echo "stop $(date +%s%N)" >> "$STATE"`)
	svc := waitPid(t, 10*time.Second, "the service runs in the background", pidFile)
	stops := len(p.events(t))
	if err := p.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	killed := time.Now()
	<-p.done
	waitFor(t, 3*time.Second, "the background service ends", svc.ended)
	t.Logf("the service's process had ended %v after natslock was killed", time.Since(killed).Round(time.Millisecond))
	waitFor(t, 3*time.Second, "the stop command runs", func() bool { return len(p.events(t)) > stops && p.lastState() == "stop" })
	if stop := p.last(t, "stop"); stop.at.Before(killed) {
		t.Errorf("no stop command ran after natslock was killed")
	}
	if !strings.Contains(p.logs(), "natslock-reaper") {
		t.Errorf("the reaper said nothing: %s", p.logs())
	}
}

// TestNatslockSigtermDuringHealthCheck: a SIGTERM that arrives while a
// health check runs (and kills it) is not logged as a failed check.
func TestNatslockSigtermDuringHealthCheck(t *testing.T) {
	bin, url, bucket := natslockEnv(t, "natslockterm")
	const key = "spof-service"
	running := filepath.Join(t.TempDir(), "running")
	p := startNatslock(t, bin, url, bucket, key, "node-a", "-r", "1s",
		"-healthcheck", fmt.Sprintf(`touch '%s'; sleep 0.6; rm -f '%s'`, running, running))
	waitFor(t, 10*time.Second, "node-a starts its service", func() bool { return p.lastState() == "start" })
	waitFor(t, 5*time.Second, "a health check runs", func() bool { _, err := os.Stat(running); return err == nil })
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(5 * time.Second):
		t.Fatal("natslock did not exit after SIGTERM")
	}
	if l := p.logs(); strings.Contains(l, "health check failed") {
		t.Errorf("a SIGTERM during a health check was logged as a failed check:\n%s", l)
	}
	if code := p.cmd.ProcessState.ExitCode(); code != 0 {
		t.Errorf("exit code after SIGTERM: %d, want 0", code)
	}
	if p.lastState() != "stop" {
		t.Errorf("the service's state after SIGTERM: %q, want stop", p.lastState())
	}
}

// TestNatslockSlowStop: with R = 100ms, F = 3, C = 6 (T = 300ms, the stop
// command has margin + C·R = 650ms), a stop command of 500ms after a
// failed health check runs to its end, is not reported before it has,
// and the standby starts only after it.
func TestNatslockSlowStop(t *testing.T) {
	requireNanoDate(t)
	bin, url, bucket := natslockEnv(t, "natslockslow")
	const key = "spof-service"
	failFile := filepath.Join(t.TempDir(), "fail")
	slow := []string{"-c", "6", "-stop", `sleep 0.5; echo "stop $(date +%s%N)" >> "$STATE"`}
	a := startNatslock(t, bin, url, bucket, key, "node-a", append(slow,
		"-healthcheck", fmt.Sprintf(`[ ! -e '%s' ] || [ "$1" = standby ]`, failFile))...)
	waitFor(t, 10*time.Second, "node-a starts its service", func() bool { return a.lastState() == "start" })
	b := startNatslock(t, bin, url, bucket, key, "node-b", slow...)
	waitFor(t, 10*time.Second, "node-b is standby", func() bool { return strings.Contains(b.logs(), "standby: the key is held") })
	if err := os.WriteFile(failFile, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 5*time.Second, "node-b starts its service", func() bool { return b.lastState() == "start" })
	if a.lastState() != "stop" {
		t.Errorf("node-a's stop command of 500ms did not finish (killed at T = 300ms?)")
	}
	checkNoOverlap(t, a, b)
}

// TestNatslockServerRestart: natslock reconnects after its server
// restarts as often as -reconnect-wait says (50ms here, not nats.go's
// 2s), so a sub-second restart does not stop the service: with R = 500ms
// (T − margin = 1.25s), the active node renews again in time.
func TestNatslockServerRestart(t *testing.T) {
	requireNanoDate(t)
	bin, srv, bucket := natslockServer(t, "natslockrestart", jetstream.FileStorage)
	url := srv.URL()
	const key = "spof-service"
	const R = 500 * time.Millisecond
	p := startNatslock(t, bin, url, bucket, key, "node-a", "-r", R.String(), "-reconnect-wait", "50ms")
	waitFor(t, 10*time.Second, "node-a starts its service", func() bool { return p.lastState() == "start" })
	runs := len(p.events(t))
	down := time.Now()
	if err := srv.Restart(); err != nil {
		t.Fatal(err)
	}
	t.Logf("the server was down for %v", time.Since(down).Round(time.Millisecond))
	took := waitFor(t, 5*time.Second, "natslock reconnects", func() bool { return strings.Contains(p.logs(), "reconnected to NATS") })
	t.Logf("natslock reconnected %v after the server was back", took.Round(time.Millisecond))
	time.Sleep(4 * R)
	if evs := p.events(t); len(evs) != runs {
		t.Errorf("the service was stopped or started across a sub-second restart: %v", evs[runs:])
	}
	select {
	case <-p.done:
		t.Fatalf("natslock exited: %v", p.cmd.ProcessState)
	default:
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

// TestNatslockStandbyCheckFails: a standby whose health check fails does
// not take over a dead node's key, however long it waits; once its check
// passes it does, within T + C·R and a few strokes.
func TestNatslockStandbyCheckFails(t *testing.T) {
	bin, url, bucket := natslockEnv(t, "natslockstandby")
	const key = "spof-service"
	failFile := filepath.Join(t.TempDir(), "fail")
	if err := os.WriteFile(failFile, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	a := startNatslock(t, bin, url, bucket, key, "node-a")
	waitFor(t, 10*time.Second, "node-a starts its service", func() bool { return a.lastState() == "start" })
	b := startNatslock(t, bin, url, bucket, key, "node-b",
		"-healthcheck", fmt.Sprintf(`[ "$1" = active ] || [ ! -e '%s' ]`, failFile))
	waitFor(t, 10*time.Second, "node-b's check fails as a standby", func() bool { return strings.Contains(b.logs(), "health check failed") })
	if err := a.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	<-a.done
	time.Sleep(3 * handoverBound)
	if b.lastState() == "start" {
		t.Fatalf("node-b took over while its standby health check failed")
	}
	if err := os.Remove(failFile); err != nil {
		t.Fatal(err)
	}
	took := waitFor(t, handoverBound+time.Second, "node-b takes over once its check passes", func() bool { return b.lastState() == "start" })
	t.Logf("node-b started %v after its check passed", took.Round(time.Millisecond))
}

// TestNatslockStopFailsExit3: when the last stop command fails, natslock
// exits with status 3, says so, and does not blank the key; its reaper
// then runs the stop command once more and kills what the start command
// left running.
func TestNatslockStopFailsExit3(t *testing.T) {
	bin, url, bucket := natslockEnv(t, "natslockexit3")
	const key = "spof-service"
	pidFile := filepath.Join(t.TempDir(), "pid")
	p := startNatslock(t, bin, url, bucket, key, "node-a",
		"-start", fmt.Sprintf(`echo "start $(date +%%s%%N)" >> "$STATE"; sh -c 'echo $$ > %s; exec sleep 60' > /dev/null 2>&1 &`, pidFile),
		"-stop", `echo "stop $(date +%s%N)" >> "$STATE"; exit 1`)
	svc := waitPid(t, 10*time.Second, "the service runs in the background", pidFile)
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(10 * time.Second):
		t.Fatal("natslock did not exit after SIGTERM")
	}
	if code := p.cmd.ProcessState.ExitCode(); code != 3 {
		t.Errorf("exit code when the last stop failed: %d, want 3", code)
	}
	if l := p.logs(); !strings.Contains(l, "stopping the service failed") {
		t.Errorf("natslock did not say that the stop failed:\n%s", l)
	}
	kv := mustBucket(t, url, bucket)
	if e, err := kv.Get(context.Background(), key); err != nil || valueToken(e.Value()) != "node-a" {
		t.Errorf("the key after a failed last stop: %v %v; want node-a's token, not blanked", e, err)
	}
	waitFor(t, 3*time.Second, "the reaper kills the service", svc.ended)
}

// TestNatslockGivesUp: with -max-reconnects 2, a natslock whose server
// stays down stops its service and exits with status 1, saying why,
// rather than running on with a closed connection.
func TestNatslockGivesUp(t *testing.T) {
	bin, srv, bucket := natslockServer(t, "natslockgiveup", jetstream.MemoryStorage)
	url := srv.URL()
	p := startNatslock(t, bin, url, bucket, "spof-service", "node-a", "-max-reconnects", "2", "-reconnect-wait", "50ms")
	waitFor(t, 10*time.Second, "node-a starts its service", func() bool { return p.lastState() == "start" })
	srv.Shutdown()
	select {
	case <-p.done:
	case <-time.After(10 * time.Second):
		t.Fatal("natslock runs on 10s after its connection gave up")
	}
	if code := p.cmd.ProcessState.ExitCode(); code != 1 {
		t.Errorf("exit code after the connection gave up: %d, want 1", code)
	}
	if !strings.Contains(p.logs(), "stopped reconnecting") {
		t.Errorf("natslock did not say why it ended:\n%s", p.logs())
	}
	if p.lastState() != "stop" {
		t.Errorf("the service's state: %q, want stop", p.lastState())
	}
}
