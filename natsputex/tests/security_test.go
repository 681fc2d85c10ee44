package natsputex_test

import (
	"context"
	"errors"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/latchkey-go/latchkey/contracttest/testenv"
	"github.com/latchkey-go/latchkey/contracttest/testenv/natsenv"
	"github.com/latchkey-go/latchkey/natsputex"
)

const (
	secUser     = "locker"
	secPassword = "s3cret-Pw-4-test"
)

// TestTLSAndPassword locks over TLS as a user with a password, and shows
// that a wrong password fails without the password in the error.
func TestTLSAndPassword(t *testing.T) {
	certs := testenv.NewTLS(t)
	srv := natsenv.StartServerWith(t, natsenv.ServerConfig{TLS: certs, User: secUser, Password: secPassword})
	if !strings.HasPrefix(srv.URL(), "tls://") {
		t.Fatalf("URL %q: want tls://", srv.URL())
	}
	connect := func(pw string) (*natsputex.Client, error) {
		return secureClient(t, srv.URL(), nats.Secure(certs.Client.Clone()), nats.UserInfo(secUser, pw))
	}
	c, err := connect(secPassword)
	if err != nil {
		t.Fatalf("over TLS as %s: %v", secUser, err)
	}
	lockOnce(t, c)

	if _, err := connect("wrong-" + secPassword); err == nil {
		t.Fatal("a wrong password was accepted")
	} else if strings.Contains(err.Error(), secPassword) {
		t.Errorf("the error shows the password: %v", err)
	}
}

// TestCredentials locks as a user of a server in operator (JWT) mode,
// authenticated by its credentials file, and shows that the credentials
// of another operator's user, a missing file and a file without its JWT
// all fail, with no seed or JWT in the error.
func TestCredentials(t *testing.T) {
	op := natsenv.NewOperator(t)
	srv := natsenv.StartServerWith(t, natsenv.ServerConfig{Operator: op})
	user := op.NewUser(t, "locker")
	c, err := secureClient(t, srv.URL(), nats.UserCredentials(user.File))
	if err != nil {
		t.Fatalf("with %s's credentials: %v", "locker", err)
	}
	lockOnce(t, c)

	for _, bad := range badCreds(t, user) {
		_, err := secureClient(t, srv.URL(), nats.UserCredentials(bad.file))
		if err == nil {
			t.Errorf("%s: accepted", bad.name)
			continue
		}
		t.Logf("%s: %v", bad.name, err)
		if !errors.Is(err, bad.want) {
			t.Errorf("%s: %v, want an error matching %v", bad.name, err, bad.want)
		}
		for _, secret := range bad.secrets {
			if strings.Contains(err.Error(), secret) {
				t.Errorf("%s: the error shows a secret of the credentials: %v", bad.name, err)
			}
		}
	}
}

// secureClient connects to url with opts and no reconnection, and makes a
// client on the bucket "secure"; both are closed at cleanup.
func secureClient(t *testing.T, url string, opts ...nats.Option) (*natsputex.Client, error) {
	t.Helper()
	nc, err := nats.Connect(url, append(opts, nats.MaxReconnects(0))...)
	if err != nil {
		return nil, err
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := natsputex.New(ctx, js, "secure", natsputex.WithRenewInterval(testR))
	if err == nil {
		t.Cleanup(func() { _ = c.Close(context.Background()) })
	}
	return c, err
}

// lockOnce locks "job" with c, checks the fencing token and releases it.
func lockOnce(t *testing.T, c *natsputex.Client) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	lease, err := c.Locker().Lock(ctx, "job")
	if err != nil {
		t.Fatalf("Lock: %v", err)
	}
	if lease.Token() == 0 {
		t.Error("no fencing token")
	}
	if err := lease.Release(ctx); err != nil {
		t.Fatalf("Release: %v", err)
	}
}

// badCred is a credentials file a server of the test's operator must
// refuse, the error it gives, and the secrets no error may show.
type badCred struct {
	name    string
	file    string
	want    error
	secrets []string
}

