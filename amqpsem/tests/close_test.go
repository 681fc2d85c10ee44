package amqpsem_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/latchkey-go/latchkey/contracttest/testenv"
	"github.com/latchkey-go/latchkey/locks"

	"github.com/latchkey-go/latchkey/amqpsem"
)

// TestCloseEndsLeasesAndWaiters: Close(ctx) ends every lease with a cause
// matching ErrLost and ErrClosed and deletes its queue, makes a waiting
// Lock return an error matching ErrClosed, makes later calls fail with
// ErrClosed, and returns nil when called again.
func TestCloseEndsLeasesAndWaiters(t *testing.T) {
	u, _ := amqpURL(t)
	sl := measureSlack(t, u)
	name := newName(t, u)
	ctx := tctx(t)
	r := rawConn(t, u)
	c, err := amqpsem.Dial(ctx, u, testOptions()...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close(context.Background()) })
	lease, err := c.Locker().TryLock(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	other := dial(t, u).Locker()
	held, err := other.TryLock(ctx, name+"-other")
	if err != nil {
		t.Fatal(err)
	}
	defer held.Release(ctx)
	waiting := make(chan error, 1)
	go func() {
		_, err := c.Locker().Lock(ctx, name+"-other")
		waiting <- err
	}()
	r.waitConsumers("amqpsem.wake."+name+"-other", 1) // it waits its turn
	if err := c.Close(ctx); err != nil {
		t.Fatalf("Close: %v", err)
	}
	cause := context.Cause(lease.Context())
	if !errors.Is(cause, locks.ErrLost) || !errors.Is(cause, locks.ErrClosed) {
		t.Errorf("lease cause after Close = %v, want ErrLost and ErrClosed", cause)
	}
	if r.exists(name) {
		t.Errorf("queue %q still exists after Close", name)
	}
	select {
	case err := <-waiting:
		if !errors.Is(err, locks.ErrClosed) {
			t.Errorf("waiting Lock after Close = %v, want ErrClosed", err)
		}
	case <-time.After(sl.bound(testHeartbeat, 2)):
		// A call in flight waits up to a heartbeat to undo what it did.
		t.Fatalf("a waiting Lock still waits %v after Close (a heartbeat, %v)", sl.bound(testHeartbeat, 2), sl)
	}
	if _, err := c.Locker().TryLock(ctx, name); !errors.Is(err, locks.ErrClosed) {
		t.Errorf("TryLock after Close = %v, want ErrClosed", err)
	}
	if err := c.Close(ctx); err != nil {
		t.Errorf("second Close = %v, want nil", err)
	}
}

