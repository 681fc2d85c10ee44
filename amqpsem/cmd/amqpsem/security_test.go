package main_test

import (
	"net/url"
	"strings"
	"testing"

	"github.com/latchkey-go/latchkey/contracttest/cmdtest"
	"github.com/latchkey-go/latchkey/contracttest/testenv"
)

// TestCommandAMQPS administers a semaphore over amqps:// with --tls-ca and
// a client certificate; a wrong password's error does not show it.
func TestCommandAMQPS(t *testing.T) {
	raw := testenv.AMQPURL(t)
	u, err := url.Parse(raw)
	if err != nil {
		t.Fatal(err)
	}
	host := u.Host
	if u.Port() == "" {
		host += ":5672"
	}
	certs := testenv.NewTLS(t)
	u.Scheme, u.Host = "amqps", testenv.TLSFront(t, host, certs)
	bin := cmdtest.Build(t, ".")
	name := uniqueName()
	tlsFlags := []string{"--tls-ca", certs.CAFile, "--tls-cert", certs.CertFile, "--tls-key", certs.KeyFile}
	run, expect := runner(t, bin, append([]string{"--url", u.String()}, tlsFlags...)...)
	t.Cleanup(func() { run("destroy", name) })

	expect(0, "created "+name+" with 2 slots", "create", name, "2")
	expect(0, "2 slots, 0 held", "status", name)
	expect(0, "", "destroy", name)

	const secret = "s3cret-Pw-4-test"
	u.User = url.UserPassword(u.User.Username(), secret)
	_, bad := runner(t, bin, append([]string{"--url", u.String()}, tlsFlags...)...)
	if out := bad(1, "", "status", name); strings.Contains(out, secret) {
		t.Errorf("the error shows the password:\n%s", out)
	} else {
		t.Logf("wrong password: %s", strings.TrimSpace(out))
	}
	// The trust anchor matters: without --tls-ca the front is refused.
	_, plain := runner(t, bin, "--url", u.String())
	plain(1, "certificate", "status", name)
}
