package amqpsem_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/latchkey-go/latchkey/locks"

	"github.com/latchkey-go/latchkey/amqpsem"
)

// events records a client's connection events.
type events struct {
	mu  sync.Mutex
	got []amqpsem.ConnectionEvent
	c   chan amqpsem.ConnectionEvent
}

func newEvents() *events { return &events{c: make(chan amqpsem.ConnectionEvent, 100)} }

func (e *events) notice(ev amqpsem.ConnectionEvent) {
	e.mu.Lock()
	e.got = append(e.got, ev)
	e.mu.Unlock()
	select {
	case e.c <- ev:
	default:
	}
}

// wait returns the first event for which ok holds, within d.
func (e *events) wait(t *testing.T, d time.Duration, what string, ok func(amqpsem.ConnectionEvent) bool) amqpsem.ConnectionEvent {
	t.Helper()
	timeout := time.After(d)
	for {
		select {
		case ev := <-e.c:
			if ok(ev) {
				return ev
			}
		case <-timeout:
			t.Fatalf("no %s event in %v", what, d)
		}
	}
}

// A Client whose connection drops reports it, ends the leases of that
// connection with ErrLost, makes new calls wait (not fail with ErrClosed)
// while it redials with back-off, reports the recovery, and serves new
// calls on the new connection. Error texts say "amqpsem:" once.
func TestClientReconnects(t *testing.T) {
	u, host := amqpURL(t)
	name := uniqueName(t, u)
	ctx := tctx(t)
	if err := admin(t, dial(t, u)).Create(ctx, name, 1); err != nil {
		t.Fatal(err)
	}
	p, via := viaProxy(t, host)
	ev := newEvents()
	c := dial(t, u, via, amqpsem.WithReconnect(true, locks.Backoff{Min: 50 * time.Millisecond, Max: 200 * time.Millisecond}),
		amqpsem.WithConnectionNotice(ev.notice))
	s := semaphore(t, c, amqpsem.MaxSemaphoreSize)
	l, err := s.TryAcquire(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	if !c.Connected() {
		t.Fatal("Connected() is false on a live client")
	}

	p.Cut() // closes the connection and refuses new ones
	select {
	case <-l.Context().Done():
	case <-time.After(3 * testHeartbeat):
		t.Fatal("the lease of the lost connection is still live")
	}
	cause := context.Cause(l.Context())
	if !errors.Is(cause, locks.ErrLost) || !errors.Is(cause, amqpsem.ErrConnectionClosed) {
		t.Fatalf("the lost connection's lease ended with %v, want ErrLost and ErrConnectionClosed", cause)
	}
	if n := strings.Count(cause.Error(), "amqpsem:"); n > 1 {
		t.Errorf("cause repeats its prefix: %v", cause)
	}
	down := ev.wait(t, 3*testHeartbeat, "loss", func(e amqpsem.ConnectionEvent) bool { return !e.Up && e.Attempt == 0 })
	if !errors.Is(down.Err, amqpsem.ErrConnectionClosed) {
		t.Errorf("loss event error = %v, want ErrConnectionClosed", down.Err)
	}
	ev.wait(t, 5*time.Second, "failed attempt", func(e amqpsem.ConnectionEvent) bool { return !e.Up && e.Attempt >= 1 && e.Err != nil })
	if c.Connected() {
		t.Error("Connected() is true while the broker is unreachable")
	}
	short, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	_, err = s.TryAcquire(short, name)
	cancel()
	if !errors.Is(err, context.DeadlineExceeded) || errors.Is(err, locks.ErrClosed) {
		t.Fatalf("TryAcquire while reconnecting = %v, want DeadlineExceeded (waiting), not ErrClosed", err)
	}
	if n := strings.Count(err.Error(), "amqpsem:"); n != 1 {
		t.Errorf("error says \"amqpsem:\" %d times: %v", n, err)
	}

	// A call waiting for the connection gets it when it is back.
	type result struct {
		l   locks.Lease
		err error
	}
	waiting := make(chan result, 1)
	go func() {
		l, err := s.Acquire(ctx, name)
		waiting <- result{l, err}
	}()
	time.Sleep(100 * time.Millisecond)
	p.Restore()
	up := ev.wait(t, 10*time.Second, "recovery", func(e amqpsem.ConnectionEvent) bool { return e.Up })
	t.Logf("reconnected after %d attempts", up.Attempt)
	if !c.Connected() {
		t.Error("Connected() is false after the recovery event")
	}
	select {
	case r := <-waiting:
		if r.err != nil {
			t.Fatalf("Acquire waiting through the reconnection: %v", r.err)
		}
		if err := r.l.(*amqpsem.Lease).Verify(ctx); err != nil {
			t.Errorf("the new connection's lease does not verify: %v", err)
		}
		if err := r.l.Release(ctx); err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Acquire still waiting 10s after the reconnection")
	}
	// The old lease stays ended.
	if err := l.Release(ctx); !errors.Is(err, locks.ErrLost) {
		t.Errorf("Release of the lost connection's lease = %v, want ErrLost", err)
	}
	if err := c.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	if _, err := s.TryAcquire(ctx, name); !errors.Is(err, locks.ErrClosed) {
		t.Errorf("TryAcquire after Close = %v, want ErrClosed", err)
	}
}

// Close stops a client that is reconnecting to a broker it cannot reach,
// at once.
func TestCloseWhileReconnecting(t *testing.T) {
	u, host := amqpURL(t)
	p, via := viaProxy(t, host)
	ev := newEvents()
	c := dial(t, u, via, amqpsem.WithReconnect(true, locks.Backoff{Min: 20 * time.Millisecond, Max: 50 * time.Millisecond}),
		amqpsem.WithConnectionNotice(ev.notice))
	p.Cut()
	ev.wait(t, 5*time.Second, "failed attempt", func(e amqpsem.ConnectionEvent) bool { return e.Attempt >= 2 })
	start := time.Now()
	if err := c.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Errorf("Close while reconnecting took %v", d)
	}
}

// Errors of calls on a client whose connection is gone say "amqpsem:"
// once, and no "locks: closed" in the middle.
func TestConnectionErrorTexts(t *testing.T) {
	u, host := amqpURL(t)
	name := uniqueName(t, u)
	ctx := tctx(t)
	p, via := viaProxy(t, host)
	c := dial(t, u, via, amqpsem.WithReconnect(false, locks.Backoff{}), amqpsem.WithCreate(true))
	ls := lockers(t, c)
	a := admin(t, c)
	p.Cut()
	time.Sleep(200 * time.Millisecond)
	for what, call := range map[string]func() error{
		"Semaphore.TryAcquire": func() error { _, err := ls["Semaphore"].TryLock(ctx, name); return err },
		"Mutex.TryLock":        func() error { _, err := ls["Mutex"].TryLock(ctx, name); return err },
		"Admin.Status":         func() error { _, err := a.Status(ctx, name); return err },
	} {
		err := call()
		if !errors.Is(err, locks.ErrClosed) {
			t.Errorf("%s = %v, want ErrClosed", what, err)
			continue
		}
		if n := strings.Count(err.Error(), "amqpsem:"); n != 1 || strings.Contains(err.Error(), "locks: closed") {
			t.Errorf("%s error text repeats prefixes: %v", what, err)
		}
	}
}
