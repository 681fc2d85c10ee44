package amqpsem_test

import (
	"context"
	"errors"
	neturl "net/url"
	"strings"
	"testing"
	"time"

	"github.com/latchkey-go/latchkey/contracttest/testenv"
	"github.com/latchkey-go/latchkey/locks"

	"github.com/latchkey-go/latchkey/amqpsem"
)

// A Client whose connection drops reports it, ends the leases of that
// connection with ErrLost, makes new calls wait (not fail with ErrClosed)
// while it redials with back-off, reports the recovery, and serves new
// calls on the new connection. Error texts say "amqpsem:" once.
func TestClientReconnects(t *testing.T) {
	u, host := amqpURL(t)
	name := newName(t, u)
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
	sl := measureSlack(t, u)
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
	// Every dial is refused at once; Close ends the attempts.
	sl.within(t, "Close while reconnecting", time.Since(start), testHeartbeat, 2)
}

// TestConnectionNoticesInOrder: the notices of a loss, failed attempts and
// the recovery, in order, and no password in their errors.
func TestConnectionNoticesInOrder(t *testing.T) {
	url, host := amqpURL(t)
	sl := measureSlack(t, url)
	p := testenv.NewProxy(t, host)
	ev := newEvents()
	c := dial(t, url, through(p), fastReconnect, amqpsem.WithConnectionNotice(ev.notice))
	p.Cut()
	ev.wait(t, sl.bound(3*testHeartbeat, 2), "failed attempt", func(e amqpsem.ConnectionEvent) bool { return !e.Up && e.Attempt >= 1 })
	if c.Connected() {
		t.Errorf("Connected() true while cut")
	}
	p.Restore()
	ev.wait(t, sl.bound(5*time.Second, 2), "recovery", func(e amqpsem.ConnectionEvent) bool { return e.Up })
	waitConnected(t, c, sl.bound(time.Second, 2))
	evs := ev.all()
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

// TestOldLeaseReleaseAfterReconnect: a lease from before a reconnect is
// released (and verified) after the same client took the same slot again
// on its new connection. "Leases of the lost connection have ended and stay
// ended": neither call may touch the new lease's holder queue.
func TestOldLeaseReleaseAfterReconnect(t *testing.T) {
	url, host := amqpURL(t)
	for _, kind := range []string{"semaphore", "mutex"} {
		t.Run(kind, func(t *testing.T) {
			name := newName(t, url)
			p := testenv.NewProxy(t, host)
			c := dial(t, url, through(p), fastReconnect)
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			var acquire func() (locks.Lease, error)
			queue := name
			if kind == "semaphore" {
				if err := admin(t, c).Create(ctx, name, 1); err != nil {
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
			waitConnected(t, c, 10*time.Second)
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
			raw := rawConn(t, url)
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

// TestWaitingAcquireAcrossReconnect: an Acquire waits for a held 1-slot
// semaphore while its client's connection is cut and comes back; then the
// holder releases. Either the Acquire failed with ErrConnectionClosed, or its
// lease must really be held by the client's current connection.
func TestWaitingAcquireAcrossReconnect(t *testing.T) {
	url, host := amqpURL(t)
	for _, kind := range []string{"semaphore", "mutex"} {
		t.Run(kind, func(t *testing.T) {
			name := newName(t, url)
			p := testenv.NewProxy(t, host)
			c := dial(t, url, through(p), fastReconnect)
			hc := dial(t, url)
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			var acq, hold func(context.Context) (locks.Lease, error)
			queue := name
			if kind == "semaphore" {
				if err := admin(t, c).Create(ctx, name, 1); err != nil {
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
			waitConnected(t, c, 10*time.Second)
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
			raw := rawConn(t, url)
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

// TestOldLeaseCleanupSparesNewLease: a lease ends because its
// verifications are too slow (replies delayed), which makes the client
// delete its queue in the background; then the connection is cut and comes
// back, and the client takes the same slot again. The old lease's clean-up
// must not free the new lease's slot.
func TestOldLeaseCleanupSparesNewLease(t *testing.T) {
	url, host := amqpURL(t)
	for _, kind := range []string{"semaphore", "mutex"} {
		t.Run(kind, func(t *testing.T) {
			name := newName(t, url)
			p := testenv.NewProxy(t, host)
			c := dial(t, url, through(p), fastReconnect)
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			var acquire func() (locks.Lease, error)
			queue := name
			if kind == "semaphore" {
				if err := admin(t, dial(t, url)).Create(ctx, name, 1); err != nil {
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
			waitConnected(t, c, 10*time.Second)
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
			raw := rawConn(t, url)
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

// TestCutEndsLeasesAndWaitingAcquires: a client behind a proxy holds the
// one slot of semaphore S2 (verifying every 50ms) and waits in Acquire
// for semaphore S1, held by another client; a third client waits for S2.
// The proxy cuts every connection. Checks: the S2 lease ends with
// ErrLost and ErrConnectionClosed before the third client holds S2; the
// waiting Acquire returns an error matching ErrConnectionClosed; after
// Restore the client reconnects and acquires S1 once it is released.
func TestCutEndsLeasesAndWaitingAcquires(t *testing.T) {
	url, host := amqpURL(t)
	sl := measureSlack(t, url)
	s1, s2 := newName(t, url), newName(t, url)
	ctx, cancel := context.WithTimeout(context.Background(), 25*time.Second)
	defer cancel()
	other := dial(t, url)
	a := admin(t, other)
	for _, n := range []string{s1, s2} {
		if err := a.Create(ctx, n, 1); err != nil {
			t.Fatal(err)
		}
	}
	osem, _ := other.Semaphore(1)
	h1, err := osem.TryAcquire(ctx, s1)
	if err != nil {
		t.Fatal(err)
	}
	p := testenv.NewProxy(t, host)
	vc := dial(t, url, through(p), amqpsem.WithVerifyInterval(50*time.Millisecond))
	vsem, _ := vc.Semaphore(1)
	rec := newLeaseHistory(1)
	v2, err := vsem.TryAcquire(ctx, s2)
	if err != nil {
		t.Fatal(err)
	}
	rec.enter("cut client", v2)
	third := dial(t, url)
	tsem, _ := third.Semaphore(1)
	thirdGot := make(chan locks.Lease, 1)
	go func() {
		l, err := tsem.Acquire(ctx, s2)
		if err != nil {
			t.Errorf("third client: %v", err)
			close(thirdGot)
			return
		}
		rec.enter("third client", l)
		thirdGot <- l
	}()
	waitErr := make(chan error, 1)
	go func() {
		_, err := vsem.Acquire(ctx, s1)
		waitErr <- err
	}()
	time.Sleep(500 * time.Millisecond)
	t0 := time.Now()
	p.Cut()
	select {
	case err := <-waitErr:
		t.Logf("waiting Acquire returned %v after %v", err, time.Since(t0))
		if !errors.Is(err, amqpsem.ErrConnectionClosed) {
			t.Errorf("waiting Acquire cut mid-wait returned %v, want ErrConnectionClosed", err)
		}
	case <-time.After(sl.bound(testHeartbeat, 2)):
		// A call in flight when the connection is lost fails; it waits
		// up to a heartbeat for what it did at the broker.
		t.Errorf("waiting Acquire did not return within a heartbeat of the cut (%v; %v)", sl.bound(testHeartbeat, 2), sl)
	}
	select {
	case l := <-thirdGot:
		if l == nil {
			t.FailNow()
		}
		t.Logf("third client took S2 %v after the cut", time.Since(t0))
		defer l.Release(context.Background())
	case <-time.After(sl.bound(testHeartbeat+testBackoff.Max, 2)):
		// The broker frees a closed socket's queues at once (the crash
		// recovery bound of a closed socket is a heartbeat); the waiter
		// finds the slot within its back-off.
		t.Fatalf("third client did not take S2 within %v of the cut (%v)", sl.bound(testHeartbeat+testBackoff.Max, 2), sl)
	}
	if cause := context.Cause(v2.Context()); !errors.Is(cause, locks.ErrLost) || !errors.Is(cause, amqpsem.ErrConnectionClosed) {
		t.Errorf("cut lease ended with %v", cause)
	}
	rec.check(t)
	p.Restore()
	waitConnected(t, vc, 10*time.Second)
	h1.Release(ctx)
	actx, acancel := context.WithTimeout(ctx, 5*time.Second)
	defer acancel()
	l, err := vsem.Acquire(actx, s1)
	if err != nil {
		t.Fatalf("after reconnecting, Acquire of a free S1: %v", err)
	}
	l.Release(ctx)
}

// TestCutMidDeclareHoldsNothing: a client's TryAcquire has its declare at the broker
// (seen as a locked B[1]; the replies are held back 1s) when the proxy
// cuts the connection.
// Checks: TryAcquire returns an error matching ErrConnectionClosed and
// locks.ErrClosed (the Client's doc, for calls in flight when the
// connection is lost), holding nothing; another client takes the slot
// at once; after Restore the client reconnects and acquires.
func TestCutMidDeclareHoldsNothing(t *testing.T) {
	url, host := amqpURL(t)
	name := newName(t, url)
	ctx, cancel := context.WithTimeout(context.Background(), 25*time.Second)
	defer cancel()
	oc := dial(t, url)
	if err := admin(t, oc).Create(ctx, name, 1); err != nil {
		t.Fatal(err)
	}
	p := testenv.NewProxy(t, host)
	vc := dial(t, url, through(p))
	vsem, _ := vc.Semaphore(1)
	p.DelayReplies(time.Second)
	errc := make(chan error, 1)
	go func() {
		l, err := vsem.TryAcquire(ctx, name)
		if err == nil {
			t.Errorf("TryAcquire succeeded across a cut: live %v", l.Context().Err() == nil)
		}
		errc <- err
	}()
	raw := rawConn(t, url)
	for deadline := time.Now().Add(10 * time.Second); raw.state(name+"-1-B") != "locked"; { // the declare is at the broker
		if time.Now().After(deadline) {
			t.Fatal("the client's declare never reached the broker")
		}
		time.Sleep(20 * time.Millisecond)
	}
	t0 := time.Now()
	p.Cut()
	select {
	case err := <-errc:
		t.Logf("TryAcquire cut mid-declare: %v after %v", err, time.Since(t0))
		if err != nil && (!errors.Is(err, amqpsem.ErrConnectionClosed) || !errors.Is(err, locks.ErrClosed)) {
			t.Errorf("TryAcquire cut mid-declare returned %v, matching ErrConnectionClosed %v, locks.ErrClosed %v",
				err, errors.Is(err, amqpsem.ErrConnectionClosed), errors.Is(err, locks.ErrClosed))
		}
	case <-time.After(5 * time.Second):
		t.Fatal("TryAcquire did not return within 5s of the cut")
	}
	osem, _ := oc.Semaphore(1)
	actx, acancel := context.WithTimeout(ctx, 3*time.Second)
	ol, err := osem.Acquire(actx, name)
	acancel()
	if err != nil {
		t.Fatalf("other client, after the cut: %v", err)
	}
	t.Logf("other client took the slot %v after the cut", time.Since(t0))
	ol.Release(ctx)
	p.Restore()
	end := time.Now().Add(10 * time.Second)
	for {
		l, err := vsem.TryAcquire(ctx, name)
		if err == nil {
			l.Release(ctx)
			return
		}
		if time.Now().After(end) {
			t.Fatalf("no slot 10s after Restore: %v", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}
