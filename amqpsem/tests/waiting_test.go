package amqpsem_test

import (
	"fmt"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

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
	name := newName(t, u)
	// A long back-off: the releaser waits that long at most for its
	// wake-up's confirm, and for its turn.
	slow := amqpsem.WithBackoff(locks.Backoff{Min: time.Second, Max: 2 * time.Second})
	ma := dial(t, u, slow).Locker()
	mb := dial(t, u).Locker()
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
	name := newName(t, u)
	const clients, rounds = 4, 10
	type event struct {
		who  int
		wait time.Duration
	}
	events := make(chan event, clients*rounds)
	errs := make(chan error, clients)
	for i := range clients {
		m := dial(t, u).Locker()
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

// slowBackoff is a waiter's back-off far longer than wakeBound: a waiter
// that holds within wakeBound of a release was woken, it did not poll.
var slowBackoff = locks.Backoff{Min: 5 * time.Second, Max: 5 * time.Second}

// wakeTrips are the round trips of a wake-up: the release's delete and
// publish, the delivery, the waiter's declare.
const wakeTrips = 4

// wakeBound is how soon after a release a woken waiter holds: a wake-up's
// round trips and the scheduler's delay, never more than half the slow
// back-off (beyond that a poll could not be told from a wake-up).
func wakeBound(sl slack) time.Duration {
	return min(sl.bound(0, wakeTrips), slowBackoff.Min/2)
}

// waitBound waits until some queue is bound to exchange with key: a
// mandatory publish to it is no longer returned. Each publish is a
// wake-up for the name key: a Mutex waiter woken by fan-out checks, finds
// the name held and sleeps again.
func (r *raw) waitBound(exchange, key string) {
	r.t.Helper()
	ch, err := r.conn.Channel()
	if err != nil {
		r.t.Fatal(err)
	}
	defer ch.Close()
	if err := ch.Confirm(false); err != nil {
		r.t.Fatal(err)
	}
	returns := ch.NotifyReturn(make(chan amqp.Return, 1))
	deadline := time.Now().Add(5 * time.Second)
	for {
		dc, err := ch.PublishWithDeferredConfirm(exchange, key, true, false, amqp.Publishing{Expiration: "1000"})
		if err != nil {
			r.t.Fatal(err)
		}
		if !dc.Wait() {
			r.t.Fatalf("publish to %q with key %q: nacked", exchange, key)
		}
		// A return comes before the confirm that follows it.
		select {
		case <-returns:
		default:
			return
		}
		if time.Now().After(deadline) {
			r.t.Fatalf("no queue bound to %q with key %q after 5s", exchange, key)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// checkWoken has a holder's Mutex TryLock name and a waiter's, with
// slowBackoff, Lock it; once waiting returns (the waiter waits), and the
// waiter has had the time to go to sleep, the holder releases it. The
// waiter's Lock must hold name within wakeBound of the Release: it was
// woken, it did not poll.
func checkWoken(t *testing.T, u, name string, waiting func()) {
	t.Helper()
	sl := measureSlack(t, u)
	holder := dial(t, u).Locker()
	waiter := dial(t, u, amqpsem.WithBackoff(slowBackoff)).Locker()
	ctx := tctx(t)
	lease, err := holder.TryLock(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	type result struct {
		lease locks.Lease
		err   error
		at    time.Time
	}
	got := make(chan result, 1)
	go func() {
		l, err := waiter.Lock(ctx, name)
		got <- result{l, err, time.Now()}
	}()
	waiting()
	time.Sleep(300 * time.Millisecond) // the waiter has checked and sleeps
	select {
	case res := <-got:
		t.Fatalf("the waiter's Lock returned while the name was held: %v, %v", res.lease, res.err)
	default:
	}
	released := time.Now()
	if err := lease.Release(ctx); err != nil {
		t.Fatal(err)
	}
	res := <-got
	if res.err != nil {
		t.Fatalf("the waiter's Lock: %v", res.err)
	}
	if err := res.lease.Release(ctx); err != nil {
		t.Fatal(err)
	}
	took := res.at.Sub(released)
	t.Logf("the waiter held %v after the Release (back-off %v)", took.Round(time.Millisecond), slowBackoff.Min)
	if took > wakeBound(sl) {
		t.Errorf("the waiter held %v after the Release, more than %v (%v): not woken (its back-off is %v)", took, wakeBound(sl), sl, slowBackoff.Min)
	}
}

// TestMutexReleaseWakesWaiter: a Release wakes a Mutex waiter of another
// client at once, through its turn on the name's shared wake queue, not
// by polling: with a 5s back-off the waiter holds within a second.
func TestMutexReleaseWakesWaiter(t *testing.T) {
	u, _ := amqpURL(t)
	name := newName(t, u)
	r := rawConn(t, u)
	wq := "amqpsem.wake." + name
	t.Cleanup(func() { r.delete(wq) }) // after the clients closed
	checkWoken(t, u, name, func() {
		r.waitConsumers(wq, 1) // the waiter takes turns
	})
}

// TestMutexWakeFallback: when the name's shared wake queue cannot be
// declared, a waiting Lock falls back to fan-out: a Release still wakes
// it, and a waiter with a 5s back-off holds within a second. The queue
// is taken first by a stranger's queue of the same name, with other
// arguments (PRECONDITION_FAILED), or exclusive to another connection
// (RESOURCE_LOCKED); the client leaves it alone.
func TestMutexWakeFallback(t *testing.T) {
	u, _ := amqpURL(t)
	for _, tc := range []struct {
		what      string
		exclusive bool
		args      amqp.Table
	}{
		{"other arguments", false, amqp.Table{"x-max-length": int32(5), "x-expires": int32(60000)}},
		// The library's own arguments: only the exclusivity is in the way.
		{"exclusive elsewhere", true, amqp.Table{"x-max-length": int32(1), "x-message-ttl": int32(1000), "x-expires": int32(60000)}},
	} {
		t.Run(tc.what, func(t *testing.T) {
			name := newName(t, u)
			r := rawConn(t, u)
			wq := "amqpsem.wake." + name
			if err := r.declare(wq, false, tc.exclusive, tc.args); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { r.delete(wq) }) // after the clients closed
			checkWoken(t, u, name, func() {
				r.waitBound("amq.direct", name) // the waiter's fan-out queue
			})
			// The stranger's queue is as it was, and nobody consumed it:
			// the waiter was woken by fan-out, not by turns.
			ch, err := r.conn.Channel()
			if err != nil {
				t.Fatal(err)
			}
			defer ch.Close()
			q, err := ch.QueueDeclare(wq, false, false, tc.exclusive, false, tc.args)
			if err != nil {
				t.Fatalf("the stranger's %q changed: %v", wq, err)
			}
			if q.Consumers != 0 {
				t.Errorf("the stranger's %q has %d consumers, want 0", wq, q.Consumers)
			}
		})
	}
}

// TestSemaphoreReleaseWakesWaiter: a Release wakes a waiting Acquire at
// once, through the wake exchange, not by polling: with a 5s backoff the
// waiter still gets the slot within a fraction of a second.
func TestSemaphoreReleaseWakesWaiter(t *testing.T) {
	u, _ := amqpURL(t)
	name := newName(t, u)
	ctx := tctx(t)
	sl := measureSlack(t, u)
	slow := slowBackoff
	holder := semaphore(t, dial(t, u, amqpsem.WithCreate(true)), 1)
	waiter := semaphore(t, dial(t, u, amqpsem.WithBackoff(slow)), amqpsem.MaxSemaphoreSize)
	lease, err := holder.TryAcquire(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	got := make(chan error, 1)
	go func() {
		l, err := waiter.Acquire(ctx, name)
		if err == nil {
			defer l.Release(ctx)
		}
		got <- err
	}()
	time.Sleep(500 * time.Millisecond) // the waiter has scanned once and sleeps
	released := time.Now()
	if err := lease.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-got; err != nil {
		t.Fatalf("the waiter's Acquire: %v", err)
	}
	took := time.Since(released)
	t.Logf("the waiter got the slot %v after the Release (backoff %v)", took.Round(time.Millisecond), slow.Min)
	if took > wakeBound(sl) {
		t.Errorf("the waiter got the slot %v after the Release, more than %v (%v): not woken (its backoff is %v)", took, wakeBound(sl), sl, slow.Min)
	}
}

// A release publishes its wake-up to the wake exchange; when that is
// missing, the broker closes the publishing channel, a moment later. That
// must not break the locks and releases that follow at once on the
// client's other channels.
func TestMissingWakeExchange(t *testing.T) {
	u, _ := amqpURL(t)
	ctx := tctx(t)
	base := newName(t, u)
	c := dial(t, u, amqpsem.WithWakeExchange(base+"-no-such-exchange"))
	m := c.Locker()
	var queues []string
	for i := range 40 {
		l, err := m.TryLock(ctx, fmt.Sprintf("%s-%d", base, i))
		if err != nil {
			t.Fatalf("TryLock #%d, after a release: %v", i, err)
		}
		queues = append(queues, l.(*amqpsem.Lease).Queue())
		if err := l.Release(ctx); err != nil {
			t.Fatalf("Release #%d: %v", i, err)
		}
	}
	r := rawConn(t, u)
	for _, q := range queues {
		if r.exists(q) {
			t.Errorf("%q outlived its Release", q)
		}
	}
}
