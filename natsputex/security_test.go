package natsputex_test

import (
	"context"
	"os/exec"
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
		nc, err := nats.Connect(srv.URL(), nats.Secure(certs.Client.Clone()), nats.UserInfo(secUser, pw), nats.MaxReconnects(0))
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
			t.Cleanup(func() { _ = c.Close() })
		}
		return c, err
	}
	c, err := connect(secPassword)
	if err != nil {
		t.Fatalf("over TLS as %s: %v", secUser, err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	lease, err := c.Locker().Lock(ctx, "job")
	if err != nil {
		t.Fatalf("Lock over TLS: %v", err)
	}
	if lease.Token() == 0 {
		t.Error("no fencing token")
	}
	if err := lease.Release(ctx); err != nil {
		t.Fatalf("Release over TLS: %v", err)
	}

	if _, err := connect("wrong-" + secPassword); err == nil {
		t.Fatal("a wrong password was accepted")
	} else if strings.Contains(err.Error(), secPassword) {
		t.Errorf("the error shows the password: %v", err)
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
	p := startNatslock(t, bin, withUser(secPassword), "secure", "svc", "node-a", "-tlsca", certs.CAFile)
	waitFor(t, 10*time.Second, "natslock over TLS starts its service", func() bool { return p.lastState() == "start" })
	if strings.Contains(p.logs(), secPassword) {
		t.Errorf("natslock's log shows the password:\n%s", p.logs())
	}

	cmd := exec.Command(bin, "-tlsca", certs.CAFile, withUser("wrong-"+secPassword), "secure", "svc", "node-b")
	out, err := cmd.CombinedOutput()
	if err == nil {
		t.Fatalf("natslock with a wrong password exited 0:\n%s", out)
	}
	if strings.Contains(string(out), secPassword) {
		t.Errorf("natslock's error shows the password:\n%s", out)
	}
	t.Logf("wrong password: %s", strings.TrimSpace(string(out)))
}
