package amqpsem_test

import (
	"errors"
	"testing"
	"time"

	"github.com/latchkey-go/latchkey/locks"

	"github.com/latchkey-go/latchkey/amqpsem"
)

// waitConsumers waits until queue q has at least n consumers.
func (r *raw) waitConsumers(q string, n int) {
	r.t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		ch, err := r.conn.Channel()
		if err != nil {
			r.t.Fatal(err)
		}
		got, err := ch.QueueDeclarePassive(q, false, false, false, false, nil)
		_ = ch.Close()
		if err == nil && got.Consumers >= n {
			return
		}
		if time.Now().After(deadline) {
			r.t.Fatalf("queue %q: still not %d consumers after 10s (last: %+v, %v)", q, n, got, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// A client that releases a mutex while another client waits for it, and
// calls Lock again at once, does not take it straight back: the waiter
// gets it first.
func TestMutexHandsOverToWaiter(t *testing.T) {
	u, _ := amqpURL(t)
	ctx := tctx(t)
	name := uniqueName(t, u)
	// A long back-off: the releaser waits that long at most for its
	// wake-up's confirm, and for its turn.
	slow := amqpsem.WithBackoff(locks.Backoff{Min: time.Second, Max: 2 * time.Second})
	ma, err := dial(t, u, slow).Mutex()
	if err != nil {
		t.Fatal(err)
	}
	mb, err := dial(t, u).Mutex()
	if err != nil {
		t.Fatal(err)
	}
	r := rawConn(t, u)
	for round := range 3 {
		held, err := ma.Lock(ctx, name)
		if err != nil {
			t.Fatal(err)
		}
		type got struct {
			who   string
			lease locks.Lease
			err   error
		}
		order := make(chan got, 2)
		go func() {
			l, err := mb.Lock(ctx, name)
			order <- got{"waiter", l, err}
		}()
		r.waitConsumers("amqpsem.wake."+name, 1)
		if err := held.Release(ctx); err != nil {
			t.Fatal(err)
		}
		go func() {
			l, err := ma.Lock(ctx, name)
			order <- got{"releaser", l, err}
		}()
		first := <-order
		if first.err != nil {
			t.Fatalf("round %d: %s: Lock: %v", round, first.who, first.err)
		}
		if first.who != "waiter" {
			t.Errorf("round %d: the releaser took the mutex back before the waiting client", round)
		}
		if err := first.lease.Release(ctx); err != nil {
			t.Fatal(err)
		}
		second := <-order
		if second.err != nil {
			t.Fatalf("round %d: %s: Lock: %v", round, second.who, second.err)
		}
		if err := second.lease.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
}

// Several clients taking turns on one name: every hand-off goes to
// another client, and nobody waits long.
func TestMutexTakesTurns(t *testing.T) {
	u, _ := amqpURL(t)
	ctx := tctx(t)
	name := uniqueName(t, u)
	const clients, rounds = 4, 10
	type event struct {
		who  int
		wait time.Duration
	}
	events := make(chan event, clients*rounds)
	errs := make(chan error, clients)
	for i := range clients {
		m, err := dial(t, u).Mutex()
		if err != nil {
			t.Fatal(err)
		}
		go func() {
			for range rounds {
				t0 := time.Now()
				l, err := m.Lock(ctx, name)
				if err != nil {
					errs <- err
					return
				}
				events <- event{i, time.Since(t0)}
				time.Sleep(time.Millisecond)
				if err := l.Release(ctx); err != nil {
					errs <- err
					return
				}
			}
			errs <- nil
		}()
	}
	for range clients {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	close(events)
	prev, same, n := -1, 0, 0
	for e := range events {
		if e.who == prev {
			same++
		}
		prev = e.who
		n++
	}
	// Unfair hand-offs, the releaser taking the mutex straight back,
	// would make most of them "same". A waiter can still lose its turn
	// now and then (a wake-up lost, a confirm slower than the back-off).
	if same > n/4 {
		t.Errorf("%d of %d acquisitions went to the client that had just released it; want another client's turn", same, n)
	}
}

// Names whose queue would be a shared wake queue are refused before any
// I/O: such a mutex would block another name's turns, and be reported
// held while nobody holds it.
func TestWakeQueueNamesRefused(t *testing.T) {
	for _, name := range []string{"amqpsem.wake.jobs", "amqpsem.wake-sha256.00"} {
		for _, l := range []amqpsem.Layout{amqpsem.DefaultLayout, amqpsem.PythonLayout} {
			if err := l.CheckName(name); !errors.Is(err, locks.ErrInvalidName) {
				t.Errorf("CheckName(%q) = %v, want ErrInvalidName", name, err)
			}
		}
	}
	if err := amqpsem.DefaultLayout.CheckName("amqpsem.wakeful"); err != nil {
		t.Errorf(`CheckName("amqpsem.wakeful") = %v, want nil`, err)
	}
}
