package testenv

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/ory/dockertest/v3"
)

const (
	localAMQPAddr = "127.0.0.1:5672"
	localAMQPURL  = "amqp://guest:guest@127.0.0.1:5672/"

	// The image started when no RabbitMQ is found.
	rabbitRepo = "rabbitmq"
	rabbitTag  = "3.13-alpine"
)

// amqpHeader is the protocol header a client sends first (AMQP 0-9-1).
var amqpHeader = []byte("AMQP\x00\x00\x09\x01")

// AMQPURL returns the URL of a RabbitMQ broker the test can use, looking in
// this order: the LOCKS_AMQP_URL environment variable; a broker answering the
// AMQP 0-9-1 handshake on 127.0.0.1:5672 (returned with the guest/guest
// account); a rabbitmq container started through Docker, published on
// 127.0.0.1 and removed at cleanup. Otherwise it calls [Missing].
//
// A URL from the environment is used as given, but the test fails if its host
// does not accept a TCP connection. Starting a container takes seconds, so
// call AMQPURL once per top-level test and share the URL with its subtests;
// the broker is shared, so tests use unique queue names. AMQPURL must be
// called from the goroutine running the test.
func AMQPURL(t testing.TB) string {
	t.Helper()
	u, err := ForTest(t).AMQPURL(t.Context())
	Require(t, err)
	return u
}

// AMQPURL is [AMQPURL] returning an error: a [*MissingError] when there is
// no broker and no Docker engine. A container it starts is removed at
// [Env.Close]. ctx bounds the search and the container's start.
func (e *Env) AMQPURL(ctx context.Context) (string, error) {
	if u := strings.TrimSpace(os.Getenv("LOCKS_AMQP_URL")); u != "" {
		addr, err := amqpAddr(u)
		if err == nil {
			err = dialCheck(addr)
		}
		if err != nil {
			return "", fmt.Errorf("testenv: LOCKS_AMQP_URL=%q: %w", RedactURL(u), err)
		}
		return u, nil
	}
	if probeAMQP(localAMQPAddr, 2*time.Second) == nil {
		return localAMQPURL, nil
	}
	pool, derr := dockerPool()
	if derr != nil {
		return "", &MissingError{What: "RabbitMQ",
			How: "set LOCKS_AMQP_URL=amqp://user:pass@host:5672/, run RabbitMQ on " + localAMQPAddr +
				" (docker compose up rabbitmq), or start a Docker engine (" + derr.Error() + ")"}
	}
	u, err := e.startRabbit(ctx, pool)
	if err != nil {
		return "", fmt.Errorf("testenv: %w", err)
	}
	return u, nil
}

func (e *Env) startRabbit(ctx context.Context, pool *dockertest.Pool) (string, error) {
	// The guest account only logs in from the container's own loopback, and
	// clients come through Docker's port forwarding: use another account.
	res, err := e.runContainer(pool, &dockertest.RunOptions{
		Repository: rabbitRepo,
		Tag:        rabbitTag,
		Env:        []string{"RABBITMQ_DEFAULT_USER=latchkey", "RABBITMQ_DEFAULT_PASS=latchkey"},
	}, map[string]string{"5672/tcp": ""})
	if err != nil {
		return "", err
	}
	addr, err := hostAddr(res, "5672/tcp")
	if err != nil {
		return "", err
	}
	if err := waitFor(ctx, containerReadyTimeout, nil, func() error { return probeAMQP(addr, 2*time.Second) }); err != nil {
		return "", fmt.Errorf("rabbitmq container on %s: %w", addr, err)
	}
	return "amqp://latchkey:latchkey@" + addr + "/", nil
}

// amqpAddr returns the host:port an amqp:// or amqps:// URL dials.
func amqpAddr(raw string) (string, error) {
	u, err := url.Parse(raw)
	if err != nil {
		return "", err
	}
	port := u.Port()
	switch {
	case u.Scheme != "amqp" && u.Scheme != "amqps":
		return "", fmt.Errorf("scheme %q is not amqp or amqps", u.Scheme)
	case u.Hostname() == "":
		return "", errors.New("no host")
	case port == "" && u.Scheme == "amqp":
		port = "5672"
	case port == "":
		port = "5671"
	}
	return net.JoinHostPort(u.Hostname(), port), nil
}

// dialCheck reports whether addr accepts a TCP connection.
func dialCheck(addr string) error {
	c, err := net.DialTimeout("tcp", addr, 2*time.Second)
	if err != nil {
		return err
	}
	return c.Close()
}

// probeAMQP reports whether an AMQP 0-9-1 broker answers on addr: it sends
// the protocol header and checks that the reply is a method frame on channel
// 0 carrying connection.start (class 10, method 10). A closed port, a server
// of another protocol and a broker refusing the protocol version all fail.
func probeAMQP(addr string, timeout time.Duration) error {
	c, err := net.DialTimeout("tcp", addr, timeout)
	if err != nil {
		return err
	}
	defer c.Close()
	if err := c.SetDeadline(time.Now().Add(timeout)); err != nil {
		return err
	}
	if _, err := c.Write(amqpHeader); err != nil {
		return err
	}
	// Frame header: type (1 = method), channel (2), size (4); then the
	// method payload: class id (2), method id (2).
	var b [11]byte
	if _, err := io.ReadFull(c, b[:]); err != nil {
		return fmt.Errorf("%s: no AMQP reply: %w", addr, err)
	}
	if b[0] != 1 || !bytes.Equal(b[1:3], []byte{0, 0}) || !bytes.Equal(b[7:11], []byte{0, 10, 0, 10}) {
		return fmt.Errorf("%s: reply %q is not an AMQP 0-9-1 connection.start", addr, b[:])
	}
	return nil
}

// RedactURL returns raw with its password, if any, replaced by "xxxxx", so
// that output never shows one; "(an unparsable URL)" if raw is not a URL.
func RedactURL(raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		return "(an unparsable URL)"
	}
	return u.Redacted()
}
