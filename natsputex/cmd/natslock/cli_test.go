package main

import (
	"fmt"
	"strings"
	"testing"

	"github.com/nats-io/nats.go"

	"github.com/latchkey-go/latchkey/contracttest/cmdtest"
	"github.com/latchkey-go/latchkey/natsputex"
)

// TestCLI: the command-line convention every command keeps, and every
// bad command line refused in one line, exit 64, before any I/O
// (nothing listens on port 1: a natslock that connected would exit 1).
func TestCLI(t *testing.T) {
	bin := cmdtest.Build(t, ".")
	const url = "nats://127.0.0.1:1"
	cmdtest.CheckConvention(t, bin, []cmdtest.Case{
		{Name: "three arguments", Args: []string{url, "b", "k"}, Want: "want 4 arguments"},
		{Args: []string{"-r", "soon", url, "b", "k", "tok"}, Want: "-r"},
		{Args: []string{"-v", "-q", url, "b", "k", "tok"}, Want: "-v and -q"},
		{Name: "http URL", Args: []string{"http://127.0.0.1:4222", "b", "k", "tok"}, Want: "got http://"},
		{Name: "bad port", Args: []string{"nats://127.0.0.1:99999", "b", "k", "tok"}, Want: "bad port"},
		{Name: "no host", Args: []string{"nats://:4222", "b", "k", "tok"}, Want: "no host"},
		{Name: "password redacted", Args: []string{"nats://u:s3cret@127.0.0.1:99999", "b", "k", "tok"}, Want: "u:xxxxx@"},
		{Name: "empty URL", Args: []string{"", "b", "k", "tok"}, Want: "empty NATS URL"},
		{Name: "empty bucket", Args: []string{url, "", "k", "tok"}, Want: "empty <bucket>"},
		{Name: "empty key", Args: []string{url, "b", "", "tok"}, Want: "empty <key>"},
		{Name: "empty token", Args: []string{url, "b", "k", ""}, Want: "empty <token>"},
		{Name: "bad bucket", Args: []string{url, "a.b", "k", "tok"}, Want: "bucket"},
		{Name: "long key cut", Args: []string{url, "b", strings.Repeat("k", 300) + " x", "tok"}, Want: "...(302 bytes)"},
		{Args: []string{"--log-format", "xml", url, "b", "k", "tok"}, Want: "--log-format"},
		{Name: "missing CA file", Args: []string{"-tls-ca", "/nonexistent/ca.pem", url, "b", "k", "tok"}, Want: "-tls-ca: open /nonexistent/ca.pem"},
		{Name: "missing client key file", Args: []string{"-tls-cert", "/nonexistent/c.pem", "-tls-key", "/nonexistent/k.pem", url, "b", "k", "tok"}, Want: "-tls-cert: open /nonexistent/c.pem"},
		{Name: "cert without key", Args: []string{"-tls-cert", "c.pem", url, "b", "k", "tok"}, Want: "-tls-cert and -tls-key go together"},
		// The old names still work, as the new ones.
		{Name: "old -tlsca", Args: []string{"-tlsca", "/nonexistent/ca.pem", url, "b", "k", "tok"}, Want: "-tls-ca: open /nonexistent/ca.pem"},
		{Name: "old -tlscert -tlskey", Args: []string{"-tlscert", "/nonexistent/c.pem", "--tlskey=/nonexistent/k.pem", url, "b", "k", "tok"}, Want: "-tls-cert: open /nonexistent/c.pem"},
		{Name: "missing creds file", Args: []string{"-creds", "/nonexistent/x.creds", url, "b", "k", "tok"}, Want: "-creds: open /nonexistent/x.creds"},
		// After I/O: one line naming the URL, exit 1.
		{Name: "refused", Args: []string{url, "b", "k", "tok"}, Exit: 1, Want: "connect to " + url, Lines: 1},
	})
	// The TLS flags are named as amqpsem's and redlockrun's; the old
	// names are not listed.
	help, _ := cmdtest.Run(t, bin, "--help")
	for _, f := range []string{"-tls-ca", "-tls-cert", "-tls-key"} {
		if !strings.Contains(help, "  "+f+" string") {
			t.Errorf("the help lists no %s flag:\n%s", f, help)
		}
	}
	for _, f := range []string{"-tlsca", "-tlscert", "-tlskey"} {
		if strings.Contains(help, "  "+f+" string") {
			t.Errorf("the help lists the old %s flag:\n%s", f, help)
		}
	}
	// No internal "locks: " prefix, and the password never shown.
	out, _ := cmdtest.Run(t, bin, "nats://u:s3cret@127.0.0.1:99999", "b", "k", "tok")
	out2, _ := cmdtest.Run(t, bin, "nats://u:s3cret@127.0.0.1:1", "b", "k", "tok")
	out3, _ := cmdtest.Run(t, bin, url, "b", "a b", "tok")
	for _, o := range []string{out, out2, out3} {
		if strings.Contains(o, "s3cret") || strings.Contains(o, "locks: ") {
			t.Errorf("a message shows the password or an internal prefix: %q", o)
		}
	}
}

// A write that found the connection gone is not logged as the cause of
// the disconnection; other causes are logged as they are.
func TestDisconnectCause(t *testing.T) {
	if got := disconnectCause(fmt.Errorf("flush: %w", nats.ErrReconnectBufExceeded)); strings.Contains(got, "buffer") {
		t.Errorf("disconnectCause(buffer exceeded) = %q", got)
	}
	if got := disconnectCause(nats.ErrStaleConnection); got != nats.ErrStaleConnection.Error() {
		t.Errorf("disconnectCause(stale) = %q", got)
	}
}

// A write that found the connection gone is logged as that, not as
// nats.go's "outbound buffer limit exceeded" (natsputex's connections
// keep no reconnect buffer).
func TestWriteFailedLogged(t *testing.T) {
	var buf strings.Builder
	logger, err := newLogger(&buf, "text", logLevel(false, false))
	if err != nil {
		t.Fatal(err)
	}
	eventLogger(logger)(natsputex.Event{Phase: natsputex.PhaseStandby, Msg: "write failed: service stopped", Err: fmt.Errorf("renew: %w", nats.ErrReconnectBufExceeded)})
	if out := buf.String(); strings.Contains(out, "buffer") || !strings.Contains(out, "renew: not connected to NATS") {
		t.Errorf("a write on a lost connection logged as:\n%s", out)
	}
}
