package redlockprio

import (
	"context"
	"errors"
	"io"
	"net"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// TestRefusedCallIsNotSent: a call to a master that refuses connections
// is known to have reached nothing (notSent) when the client makes one
// attempt per command (MaxRetries -1), whether the pool dials or returns
// its remembered dial error, and so is a step that ended before its call
// was made; a client that retries may have sent the command on an earlier
// attempt, and other errors (a lost answer) leave the master's state
// unknown.
func TestRefusedCallIsNotSent(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	_ = ln.Close() // refused from now on
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	client := func(o *redis.Options) *master {
		o.Addr, o.DialerRetries, o.PoolSize = addr, 1, 2
		c := redis.NewClient(o)
		t.Cleanup(func() { _ = c.Close() })
		return &master{index: 0, addr: addr, c: c, oneShot: oneShot(c)}
	}
	call := func(m *master) error {
		_, err := runScript(ctx, acquireScript, m.c, []string{"{n}:fence", "{n}:1"}, "id", 1000, 0, "inbox", 0, 0)
		return m.sendErr(err)
	}
	m := client(&redis.Options{MaxRetries: -1})
	for i := range 4 { // dials, then the pool's remembered dial error (PoolSize 2)
		if err := call(m); !m.oneShot || err == nil || !notSent(&masterError{err: err}) {
			t.Errorf("call %d, no retries: oneShot %v, err %v: not classified as not sent", i, m.oneShot, err)
		}
	}
	m = client(&redis.Options{MinRetryBackoff: time.Millisecond, MaxRetryBackoff: time.Millisecond})
	if err := call(m); m.oneShot || notSent(err) {
		t.Errorf("retrying client: oneShot %v, notSent(%v) = true; want unknown", m.oneShot, err)
	}
	if !notSent(&masterError{err: unsent(context.DeadlineExceeded)}) || !errors.Is(unsent(context.DeadlineExceeded), context.DeadlineExceeded) {
		t.Error("a call never made is not classified as not sent, or hides its cause")
	}
	for _, err := range []error{io.EOF, context.DeadlineExceeded, errStraggler, &net.OpError{Op: "read", Err: io.EOF}} {
		if notSent(&masterError{err: m.sendErr(err)}) || notSent((&master{oneShot: true}).sendErr(err)) {
			t.Errorf("%v classified as not sent", err)
		}
	}
}
