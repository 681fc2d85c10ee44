package amqpsem_test

import (
	"context"
	"errors"
	"net"
	"testing"
	"time"

	"github.com/latchkey-go/latchkey/contracttest/testenv"
	"github.com/latchkey-go/latchkey/locks"

	"github.com/latchkey-go/latchkey/amqpsem"
)

// viaProxy dials the broker through a fault proxy of the test's.
func viaProxy(t *testing.T, host string) (*testenv.Proxy, amqpsem.Option) {
	p := testenv.NewProxy(t, host)
	return p, amqpsem.WithDial(func(ctx context.Context, network, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, network, p.Addr())
	})
}

// lockers are the mutex and a one-slot semaphore of c, as Lockers.
func lockers(t *testing.T, c *amqpsem.Client) map[string]locks.Locker {
	m := c.Locker()
	s := semaphore(t, c, 1)
	return map[string]locks.Locker{"Mutex": m, "Semaphore": semLocker{s}}
}

// TestFreedAtOnceOnSocketClose: when a holder's socket closes (its
// process died), the broker frees its slot or mutex at once, long before
// the heartbeat bound of a silent holder (2–3 intervals).
func TestFreedAtOnceOnSocketClose(t *testing.T) {
	u, host := amqpURL(t)
	for _, kind := range []string{"Mutex", "Semaphore"} {
		t.Run(kind, func(t *testing.T) {
			name := uniqueName(t, u)
			ctx := tctx(t)
			p, via := viaProxy(t, host)
			holder := lockers(t, dial(t, u, via, amqpsem.WithCreate(true)))[kind]
			other := lockers(t, dial(t, u, amqpsem.WithCreate(true)))[kind]
			lease, err := holder.TryLock(ctx, name)
			if err != nil {
				t.Fatal(err)
			}
			p.Cut() // both ends see the socket close
			cut := time.Now()
			wctx, cancel := context.WithTimeout(ctx, 3*testHeartbeat)
			defer cancel()
			got, err := other.Lock(wctx, name)
			if err != nil {
				t.Fatalf("Lock after the holder's socket closed: %v", err)
			}
			defer got.Release(ctx)
			took := time.Since(cut)
			t.Logf("freed %v after the holder's socket closed (heartbeat %v)", took.Round(time.Millisecond), testHeartbeat)
			if bound := testHeartbeat - 200*time.Millisecond; took > bound {
				t.Errorf("freed %v after the socket closed, want at once (well under the %v heartbeat)", took, testHeartbeat)
			}
			if cause := context.Cause(lease.Context()); !errors.Is(cause, locks.ErrLost) {
				t.Errorf("the holder's lease after its socket closed: %v, want ErrLost", cause)
			}
		})
	}
}

// TestErrClosedAfterConnectionGone: a Client made WithReconnect(false)
// does not reconnect; once its connection is gone, its calls return
// errors matching locks.ErrClosed.
func TestErrClosedAfterConnectionGone(t *testing.T) {
	u, host := amqpURL(t)
	name := uniqueName(t, u)
	ctx := tctx(t)
	p, via := viaProxy(t, host)
	c := dial(t, u, via, amqpsem.WithReconnect(false, locks.Backoff{}), amqpsem.WithCreate(true))
	ls := lockers(t, c)
	a := admin(t, c)
	p.Cut()
	calls := map[string]func() error{
		"Mutex.TryLock": func() error { _, err := ls["Mutex"].TryLock(ctx, name); return err },
		"Mutex.Lock":    func() error { _, err := ls["Mutex"].Lock(ctx, name); return err },
		"Semaphore.TryAcquire": func() error {
			_, err := ls["Semaphore"].TryLock(ctx, name)
			return err
		},
		"Semaphore.Acquire": func() error { _, err := ls["Semaphore"].Lock(ctx, name); return err },
		"Admin.Create":      func() error { return a.Create(ctx, name, 1) },
	}
	deadline := time.Now().Add(3 * testHeartbeat)
	for what, call := range calls {
		var err error
		for err = call(); !errors.Is(err, locks.ErrClosed) && time.Now().Before(deadline); err = call() {
			time.Sleep(20 * time.Millisecond) // the client may not have seen the close yet
		}
		if !errors.Is(err, locks.ErrClosed) {
			t.Errorf("%s after the connection was cut: %v, want an error matching ErrClosed", what, err)
		}
	}
}

// TestMutexIsSemaphoreAdminMutex: a Mutex on N is semaphore N's
// administration mutex: while it is held, administration of N waits.
func TestMutexIsSemaphoreAdminMutex(t *testing.T) {
	u, _ := amqpURL(t)
	name := uniqueName(t, u)
	ctx := tctx(t)
	m := dial(t, u).Locker()
	held, err := m.TryLock(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	a := admin(t, dial(t, u))
	short, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
	err = a.Create(short, name, 2)
	cancel()
	if err == nil {
		t.Fatal("Create of semaphore N succeeded while the Mutex on N was held")
	}
	if err := held.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if err := a.Create(ctx, name, 2); err != nil {
		t.Fatalf("Create after the Mutex on N was released: %v", err)
	}
}

// TestSemaphoreReleaseWakesWaiter: a Release wakes a waiting Acquire at
// once, through the wake exchange, not by polling: with a 5s backoff the
// waiter still gets the slot within a fraction of a second.
func TestSemaphoreReleaseWakesWaiter(t *testing.T) {
	u, _ := amqpURL(t)
	name := uniqueName(t, u)
	ctx := tctx(t)
	slow := locks.Backoff{Min: 5 * time.Second, Max: 5 * time.Second}
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
	if took > time.Second {
		t.Errorf("the waiter got the slot %v after the Release: not woken (its backoff is %v)", took, slow.Min)
	}
}
