package amqpsem_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/latchkey-go/latchkey/contracttest/testenv"
	"github.com/latchkey-go/latchkey/locks"

	"github.com/latchkey-go/latchkey/amqpsem"
)

var atkReconnect = amqpsem.WithReconnect(true, locks.Backoff{Min: 50 * time.Millisecond, Max: 200 * time.Millisecond})

func atkWaitConnected(t *testing.T, c *amqpsem.Client, d time.Duration) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !c.Connected() {
		if time.Now().After(deadline) {
			t.Fatalf("client not reconnected after %v", d)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestAttackReconnectOldLeaseRelease: a lease from before a reconnect is
// released (and verified) after the same client took the same slot again
// on its new connection. "Leases of the lost connection have ended and stay
// ended": neither call may touch the new lease's holder queue.
func TestAttackReconnectOldLeaseRelease(t *testing.T) {
	url, host := amqpURL(t)
	for _, kind := range []string{"semaphore", "mutex"} {
		t.Run(kind, func(t *testing.T) {
			name := atkName("oldrel" + kind)
			atkCleanup(t, url, name)
			p := testenv.NewProxy(t, host)
			c := atkDial(t, url, p.Addr(), atkReconnect)
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			var acquire func() (locks.Lease, error)
			queue := name
			if kind == "semaphore" {
				if err := atkAdmin(t, c).Create(ctx, name, 1); err != nil {
					t.Fatal(err)
				}
				s, _ := c.Semaphore(amqpsem.MaxSemaphoreSize)
				acquire = func() (locks.Lease, error) { return s.TryAcquire(ctx, name) }
				queue = name + "-1-B"
			} else {
				m := c.Locker()
				acquire = func() (locks.Lease, error) { return m.TryLock(ctx, name) }
			}
			old, err := acquire()
			if err != nil {
				t.Fatal(err)
			}
			p.Cut()
			select {
			case <-old.Context().Done():
			case <-time.After(3 * time.Second):
				t.Fatal("old lease did not end after its connection was cut")
			}
			time.Sleep(200 * time.Millisecond)
			p.Restore()
			atkWaitConnected(t, c, 10*time.Second)
			var nw locks.Lease
			for i := 0; ; i++ {
				nw, err = acquire()
				if err == nil {
					break
				}
				if i > 100 {
					t.Fatalf("reacquire: %v", err)
				}
				time.Sleep(50 * time.Millisecond)
			}
			defer nw.Release(context.Background())
			if err := old.(*amqpsem.Lease).Verify(ctx); err == nil {
				t.Errorf("old lease verifies after reconnect")
			}
			if err := old.Release(ctx); err != nil {
				t.Logf("old release: %v", err)
			}
			time.Sleep(300 * time.Millisecond)
			raw := atkRaw(t, url)
			if st := raw.state(queue); st != "locked" {
				t.Errorf("after the old lease's Release, %s is %s, while the new lease (ended: %v) holds it", queue, st, context.Cause(nw.Context()))
			}
			select {
			case <-nw.Context().Done():
				t.Errorf("new lease ended: %v", context.Cause(nw.Context()))
			default:
			}
		})
	}
}

// TestAttackReconnectWaitingAcquire: an Acquire waits for a held 1-slot
// semaphore while its client's connection is cut and comes back; then the
// holder releases. Either the Acquire failed with ErrConnectionClosed, or its
// lease must really be held by the client's current connection.
func TestAttackReconnectWaitingAcquire(t *testing.T) {
	url, host := amqpURL(t)
	for _, kind := range []string{"semaphore", "mutex"} {
		t.Run(kind, func(t *testing.T) {
			name := atkName("waitrc" + kind)
			atkCleanup(t, url, name)
			p := testenv.NewProxy(t, host)
			c := atkDial(t, url, p.Addr(), atkReconnect)
			hc := atkDial(t, url, "")
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			var acq, hold func(context.Context) (locks.Lease, error)
			queue := name
			if kind == "semaphore" {
				if err := atkAdmin(t, c).Create(ctx, name, 1); err != nil {
					t.Fatal(err)
				}
				s, _ := c.Semaphore(amqpsem.MaxSemaphoreSize)
				hs, _ := hc.Semaphore(amqpsem.MaxSemaphoreSize)
				acq = func(ctx context.Context) (locks.Lease, error) { return s.Acquire(ctx, name) }
				hold = func(ctx context.Context) (locks.Lease, error) { return hs.TryAcquire(ctx, name) }
				queue = name + "-1-B"
			} else {
				m := c.Locker()
				hm := hc.Locker()
				acq = func(ctx context.Context) (locks.Lease, error) { return m.Lock(ctx, name) }
				hold = func(ctx context.Context) (locks.Lease, error) { return hm.TryLock(ctx, name) }
			}
			hl, err := hold(ctx)
			if err != nil {
				t.Fatal(err)
			}
			type res struct {
				l   locks.Lease
				err error
			}
			done := make(chan res, 1)
			go func() {
				l, err := acq(ctx)
				done <- res{l, err}
			}()
			time.Sleep(500 * time.Millisecond)
			p.Cut()
			time.Sleep(300 * time.Millisecond)
			p.Restore()
			atkWaitConnected(t, c, 10*time.Second)
			time.Sleep(300 * time.Millisecond)
			hl.Release(ctx)
			var r res
			select {
			case r = <-done:
			case <-time.After(15 * time.Second):
				t.Fatal("Acquire neither failed nor succeeded 15s after the release")
			}
			t.Logf("waiting acquire across a reconnect: %v", r.err)
			if r.err != nil {
				if !errors.Is(r.err, amqpsem.ErrConnectionClosed) {
					t.Errorf("Acquire in flight at the cut: %v, want ErrConnectionClosed", r.err)
				}
				return
			}
			defer r.l.Release(context.Background())
			raw := atkRaw(t, url)
			if st := raw.state(queue); st != "locked" {
				t.Errorf("Acquire returned a lease but %s is %s", queue, st)
			}
			if err := r.l.(*amqpsem.Lease).Verify(ctx); err != nil {
				t.Errorf("lease from Acquire across reconnect fails Verify: %v", err)
			}
			if l2, err := hold(ctx); err == nil {
				l2.Release(ctx)
				t.Errorf("another client took %s while the reconnected client's lease is live", name)
			}
		})
	}
}

// TestAttackReconnectBackgroundDelete: a lease ends because its
// verifications are too slow (replies delayed), which makes the client
// delete its queue in the background; then the connection is cut and comes
// back, and the client takes the same slot again. The old lease's clean-up
// must not free the new lease's slot.
func TestAttackReconnectBackgroundDelete(t *testing.T) {
	url, host := amqpURL(t)
	for _, kind := range []string{"semaphore", "mutex"} {
		t.Run(kind, func(t *testing.T) {
			name := atkName("bgdel" + kind)
			atkCleanup(t, url, name)
			p := testenv.NewProxy(t, host)
			c := atkDial(t, url, p.Addr(), atkReconnect)
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			var acquire func() (locks.Lease, error)
			queue := name
			if kind == "semaphore" {
				if err := atkAdmin(t, atkDial(t, url, "")).Create(ctx, name, 1); err != nil {
					t.Fatal(err)
				}
				s, _ := c.Semaphore(amqpsem.MaxSemaphoreSize)
				acquire = func() (locks.Lease, error) { return s.TryAcquire(ctx, name) }
				queue = name + "-1-B"
			} else {
				m := c.Locker()
				acquire = func() (locks.Lease, error) { return m.TryLock(ctx, name) }
			}
			old, err := acquire()
			if err != nil {
				t.Fatal(err)
			}
			p.DelayReplies(2500 * time.Millisecond)
			select {
			case <-old.Context().Done():
				t.Logf("old lease ended: %v", context.Cause(old.Context()))
			case <-time.After(5 * time.Second):
				t.Fatal("old lease did not end with slow verifications")
			}
			p.Cut()
			time.Sleep(200 * time.Millisecond)
			p.Restore()
			atkWaitConnected(t, c, 10*time.Second)
			var nw locks.Lease
			for i := 0; ; i++ {
				nw, err = acquire()
				if err == nil {
					break
				}
				if i > 200 {
					t.Fatalf("reacquire: %v", err)
				}
				time.Sleep(25 * time.Millisecond)
			}
			defer nw.Release(context.Background())
			old.Release(ctx)
			raw := atkRaw(t, url)
			for end := time.Now().Add(3 * time.Second); time.Now().Before(end); {
				if st := raw.state(queue); st != "locked" {
					t.Fatalf("new lease's queue %s is %s (new lease end: %v)", queue, st, context.Cause(nw.Context()))
				}
				time.Sleep(50 * time.Millisecond)
			}
			if err := nw.Context().Err(); err != nil {
				t.Errorf("new lease ended: %v", context.Cause(nw.Context()))
			}
		})
	}
}
