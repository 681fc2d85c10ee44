package amqpsem_test

import (
	"context"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/latchkey-go/latchkey/amqpsem"
	"github.com/latchkey-go/latchkey/contracttest/testenv"
)

// amqpsFront puts a TLS front before the local broker and returns a
// function making amqps:// URLs to it with password pw ("" for the
// broker's own), and the certificates to trust.
func amqpsFront(t *testing.T) (func(pw string) string, *testenv.TLS) {
	t.Helper()
	raw, host := amqpURL(t)
	certs := testenv.NewTLS(t)
	front := testenv.TLSFront(t, host, certs)
	return func(pw string) string {
		u, err := url.Parse(raw)
		if err != nil {
			t.Fatal(err)
		}
		u.Scheme, u.Host = "amqps", front
		if pw != "" {
			u.User = url.UserPassword(u.User.Username(), pw)
		}
		return u.String()
	}, certs
}

// TestAMQPS locks over amqps:// with a client certificate; a wrong
// password fails without the password in the error.
func TestAMQPS(t *testing.T) {
	urlWith, certs := amqpsFront(t)
	good := urlWith("")
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	c, err := amqpsem.Dial(ctx, good, append(testOptions(), amqpsem.WithTLS(certs.Client.Clone()))...)
	if err != nil {
		t.Fatalf("Dial amqps: %v", err)
	}
	defer c.Close(context.Background())
	m := c.Locker()
	name := "amqps-" + t.Name()
	lease, err := m.TryLock(ctx, name)
	if err != nil {
		t.Fatalf("TryLock over amqps: %v", err)
	}
	if err := lease.Release(ctx); err != nil {
		t.Fatalf("Release over amqps: %v", err)
	}

	const secret = "s3cret-Pw-4-test"
	bad := urlWith(secret)
	_, err = amqpsem.Dial(ctx, bad, append(testOptions(), amqpsem.WithTLS(certs.Client.Clone()))...)
	if err == nil {
		t.Fatal("Dial with a wrong password succeeded")
	}
	if strings.Contains(err.Error(), secret) {
		t.Errorf("the error shows the password: %v", err)
	}
	t.Logf("wrong password: %v", err)

	// Without the test CA the server's certificate is refused.
	if c, err := amqpsem.Dial(ctx, good, testOptions()...); err == nil {
		c.Close(context.Background())
		t.Fatal("Dial amqps trusted a certificate from an unknown authority")
	}
}
