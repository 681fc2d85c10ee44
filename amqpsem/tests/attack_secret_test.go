package amqpsem_test

import (
	"context"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/latchkey-go/latchkey/amqpsem"
)

// TestAttackSecretsNeverShown: passwords, plain, percent-encoded or with
// odd characters, in the command's every output and in Dial's errors.
func TestAttackSecretsNeverShown(t *testing.T) {
	url, _ := amqpURL(t)
	_ = url
	// A listener that accepts and never answers.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			defer c.Close()
		}
	}()
	silent := ln.Addr().String()
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
			out, code := atkRun(t, 15*time.Second, env, args...)
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
