package natsputex_test

// Attack round 7, on three changes: a write nats.go refused to send while
// it reconnects (ConnectOptions: ReconnectBufSize(-1)) is sent again once
// the connection is back, while the write's own bound lasts (this file
// and attack7_faults_test.go); a takeover's C·R counts from the answer to
// its write (attack7_confirm_test.go); a Supervisor whose renewal is
// refused names what the key held (attack7_events_test.go). The clients
// here connect with ConnectOptions through a fault proxy of their own
// (link7) to the NATS server on 127.0.0.1:4222 (2.9.10 on the reference
// machine), each test on a memory bucket of its own (atk4Env).

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/latchkey-go/latchkey/contracttest/testenv"
	"github.com/latchkey-go/latchkey/locks"
	"github.com/latchkey-go/latchkey/natsputex"
)

// reconnects records when nats.go said a connection was back.
type reconnects struct {
	mu sync.Mutex
	at []time.Time
}

func (r *reconnects) option() nats.Option {
	return nats.ReconnectHandler(func(*nats.Conn) {
		r.mu.Lock()
		r.at = append(r.at, time.Now())
		r.mu.Unlock()
	})
}

func (r *reconnects) count() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.at)
}

// link7 is a connection made with ConnectOptions, as the docs ask,
// through a fault proxy of its own to url.
type link7 struct {
	reconnects
	nc    *nats.Conn
	js    jetstream.JetStream
	proxy *testenv.Proxy
}

