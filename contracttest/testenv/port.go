package testenv

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"
)

// FreePort returns a TCP port on 127.0.0.1 that was free when it was chosen.
// The port is released before FreePort returns, so another process may take
// it in the meantime; callers that bind it should be ready to retry with a new
// port. It calls t.Fatal if no port can be found.
func FreePort(t testing.TB) int {
	t.Helper()
	p, err := new(Env).FreePort()
	Require(t, err)
	return p
}

// FreePort is [FreePort] returning an error when no port can be found.
// It starts nothing for the Env to stop.
func (e *Env) FreePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("testenv: free port: %w", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// redisPing sends PING over a new connection to addr and checks the reply is
// +PONG, all within timeout.
func redisPing(addr string, timeout time.Duration) error {
	c, err := net.DialTimeout("tcp", addr, timeout)
	if err != nil {
		return err
	}
	defer c.Close()
	if err := c.SetDeadline(time.Now().Add(timeout)); err != nil {
		return err
	}
	if _, err := c.Write([]byte("*1\r\n$4\r\nPING\r\n")); err != nil {
		return err
	}
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		return err
	}
	if line = strings.TrimRight(line, "\r\n"); line != "+PONG" {
		return fmt.Errorf("PING to %s: unexpected reply %q", addr, line)
	}
	return nil
}

// waitFor calls probe until it succeeds, stop returns an error, ctx ends or
// timeout passes. It returns the last error.
func waitFor(ctx context.Context, timeout time.Duration, stop func() error, probe func() error) error {
	deadline := time.Now().Add(timeout)
	delay := 5 * time.Millisecond
	for {
		err := probe()
		if err == nil {
			return nil
		}
		if stop != nil {
			if serr := stop(); serr != nil {
				return fmt.Errorf("%w (last probe: %v)", serr, err)
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("not ready after %v: %w", timeout, err)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%w (last probe: %v)", ctx.Err(), err)
		case <-time.After(delay):
		}
		delay = min(2*delay, 200*time.Millisecond)
	}
}
