package main

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// passwordEnv is the environment variable redlockrun reads the masters'
// password from, for addresses that carry none.
const passwordEnv = "REDLOCKRUN_PASSWORD"

// security is what the flags say about authentication and TLS.
type security struct {
	user, passwordFile       string
	tls, insecure            bool
	ca, cert, key, tlsServer string
}

// tlsFlags reports whether a --tls-* flag other than --tls was given.
func (s *security) tlsFlags() bool {
	return s.ca != "" || s.cert != "" || s.key != "" || s.tlsServer != "" || s.insecure
}

// masterOptions parses -addrs into go-redis options, one per master,
// with the user, password and TLS settings applied, before any I/O.
// callTO bounds each dial and each read or write on a socket.
func masterOptions(addrs string, sec *security, callTO time.Duration) ([]*redis.Options, error) {
	var list []*redis.Options
	anyTLS := false
	for a := range strings.SplitSeq(addrs, ",") {
		a = strings.TrimSpace(a)
		if a == "" {
			continue
		}
		o, err := parseAddr(a, sec.tls)
		if err != nil {
			return nil, err
		}
		anyTLS = anyTLS || o.TLSConfig != nil
		list = append(list, o)
	}
	if len(list) == 0 {
		return nil, fmt.Errorf("-addrs: no master")
	}
	if sec.tlsFlags() && !anyTLS {
		return nil, fmt.Errorf("-tls-* flags need -tls or rediss:// addresses")
	}
	if (sec.cert == "") != (sec.key == "") {
		return nil, fmt.Errorf("-tls-cert and -tls-key go together")
	}
	password, err := readPassword(sec.passwordFile)
	if err != nil {
		return nil, err
	}
	var certs []tls.Certificate
	if sec.cert != "" {
		pair, err := tls.LoadX509KeyPair(sec.cert, sec.key)
		if err != nil {
			return nil, fmt.Errorf("-tls-cert, -tls-key: %v", err)
		}
		certs = []tls.Certificate{pair}
	}
	var roots *x509.CertPool
	if sec.ca != "" {
		pem, err := os.ReadFile(sec.ca)
		if err != nil {
			return nil, fmt.Errorf("-tls-ca: %v", err)
		}
		roots = x509.NewCertPool()
		if !roots.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("-tls-ca: no PEM certificate in %s", sec.ca)
		}
	}
	for _, o := range list {
		if o.Username == "" {
			o.Username = sec.user
		}
		if o.Password == "" {
			o.Password = password
		}
		if o.TLSConfig != nil {
			o.TLSConfig.RootCAs, o.TLSConfig.Certificates = roots, certs
			o.TLSConfig.InsecureSkipVerify = sec.insecure
			if sec.tlsServer != "" {
				o.TLSConfig.ServerName = sec.tlsServer
			}
		}
		// Redlock retries by itself, on a quorum: one dial attempt and
		// no retried command, each bounded by the call timeout, so a
		// master that never answers costs one call timeout per step.
		o.DialTimeout, o.ReadTimeout, o.WriteTimeout = callTO, callTO, callTO
		o.DialerRetries, o.MaxRetries = 1, -1
		o.ContextTimeoutEnabled = true
	}
	return list, nil
}

// parseAddr parses one master: a redis:// or rediss:// URL, as go-redis
// reads it, or host:port (with TLS when tlsOn).
func parseAddr(a string, tlsOn bool) (*redis.Options, error) {
	if strings.Contains(a, "://") {
		scheme, _, _ := strings.Cut(a, "://")
		if scheme != "redis" && scheme != "rediss" {
			return nil, fmt.Errorf("-addrs %q: want host:port or a redis:// or rediss:// URL, got %s://", redact(a), scheme)
		}
		o, err := redis.ParseURL(a)
		if err != nil {
			return nil, fmt.Errorf("-addrs %q: %s", redact(a), strings.ReplaceAll(err.Error(), a, redact(a)))
		}
		if err := checkHostPort(o.Addr); err != nil {
			return nil, fmt.Errorf("-addrs %q: %v", redact(a), err)
		}
		if tlsOn && o.TLSConfig == nil {
			return nil, fmt.Errorf("-addrs %q: -tls with a redis:// URL: use rediss://", redact(a))
		}
		return o, nil
	}
	if err := checkHostPort(a); err != nil {
		return nil, fmt.Errorf("-addrs %q: want host:port or a redis:// or rediss:// URL: %v", a, err)
	}
	o := &redis.Options{Addr: a}
	if tlsOn {
		host, _, _ := net.SplitHostPort(a)
		o.TLSConfig = &tls.Config{ServerName: host, MinVersion: tls.VersionTLS12}
	}
	return o, nil
}

// checkHostPort checks that a is host:port with a host and a port number.
func checkHostPort(a string) error {
	host, port, err := net.SplitHostPort(a)
	if err != nil {
		return err
	}
	if host == "" || strings.ContainsAny(host, " \t/") {
		return fmt.Errorf("bad host %q", host)
	}
	if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 {
		return fmt.Errorf("bad port %q", port)
	}
	return nil
}

// readPassword returns the password of -password-file, else of
// $REDLOCKRUN_PASSWORD, else "". A file's trailing line break is not
// part of the password.
func readPassword(file string) (string, error) {
	if file == "" {
		return os.Getenv(passwordEnv), nil
	}
	b, err := os.ReadFile(file)
	if err != nil {
		return "", fmt.Errorf("-password-file: %v", err)
	}
	return strings.TrimRight(string(b), "\r\n"), nil
}

// redact returns a URL with its password, if any, replaced by "xxxxx".
func redact(a string) string {
	scheme, rest, ok := strings.Cut(a, "://")
	if !ok {
		return a
	}
	userinfo, hostpart, ok := strings.Cut(rest, "@")
	if !ok || strings.ContainsAny(userinfo, "/") {
		return a
	}
	user, _, hasPw := strings.Cut(userinfo, ":")
	if !hasPw {
		return a
	}
	return scheme + "://" + user + ":xxxxx@" + hostpart
}
