package main_test

import (
	"net"
	"strings"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/latchkey-go/latchkey/contracttest/cmdtest"
	"github.com/latchkey-go/latchkey/contracttest/testenv"
)

// secureMasters starts three masters that require a password (and, for
// user, an ACL user alice with it) and listen with TLS too; it returns
// the servers and the TLS files.
func secureMasters(t *testing.T, password string, user bool) ([]*testenv.RedisServer, *testenv.TLS) {
	t.Helper()
	certs := testenv.NewTLS(t)
	var args []string
	if user {
		args = []string{"--user", "alice", "on", ">" + password, "~*", "&*", "+@all"}
	}
	servers := testenv.StartRedisWith(t, 3, testenv.RedisConfig{TLS: certs, Args: args})
	// requirepass once they answer: testenv's readiness PING has none.
	for _, s := range servers {
		c := redis.NewClient(&redis.Options{Addr: s.Addr()})
		err := c.ConfigSet(t.Context(), "requirepass", password).Err()
		_ = c.Close()
		if err != nil {
			t.Fatal(err)
		}
	}
	return servers, certs
}

// A command runs under a lock on three requirepass masters over TLS,
// with the password from $REDLOCKRUN_PASSWORD, from -password-file, or
// in rediss:// URLs, and with an ACL user; a wrong password or no TLS
// trust is an error (exit 1) naming what failed.
func TestAuthTLS(t *testing.T) {
	bin := cmdtest.Build(t, ".")
	const password = "pw-for-redlockrun"
	servers, certs := secureMasters(t, password, true)
	var plain, tlsAddrs, urls, userURLs []string
	for _, s := range servers {
		plain = append(plain, s.Addr())
		tlsAddrs = append(tlsAddrs, s.TLSAddr())
		urls = append(urls, "rediss://:"+password+"@"+s.TLSAddr()+"/0")
		userURLs = append(userURLs, "rediss://alice@"+s.TLSAddr())
	}
	pwFile := writeFile(t, t.TempDir(), "password", password+"\n")
	name := cmdtest.UniqueName("redlockrun-auth-")
	echo := []string{name, "--", "/bin/sh", "-c", `echo "token=$LOCK_TOKEN"`}
	for _, tc := range []struct {
		what string
		env  []string
		args []string
	}{
		{"TLS, password from the environment", []string{"REDLOCKRUN_PASSWORD=" + password}, []string{"-tls", "-tls-ca", certs.CAFile, "-addrs", strings.Join(tlsAddrs, ",")}},
		{"TLS, password file, client certificate", nil, []string{"-tls", "-tls-ca", certs.CAFile, "-tls-cert", certs.CertFile, "-tls-key", certs.KeyFile, "-password-file", pwFile, "-addrs", strings.Join(tlsAddrs, ",")}},
		{"rediss:// URLs with the password", nil, []string{"-tls-ca", certs.CAFile, "-addrs", strings.Join(urls, ",")}},
		{"rediss:// URLs with an ACL user", []string{"REDLOCKRUN_PASSWORD=" + password}, []string{"-tls-ca", certs.CAFile, "-addrs", strings.Join(userURLs, ",")}},
		{"-user on plain TCP", []string{"REDLOCKRUN_PASSWORD=" + password}, []string{"-user", "alice", "-addrs", strings.Join(plain, ",")}},
	} {
		out, code := cmdtest.RunEnv(t, bin, tc.env, append(tc.args, echo...)...)
		if code != 0 || !strings.Contains(out, "token=") || strings.Contains(out, "token=0\n") {
			t.Errorf("%s: exit %d, want 0 and a token:\n%s", tc.what, code, out)
		}
	}
	for _, tc := range []struct {
		what, want string
		env        []string
		args       []string
	}{
		{"no password", "NOAUTH", nil, []string{"-addrs", strings.Join(plain, ",")}},
		{"wrong password", "WRONGPASS", []string{"REDLOCKRUN_PASSWORD=wrong"}, []string{"-addrs", strings.Join(plain, ",")}},
		{"untrusted certificate", "certificate", []string{"REDLOCKRUN_PASSWORD=" + password}, []string{"-tls", "-addrs", strings.Join(tlsAddrs, ",")}},
	} {
		out, code := cmdtest.RunEnv(t, bin, tc.env, append(tc.args, echo...)...)
		if code != 1 || !strings.Contains(out, tc.want) || strings.Count(out, "\n") != 1 {
			t.Errorf("%s: exit %d, want 1 and one line saying %s:\n%s", tc.what, code, tc.want, out)
		}
	}
}

// silentListener accepts connections and never answers, like a master
// whose port is black-holed after the TCP handshake. It returns its
// address; it is closed at the end of the test.
func silentListener(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var conns []net.Conn
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			conns = append(conns, c)
		}
	}()
	t.Cleanup(func() {
		_ = ln.Close()
		<-done
		for _, c := range conns {
			_ = c.Close()
		}
	})
	return ln.Addr().String()
}
