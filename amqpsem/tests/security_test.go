package amqpsem_test

import (
	"context"
	neturl "net/url"
	"strings"
	"testing"
	"time"

	"github.com/latchkey-go/latchkey/contracttest/testenv"

	"github.com/latchkey-go/latchkey/amqpsem"
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
		u, err := neturl.Parse(raw)
		if err != nil {
			t.Fatal(err)
		}
		u.Scheme, u.Host = "amqps", front
		if pw != "" {
			u.User = neturl.UserPassword(u.User.Username(), pw)
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

// Dial's errors never show the URL's password: not for URLs that do not
// parse (net/url quotes the whole URL), brokers that cannot be reached,
// or refused credentials.
func TestDialErrorsHidePassword(t *testing.T) {
	u, _ := amqpURL(t)
	const secret = "s3cretPw"
	good, err := neturl.Parse(u)
	if err != nil {
		t.Fatal(err)
	}
	wrong := *good
	wrong.User = neturl.UserPassword("guest", secret)
	for _, raw := range []string{
		"amqp://admin:" + secret + "@host:xx/",
		"amqp://admin:" + secret + "@[::1/",
		"amqp://admin:" + secret + "@host:99999999999/",
		"amqp://admin:" + secret + "@127.0.0.1:1/",
		wrong.String(),
	} {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		c, err := amqpsem.Dial(ctx, raw, amqpsem.WithConnectTimeout(3*time.Second))
		cancel()
		if err == nil {
			_ = c.Close(context.Background())
			t.Errorf("Dial(%s) succeeded", amqpsem.RedactURL(raw))
			continue
		}
		if strings.Contains(err.Error(), secret) {
			t.Errorf("Dial's error shows the password: %v", err)
		}
	}
	if got := amqpsem.RedactURL("amqp://admin:" + secret + "@h/v"); got != "amqp://admin:xxxxx@h/v" {
		t.Errorf("RedactURL = %q", got)
	}
}

// TestPasswordsNeverShown: passwords, plain, percent-encoded or with
// odd characters, in the command's every output and in Dial's errors.
func TestPasswordsNeverShown(t *testing.T) {
	_, host := amqpURL(t)
	// A broker that accepts connections and never answers.
	p := testenv.NewProxy(t, host)
	p.BlackHole()
	silent := p.Addr()
	secrets := []string{"Zq9Secret", "Zq9%53ecret", "Zq9Secret"}
	type tc struct {
		url     string
		secrets []string
		args    []string
	}
	cases := []tc{
		{"amqp://guest:Zq9Secret@127.0.0.1:1/", secrets[:1], []string{"--help"}},
		{"amqp://guest:Zq9Secret@127.0.0.1:1/", secrets[:1], []string{"status", "n"}},
		{"amqp://guest:Zq9%53ecret@127.0.0.1:1/", []string{"Zq9%53ecret", "Zq9Secret", "Zq9%53"}, []string{"status", "n"}},
		{"amqp://guest:Zq9%53ecret@127.0.0.1:1/", []string{"Zq9%53ecret", "Zq9Secret"}, []string{"--help"}},
		{"amqp://guest:Zq9@Secret@127.0.0.1:5672/", []string{"Zq9", "Secret"}, []string{"status", "n"}},
		{"amqp://guest:Zq9Secret@127.0.0.1:99999/", secrets[:1], []string{"status", "n"}},
		{"amqp://guest:Zq9%zzSecret@127.0.0.1:5672/", []string{"Zq9", "Secret"}, []string{"status", "n"}},
		{"http://guest:Zq9Secret@127.0.0.1:5672/", secrets[:1], []string{"status", "n"}},
		{"amqp://guest:Zq9 Secret@127.0.0.1:5672/", []string{"Zq9", "Secret"}, []string{"status", "n"}},
		{"amqp://:Zq9Secret@127.0.0.1:1/", secrets[:1], []string{"status", "n"}},
		{"amqp://guest:Zq9Secret@" + silent + "/", secrets[:1], []string{"--connect-timeout", "1s", "status", "n"}},
		{"amqp://guest:Zq9Secret@" + silent + "/", secrets[:1], []string{"--timeout", "1s", "acquire", "n", "--", "true"}},
		{"amqps://guest:Zq9Secret@127.0.0.1:5672/", secrets[:1], []string{"--connect-timeout", "2s", "--tls-ca", "/nonexistent", "status", "n"}},
		{"amqp://guest:Zq9Secret@127.0.0.1:1/", secrets[:1], []string{"--heartbeat", "10ms", "status", "n"}},
		{"amqp://guest:Zq9Secret@127.0.0.1:1/", secrets[:1], []string{"bogusverb", "n"}},
		{"amqp://guest:Zq9Secret@127.0.0.1:5672/?heartbeat=abc", secrets[:1], []string{"status", "n"}},
		{"amqp://guest:Zq9Secret@127.0.0.1:5672/%zz", secrets[:1], []string{"status", "n"}},
	}
	for _, c := range cases {
		for _, viaFlag := range []bool{false, true} {
			if viaFlag && (strings.Contains(c.url, silent) || strings.Contains(c.url, ":5672/") && strings.Contains(c.url, "@Secret")) {
				continue // 3s for the broker to refuse the credentials
			}
			var env []string
			args := c.args
			if viaFlag {
				env = []string{"AMQPSEM_URL="}
				args = append([]string{"--url", c.url}, args...)
			} else {
				env = []string{"AMQPSEM_URL=" + c.url}
			}
			t0 := time.Now()
			out, code := runCommand(t, 15*time.Second, env, args...)
			_ = t0
			for _, s := range c.secrets {
				if strings.Contains(out, s) {
					t.Errorf("%q (flag %v) %v: exit %d, output shows %q:\n%s", c.url, viaFlag, c.args, code, s, out)
				}
			}
		}
		if strings.Contains(c.url, "@Secret") {
			continue
		}
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		cl, err := amqpsem.Dial(ctx, c.url, amqpsem.WithConnectTimeout(time.Second))
		cancel()
		if err == nil {
			cl.Close(context.Background())
			continue
		}
		for _, s := range c.secrets {
			if strings.Contains(err.Error(), s) {
				t.Errorf("Dial(%q): error shows %q: %v", c.url, s, err)
			}
		}
	}
}
