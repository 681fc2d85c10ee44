package testenv

import (
	"bufio"
	"context"
	"fmt"
	"math/rand/v2"
	"net"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// FreePort returns a TCP port on 127.0.0.1 that is free and stays the
// test's own until its cleanup, so that a server stopped and started again
// finds its port still free (see [Env.FreePort]). It calls t.Fatal if no
// port can be found.
func FreePort(t testing.TB) int {
	t.Helper()
	e := new(Env)
	t.Cleanup(func() { _ = e.Close() })
	p, err := e.FreePort()
	Require(t, err)
	return p
}

// Reserved ports are chosen in [reservedLow, reservedHigh): below the
// kernel's range of ephemeral ports (32768 and up on Linux, 49152 and up
// on macOS and Windows), so that no outgoing connection and no listener on
// port 0 is given one while its server is stopped.
const reservedLow, reservedHigh = 20000, 32000

var (
	reservedMu sync.Mutex
	reserved   = map[int]bool{} // ports this process holds
)

// FreePort returns a TCP port on 127.0.0.1 that is free now and is held for
// the Env until its Close: no other FreePort, in this process or (where
// file locks exist) in another, chooses it meanwhile, and it lies outside
// the ephemeral range, so a server stopped mid-test (a restart, a whole
// cluster's outage) can bind it again. Other programs on the machine are
// not bound by the reservation.
func (e *Env) FreePort() (int, error) {
	for range 1000 {
		p := reservedLow + rand.IntN(reservedHigh-reservedLow)
		reservedMu.Lock()
		taken := reserved[p]
		reserved[p] = true
		reservedMu.Unlock()
		if taken {
			continue
		}
		unlock, err := lockPort(p)
		if err == nil {
			var l net.Listener
			if l, err = net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(p))); err == nil {
				_ = l.Close()
				release := func() error {
					unlock()
					reservedMu.Lock()
					delete(reserved, p)
					reservedMu.Unlock()
					return nil
				}
				if err := e.OnClose(release); err != nil {
					return 0, err
				}
				return p, nil
			}
			unlock()
		}
		reservedMu.Lock()
		delete(reserved, p)
		reservedMu.Unlock()
	}
	return 0, fmt.Errorf("testenv: no free port in [%d, %d) after 1000 tries", reservedLow, reservedHigh)
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
