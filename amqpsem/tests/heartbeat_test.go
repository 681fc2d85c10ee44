package amqpsem_test

import (
	"context"
	"errors"
	"fmt"
	neturl "net/url"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/latchkey-go/latchkey/contracttest/testenv"
	"github.com/latchkey-go/latchkey/locks"

	"github.com/latchkey-go/latchkey/amqpsem"
)

// TestHeartbeatNegotiated: the negotiated interval, Client.Heartbeat, is
// what WithHeartbeat asks for (10s when not given), unless the broker
// proposes a lower one, or the URL's heartbeat= replaces it, lower or
// higher.
func TestHeartbeatNegotiated(t *testing.T) {
	u, _ := amqpURL(t)
	broker := brokerHeartbeat(t, u)
	t.Logf("the broker proposes a heartbeat of %v", broker)
	// The AMQP rule: the lower of the two proposals, unless one is 0.
	negotiated := func(asked time.Duration) time.Duration {
		if broker == 0 {
			return asked
		}
		return min(asked, broker)
	}
	plain := withQuery(t, u, "heartbeat", "")
	for _, tc := range []struct {
		what  string
		url   string
		opts  []amqpsem.Option
		asked time.Duration
	}{
		{"default", plain, nil, 10 * time.Second},
		{"option", plain, []amqpsem.Option{amqpsem.WithHeartbeat(7 * time.Second)}, 7 * time.Second},
		{"URL lower than the option", withQuery(t, plain, "heartbeat", "2"), []amqpsem.Option{amqpsem.WithHeartbeat(10 * time.Second)}, 2 * time.Second},
		{"URL higher than the option", withQuery(t, plain, "heartbeat", "3"), []amqpsem.Option{amqpsem.WithHeartbeat(time.Second)}, 3 * time.Second},
	} {
		c, err := amqpsem.Dial(tctx(t), tc.url, tc.opts...)
		if err != nil {
			t.Fatalf("%s: Dial: %v", tc.what, err)
		}
		got := c.Heartbeat()
		_ = c.Close(context.Background())
		if want := negotiated(tc.asked); got != want {
			t.Errorf("%s: Heartbeat() = %v, want %v (asked for %v, the broker proposes %v)", tc.what, got, want, tc.asked, broker)
		}
	}
	if broker != 0 && broker < 10*time.Second {
		t.Logf("the broker's %v is below some of the intervals asked for: those cases only show that it lowers them", broker)
	}
}

// withQuery returns rawURL with its query parameter key set to value, or
// without it when value is "".
func withQuery(t *testing.T, rawURL, key, value string) string {
	t.Helper()
	u, err := neturl.Parse(rawURL)
	if err != nil {
		t.Fatal(err)
	}
	q := u.Query()
	if value == "" {
		q.Del(key)
	} else {
		q.Set(key, value)
	}
	u.RawQuery = q.Encode()
	return u.String()
}