// badCreds returns credentials files that are wrong for user's server: a
// user of another operator, a file that does not exist, and user's file
// without its JWT (its seed alone, which nats.go then sends whole as the
// JWT).
func badCreds(t *testing.T, user natsenv.Creds) []badCred {
	t.Helper()
	stranger := natsenv.NewOperator(t).NewUser(t, "mallory")
	dir := t.TempDir()
	seedOnly := filepath.Join(dir, "seed-only.creds")
	file, err := os.ReadFile(user.File)
	if err != nil {
		t.Fatal(err)
	}
	i := strings.Index(string(file), "-----BEGIN USER NKEY SEED-----")
	if i < 0 {
		t.Fatalf("no seed in %s", user.File)
	}
	if err := os.WriteFile(seedOnly, file[i:], 0o600); err != nil {
		t.Fatal(err)
	}
	all := []string{user.Seed, user.JWT, stranger.Seed, stranger.JWT}
	return []badCred{
		{"another operator's user", stranger.File, nats.ErrAuthorization, all},
		{"a missing file", filepath.Join(dir, "missing.creds"), fs.ErrNotExist, all},
		{"a file without its JWT", seedOnly, nats.ErrAuthorization, all},
	}
}

// TestNatslockTLSAndPassword runs natslock over TLS with the password in
// its URL: it starts the service, and neither its log nor its error with a
// wrong password shows the password.
func TestNatslockTLSAndPassword(t *testing.T) {
	bin := buildNatslock(t)
	certs := testenv.NewTLS(t)
	srv := natsenv.StartServerWith(t, natsenv.ServerConfig{TLS: certs, User: secUser, Password: secPassword})
	withUser := func(pw string) string {
		return strings.Replace(srv.URL(), "tls://", "tls://"+secUser+":"+pw+"@", 1)
	}
	p := startNatslock(t, bin, withUser(secPassword), "secure", "svc", "node-a", "-tls-ca", certs.CAFile)
	waitFor(t, 10*time.Second, "natslock over TLS starts its service", func() bool { return p.lastState() == "start" })
	if strings.Contains(p.logs(), secPassword) {
		t.Errorf("natslock's log shows the password:\n%s", p.logs())
	}

	cmd := exec.Command(bin, "-tls-ca", certs.CAFile, withUser("wrong-"+secPassword), "secure", "svc", "node-b")
	out, err := cmd.CombinedOutput()
	if err == nil {
		t.Fatalf("natslock with a wrong password exited 0:\n%s", out)
	}
	if strings.Contains(string(out), secPassword) {
		t.Errorf("natslock's error shows the password:\n%s", out)
	}
	t.Logf("wrong password: %s", strings.TrimSpace(string(out)))
}

// TestNatslockCredentials runs natslock with --creds on a server in
// operator mode: it starts the service, and its log shows neither the
// user's seed nor its JWT; wrong credentials make it exit with status 1
// and a clear error, with no secret in it; a missing file is a usage
// error (64), found before natslock connects.
func TestNatslockCredentials(t *testing.T) {
	bin := buildNatslock(t)
	op := natsenv.NewOperator(t)
	srv := natsenv.StartServerWith(t, natsenv.ServerConfig{Operator: op})
	user := op.NewUser(t, "natslock")
	p := startNatslock(t, bin, srv.URL(), "secure", "svc", "node-a", "--creds", user.File)
	waitFor(t, 10*time.Second, "natslock with --creds starts its service", func() bool { return p.lastState() == "start" })
	for _, secret := range []string{user.Seed, user.JWT} {
		if strings.Contains(p.logs(), secret) {
			t.Errorf("natslock's log shows a secret of its credentials:\n%s", p.logs())
		}
	}

	for _, bad := range badCreds(t, user) {
		out, err := exec.Command(bin, "--creds", bad.file, srv.URL(), "secure", "svc", "node-b").CombinedOutput()
		code := 1
		if bad.want == fs.ErrNotExist {
			code = 64
		}
		var exit *exec.ExitError
		if !errors.As(err, &exit) || exit.ExitCode() != code {
			t.Errorf("natslock with %s: %v, want exit status %d\n%s", bad.name, err, code, out)
			continue
		}
		t.Logf("natslock with %s: %s", bad.name, strings.TrimSpace(string(out)))
		want := map[error]string{nats.ErrAuthorization: "Authorization Violation", fs.ErrNotExist: bad.file}[bad.want]
		if !strings.Contains(string(out), want) {
			t.Errorf("natslock with %s said %q, want it to say %q", bad.name, out, want)
		}
		for _, secret := range bad.secrets {
			if strings.Contains(string(out), secret) {
				t.Errorf("natslock with %s shows a secret of the credentials:\n%s", bad.name, out)
			}
		}
	}
}