// TestCloseBoundedByContext: Close with a context that has ended returns
// an error matching it at once; the connection goes all the same.
func TestCloseBoundedByContext(t *testing.T) {
	u, _ := amqpURL(t)
	sl := measureSlack(t, u)
	name := newName(t, u)
	ctx := tctx(t)
	c, err := amqpsem.Dial(ctx, u, testOptions()...)
	if err != nil {
		t.Fatal(err)
	}
	lease, err := c.Locker().TryLock(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	ended, cancel := context.WithCancel(ctx)
	cancel()
	start := time.Now()
	err = c.Close(ended)
	if !errors.Is(err, context.Canceled) {
		t.Errorf("Close(ended ctx) = %v, want context.Canceled", err)
	}
	sl.within(t, "Close(ended ctx)", time.Since(start), 0, 2)
	if !errors.Is(context.Cause(lease.Context()), locks.ErrClosed) {
		t.Errorf("lease cause = %v, want ErrClosed", context.Cause(lease.Context()))
	}
	// The broker frees the queue once the socket is gone.
	l, err := dial(t, u).Locker().Lock(ctx, name)
	if err != nil {
		t.Fatalf("Lock after the closed client's socket went: %v", err)
	}
	_ = l.Release(ctx)
}

// TestCloseWithShortDeadlineEndsEverything: a client holds every slot of a
// semaphore (verifying every 50ms), has Acquires waiting and a Verify
// loop running, and is closed with a deadline of 0, 5ms or 50ms. Checks:
// Close returns within its deadline plus a second; every lease's context
// has ended with locks.ErrLost and locks.ErrClosed when Close returns;
// the waiting Acquires return errors matching locks.ErrClosed; no holder
// queue is left at the broker within 3s; no goroutine outlives Close
// (goleak, after a grace period, since a late Close finishes in the
// background).
func TestCloseWithShortDeadlineEndsEverything(t *testing.T) {
	url, _ := amqpURL(t)
	for _, deadline := range []time.Duration{0, 5 * time.Millisecond, 50 * time.Millisecond} {
		t.Run(deadline.String(), func(t *testing.T) {
			sl := measureSlack(t, url)
			name := newName(t, url)
			raw := rawConn(t, url)
			setup := dial(t, url)
			ctx, cancel := context.WithTimeout(context.Background(), 25*time.Second)
			defer cancel()
			if err := admin(t, setup).Create(ctx, name, 4); err != nil {
				t.Fatal(err)
			}
			before := goleak.IgnoreCurrent()
			dctx, dcancel := context.WithTimeout(ctx, 5*time.Second)
			c, err := amqpsem.Dial(dctx, url, append(testOptions(), amqpsem.WithVerifyInterval(50*time.Millisecond))...)
			dcancel()
			if err != nil {
				t.Fatal(err)
			}
			sem, _ := c.Semaphore(4)
			var leases []locks.Lease
			for range 4 {
				l, err := sem.TryAcquire(ctx, name)
				if err != nil {
					t.Fatal(err)
				}
				leases = append(leases, l)
			}
			waitErrs := make(chan error, 3)
			for range 3 {
				go func() {
					_, err := sem.Acquire(ctx, name)
					waitErrs <- err
				}()
			}
			verifyDone := make(chan struct{})
			go func() {
				defer close(verifyDone)
				for leases[0].(*amqpsem.Lease).Verify(ctx) == nil {
				}
			}()
			time.Sleep(300 * time.Millisecond)
			cctx, ccancel := context.WithTimeout(context.Background(), deadline)
			t0 := time.Now()
			cerr := c.Close(cctx)
			took := time.Since(t0)
			ccancel()
			t.Logf("Close(%v) took %v: %v", deadline, took, cerr)
			sl.within(t, fmt.Sprintf("Close with a %v deadline", deadline), took, deadline, 2)
			for i, l := range leases {
				if l.Context().Err() == nil {
					t.Errorf("lease %d still live after Close returned", i)
					continue
				}
				if cause := context.Cause(l.Context()); !errors.Is(cause, locks.ErrLost) || !errors.Is(cause, locks.ErrClosed) {
					t.Errorf("lease %d ended with %v, want ErrLost and ErrClosed", i, cause)
				}
			}
			for range 3 {
				select {
				case err := <-waitErrs:
					if !errors.Is(err, locks.ErrClosed) {
						t.Errorf("waiting Acquire returned %v, want ErrClosed", err)
					}
				case <-time.After(sl.bound(testHeartbeat, 2)):
					// A call in flight waits up to a heartbeat to undo what it did.
					t.Fatalf("a waiting Acquire did not return within a heartbeat of Close (%v; %v)", sl.bound(testHeartbeat, 2), sl)
				}
			}
			<-verifyDone
			// The broker frees a closed socket's queues at once, a silent
			// one's within three heartbeats.
			if left := holderQueuesLeft(raw, name, 4, sl.bound(3*testHeartbeat, 2)); len(left) > 0 {
				t.Errorf("holder queues left %v after Close (three heartbeats; %v): %v", sl.bound(3*testHeartbeat, 2), sl, left)
			}
			leakEnd := time.Now().Add(5 * time.Second)
			for {
				err := goleak.Find(before)
				if err == nil {
					break
				}
				if time.Now().After(leakEnd) {
					t.Errorf("goroutines outlive Close(%v) by 5s: %v", deadline, err)
					break
				}
			}
		})
	}
}

// TestCloseDuringLateDeclareLeavesNothing: a client's Acquire has declared a
// holder queue whose declare-ok is 2s late when the client is closed with
// a 100ms deadline. Checks: Close returns within its deadline plus a
// second, the Acquire returns an error matching locks.ErrClosed (or
// ctx's), and no holder queue is left at the broker 3s later.
func TestCloseDuringLateDeclareLeavesNothing(t *testing.T) {
	url, host := amqpURL(t)
	sl := measureSlack(t, url)
	name := newName(t, url)
	ctx, cancel := context.WithTimeout(context.Background(), 25*time.Second)
	defer cancel()
	raw := rawConn(t, url)
	if err := admin(t, dial(t, url)).Create(ctx, name, 2); err != nil {
		t.Fatal(err)
	}
	p := testenv.NewProxy(t, host)
	vc := dial(t, url, through(p), amqpsem.WithHeartbeat(5*time.Second))
	vsem, _ := vc.Semaphore(2)
	p.DelayReplies(2 * time.Second)
	acqErr := make(chan error, 2)
	for range 2 {
		go func() {
			l, err := vsem.Acquire(ctx, name)
			if err == nil {
				t.Errorf("Acquire succeeded on a client being closed: slot %d, live %v", l.(locks.SlotLease).Slot(), l.Context().Err() == nil)
			}
			acqErr <- err
		}()
	}
	// The probes' replies are in (2s late) when a declare is at the broker.
	waitFor(t, sl.bound(10*time.Second, 2), "a declare at the broker", func() bool {
		return raw.state(amqpsem.DefaultLayout.Holder(name, 1)) == "locked"
	})
	cctx, ccancel := context.WithTimeout(ctx, 100*time.Millisecond)
	t0 := time.Now()
	cerr := vc.Close(cctx)
	ccancel()
	t.Logf("Close took %v: %v", time.Since(t0), cerr)
	sl.within(t, "Close with a 100ms deadline", time.Since(t0), 100*time.Millisecond, 2)
	for range 2 {
		select {
		case err := <-acqErr:
			if err != nil && !errors.Is(err, locks.ErrClosed) && !errors.Is(err, context.DeadlineExceeded) {
				t.Errorf("Acquire during Close: %v", err)
			}
		case <-time.After(sl.bound(5*time.Second, 2)):
			// A call in flight waits up to a heartbeat (5s) to undo what it did.
			t.Errorf("Acquire did not return within a heartbeat of Close (%v; %v)", sl.bound(5*time.Second, 2), sl)
		}
	}
	p.Restore()
	if left := holderQueuesLeft(raw, name, 2, sl.bound(3*testHeartbeat, 2)); len(left) > 0 {
		t.Errorf("holder queues left %v after Close (%v): %v", sl.bound(3*testHeartbeat, 2), sl, left)
	}
}