// brokerHeartbeat returns the heartbeat interval the broker proposes (0:
// none). A client asking for none (heartbeat=0 in the URL) gets the
// broker's.
func brokerHeartbeat(t *testing.T, rawURL string) time.Duration {
	t.Helper()
	conn, err := amqp.Dial(withQuery(t, rawURL, "heartbeat", "0"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	return conn.Config.Heartbeat
}

// TestURLHeartbeatOverridesOption: a heartbeat in the URL replaces WithHeartbeat.
func TestURLHeartbeatOverridesOption(t *testing.T) {
	url, _ := amqpURL(t)
	c := dial(t, url+"?heartbeat=2", amqpsem.WithHeartbeat(5*time.Second))
	if hb := c.Heartbeat(); hb != 2*time.Second {
		t.Errorf("URL heartbeat=2 with WithHeartbeat(5s): Heartbeat() = %v", hb)
	}
}

// TestFreedAtOnceOnSocketClose: when a holder's socket closes (its
// process died), the broker frees its slot or mutex at once, long before
// the heartbeat bound of a silent holder (2–3 intervals).
func TestFreedAtOnceOnSocketClose(t *testing.T) {
	u, host := amqpURL(t)
	for _, kind := range []string{"Mutex", "Semaphore"} {
		t.Run(kind, func(t *testing.T) {
			name := newName(t, u)
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
			bound := testHeartbeat - 200*time.Millisecond
			if took > bound {
				t.Errorf("freed %v after the socket closed, want at once (well under the %v heartbeat)", took, testHeartbeat)
			}
			// The holder's client hears of the close on its own: the
			// broker may free the slot a moment before (a CI run: the
			// other held 5ms after the cut, the holder's lease not yet
			// ended). It ends at once too, not a heartbeat later.
			select {
			case <-lease.Context().Done():
			case <-time.After(time.Until(cut.Add(bound))):
			}
			if cause := context.Cause(lease.Context()); !errors.Is(cause, locks.ErrLost) {
				t.Errorf("the holder's lease %v after its socket closed: %v, want ErrLost", time.Since(cut).Round(time.Millisecond), cause)
			}
		})
	}
}

// A client whose connection is cut by a fault proxy loses its slot at
// once on both sides, and another client gets it.
func TestCutHolderLosesSlotAtOnce(t *testing.T) {
	u, host := amqpURL(t)
	sl := measureSlack(t, u)
	name := newName(t, u)
	ctx := tctx(t)
	if err := admin(t, dial(t, u)).Create(ctx, name, 1); err != nil {
		t.Fatal(err)
	}
	p, via := viaProxy(t, host)
	holder := semaphore(t, dial(t, u, via), amqpsem.MaxSemaphoreSize)
	l, err := holder.TryAcquire(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	other := semaphore(t, dial(t, u), amqpsem.MaxSemaphoreSize)
	if _, err := other.TryAcquire(ctx, name); !errors.Is(err, locks.ErrNotAcquired) {
		t.Fatalf("TryAcquire of the held slot = %v", err)
	}
	p.Cut()
	// The broker frees a closed socket's queues at once, a silent one's
	// within three heartbeats.
	wctx, cancel := context.WithTimeout(ctx, sl.bound(3*testHeartbeat, 2))
	defer cancel()
	got, err := other.Acquire(wctx, name)
	if err != nil {
		t.Fatalf("Acquire after the holder was cut off: %v (three heartbeats; %v)", err, sl)
	}
	defer got.Release(ctx)
	select {
	case <-l.Context().Done():
	case <-time.After(sl.bound(2*testHeartbeat, 2)):
		t.Fatalf("the cut-off holder's lease is still live after %v (%v)", sl.bound(2*testHeartbeat, 2), sl)
	}
	if cause := context.Cause(l.Context()); !errors.Is(cause, locks.ErrLost) {
		t.Fatalf("cut-off holder's cause = %v", cause)
	}
}

// TestSilencedHolderStopsBeforeWaiterStarts: a holder with a 3s heartbeat is cut
// off without a close; a waiter with a 1s heartbeat waits. "a cut-off holder
// stops before anyone else starts", its lease ends within one interval of
// its last verification, and the broker frees the slot within three
// intervals (plus the delete).
func TestSilencedHolderStopsBeforeWaiterStarts(t *testing.T) {
	url, host := amqpURL(t)
	sl := measureSlack(t, url)
	name := newName(t, url)
	p := testenv.NewProxy(t, host)
	hc := dial(t, url, through(p), amqpsem.WithHeartbeat(3*time.Second), amqpsem.WithVerifyInterval(time.Second))
	if hb := hc.Heartbeat(); hb != 3*time.Second {
		t.Fatalf("holder heartbeat %v", hb)
	}
	wc := dial(t, url)
	ctx, cancel := context.WithTimeout(context.Background(), 40*time.Second)
	defer cancel()
	if err := admin(t, wc).Create(ctx, name, 1); err != nil {
		t.Fatal(err)
	}
	hs, _ := hc.Semaphore(amqpsem.MaxSemaphoreSize)
	ws, _ := wc.Semaphore(amqpsem.MaxSemaphoreSize)
	hl, err := hs.TryAcquire(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	lostAt := make(chan time.Time, 1)
	context.AfterFunc(hl.Context(), func() { lostAt <- time.Now() })
	got := make(chan time.Time, 1)
	go func() {
		l, err := ws.Acquire(ctx, name)
		if err != nil {
			t.Errorf("waiter: %v", err)
			close(got)
			return
		}
		got <- time.Now()
		l.Release(context.Background())
	}()
	time.Sleep(1500 * time.Millisecond) // a verification or two
	t0 := time.Now()
	p.BlackHole()
	var lost, acq time.Time
	select {
	case lost = <-lostAt:
	case <-time.After(15 * time.Second):
		t.Fatal("holder's lease did not end")
	}
	select {
	case acq = <-got:
	case <-time.After(20 * time.Second):
		t.Fatal("waiter did not acquire")
	}
	t.Logf("holder lease ended %v after the black hole (%v); waiter acquired at %v", lost.Sub(t0), context.Cause(hl.Context()), acq.Sub(t0))
	if !lost.Before(acq) {
		t.Errorf("waiter acquired at %v before the holder's lease ended at %v", acq.Sub(t0), lost.Sub(t0))
	}
	// The lease ends within one interval (3s) of its last verification
	// (every 1s); the broker frees the slot within three intervals, and
	// the waiter finds it within its back-off.
	sl.within(t, "the silenced holder's lease's end", lost.Sub(t0), 3*time.Second+time.Second, 2)
	sl.within(t, "the slot's release after the black hole", acq.Sub(t0), 9*time.Second+testBackoff.Max, 2)
}

// TestSilencedHolderVerifyIntervalCapped: a holder dialed with a 2s heartbeat and
// a verify interval of 10s (the doc caps it at half the heartbeat, 1s)
// holds two slots through two Semaphores of different sizes; its proxy
// black-holes. Checks: both leases end within one heartbeat of the last
// successful verification (2s + 1s + slack) and before a waiter holds
// either slot; the waiter holds both within three heartbeats (6s) plus
// slack.
func TestSilencedHolderVerifyIntervalCapped(t *testing.T) {
	url, host := amqpURL(t)
	sl := measureSlack(t, url)
	name := newName(t, url)
	ctx, cancel := context.WithTimeout(context.Background(), 25*time.Second)
	defer cancel()
	wc := dial(t, url)
	if err := admin(t, wc).Create(ctx, name, 2); err != nil {
		t.Fatal(err)
	}
	p := testenv.NewProxy(t, host)
	hc := dial(t, url, through(p), amqpsem.WithHeartbeat(2*time.Second), amqpsem.WithVerifyInterval(10*time.Second))
	rec := newLeaseHistory(2)
	var held []locks.Lease
	for _, size := range []int{1, 2} {
		sem, _ := hc.Semaphore(size)
		l, err := sem.TryAcquire(ctx, name)
		if err != nil {
			t.Fatal(err)
		}
		rec.enter(fmt.Sprintf("silenced size %d", size), l)
		held = append(held, l)
	}
	wsem, _ := wc.Semaphore(2)
	got := make(chan time.Time, 2)
	for range 2 {
		go func() {
			l, err := wsem.Acquire(ctx, name)
			if err != nil {
				t.Errorf("waiter: %v", err)
				got <- time.Time{}
				return
			}
			rec.enter("waiter", l)
			got <- time.Now()
		}()
	}
	time.Sleep(2500 * time.Millisecond) // verifications at the capped interval
	t0, t0h := time.Now(), rec.all.Now()
	p.BlackHole()
	for i := range 2 {
		select {
		case at := <-got:
			t.Logf("waiter %d held a slot %v after the black hole", i, at.Sub(t0))
			// Three 2s heartbeats, and the waiter's back-off.
			sl.within(t, fmt.Sprintf("waiter %d's slot after the black hole", i), at.Sub(t0), 6*time.Second+testBackoff.Max, 2)
		case <-time.After(15 * time.Second):
			t.Fatal("waiter did not acquire within 15s")
		}
	}
	for i, l := range held {
		ended, ok := rec.ended(fmt.Sprintf("silenced size %d", i+1))
		if !ok {
			t.Errorf("silenced lease %d still live", i)
			continue
		}
		t.Logf("silenced lease %d (slot %d) ended %v after the black hole: %v", i, l.(locks.SlotLease).Slot(), ended-t0h, context.Cause(l.Context()))
		// A heartbeat (2s) after its last verification (capped at 1s).
		sl.within(t, fmt.Sprintf("silenced lease %d's end after the black hole", i), ended-t0h, 2*time.Second+time.Second, 2)
	}
	rec.check(t)
}

// TestLateRepliesEndLeaseBeforeSlotFreed: a holder's replies come 2s
// late (its requests still reach the broker at once), so its
// verifications stop succeeding in time. Checks: its lease ends with
// ErrLost within a heartbeat (1s) of its last verification plus slack,
// and its slot is freed soon after (by the queue's delete, which reaches
// the broker at once, or by the client dropping the silent connection:
// in the runs seen, Connected() was already false when the waiter got
// the slot), never before the lease ended.
func TestLateRepliesEndLeaseBeforeSlotFreed(t *testing.T) {
	url, host := amqpURL(t)
	sl := measureSlack(t, url)
	name := newName(t, url)
	ctx, cancel := context.WithTimeout(context.Background(), 25*time.Second)
	defer cancel()
	wc := dial(t, url)
	if err := admin(t, wc).Create(ctx, name, 1); err != nil {
		t.Fatal(err)
	}
	p := testenv.NewProxy(t, host)
	hc := dial(t, url, through(p), amqpsem.WithHeartbeat(time.Second), amqpsem.WithVerifyInterval(200*time.Millisecond))
	hsem, _ := hc.Semaphore(1)
	hl, err := hsem.TryAcquire(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	rec := newLeaseHistory(1)
	rec.enter("late holder", hl)
	wsem, _ := wc.Semaphore(1)
	got := make(chan time.Time, 1)
	go func() {
		l, err := wsem.Acquire(ctx, name)
		if err != nil {
			t.Errorf("waiter: %v", err)
			got <- time.Time{}
			return
		}
		rec.enter("waiter", l)
		got <- time.Now()
		l.Release(context.Background())
	}()
	time.Sleep(500 * time.Millisecond)
	t0, t0h := time.Now(), rec.all.Now()
	p.DelayReplies(2 * time.Second)
	var at time.Time
	select {
	case at = <-got:
	case <-time.After(15 * time.Second):
		t.Fatal("waiter did not acquire within 15s")
	}
	<-hl.Context().Done()
	var endedH time.Duration
	waitFor(t, time.Second, "the late holder's section ended", func() (ok bool) {
		endedH, ok = rec.ended("late holder")
		return ok
	})
	ended := endedH - t0h
	held := at.Sub(t0)
	t.Logf("late holder's lease ended %v after the delay began (%v); waiter held the slot at %v; holder connected %v",
		ended, context.Cause(hl.Context()), held, hc.Connected())
	if ended < 0 {
		t.Logf("the lease ended before the fault: its verifications were already too slow (load)")
	}
	// A heartbeat (1s) after its last successful verification (every
	// 200ms).
	sl.within(t, "the late holder's lease's end after the delay began", ended, time.Second+200*time.Millisecond, 2)
	// The background delete may need a channel, whose open-ok is 2s late;
	// the broker's heartbeat bound (three 1s heartbeats) frees the slot in
	// any case, and the waiter finds it within its back-off.
	sl.within(t, "the waiter's hold after the lease ended", held-ended, 3*time.Second+testBackoff.Max, 2)
	rec.check(t)
	p.Restore()
}