func dial7(t *testing.T, url string) *link7 {
	t.Helper()
	l := &link7{proxy: testenv.NewProxy(t, strings.TrimPrefix(url, "nats://"))}
	var err error
	l.nc, l.js, err = connect("nats://"+l.proxy.Addr(), append(natsputex.ConnectOptions(), nats.IgnoreDiscoveredServers(), l.option())...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(l.nc.Close)
	return l
}

// client makes a Client with the suite's timing and opts on the link.
func (l *link7) client(t *testing.T, bucket string, opts ...natsputex.Option) *natsputex.Client {
	t.Helper()
	return newClientOn(t, l.nc, l.js, bucket, opts...)
}

// cut cuts the link and waits until nats.go reconnects (and so refuses
// every write); it returns when the cut was made.
func (l *link7) cut(t *testing.T) time.Time {
	t.Helper()
	at := time.Now()
	l.proxy.Cut()
	waitFor(t, 2*time.Second, "nats.go sees the link cut", l.nc.IsReconnecting)
	return at
}

// restore restores the link and returns when nats.go said it was back.
func (l *link7) restore(t *testing.T) time.Time {
	t.Helper()
	n := l.count()
	l.proxy.Restore()
	waitFor(t, 3*time.Second, "nats.go reconnects", func() bool { return l.count() > n })
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.at[n]
}

// writeAt waits for the watch to see revision rev and returns it.
func writeAt(t *testing.T, w *keyWatch, rev uint64) keyWrite {
	t.Helper()
	var out keyWrite
	waitFor(t, 2*time.Second, fmt.Sprintf("the watch sees rev %d", rev), func() bool {
		for _, kw := range w.all() {
			if kw.rev == rev {
				out = kw
				return true
			}
		}
		return false
	})
	return out
}

// prefixed returns the writes whose token begins with prefix, stored
// after t.
func prefixed(w *keyWatch, prefix string, t time.Time) []keyWrite {
	var out []keyWrite
	for _, kw := range w.writesAfter(t) {
		if strings.HasPrefix(kw.value, prefix) {
			out = append(out, kw)
		}
	}
	return out
}

// outcome is what a Lock, TryLock or Release returned, and when.
type outcome struct {
	lease locks.Lease
	err   error
	at    time.Time
}

func goLock(ctx context.Context, l *natsputex.Locker, name string, try bool) <-chan outcome {
	ch := make(chan outcome, 1)
	go func() {
		var o outcome
		if try {
			o.lease, o.err = l.TryLock(ctx, name)
		} else {
			o.lease, o.err = l.Lock(ctx, name)
		}
		o.at = time.Now()
		ch <- o
	}()
	return ch
}

func waitOutcome(t *testing.T, ch <-chan outcome, within time.Duration, what string) outcome {
	t.Helper()
	select {
	case o := <-ch:
		return o
	case <-time.After(within):
		t.Fatalf("%s did not return within %v", what, within)
		return outcome{}
	}
}

func ms(d time.Duration) time.Duration { return d.Round(time.Millisecond) }

// TestAttack7RenewalResent: "a write that nats.go refused to send while it
// reconnects has not failed: it is sent again once the connection is back,
// see ConnectOptions"; ConnectOptions: "natsputex sends such a write again
// itself once the connection is back, while the write's own bound lasts
// (a renewal's: the lease's validity), so a holder whose server restarted
// within that keeps its lease". A Locker lease (R = 100ms) is held by a
// client whose link is cut halfway between two renewals:
//   - back-in-time (F = 10: validity 950ms): cut for 200–400ms, three
//     times. The lease must stay live and a renewal of its token land
//     within 50ms of nats.go's reconnect (it was due during the cut).
//   - taken-meanwhile (F = 10): during the cut the key is written by hand
//     ("intruder"). The resent renewal is conditional on the lease's
//     revision: it must be refused, the lease end with ErrLost within R
//     (+60ms) of the reconnect, its token never be written after the
//     intruder's, and Release leave the intruder's write.
//   - past-deadline (F = 3: T = 300ms, margin 50ms): five rounds, each a
//     fresh key held by the cut client with a waiter on a direct link;
//     the link is restored 150ms, 80ms, 30ms before the lease's deadline,
//     at it, and 200ms after it (down longer than T). The lease must end
//     by its deadline (+3ms: watchValidity), no write of its token be
//     stored after its final deadline (a resent renewal past the bound
//     would make the key look held by a dead lease), nor after the
//     waiter's takeover; the waiter must take the key T after the
//     holder's last write and hold it only once the lease has ended.
func TestAttack7RenewalResent(t *testing.T) {
	t.Run("back-in-time", func(t *testing.T) {
		const F = 10
		url, bucket, key := atk4Env(t)
		writes := watchWrites(t, url, bucket, key)
		l := dial7(t, url)
		c := l.client(t, bucket, natsputex.WithFailureThreshold(F), natsputex.WithHolderID("holder"))
		v := watchValidity(t)
		lease, err := c.Locker().TryLock(context.Background(), key)
		if err != nil {
			t.Fatal(err)
		}
		v.add("holder", lease)
		token := writeAt(t, writes, lease.Token()).value
		for i, down := range []time.Duration{200 * time.Millisecond, 300 * time.Millisecond, 400 * time.Millisecond} {
			time.Sleep(3 * testR)
			cut := cutAfterRenewal(t, writes, token, l.proxy.Cut)
			waitFor(t, 2*time.Second, "nats.go sees the link cut", l.nc.IsReconnecting)
			time.Sleep(time.Until(cut.Add(down)))
			back := l.restore(t)
			waitFor(t, 2*time.Second, "a renewal after the reconnect", func() bool { return len(nodeWrites(writes, token, cut)) > 0 })
			first := nodeWrites(writes, token, cut)[0]
			t.Logf("round %d: link cut for %v, back %v after the cut; the first renewal since (rev %d) stored %v after the reconnect; lease live: %v",
				i, ms(down), ms(back.Sub(cut)), first.rev, ms(first.created.Sub(back)), lease.Context().Err() == nil)
			if d := first.created.Sub(back); d > 50*time.Millisecond {
				t.Errorf("round %d: the renewal refused during the cut landed %v after the reconnect, not once the connection was back (resent every ~10ms)", i, ms(d))
			}
			if err := lease.Context().Err(); err != nil {
				t.Fatalf("round %d: the lease ended though the link was back %v after its last renewal, within its validity (950ms): %v", i, ms(back.Sub(cut)), context.Cause(lease.Context()))
			}
		}
		if err := lease.Release(context.Background()); err != nil {
			t.Errorf("Release: %v", err)
		}
		v.check(t)
	})

	t.Run("taken-meanwhile", func(t *testing.T) {
		const F = 10
		url, bucket, key := atk4Env(t)
		writes := watchWrites(t, url, bucket, key)
		kv := mustBucket(t, url, bucket)
		l := dial7(t, url)
		c := l.client(t, bucket, natsputex.WithFailureThreshold(F), natsputex.WithHolderID("holder"))
		lease, _, _, cut := holdAndCut7(t, l, c, nil, writes, key)
		time.Sleep(30 * time.Millisecond)
		irev, err := kv.Put(context.Background(), key, []byte("intruder"))
		if err != nil {
			t.Fatal(err)
		}
		time.Sleep(time.Until(cut.Add(250 * time.Millisecond)))
		back := l.restore(t)
		waitFor(t, 2*time.Second, "the lease ends", func() bool { return lease.Context().Err() != nil })
		ended := time.Now()
		t.Logf("intruder at rev %d; link back %v after the cut; the lease ended %v after the reconnect: %v",
			irev, ms(back.Sub(cut)), ms(ended.Sub(back)), context.Cause(lease.Context()))
		if !errors.Is(context.Cause(lease.Context()), locks.ErrLost) {
			t.Errorf("the lease ended with %v, not ErrLost", context.Cause(lease.Context()))
		}
		if d := ended.Sub(back); d > testR+slack6 {
			t.Errorf("the lease ended %v after the reconnect, later than R = %v (+%v): its resent renewal should have been refused at once", ms(d), testR, slack6)
		}
		time.Sleep(3 * testR)
		err = lease.Release(context.Background())
		t.Logf("Release: %v", err)
		if err == nil || !errors.Is(err, locks.ErrLost) {
			t.Errorf("Release of the lost lease returned %v, want an error matching ErrLost", err)
		}
		time.Sleep(testR)
		for _, w := range writes.all() {
			if w.rev > irev {
				t.Errorf("the key was written after the intruder (rev %d): rev %d %q", irev, w.rev, w.value)
			}
		}
		if e, err := kv.Get(context.Background(), key); err != nil || e.Revision() != irev {
			t.Errorf("the key: %v %v; want the intruder's write, rev %d", e, err, irev)
		}
	})

	t.Run("past-deadline", func(t *testing.T) {
		const T = testF * testR
		url, bucket, _ := atk4Env(t)
		l := dial7(t, url)
		holder := l.client(t, bucket, natsputex.WithHolderID("holder"))
		waiter := newTestClient(t, url, bucket, natsputex.WithHolderID("waiter"))
		v := watchValidity(t)
		g := newGrants()
		for i, off := range []time.Duration{-150 * time.Millisecond, -80 * time.Millisecond, -30 * time.Millisecond, 0, 200 * time.Millisecond} {
			key := fmt.Sprintf("job%d", i)
			writes := watchWrites(t, url, bucket, key)
			lease, token, waiting, cut := holdAndCut7(t, l, holder, waiter, writes, key)
			v.add(key+" holder", lease)
			g.grant(key+" holder", lease)
			dl := lease.(interface{ Deadline() time.Time }).Deadline()
			time.Sleep(time.Until(dl.Add(off)))
			back := l.restore(t)
			time.Sleep(2 * T)
			survived := lease.Context().Err() == nil
			if survived {
				_ = lease.Release(context.Background())
			}
			w := waitOutcome(t, waiting, 5*time.Second, "the waiter's Lock")
			if w.err != nil {
				t.Fatalf("%s: the waiter's Lock: %v", key, w.err)
			}
			g.grant(key+" waiter", w.lease)
			v.add(key+" waiter", w.lease)
			final := lease.(interface{ Deadline() time.Time }).Deadline()
			last, _ := writes.lastBy(token, time.Now())
			ww := writeAt(t, writes, w.lease.Token())
			t.Logf("%s: restored %v from the deadline at the cut; back %v after the cut (deadline %v after it); lease survived: %v, its last write rev %d, final deadline %v after the cut; the waiter took rev %d %v after that write",
				key, off, ms(back.Sub(cut)), ms(dl.Sub(cut)), survived, last.rev, ms(final.Sub(cut)), ww.rev, ms(ww.created.Sub(last.created)))
			for _, hw := range nodeWrites(writes, token, cut) {
				if hw.created.After(final.Add(2 * time.Millisecond)) {
					t.Errorf("%s: the holder's token was written (rev %d) %v after its lease's deadline: a write resent past its bound", key, hw.rev, ms(hw.created.Sub(final)))
				}
				if hw.rev > ww.rev {
					t.Errorf("%s: the holder's token was written (rev %d) after the waiter took the key (rev %d)", key, hw.rev, ww.rev)
				}
			}
			if !survived {
				if d := ww.created.Sub(last.created); d < T-10*time.Millisecond {
					t.Errorf("%s: the waiter took the key %v after the holder's last write, before T = %v", key, ms(d), T)
				}
			}
			_ = w.lease.Release(context.Background())
		}
		v.check(t)
		g.check(t)
	})
}

// faultHook returns a health check that, the first time it is told
// Standby at or after the time armed holds (none: never), calls fault and
// waits for down to hold (nats.go reconnecting), so that the takeover
// write the check precedes is made while nats.go reconnects; it sends the
// time of the fault on the channel.
func faultHook(armed *atomic.Pointer[time.Time], fault func(), down func() bool) (natsputex.HealthCheck, <-chan time.Time) {
	ch := make(chan time.Time, 1)
	var done atomic.Bool
	return func(ctx context.Context, s natsputex.State) error {
		from := armed.Load()
		if s != natsputex.Standby || from == nil || time.Now().Before(*from) || !done.CompareAndSwap(false, true) {
			return nil
		}
		at := time.Now()
		fault()
		for !down() && time.Since(at) < 2*time.Second {
			time.Sleep(time.Millisecond)
		}
		ch <- at
		return nil
	}, ch
}

// TestAttack7TakeDuringReconnect: Lock: "A write that would take the key
// is not interrupted when ctx ends (it could land all the same, and leave
// the key held by no one for T): Lock then returns once it is answered,
// at most max(T, 1s) later, with the lease if the write won the key"; "On
// failure Lock returns an error and holds nothing; when ctx ends first,
// the error matches ctx.Err()"; a takeover "given up before its C
// intervals of confirmation are done (ctx ended ...) leaves its last
// write"; ConnectOptions: a write refused while nats.go reconnects is
// sent again once the connection is back. A key is written by hand
// ("ghost", no timing); a client (R = 100ms, F = 3, C = 0 or 1) behind a
// proxy takes it over with Lock (waiting for it) or TryLock (made once it
// is silent for T). Its health check, told Standby before the takeover
// write, cuts the link and returns once nats.go reconnects, so the write
// is refused; the link is restored 90ms later ("fast": nats.go is back
// 100–200ms after the cut, within the lease's validity T − margin =
// 250ms) or 300ms later ("slow": back after the validity, within the
// take's bound max(T, 1s)). With a long ctx a Lock must return the lease
// (a TryLock may fail, holding nothing): its write stored after the cut,
// T after the ghost's, the call returning C·R after it. With a ctx that
// ends 40–60ms into the cut, the call must return within max(T, 1s)
// (+60ms) of the ctx's end, with the lease (live, its token the key's
// revision) or with ctx's error. With C = 0 a failed call means no write
// of its token may be stored ("with the lease if the write won the key";
// else the key is held by no one for T). Then a third client's TryLock
// must take the key within C·R + R (+0.3s) once it is T silent.
func TestAttack7TakeDuringReconnect(t *testing.T) {
	const T = testF * testR
	for _, tc := range []struct {
		name string
		C    int
		long bool
		try  bool
		down time.Duration // from the cut to the restore
	}{
		{"lock-C0-ctx-long-fast", 0, true, false, 90 * time.Millisecond},
		{"lock-C0-ctx-long-slow", 0, true, false, 300 * time.Millisecond},
		{"lock-C0-ctx-ends-fast", 0, false, false, 90 * time.Millisecond},
		{"lock-C0-ctx-ends-slow", 0, false, false, 300 * time.Millisecond},
		{"lock-C1-ctx-long-fast", 1, true, false, 90 * time.Millisecond},
		{"lock-C1-ctx-ends-slow", 1, false, false, 300 * time.Millisecond},
		{"trylock-C0-ctx-long-fast", 0, true, true, 90 * time.Millisecond},
		{"trylock-C0-ctx-long-slow", 0, true, true, 300 * time.Millisecond},
		{"trylock-C0-ctx-ends-slow", 0, false, true, 300 * time.Millisecond},
	} {
		t.Run(tc.name, func(t *testing.T) {
			url, bucket, key := atk4Env(t)
			writes := watchWrites(t, url, bucket, key)
			kv := mustBucket(t, url, bucket)
			l := dial7(t, url)
			var armed atomic.Pointer[time.Time]
			hc, cuts := faultHook(&armed, l.proxy.Cut, l.nc.IsReconnecting)
			taker := l.client(t, bucket, natsputex.WithConfirmations(tc.C), natsputex.WithHolderID("taker"), natsputex.WithHealthCheck(hc))
			third := newTestClient(t, url, bucket, natsputex.WithHolderID("third"))
			grev, err := kv.Put(context.Background(), key, []byte("ghost"))
			if err != nil {
				t.Fatal(err)
			}
			ghost := writeAt(t, writes, grev)
			due := ghost.created.Add(T)
			from := due.Add(-30 * time.Millisecond)
			armed.Store(&from)
			if tc.try {
				time.Sleep(time.Until(due.Add(20 * time.Millisecond)))
			}
			ctxEnd := time.Now().Add(5 * time.Second)
			if !tc.long {
				ctxEnd = due.Add(60 * time.Millisecond)
				if tc.try {
					ctxEnd = time.Now().Add(40 * time.Millisecond)
				}
			}
			ctx, cancel := context.WithDeadline(context.Background(), ctxEnd)
			defer cancel()
			got := goLock(ctx, taker.Locker(), key, tc.try)
			var cut time.Time
			select {
			case cut = <-cuts:
			case o := <-got:
				t.Fatalf("the call returned (%v) before its Standby health check ran", o.err)
			case <-time.After(3 * time.Second):
				t.Fatal("no Standby health check before the takeover")
			}
			time.Sleep(time.Until(cut.Add(tc.down)))
			back := l.restore(t)
			bound := max(T, time.Second) + slack6
			o := waitOutcome(t, got, time.Until(ctxEnd.Add(bound+5*time.Second)), "the taker's call")
			if o.err == nil {
				writeAt(t, writes, o.lease.Token())
			} else {
				time.Sleep(2 * testR) // a write landing late
			}
			ws := prefixed(writes, "taker", ghost.created)
			t.Logf("cut by the Standby check %v after the takeover was due, back %v after the cut; ctx ends %v after the cut; the call returned %v after the cut (%v after the ctx's end): lease %v, err %v; taker's writes: %d",
				ms(cut.Sub(due)), ms(back.Sub(cut)), ms(ctxEnd.Sub(cut)), ms(o.at.Sub(cut)), ms(o.at.Sub(ctxEnd)), o.lease != nil, o.err, len(ws))
			for _, w := range ws {
				t.Logf("  taker's write rev %d stored %v after the cut, %v after the reconnect", w.rev, ms(w.created.Sub(cut)), ms(w.created.Sub(back)))
			}
			if d := o.at.Sub(ctxEnd); d > bound {
				t.Errorf("the call returned %v after its ctx ended, later than max(T, 1s) = %v (+%v)", ms(d), max(T, time.Second), slack6)
			}
			if o.err == nil {
				w := writeAt(t, writes, o.lease.Token())
				if !strings.HasPrefix(w.value, "taker") {
					t.Errorf("the lease's token %d is rev %d %q, not the taker's write", o.lease.Token(), w.rev, w.value)
				}
				if err := o.lease.Context().Err(); err != nil {
					t.Errorf("the lease returned was already over: %v", context.Cause(o.lease.Context()))
				}
				if d := w.created.Sub(ghost.created); d < T-10*time.Millisecond {
					t.Errorf("the taker took the key %v after the ghost's write, before T = %v", ms(d), T)
				}
				if d := o.at.Sub(w.created); d < time.Duration(tc.C)*testR-10*time.Millisecond {
					t.Errorf("the call returned %v after its takeover write was stored, before C·R = %v", ms(d), time.Duration(tc.C)*testR)
				}
				if !w.created.After(cut) {
					t.Errorf("the takeover write (rev %d) landed before the cut: the reconnect path was not exercised", w.rev)
				}
				_ = o.lease.Release(context.Background())
				return
			}
			if tc.long && !tc.try {
				t.Errorf("the Lock failed though its ctx had %v left and the link was back %v after the cut: %v", ms(ctxEnd.Sub(o.at)), ms(back.Sub(cut)), o.err)
			}
			if !o.at.Before(ctxEnd) && !errors.Is(o.err, ctx.Err()) {
				t.Errorf("the call failed with %v after its ctx ended, not an error matching %v", o.err, ctx.Err())
			}
			if tc.C == 0 {
				for _, w := range ws {
					t.Errorf("the call failed (%v) but its write rev %d won the key (stored %v after the call returned): the key is held by no one for T", o.err, w.rev, ms(w.created.Sub(o.at)))
				}
			}
			last := ghost
			if len(ws) > 0 {
				last = ws[len(ws)-1]
			}
			time.Sleep(time.Until(last.created.Add(T)))
			began := time.Now()
			lease, err := third.Locker().TryLock(context.Background(), key)
			t.Logf("a third client's TryLock, %v after the last write (rev %d %q): %v after it began: %v", ms(began.Sub(last.created)), last.rev, last.value, ms(time.Since(began)), err)
			if err != nil {
				t.Errorf("the key, silent for T, was not free to a third client's TryLock: %v", err)
			} else {
				_ = lease.Release(context.Background())
				if d := time.Since(began); d > testC*testR+testR+300*time.Millisecond {
					t.Errorf("the third client's TryLock took %v, more than C·R + R (+0.3s)", ms(d))
				}
			}
		})
	}
}

// TestAttack7WaitingLockAcrossCut: "Waiting calls look at their keys again
// as soon as the connection is back, and make their KV watches again";
// "waiting calls wait ... A request sent then is not answered even after
// the election, so each is bounded ... and made again"; ConnectOptions:
// "no buffering of writes while reconnecting". A client connected with
// ConnectOptions waits in Lock (ctx 5s, the default backoff) behind a
// proxy:
//   - live-holder: the key is held by another client's lease (F = 10)
//     that renews; the waiter's link is cut for 250ms, three times. The
//     Lock must still wait after each (its polls or reads refused by
//     nats.go meanwhile are made again), and get the key within 1s of the
//     holder's Release.
//   - new-calls-while-down: a Lock and a TryLock (ctx 3s) of free keys
//     made while the link is cut (restored 200ms later). The docs speak
//     of waiting calls only: what they return is logged; a failed Lock
//     must leave no write of its token.
//   - takeover-due: the key is written by hand ("ghost") and the link is
//     cut from 60ms before the takeover is due (T after the ghost's write)
//     to 150ms after it: the Lock must return the lease, T after the
//     ghost's write.
func TestAttack7WaitingLockAcrossCut(t *testing.T) {
	const T = testF * testR
	t.Run("live-holder", func(t *testing.T) {
		url, bucket, key := atk4Env(t)
		l := dial7(t, url)
		holder := newTestClient(t, url, bucket, natsputex.WithFailureThreshold(10))
		waiter := l.client(t, bucket, natsputex.WithFailureThreshold(10), natsputex.WithHolderID("waiter"))
		lease, err := holder.Locker().TryLock(context.Background(), key)
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		got := goLock(ctx, waiter.Locker(), key, false)
		time.Sleep(3 * testR)
		for i := 0; i < 3; i++ {
			cut := l.cut(t)
			time.Sleep(250 * time.Millisecond)
			back := l.restore(t)
			select {
			case o := <-got:
				t.Fatalf("cut %d: the waiting Lock returned %v after the cut (the link back %v after it), its ctx with %v left: lease %v, err %v",
					i, ms(o.at.Sub(cut)), ms(back.Sub(cut)), ms(time.Until(time.Now().Add(5*time.Second))), o.lease != nil, o.err)
			case <-time.After(300 * time.Millisecond):
				t.Logf("cut %d: link back %v after the cut; the Lock still waits", i, ms(back.Sub(cut)))
			}
		}
		released := time.Now()
		if err := lease.Release(context.Background()); err != nil {
			t.Fatal(err)
		}
		o := waitOutcome(t, got, 3*time.Second, "the waiting Lock")
		if o.err != nil {
			t.Fatalf("the waiting Lock: %v", o.err)
		}
		defer func() { _ = o.lease.Release(context.Background()) }()
		t.Logf("the waiter got the key %v after the Release", ms(o.at.Sub(released)))
		if d := o.at.Sub(released); d > time.Second {
			t.Errorf("the waiter got the key %v after the Release, not within 1s", ms(d))
		}
	})
	t.Run("new-calls-while-down", func(t *testing.T) {
		url, bucket, key := atk4Env(t)
		writes := watchWrites(t, url, bucket, key)
		l := dial7(t, url)
		c := l.client(t, bucket, natsputex.WithHolderID("caller"))
		cut := l.cut(t)
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		defer cancel()
		lock := goLock(ctx, c.Locker(), key, false)
		try := goLock(ctx, c.Locker(), key+"-try", true)
		time.Sleep(200 * time.Millisecond)
		back := l.restore(t)
		for name, ch := range map[string]<-chan outcome{"Lock": lock, "TryLock": try} {
			o := waitOutcome(t, ch, 4*time.Second, name)
			t.Logf("%s of a free key made while nats.go reconnects (ctx 3s): returned %v after the cut (link back %v after it): lease %v, err %v",
				name, ms(o.at.Sub(cut)), ms(back.Sub(cut)), o.lease != nil, o.err)
			if o.lease != nil {
				_ = o.lease.Release(context.Background())
			} else if name == "Lock" {
				time.Sleep(2 * testR)
				if ws := prefixed(writes, "caller", cut); len(ws) > 0 {
					t.Errorf("the Lock failed (%v) but its write rev %d landed %v after it returned", o.err, ws[0].rev, ms(ws[0].created.Sub(o.at)))
				}
			}
		}
	})
	t.Run("takeover-due", func(t *testing.T) {
		url, bucket, key := atk4Env(t)
		writes := watchWrites(t, url, bucket, key)
		kv := mustBucket(t, url, bucket)
		l := dial7(t, url)
		waiter := l.client(t, bucket, natsputex.WithHolderID("waiter"))
		grev, err := kv.Put(context.Background(), key, []byte("ghost"))
		if err != nil {
			t.Fatal(err)
		}
		ghost := writeAt(t, writes, grev)
		due := ghost.created.Add(T)
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		got := goLock(ctx, waiter.Locker(), key, false)
		time.Sleep(time.Until(due.Add(-60 * time.Millisecond)))
		cut := l.cut(t)
		time.Sleep(time.Until(due.Add(150 * time.Millisecond)))
		back := l.restore(t)
		o := waitOutcome(t, got, 3*time.Second, "the waiting Lock")
		t.Logf("cut %v before the takeover was due, back %v after it; the Lock returned %v after it: lease %v, err %v", ms(due.Sub(cut)), ms(back.Sub(due)), ms(o.at.Sub(due)), o.lease != nil, o.err)
		if o.err != nil {
			t.Fatalf("the waiting Lock (ctx 5s) failed %v after the cut, the link back %v after it: %v", ms(o.at.Sub(cut)), ms(back.Sub(cut)), o.err)
		}
		defer func() { _ = o.lease.Release(context.Background()) }()
		if w := writeAt(t, writes, o.lease.Token()); w.created.Sub(ghost.created) < T-10*time.Millisecond {
			t.Errorf("the waiter took the key %v after the ghost's write, before T = %v", ms(w.created.Sub(ghost.created)), T)
		}
	})
}

// libGoroutines returns the stacks of the goroutines running code of
// natsputex or of the locks kit, by goroutine id.
func libGoroutines() map[string]string {
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			buf = buf[:n]
			break
		}
		buf = make([]byte, 2*len(buf))
	}
	out := map[string]string{}
	for _, g := range strings.Split(string(buf), "\n\n") {
		if strings.Contains(g, "latchkey/natsputex.") || strings.Contains(g, "latchkey/locks.") || strings.Contains(g, "latchkey/locks/") {
			id, _, _ := strings.Cut(strings.TrimPrefix(g, "goroutine "), " ")
			out[id] = g
		}
	}
	return out
}

// newLibGoroutines waits up to within for the goroutines of libGoroutines
// that are not in before to end, and returns those left.
func newLibGoroutines(before map[string]string, within time.Duration) []string {
	deadline := time.Now().Add(within)
	for {
		var left []string
		for id, g := range libGoroutines() {
			if _, ok := before[id]; !ok {
				left = append(left, g)
			}
		}
		if len(left) == 0 || time.Now().After(deadline) {
			return left
		}
		time.Sleep(10 * time.Millisecond)
	}
}
