package amqpsem_test

import (
	"context"
	"errors"
	neturl "net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/latchkey-go/latchkey/contracttest/testenv"

	"github.com/latchkey-go/latchkey/locks"

	"github.com/latchkey-go/latchkey/amqpsem"
)

// TestAttackDestroyWhileWaiting: "when name has none, at the start or at any
// check while it waits (the semaphore was destroyed), it returns an error
// matching ErrNoSlots at once".
func TestAttackDestroyWhileWaiting(t *testing.T) {
	url, _ := amqpURL(t)
	name := atkName("destroywait")
	atkCleanup(t, url, name)
	c := atkDial(t, url, "")
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	a := atkAdmin(t, c)
	if err := a.Create(ctx, name, 1); err != nil {
		t.Fatal(err)
	}
	h := atkRaw(t, url)
	if err := h.hold(name + "-1-B"); err != nil {
		t.Fatal(err)
	}
	s, _ := atkDial(t, url, "").Semaphore(amqpsem.MaxSemaphoreSize)
	done := make(chan error, 1)
	go func() {
		l, err := s.Acquire(ctx, name)
		if err == nil {
			l.Release(ctx)
		}
		done <- err
	}()
	time.Sleep(500 * time.Millisecond)
	if _, err := a.Destroy(ctx, name); err != nil {
		t.Fatal(err)
	}
	t0 := time.Now()
	select {
	case err := <-done:
		t.Logf("Acquire after destroy: %v after %v", err, time.Since(t0))
		if !errors.Is(err, amqpsem.ErrNoSlots) || errors.Is(err, locks.ErrNotAcquired) {
			t.Errorf("Acquire of a destroyed semaphore: %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Errorf("Acquire still waiting 5s after the semaphore was destroyed")
	}
	// Releasing the holder (no wake) must not let a fresh Acquire succeed.
	h.drop(name + "-1-B")
	if l, err := s.TryAcquire(ctx, name); !errors.Is(err, amqpsem.ErrNoSlots) {
		if err == nil {
			l.Release(ctx)
		}
		t.Errorf("TryAcquire of a destroyed semaphore: %v", err)
	}
}

// TestAttackReservedNames: names whose queues start with the wake prefixes
// are refused before any I/O.
func TestAttackReservedNames(t *testing.T) {
	url, _ := amqpURL(t)
	c := atkDial(t, url, "", amqpsem.WithCreate(true))
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	m := c.Locker()
	s, _ := c.Semaphore(1)
	ps, _ := atkDial(t, url, "", amqpsem.WithCreate(true), amqpsem.WithLayout(amqpsem.PythonLayout)).Semaphore(1)
	a := atkAdmin(t, c)
	for _, n := range []string{"amqpsem.wake.x", "amqpsem.wake-sha256.ab", "amqpsem.wake.", "amq.x"} {
		if l, err := m.TryLock(ctx, n); !errors.Is(err, locks.ErrInvalidName) {
			if err == nil {
				l.Release(ctx)
			}
			t.Errorf("TryLock(%q): %v", n, err)
		}
		for _, sem := range []*amqpsem.Semaphore{s, ps} {
			if l, err := sem.TryAcquire(ctx, n); !errors.Is(err, locks.ErrInvalidName) {
				if err == nil {
					l.Release(ctx)
				}
				a.Destroy(ctx, n)
				t.Errorf("TryAcquire(%q): %v", n, err)
			}
		}
		if err := a.Create(ctx, n, 1); !errors.Is(err, locks.ErrInvalidName) {
			a.Destroy(ctx, n)
			t.Errorf("Create(%q): %v", n, err)
		}
	}
}

// TestAttackWithCreateConcurrent: five clients acquire a missing name
// WithCreate(2) at once: the semaphore is created once, with 2 slots; two
// acquires succeed, the others find every slot held.
func TestAttackWithCreateConcurrent(t *testing.T) {
	url, _ := amqpURL(t)
	name := atkName("wcconc")
	atkCleanup(t, url, name)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	var sems []*amqpsem.Semaphore
	for range 5 {
		s, _ := atkDial(t, url, "", amqpsem.WithCreate(true)).Semaphore(2)
		sems = append(sems, s)
	}
	type res struct {
		l   locks.Lease
		err error
	}
	ch := make(chan res, len(sems))
	for _, s := range sems {
		go func() {
			l, err := s.TryAcquire(ctx, name)
			ch <- res{l, err}
		}()
	}
	ok := 0
	for range sems {
		r := <-ch
		if r.err == nil {
			ok++
			defer r.l.Release(context.Background())
		} else if !errors.Is(r.err, locks.ErrNotAcquired) {
			t.Errorf("TryAcquire WithCreate: %v", r.err)
		}
	}
	n, err := atkAdmin(t, atkDial(t, url, "")).Max(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	if n != 2 || ok != 2 {
		t.Errorf("WithCreate(2) from 5 clients: %d slots, %d leases", n, ok)
	}
}

// TestAttackConnectionNotice: the notices of a loss, failed attempts and
// the recovery, in order, and no password in their errors.
func TestAttackConnectionNotice(t *testing.T) {
	url, host := amqpURL(t)
	p := testenv.NewProxy(t, host)
	var mu sync.Mutex
	var evs []amqpsem.ConnectionEvent
	c := atkDial(t, url, p.Addr(), atkReconnect, amqpsem.WithConnectionNotice(func(e amqpsem.ConnectionEvent) {
		mu.Lock()
		evs = append(evs, e)
		mu.Unlock()
	}))
	p.Cut()
	time.Sleep(700 * time.Millisecond)
	if c.Connected() {
		t.Errorf("Connected() true while cut")
	}
	p.Restore()
	atkWaitConnected(t, c, 5*time.Second)
	time.Sleep(100 * time.Millisecond)
	mu.Lock()
	defer mu.Unlock()
	if len(evs) < 3 {
		t.Fatalf("events %+v", evs)
	}
	if evs[0].Up || evs[0].Attempt != 0 || evs[0].Err == nil {
		t.Errorf("first event %+v, want the loss", evs[0])
	}
	for i, e := range evs[1 : len(evs)-1] {
		if e.Up || e.Attempt != i+1 || e.Err == nil {
			t.Errorf("event %d %+v, want failed attempt %d", i+1, e, i+1)
		}
	}
	if last := evs[len(evs)-1]; !last.Up {
		t.Errorf("last event %+v, want Up", last)
	}
	u, _ := neturl.Parse(url)
	if pw, ok := u.User.Password(); ok {
		for _, e := range evs {
			if e.Err != nil && strings.Contains(e.Err.Error(), u.User.Username()+":"+pw+"@") {
				t.Errorf("event error shows the password: %v", e.Err)
			}
		}
	}
	t.Logf("%d events; first %v; second %v", len(evs), evs[0].Err, evs[1].Err)
}
