package natsputex_test

// Attacks on the kit refactor: batched renewals of a Client's leases,
// the health check run once per round, the time-counted takeover
// confirmation shared by the Locker and the Supervisor, and Close(ctx)
// bounded by its context.

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/latchkey-go/latchkey/contracttest"
	"github.com/latchkey-go/latchkey/contracttest/testenv"
	"github.com/latchkey-go/latchkey/contracttest/testenv/natsenv"
	"github.com/latchkey-go/latchkey/locks"
	"github.com/latchkey-go/latchkey/locks/driver"
	"github.com/latchkey-go/latchkey/natsputex"
)

// validity polls leases every millisecond and records any moment one of
// them is still live (its Context not done) after its Deadline, plus a
// 3ms tolerance for the poll: "a holder ... ends its lease by itself at
// the start of its last successful write plus T minus a safety margin".
type validity struct {
	mu     sync.Mutex
	leases []locks.Lease
	names  []string
	bad    []string
	stop   chan struct{}
	done   chan struct{}
}

func watchValidity(t *testing.T) *validity {
	v := &validity{stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(v.done)
		tick := time.NewTicker(time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-v.stop:
				return
			case <-tick.C:
			}
			v.mu.Lock()
			for i, l := range v.leases {
				dl := l.(interface{ Deadline() time.Time }).Deadline()
				if l.Context().Err() == nil && time.Since(dl) > 3*time.Millisecond && len(v.bad) < 20 {
					v.bad = append(v.bad, fmt.Sprintf("%s (token %d) still live %v after its deadline",
						v.names[i], l.Token(), time.Since(dl).Round(time.Millisecond)))
				}
			}
			v.mu.Unlock()
		}
	}()
	t.Cleanup(v.close)
	return v
}

func (v *validity) add(name string, l locks.Lease) {
	v.mu.Lock()
	defer v.mu.Unlock()
	v.leases = append(v.leases, l)
	v.names = append(v.names, name)
}

func (v *validity) close() {
	select {
	case <-v.stop:
	default:
		close(v.stop)
	}
	<-v.done
}

func (v *validity) check(t *testing.T) {
	t.Helper()
	v.close()
	v.mu.Lock()
	defer v.mu.Unlock()
	for _, b := range v.bad {
		t.Error(b)
	}
}

// proxiedClient is a client on a connection through a fault proxy of its
// own, pinned to url.
func proxiedClient(t *testing.T, url, bucket string, opts ...natsputex.Option) (*natsputex.Client, *testenv.Proxy) {
	t.Helper()
	proxy := testenv.NewProxy(t, strings.TrimPrefix(url, "nats://"))
	nc, js, err := connect("nats://"+proxy.Addr(), nats.IgnoreDiscoveredServers())
	if err != nil {
		t.Fatal(err)
	}
	return newClientOn(t, nc, js, bucket, opts...), proxy
}

func leaseNames(n int) []string {
	names := make([]string, n)
	for i := range names {
		names[i] = fmt.Sprintf("batch%02d", i)
	}
	return names
}

// TestAttack3BatchOneKeyStolen: one Client holds 16 leases (R = 100ms,
// F = 3), renewed together. A rogue write lands on one key behind the
// holder's back. That lease must end within about R ("A holder learns it
// lost its key at its next renewal, within R"); the other 15 must go on
// being renewed (their deadlines keep moving) and no lease may be live
// past its deadline.
func TestAttack3BatchOneKeyStolen(t *testing.T) {
	url, bucket := promiseEnv(t, "atk3steal")
	c := newTestClient(t, url, bucket, natsputex.WithHolderID("batch"))
	v := watchValidity(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	names := leaseNames(16)
	leases := make([]locks.Lease, len(names))
	for i, n := range names {
		l, err := c.Locker().TryLock(ctx, n)
		if err != nil {
			t.Fatal(err)
		}
		leases[i] = l
		v.add(n, l)
	}
	time.Sleep(300 * time.Millisecond)
	kv := mustBucket(t, url, bucket)
	if _, err := kv.Put(ctx, names[5], []byte("rogue")); err != nil {
		t.Fatal(err)
	}
	stolenAt := time.Now()
	select {
	case <-leases[5].Context().Done():
		t.Logf("the stolen lease ended %v after the rogue write: %v", time.Since(stolenAt).Round(time.Millisecond), context.Cause(leases[5].Context()))
		if d := time.Since(stolenAt); d > testR+150*time.Millisecond {
			t.Errorf("the stolen lease ended %v after the rogue write, beyond R = %v (+150ms slack)", d.Round(time.Millisecond), testR)
		}
		if !errors.Is(context.Cause(leases[5].Context()), locks.ErrLost) {
			t.Errorf("the stolen lease's cause %v does not match ErrLost", context.Cause(leases[5].Context()))
		}
	case <-time.After(2 * time.Second):
		t.Fatal("the stolen lease was still live 2s after the rogue write")
	}
	before := leases[0].(interface{ Deadline() time.Time }).Deadline()
	time.Sleep(800 * time.Millisecond)
	after := leases[0].(interface{ Deadline() time.Time }).Deadline()
	if !after.After(before.Add(500 * time.Millisecond)) {
		t.Errorf("lease 0's deadline moved by %v in 800ms after the theft: its renewals stalled", after.Sub(before))
	}
	for i, l := range leases {
		if i != 5 && l.Context().Err() != nil {
			t.Errorf("lease %s ended with the stolen one: %v", names[i], context.Cause(l.Context()))
		}
	}
	for _, l := range leases {
		_ = l.Release(ctx)
	}
	v.check(t)
}

// TestAttack3BatchRepliesDelayed: 12 leases of one Client (R = 100ms,
// F = 3, margin 50ms: validity 250ms) behind a proxy whose replies are
// held for 400ms, longer than the validity, while another client waits
// in Lock on every name. Every lease must end by its deadline, and no
// waiter may be granted a name while its holder's lease is live; tokens
// rise. On the embedded server and on the nats-server program (2.9.10).
func TestAttack3BatchRepliesDelayed(t *testing.T) {
	t.Run("embedded", func(t *testing.T) {
		url, bucket := promiseEnv(t, "atk3delay")
		batchRepliesDelayed(t, url, bucket)
	})
	t.Run("binary", func(t *testing.T) {
		url := natsenv.StartBinaryServer(t).URL()
		bucket := uniqueBucket("atk3delay")
		prepareBucket(t, url, bucket)
		batchRepliesDelayed(t, url, bucket)
	})
}

func batchRepliesDelayed(t *testing.T, url, bucket string) {
	holder, proxy := proxiedClient(t, url, bucket, natsputex.WithHolderID("batch"), natsputex.WithSafetyMargin(50*time.Millisecond))
	waiter := newTestClient(t, url, bucket, natsputex.WithHolderID("waiter"),
		natsputex.WithRenewInterval(50*time.Millisecond), natsputex.WithFailureThreshold(2), natsputex.WithConfirmations(1))
	v := watchValidity(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	names := leaseNames(12)
	gs := make([]*grants, len(names))
	for i, n := range names {
		l, err := holder.Locker().TryLock(ctx, n)
		if err != nil {
			t.Fatal(err)
		}
		gs[i] = newGrants()
		gs[i].grant("holder", l)
		v.add(n, l)
	}
	var wg sync.WaitGroup
	var granted atomic.Int32
	for i, n := range names {
		wg.Add(1)
		go func() {
			defer wg.Done()
			l, err := waiter.Locker().Lock(ctx, n)
			if err != nil {
				t.Errorf("waiter on %s: %v", n, err)
				return
			}
			gs[i].grant("waiter", l)
			granted.Add(1)
			v.add(n+"/waiter", l)
		}()
	}
	time.Sleep(350 * time.Millisecond)
	proxy.DelayReplies(400 * time.Millisecond)
	delayed := time.Now()
	wg.Wait()
	t.Logf("all %d waiters granted %v after the delay began", granted.Load(), time.Since(delayed).Round(time.Millisecond))
	proxy.Restore()
	for _, g := range gs {
		g.check(t)
	}
	v.check(t)
}

// FOUND (liveness, fails today): the keys are never blanked. Close's
// releases run with the caller's ctx (driver.Registry.Close calls
// l.free(ctx)): when it ends, the background blanks are cancelled instead
// of finishing, so every waiter pays T + C·R of silence (20 of 20 keys
// still held 700ms after the replies came back; the waiter needed 2.1s
// for the 20 keys, each a takeover).
//
// TestAttack3CloseShortDeadline: a Client with 20 leases whose replies
// are held for 600ms is closed with a 50ms context while its renewals
// run. Close must return within its context (plus slack) with an error
// matching context.DeadlineExceeded, every lease must have ended by then
// with a cause matching ErrLost and ErrClosed, later calls must fail with
// ErrClosed; a waiter of another client must still get every key, never
// while the closed client's lease is live.
func TestAttack3CloseShortDeadline(t *testing.T) {
	url, bucket := promiseEnv(t, "atk3close")
	holder, proxy := proxiedClient(t, url, bucket, natsputex.WithHolderID("closing"))
	waiter := newTestClient(t, url, bucket, natsputex.WithHolderID("waiter"))
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	names := leaseNames(20)
	leases := make([]locks.Lease, len(names))
	for i, n := range names {
		l, err := holder.Locker().TryLock(ctx, n)
		if err != nil {
			t.Fatal(err)
		}
		leases[i] = l
	}
	time.Sleep(250 * time.Millisecond)
	proxy.DelayReplies(600 * time.Millisecond)
	time.Sleep(120 * time.Millisecond) // a round is under way
	cctx, ccancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	start := time.Now()
	err := holder.Close(cctx)
	took := time.Since(start)
	ccancel()
	var liveAtReturn int
	for _, l := range leases {
		if l.Context().Err() == nil {
			liveAtReturn++
		}
	}
	t.Logf("Close returned after %v: %v; %d lease(s) live then", took.Round(time.Millisecond), err, liveAtReturn)
	if took > 250*time.Millisecond {
		t.Errorf("Close with a 50ms context took %v", took.Round(time.Millisecond))
	}
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Close's error %v does not match context.DeadlineExceeded", err)
	}
	if liveAtReturn > 0 {
		t.Errorf("%d lease(s) still live when Close returned", liveAtReturn)
	}
	for i, l := range leases {
		cause := context.Cause(l.Context())
		if !errors.Is(cause, locks.ErrLost) || !errors.Is(cause, locks.ErrClosed) {
			t.Errorf("lease %s ended with %v, not ErrLost and ErrClosed", names[i], cause)
		}
	}
	if _, err := holder.Locker().TryLock(ctx, "after"); !errors.Is(err, locks.ErrClosed) {
		t.Errorf("TryLock after Close: %v, not ErrClosed", err)
	}
	if err := holder.Close(context.Background()); err != nil {
		t.Errorf("second Close: %v", err)
	}
	proxy.Restore()
	var takeovers atomic.Int32
	defer waiter.Locker().Observe(func(e driver.Event) {
		if e.Kind == driver.EventTakeover {
			takeovers.Add(1)
		}
	})()
	time.Sleep(700 * time.Millisecond) // the held replies delivered, the background blanks done
	kv := mustBucket(t, url, bucket)
	var held []string
	for _, n := range names {
		e, err := kv.Get(ctx, n)
		if err == nil && len(e.Value()) > 0 {
			held = append(held, fmt.Sprintf("%s=%q@%d", n, valueToken(e.Value()), e.Revision()))
		}
	}
	t.Logf("700ms after the restore, %d of %d keys still hold a value: %v", len(held), len(names), held[:min(3, len(held))])
	if len(held) > 0 {
		t.Errorf("FOUND: %d of %d keys never blanked after Close(ctx) returned on its deadline (\"the rest finishes in the background\")", len(held), len(names))
	}
	start = time.Now()
	for i, n := range names {
		l, err := waiter.Locker().Lock(ctx, n)
		if err != nil {
			t.Fatalf("waiter on %s: %v", n, err)
		}
		if l.Token() <= leases[i].Token() {
			t.Errorf("%s: waiter's token %d not above the closed holder's %d", n, l.Token(), leases[i].Token())
		}
		_ = l.Release(ctx)
	}
	t.Logf("the waiter took all %d keys within %v; %d of them by a takeover (not blanked)", len(names), time.Since(start).Round(time.Millisecond), takeovers.Load())
}

// FOUND (liveness, fails today): the blanks after a failed health check
// run one after the other, each waiting for its answer, and each lease is
// ended only just before its own blank: driver.Registry.renewRound calls
// l.End then a.Then() (natsputex's abandon, a blocking write) in its loop
// over the batch. With a 200ms round trip the 10 blanks landed over 2.3s
// and the leases past the first ended only at their validity deadline
// (153ms after the failed check), not "at once".
//
// TestAttack3HealthFailManyLeases: a Client holds 10 leases; its health
// check fails once. "a failure ends every one of them at once, then
// clears their keys": waiters on a direct connection, one per name, must
// each get its key only after the holder's lease on it ended (the holder's
// blanks and their answers are delayed 100ms each way by its proxy), and
// soon, well before T + C·R of silence.
func TestAttack3HealthFailManyLeases(t *testing.T) {
	url, bucket := promiseEnv(t, "atk3hc")
	var fail atomic.Bool
	var failedAt atomic.Int64
	var checksFailed atomic.Int32
	holder, proxy := proxiedClient(t, url, bucket, natsputex.WithHolderID("sick"),
		natsputex.WithHealthCheck(func(context.Context, natsputex.State) error {
			if fail.Load() {
				failedAt.CompareAndSwap(0, time.Now().UnixNano())
				checksFailed.Add(1)
				return errors.New("sick (test)")
			}
			return nil
		}))
	waiter := newTestClient(t, url, bucket, natsputex.WithHolderID("waiter"), natsputex.WithRenewInterval(time.Second))
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	names := leaseNames(10)
	gs := make([]*grants, len(names))
	ended := make([]atomic.Int64, len(names))
	for i, n := range names {
		l, err := holder.Locker().TryLock(ctx, n)
		if err != nil {
			t.Fatal(err)
		}
		gs[i] = newGrants()
		gs[i].grant("sick", l)
		go func() { <-l.Context().Done(); ended[i].Store(time.Now().UnixNano()) }()
	}
	var wg sync.WaitGroup
	took := make([]time.Duration, len(names))
	for i, n := range names {
		wg.Add(1)
		go func() {
			defer wg.Done()
			l, err := waiter.Locker().Lock(ctx, n)
			if err != nil {
				t.Errorf("waiter on %s: %v", n, err)
				return
			}
			gs[i].grant("waiter", l)
			took[i] = time.Since(time.Unix(0, failedAt.Load()))
		}()
	}
	blanks := make(chan time.Time, 64)
	kw, err := mustBucket(t, url, bucket).WatchAll(ctx, jetstream.UpdatesOnly())
	if err != nil {
		t.Fatal(err)
	}
	defer kw.Stop()
	go func() {
		for e := range kw.Updates() {
			if e != nil && len(e.Value()) == 0 {
				blanks <- e.Created()
			}
		}
	}()
	time.Sleep(300 * time.Millisecond)
	proxy.Latency(100 * time.Millisecond)
	fail.Store(true)
	wg.Wait()
	var first, last time.Time
	for n := len(blanks); n > 0; n-- {
		at := <-blanks
		if first.IsZero() || at.Before(first) {
			first = at
		}
		if at.After(last) {
			last = at
		}
	}
	t.Logf("the holder's blanks landed over %v (first to last); %d failed health check call(s)", last.Sub(first).Round(time.Millisecond), checksFailed.Load())
	var lastEnd time.Duration
	for i := range ended {
		lastEnd = max(lastEnd, time.Duration(ended[i].Load()-failedAt.Load()))
	}
	t.Logf("the last of the holder's leases ended %v after the failed check", lastEnd.Round(time.Millisecond))
	// "a failure ends every one of them at once": the blanks may take
	// their round trips, the leases' ends must not wait for them.
	if lastEnd > 100*time.Millisecond {
		t.Errorf("FOUND: the holder's last lease ended %v after the failed health check, not at once", lastEnd.Round(time.Millisecond))
	}
	var worst time.Duration
	for _, d := range took {
		worst = max(worst, d)
	}
	t.Logf("after the failed check, the slowest waiter got its key in %v", worst.Round(time.Millisecond))
	// T + C·R of silence would be 400ms; the blanks come back sooner.
	if worst > 1200*time.Millisecond {
		t.Errorf("FOUND: a waiter took %v after the failed health check: the keys were blanked one at a time", worst.Round(time.Millisecond))
	}
	for _, g := range gs {
		g.check(t)
	}
}

// TestAttack3RestartMidConfirmation: a holder crashes; a waiter with
// R = 100ms, F = 3, C = 6 (C·R = 600ms) takes its key over and, 150ms
// into its confirmation, the server is shut down for 300ms. The
// confirmation lasts C·R "counted from the answer to its takeover
// write", every write since succeeding; a write that nats.go refused to
// send while it reconnects is sent again once the connection is back
// (ConnectOptions), so the confirmation goes on across the outage. The
// confirmation event's Duration must be at least C·R, the lease's last
// write (the taker's own token) stored after the restart, and every write
// of the key from the takeover to the grant the taker's: a grant counted
// on writes that never landed would fail here. (Before writes refused
// during a reconnect were sent again, the confirmation failed and began
// again after the restart.) Run on the embedded server and on the
// nats-server program (2.9.10).
func TestAttack3RestartMidConfirmation(t *testing.T) {
	for _, kind := range []string{"embedded", "binary"} {
		t.Run(kind, func(t *testing.T) {
			var srv *natsenv.Server
			if kind == "binary" {
				srv = natsenv.StartBinaryServer(t)
			} else {
				srv = natsenv.StartServer(t)
			}
			url := srv.URL()
			bucket := uniqueBucket("atk3restart")
			prepareBucket(t, url, bucket)
			nc, js, err := connect(url)
			if err != nil {
				t.Fatal(err)
			}
			crashed := newClientOn(t, nc, js, bucket, natsputex.WithHolderID("crashed"))
			ctx, cancel := context.WithTimeout(context.Background(), 25*time.Second)
			defer cancel()
			held, err := crashed.Locker().TryLock(ctx, "job")
			if err != nil {
				t.Fatal(err)
			}
			const C, R = 6, 100 * time.Millisecond
			// ConnectOptions: no writes buffered by nats.go while the server
			// is down; natsputex sends them again once it is back.
			wnc, err := nats.Connect(url, natsputex.ConnectOptions()...)
			if err != nil {
				t.Fatal(err)
			}
			wjs, err := jetstream.New(wnc)
			if err != nil {
				t.Fatal(err)
			}
			waiter := newClientOn(t, wnc, wjs, bucket, natsputex.WithHolderID("taker"),
				natsputex.WithRenewInterval(R), natsputex.WithFailureThreshold(3), natsputex.WithConfirmations(C))
			takeover := make(chan time.Time, 8)
			var mu sync.Mutex
			var confirms []time.Duration
			stop := waiter.Locker().Observe(func(e driver.Event) {
				switch e.Kind {
				case driver.EventTakeover:
					select {
					case takeover <- time.Now():
					default:
					}
				case driver.EventConfirmation:
					mu.Lock()
					confirms = append(confirms, e.Duration)
					mu.Unlock()
				}
			})
			defer stop()
			got := make(chan grant, 1)
			var lockFailures []string
			go func() {
				for {
					l, err := waiter.Locker().Lock(ctx, "job")
					if err != nil && ctx.Err() == nil {
						mu.Lock()
						lockFailures = append(lockFailures, err.Error())
						mu.Unlock()
						time.Sleep(10 * time.Millisecond)
						continue
					}
					got <- grant{lease: l, err: err, otherLive: held.Context().Err() == nil}
					return
				}
			}()
			time.Sleep(100 * time.Millisecond)
			nc.Close() // the crash
			var tookAt time.Time
			select {
			case tookAt = <-takeover:
			case <-time.After(5 * time.Second):
				t.Fatal("no takeover within 5s of the crash")
			}
			time.Sleep(150 * time.Millisecond)
			srv.Shutdown()
			time.Sleep(300 * time.Millisecond)
			if err := srv.Restart(); err != nil {
				t.Fatal(err)
			}
			upAt := time.Now()
			g := <-got
			if g.err != nil {
				t.Fatalf("Lock: %v", g.err)
			}
			defer g.lease.Release(context.Background())
			grantAt := time.Now()
			mu.Lock()
			t.Logf("takeover at 0, restart done at %v, grant at %v (token %d, crashed holder's %d); confirmations %v",
				upAt.Sub(tookAt).Round(time.Millisecond), grantAt.Sub(tookAt).Round(time.Millisecond), g.lease.Token(), held.Token(), confirms)
			if len(lockFailures) > 0 {
				t.Logf("Lock failed %d time(s) while the server was down, first: %s", len(lockFailures), lockFailures[0])
			}
			for _, d := range confirms {
				if d < C*R {
					t.Errorf("a confirmation reported after %v, under C·R = %v", d, C*R)
				}
			}
			mu.Unlock()
			if g.otherLive {
				t.Error("granted while the crashed holder's lease was live")
			}
			if g.lease.Token() <= held.Token() {
				t.Errorf("token %d not above the crashed holder's %d", g.lease.Token(), held.Token())
			}
			hctx, hcancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer hcancel()
			hist, err := mustBucket(t, url, bucket).History(hctx, "job")
			if err != nil {
				t.Fatal(err)
			}
			var last jetstream.KeyValueEntry
			for _, e := range hist {
				if e.Revision() < g.lease.Token() || e.Created().After(grantAt) {
					continue
				}
				if !strings.HasPrefix(string(e.Value()), "taker/") {
					t.Errorf("rev %d %q written between the takeover (rev %d) and the grant", e.Revision(), e.Value(), g.lease.Token())
				}
				last = e
			}
			if last == nil || !last.Created().After(upAt) {
				t.Errorf("the lease was granted without a write stored after the restart (last: %v)", last)
			}
		})
	}
}

// TestAttack3PausedHolderResumedMidConfirmation: a holder process (suite
// timing, T = 300ms) is paused with SIGSTOP; a waiter with R = 50ms,
// F = 2, C = 6 takes its key over and, 100ms into its confirmation, the
// holder is resumed. The holder's renewal, at its old revision, must fail
// and end its lease; the waiter's lease, granted with a greater token,
// must stay live for the next 500ms (the resumed holder did not win the
// key back nor make the waiter lose it).
func TestAttack3PausedHolderResumedMidConfirmation(t *testing.T) {
	url, bucket := promiseEnv(t, "atk3paused")
	h := &harness{urls: url, bucket: bucket}
	p, token, _ := contracttest.StartHolder(t, h.ChildEnv(), "job")
	defer p.Stop()
	for range 3 {
		if _, ok := p.Next(5 * time.Second); !ok {
			t.Fatal("the holder process said nothing")
		}
	}
	waiter := newTestClient(t, url, bucket, natsputex.WithHolderID("taker"),
		natsputex.WithRenewInterval(50*time.Millisecond), natsputex.WithFailureThreshold(2), natsputex.WithConfirmations(6))
	takeover := make(chan time.Time, 8)
	stop := waiter.Locker().Observe(func(e driver.Event) {
		if e.Kind == driver.EventTakeover {
			select {
			case takeover <- time.Now():
			default:
			}
		}
	})
	defer stop()
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	got := make(chan grant, 1)
	go func() {
		l, err := waiter.Locker().Lock(ctx, "job")
		got <- grant{lease: l, err: err}
	}()
	time.Sleep(100 * time.Millisecond)
	if err := p.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	paused := time.Now()
	p.Drain(20 * time.Millisecond)
	select {
	case at := <-takeover:
		t.Logf("takeover %v after the pause", at.Sub(paused).Round(time.Millisecond))
	case <-time.After(5 * time.Second):
		t.Fatal("no takeover within 5s of the pause")
	}
	time.Sleep(100 * time.Millisecond)
	if err := p.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	lines := p.ResumedWrites(t)
	t.Logf("the resumed holder wrote %d time(s): %q", len(lines), lines)
	g := <-got
	if g.err != nil {
		t.Fatalf("Lock: %v", g.err)
	}
	defer g.lease.Release(context.Background())
	t.Logf("granted %v after the pause, token %d (the holder's %d)", time.Since(paused).Round(time.Millisecond), g.lease.Token(), token)
	if g.lease.Token() <= token {
		t.Errorf("token %d not above the paused holder's %d", g.lease.Token(), token)
	}
	select {
	case <-g.lease.Context().Done():
		t.Errorf("the taker's lease ended after the holder resumed: %v", context.Cause(g.lease.Context()))
	case <-time.After(500 * time.Millisecond):
	}
}

// TestAttack3LockerToSupervisor: a Locker with a long T (R = 200ms,
// F = 3: T = 600ms, margin 100ms) holds the key a fast Supervisor
// (R = 50ms, F = 2, C = 2: T = 100ms, C·R = 100ms) stands by on; the
// Locker's link is black-holed. The Supervisor must start its service no
// sooner than the Locker's T + its own C·R (700ms) after the Locker's
// last write, after the Locker's lease ended.
func TestAttack3LockerToSupervisor(t *testing.T) {
	url, bucket, key := supervisorEnv(t)
	writes := watchWrites(t, url, bucket, key)
	locker, proxy := proxiedClient(t, url, bucket, natsputex.WithHolderID("locker"),
		natsputex.WithRenewInterval(200*time.Millisecond), natsputex.WithFailureThreshold(3), natsputex.WithConfirmations(1))
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	l, err := locker.Locker().TryLock(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	h := contracttest.NewHistory(1)
	exit := h.Enter("locker", l.Token())
	go func() { <-l.Context().Done(); exit() }()
	b := startAgentWith(t, url, bucket, key, "node-b", "node-b", h, nil,
		natsputex.WithRenewInterval(50*time.Millisecond), natsputex.WithFailureThreshold(2), natsputex.WithConfirmations(2))
	time.Sleep(500 * time.Millisecond)
	if b.running() {
		t.Fatal("node-b started while the Locker held the key")
	}
	proxy.BlackHole()
	waitFor(t, 5*time.Second, "node-b starts its service", b.running)
	started := b.lastStart()
	var last keyWrite
	writes.mu.Lock()
	for _, w := range writes.writes {
		if strings.HasPrefix(w.value, "locker") && !w.created.After(started) {
			last = w
		}
	}
	writes.mu.Unlock()
	t.Logf("locker's last write at %v, node-b started %v later; the Locker's lease: %v",
		last.created.Format("15:04:05.000"), started.Sub(last.created).Round(time.Millisecond), context.Cause(l.Context()))
	if started.Sub(last.created) < 700*time.Millisecond {
		t.Errorf("node-b started %v after the Locker's last write, before its T + C·R = 700ms", started.Sub(last.created).Round(time.Millisecond))
	}
	proxy.Restore()
	b.stop()
	if err := h.Check(); err != nil {
		t.Errorf("overlap: %v", err)
	}
}

// TestAttack3MixedChurn: three Lockers with different R, F, C and margins
// and a Supervisor contend on one key for 8s; each Locker holds for up to
// 150ms then either releases or has its link cut (its lease must end by
// itself; the link comes back after a second). Every critical section is
// recorded on one monotonic clock: none may overlap, tokens rise.
func TestAttack3MixedChurn(t *testing.T) {
	url, bucket, key := supervisorEnv(t)
	h := contracttest.NewHistory(1)
	g := newGrants()
	v := watchValidity(t)
	type cfg struct {
		name    string
		R       time.Duration
		F, C    int
		margin  time.Duration
		cutEach int
	}
	cfgs := []cfg{
		{"fast", 30 * time.Millisecond, 2, 1, 10 * time.Millisecond, 3},
		{"slow", 150 * time.Millisecond, 3, 3, 75 * time.Millisecond, 4},
		{"f1", 100 * time.Millisecond, 1, 2, 20 * time.Millisecond, 5},
	}
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Second)
	defer cancel()
	sup := startAgentWith(t, url, bucket, key, "node-s", "node-s", h, nil,
		natsputex.WithRenewInterval(80*time.Millisecond), natsputex.WithFailureThreshold(2), natsputex.WithConfirmations(2))
	stopSup := time.AfterFunc(3*time.Second, sup.stop)
	defer stopSup.Stop()
	var wg sync.WaitGroup
	var grantsN atomic.Int32
	for _, c := range cfgs {
		cl, proxy := proxiedClient(t, url, bucket, natsputex.WithHolderID(c.name), natsputex.WithRenewInterval(c.R),
			natsputex.WithFailureThreshold(c.F), natsputex.WithConfirmations(c.C), natsputex.WithSafetyMargin(c.margin))
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ctx.Err() == nil; i++ {
				l, err := cl.Locker().Lock(ctx, key)
				if err != nil {
					if ctx.Err() == nil {
						time.Sleep(20 * time.Millisecond)
					}
					continue
				}
				grantsN.Add(1)
				g.grant(c.name, l)
				v.add(c.name, l)
				exit := sync.OnceFunc(h.Enter(c.name, l.Token()))
				go func() { <-l.Context().Done(); exit() }()
				time.Sleep(time.Duration(20+(i*37)%130) * time.Millisecond)
				if i%c.cutEach == c.cutEach-1 {
					proxy.Cut()
					<-l.Context().Done()
					exit()
					time.Sleep(time.Second)
					proxy.Restore()
					continue
				}
				exit()
				_ = l.Release(context.Background())
			}
		}()
	}
	wg.Wait()
	sup.stop()
	t.Logf("%d Locker grants, %d critical sections, peak %d", grantsN.Load(), h.Len(), h.Peak())
	if grantsN.Load() < 5 {
		t.Errorf("only %d grants in 8s", grantsN.Load())
	}
	if err := h.Check(); err != nil {
		t.Errorf("overlap: %v", err)
	}
	g.check(t)
	v.check(t)
}

// TestAttack3CloseDuringSlowRound: a Client with 20 leases whose replies
// are held for 200ms is closed, with a context of 5s, while a renewal
// round is in flight. With time enough, "Close ends every lease ... then
// blanks their keys": a waiter of another client must find the keys free
// (no takeover, which costs T + C·R of silence) once Close returned.
func TestAttack3CloseDuringSlowRound(t *testing.T) {
	url, bucket := promiseEnv(t, "atk3closeslow")
	holder, proxy := proxiedClient(t, url, bucket, natsputex.WithHolderID("closing"))
	waiter := newTestClient(t, url, bucket, natsputex.WithHolderID("waiter"))
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	names := leaseNames(20)
	for _, n := range names {
		if _, err := holder.Locker().TryLock(ctx, n); err != nil {
			t.Fatal(err)
		}
	}
	var rounds atomic.Int32
	defer holder.Locker().Observe(func(e driver.Event) {
		if e.Kind == driver.EventRenewRound {
			rounds.Add(1)
		}
	})()
	time.Sleep(250 * time.Millisecond)
	proxy.DelayReplies(200 * time.Millisecond)
	time.Sleep(150 * time.Millisecond) // a round is in flight
	cctx, ccancel := context.WithTimeout(context.Background(), 5*time.Second)
	start := time.Now()
	err := holder.Close(cctx)
	ccancel()
	t.Logf("Close took %v: %v (%d rounds before)", time.Since(start).Round(time.Millisecond), err, rounds.Load())
	proxy.Restore()
	var takeovers atomic.Int32
	defer waiter.Locker().Observe(func(e driver.Event) {
		if e.Kind == driver.EventTakeover {
			takeovers.Add(1)
		}
	})()
	start = time.Now()
	for _, n := range names {
		l, err := waiter.Locker().TryLock(ctx, n)
		if err != nil {
			t.Logf("%s: %v", n, err)
			continue
		}
		_ = l.Release(ctx)
	}
	t.Logf("TryLock of %d keys after Close: %v, %d takeovers", len(names), time.Since(start).Round(time.Millisecond), takeovers.Load())
	if takeovers.Load() > 0 {
		t.Errorf("%d of %d keys were not blanked by a Close given time enough (a waiter paid T + C·R)", takeovers.Load(), len(names))
	}
}

// TestAttack3LostConfirmationReply: a holder crashes; a taker (R = 100ms,
// F = 3, C = 4) on a proxy takes its key over, and the answer of one of
// its confirmation writes (the first, or the third) is lost: the write
// lands, its answer is dropped for 300ms and the connection is then
// closed. A second client (C = 1) waits in Lock meanwhile. The
// confirmation, counted by time with "every write in between succeeding",
// must not hand out a lease across the lost answer: no grant while
// another lease is live, tokens rising, and the taker's lease (if it got
// one) handed out at least C·R after the start of a run of writes it saw
// succeed.
func TestAttack3LostConfirmationReply(t *testing.T) {
	for _, k := range []int{0, 2} {
		t.Run(fmt.Sprintf("write%d", k+1), func(t *testing.T) {
			const C, R = 4, 100 * time.Millisecond
			url, bucket := promiseEnv(t, "atk3lostconf")
			writes := watchWrites(t, url, bucket, "job")
			nc, js, err := connect(url)
			if err != nil {
				t.Fatal(err)
			}
			crashed := newClientOn(t, nc, js, bucket, natsputex.WithHolderID("crashed"))
			g := newGrants()
			held, err := crashed.Locker().TryLock(context.Background(), "job")
			if err != nil {
				t.Fatal(err)
			}
			g.grant("crashed", held)
			proxy := newTriggerProxy(t, strings.TrimPrefix(url, "nats://"), "PUB $KV."+bucket+".job ", 300*time.Millisecond)
			taker := newTestClient(t, "nats://"+proxy.Addr(), bucket, natsputex.WithHolderID("taker"),
				natsputex.WithRenewInterval(R), natsputex.WithConfirmations(C))
			other := newTestClient(t, url, bucket, natsputex.WithHolderID("other"))
			var tookAt atomic.Int64
			defer taker.Locker().Observe(func(e driver.Event) {
				if e.Kind == driver.EventTakeover && tookAt.Load() == 0 {
					tookAt.Store(time.Now().UnixNano())
					time.AfterFunc(time.Duration(k)*R+R/2, func() { proxy.armed.Store(true) })
				}
			})()
			ctx, cancel := context.WithTimeout(context.Background(), 12*time.Second)
			defer cancel()
			var wg sync.WaitGroup
			var mu sync.Mutex
			var takerGrant, otherGrant time.Time
			var takerFree bool // the taker took a blank key: no confirmation
			lockLoop := func(c struct {
				who string
				cl  *natsputex.Client
			}) {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for ctx.Err() == nil {
						l, err := c.cl.Locker().Lock(ctx, "job")
						if err != nil {
							time.Sleep(10 * time.Millisecond)
							continue
						}
						g.grant(c.who, l)
						if c.who == "other" {
							mu.Lock()
							otherGrant = time.Now()
							mu.Unlock()
						}
						if c.who == "taker" {
							grantAt := time.Now()
							// The test's watch may lag the taker's own (seen
							// in a CI run under -race: the blank before a
							// free take was not in yet): wait for the grant.
							seen := func() bool {
								writes.mu.Lock()
								defer writes.mu.Unlock()
								return len(writes.writes) > 0 && writes.writes[len(writes.writes)-1].rev >= l.Token()
							}
							for end := time.Now().Add(2 * time.Second); !seen() && time.Now().Before(end); {
								time.Sleep(5 * time.Millisecond)
							}
							mu.Lock()
							takerGrant = grantAt
							writes.mu.Lock()
							for _, w := range writes.writes {
								if w.rev < l.Token() {
									takerFree = w.value == "" // the last write before the taker's
								}
							}
							writes.mu.Unlock()
							mu.Unlock()
						}
						time.Sleep(300 * time.Millisecond)
						_ = l.Release(context.Background())
						return
					}
				}()
			}
			type locker = struct {
				who string
				cl  *natsputex.Client
			}
			lockLoop(locker{"taker", taker})
			time.Sleep(100 * time.Millisecond)
			nc.Close() // the crash
			select {
			case at := <-proxy.fired:
				t.Logf("answer dropped for the write sent %v after the takeover", at.Sub(time.Unix(0, tookAt.Load())).Round(time.Millisecond))
			case <-time.After(5 * time.Second):
				t.Fatal("the trigger never fired")
			}
			lockLoop(locker{"other", other})
			wg.Wait()
			g.check(t)
			mu.Lock()
			defer mu.Unlock()
			// The other client took the key from a confirming taker: it must
			// have waited T and the taker's longer C·R after the taker's last
			// write (the lost one included).
			if !otherGrant.IsZero() && (takerGrant.IsZero() || otherGrant.Before(takerGrant)) {
				last, _ := writes.lastBy("", time.Time{})
				writes.mu.Lock()
				for _, w := range writes.writes {
					if strings.HasPrefix(w.value, "taker") && w.created.Before(otherGrant) {
						last = w
					}
				}
				writes.mu.Unlock()
				gap := otherGrant.Sub(last.created)
				t.Logf("the other client's lease %v after the taker's last write (rev %d)", gap.Round(time.Millisecond), last.rev)
				if gap < 3*testR+C*R-10*time.Millisecond {
					t.Errorf("the other client's lease came %v after the confirming taker's last write, under T + its C·R = %v", gap.Round(time.Millisecond), 3*testR+C*R)
				}
			}
			if takerGrant.IsZero() || takerFree {
				t.Logf("the taker got no lease over a held key (granted: %t)", !takerGrant.IsZero())
				return
			}
			// The last run of the taker's writes, one R or so apart, before
			// its grant: the grant must come C·R after its first write.
			writes.mu.Lock()
			var runStart, prev time.Time
			for _, w := range writes.writes {
				if w.created.After(takerGrant) {
					break
				}
				if !strings.HasPrefix(w.value, "taker") {
					runStart, prev = time.Time{}, time.Time{}
					continue
				}
				if runStart.IsZero() || w.created.Sub(prev) > 2*R {
					runStart = w.created
				}
				prev = w.created
			}
			writes.mu.Unlock()
			t.Logf("the taker's lease %v after the start of its last run of writes", takerGrant.Sub(runStart).Round(time.Millisecond))
			if takerGrant.Sub(runStart) < C*R-10*time.Millisecond {
				t.Errorf("the taker's lease came %v after its run of writes began, under C·R = %v", takerGrant.Sub(runStart).Round(time.Millisecond), C*R)
			}
		})
	}
}

// TestAttack3ClusterBatchStepDown: on an embedded 3-node cluster with an
// R3 bucket, one Client pinned to a follower holds 10 leases (R = 200ms,
// F = 3: T = 600ms) while another, pinned to the other follower, waits in
// Lock on each name; the bucket's stream leader steps down three times,
// 800ms apart, while the batched renewals run. No lease may be live past
// its deadline, no name granted while its holder's lease is live, tokens
// rise.
func TestAttack3ClusterBatchStepDown(t *testing.T) {
	if testing.Short() {
		t.Skip("a 3-node cluster")
	}
	cluster := natsenv.StartCluster(t, 3)
	nodes := cluster.Servers()
	bucket := uniqueBucket("atk3cluster")
	prepareBucket(t, cluster.URLs(), bucket, natsputex.WithReplicas(3))
	leader := bucketLeader(t, cluster.URLs(), bucket, nodes, -1)
	opts := []natsputex.Option{natsputex.WithRenewInterval(200 * time.Millisecond), natsputex.WithFailureThreshold(3)}
	holder := newPinnedClient(t, nodes[(leader+1)%3].URL(), bucket, append(opts, natsputex.WithHolderID("holder"))...)
	waiter := newPinnedClient(t, nodes[(leader+2)%3].URL(), bucket, append(opts, natsputex.WithHolderID("waiter"))...)
	v := watchValidity(t)
	ctx, cancel := context.WithTimeout(context.Background(), 25*time.Second)
	defer cancel()
	names := leaseNames(10)
	gs := make([]*grants, len(names))
	for i, n := range names {
		l, err := holder.Locker().TryLock(ctx, n)
		if err != nil {
			t.Fatal(err)
		}
		gs[i] = newGrants()
		gs[i].grant("holder", l)
		v.add(n, l)
	}
	var wg sync.WaitGroup
	var granted atomic.Int32
	for i, n := range names {
		wg.Add(1)
		go func() {
			defer wg.Done()
			l, err := waiter.Locker().Lock(ctx, n)
			if err != nil {
				return
			}
			granted.Add(1)
			gs[i].grant("waiter", l)
			v.add(n+"/waiter", l)
		}()
	}
	nc, _, err := connect(cluster.URLs())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	for range 3 {
		time.Sleep(800 * time.Millisecond)
		sctx, scancel := context.WithTimeout(ctx, 5*time.Second)
		if err := stepDown(sctx, nc, "KV_"+bucket); err != nil {
			t.Logf("step down: %v", err)
		}
		scancel()
	}
	time.Sleep(time.Second)
	var lost int
	for _, g := range gs {
		if g.leases[0].lease.Context().Err() != nil {
			lost++
		}
	}
	t.Logf("after three step-downs: %d of %d holder leases lost, %d names granted to the waiter", lost, len(names), granted.Load())
	cancel()
	wg.Wait()
	for _, g := range gs {
		g.check(t)
	}
	v.check(t)
}

// TestAttack3SupervisorSlowReplies: an active Supervisor (R = 100ms,
// F = 3, C = 1, margin 50ms) behind a proxy whose replies are delayed
// 150ms, then 240ms, then 400ms (1.5s each), while a fast Locker
// (R = 50ms, F = 2, C = 1) loops Lock on the same key. The Supervisor's
// deadline is a kit lease extended by each successful write from the
// write's start: its service and the Locker's leases must never overlap
// (one monotonic clock), and tokens rise.
func TestAttack3SupervisorSlowReplies(t *testing.T) {
	url, bucket, key := supervisorEnv(t)
	proxy := testenv.NewProxy(t, strings.TrimPrefix(url, "nats://"))
	h := contracttest.NewHistory(1)
	a := startAgentWith(t, "nats://"+proxy.Addr(), bucket, key, "node-a", "node-a", h, nil,
		natsputex.WithSafetyMargin(50*time.Millisecond))
	waitFor(t, 5*time.Second, "node-a starts its service", a.running)
	locker := newTestClient(t, url, bucket, natsputex.WithHolderID("locker"),
		natsputex.WithRenewInterval(50*time.Millisecond), natsputex.WithFailureThreshold(2), natsputex.WithConfirmations(1))
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	var grantsN atomic.Int32
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for ctx.Err() == nil {
			l, err := locker.Locker().Lock(ctx, key)
			if err != nil {
				continue
			}
			grantsN.Add(1)
			exit := sync.OnceFunc(h.Enter("locker", l.Token()))
			go func() { <-l.Context().Done(); exit() }()
			time.Sleep(200 * time.Millisecond)
			exit()
			_ = l.Release(context.Background())
			time.Sleep(100 * time.Millisecond)
		}
	}()
	for _, d := range []time.Duration{150 * time.Millisecond, 240 * time.Millisecond, 400 * time.Millisecond} {
		proxy.DelayReplies(d)
		time.Sleep(1500 * time.Millisecond)
	}
	proxy.Restore()
	time.Sleep(time.Second)
	cancel()
	wg.Wait()
	a.stop()
	a.mu.Lock()
	t.Logf("node-a's service started %d time(s), tokens %v; the Locker got the key %d time(s)", len(a.started), a.tokens, grantsN.Load())
	a.mu.Unlock()
	if err := h.Check(); err != nil {
		t.Errorf("overlap: %v", err)
	}
}

// FOUND (liveness, the 5s-then-disconnect case fails today): Close returns
// at once (nil, 0s) without waiting for a running Supervisor; if the
// connection is then closed, as the docs say to do after the Client, Run
// takes 5.3s to return (T = 300ms): Run's deferred watch.stop waits up to
// 5s for the watch goroutine, stuck stopping its KV watcher on the dead
// connection. The service itself is stopped in time (no overlap).
//
// TestAttack3CloseShortDeadlineSupervisor: an active Supervisor's Client,
// whose replies are delayed 500ms, is closed with a 30ms context. Close
// must return within its context (plus slack); Run must return, matching
// ErrClosed, with the service stopped; a Locker waiting on the key must
// get it, never while the service runs.
func TestAttack3CloseShortDeadlineSupervisor(t *testing.T) {
	for _, within := range []time.Duration{30 * time.Millisecond, 5 * time.Second} {
		t.Run(within.String(), func(t *testing.T) { closeSupervisorWithin(t, within, false) })
	}
	// The connection closed as soon as Close returned, as the docs say
	// to close it after the Client.
	t.Run("5s-then-disconnect", func(t *testing.T) { closeSupervisorWithin(t, 5*time.Second, true) })
}

func closeSupervisorWithin(t *testing.T, within time.Duration, disconnect bool) {
	url, bucket, key := supervisorEnv(t)
	writes := watchWrites(t, url, bucket, key)
	var stoppedAt atomic.Int64
	c, proxy := proxiedClient(t, url, bucket, natsputex.WithSafetyMargin(50*time.Millisecond))
	h := contracttest.NewHistory(1)
	var mu sync.Mutex
	var exit func()
	sup, err := c.Supervisor(key, "node-a", natsputex.Service{
		Start: func(_ context.Context, token uint64) error {
			mu.Lock()
			defer mu.Unlock()
			if exit == nil {
				exit = h.Enter("node-a", token)
			}
			return nil
		},
		Stop: func(context.Context) error {
			mu.Lock()
			defer mu.Unlock()
			if exit != nil {
				exit()
				exit = nil
				stoppedAt.Store(time.Now().UnixNano())
			}
			return nil
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	runDone := make(chan error, 1)
	go func() { runDone <- sup.Run(context.Background()) }()
	waitFor(t, 5*time.Second, "node-a active", func() bool { return sup.Phase() == natsputex.PhaseActive })
	locker := newTestClient(t, url, bucket, natsputex.WithHolderID("locker"))
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	got := make(chan locks.Lease, 1)
	go func() {
		l, err := locker.Locker().Lock(ctx, key)
		if err != nil {
			t.Errorf("Lock: %v", err)
			got <- nil
			return
		}
		exit := h.Enter("locker", l.Token())
		time.Sleep(100 * time.Millisecond)
		exit()
		got <- l
	}()
	time.Sleep(250 * time.Millisecond)
	proxy.DelayReplies(500 * time.Millisecond)
	time.Sleep(120 * time.Millisecond)
	cctx, ccancel := context.WithTimeout(context.Background(), within)
	start := time.Now()
	err = c.Close(cctx)
	ccancel()
	took := time.Since(start)
	mu.Lock()
	runningAtClose := exit != nil
	mu.Unlock()
	t.Logf("Close took %v: %v; the service still ran then: %t; Run returned by then: %t", took.Round(time.Millisecond), err, runningAtClose, len(runDone) > 0)
	if disconnect {
		proxy.Cut()
	}
	runBound := 2 * time.Second // max(T, 1s) for the last blank, plus slack
	if took > within+250*time.Millisecond {
		t.Errorf("Close with a %v context took %v", within, took.Round(time.Millisecond))
	}
	select {
	case err := <-runDone:
		t.Logf("Run returned %v after Close began: %v", time.Since(start).Round(time.Millisecond), err)
		if d := time.Since(start); d > runBound {
			t.Errorf("FOUND: Run returned %v after Close, beyond %v (its watch's stop waits up to 5s)", d.Round(time.Millisecond), runBound)
		}
		if !errors.Is(err, locks.ErrClosed) {
			t.Errorf("Run's error %v does not match ErrClosed", err)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("Run did not return within 15s of Close")
	}
	mu.Lock()
	if exit != nil {
		t.Error("the service still runs after Run returned")
	}
	mu.Unlock()
	proxy.Restore()
	select {
	case l := <-got:
		if l != nil {
			t.Logf("the Locker got the key %v after Close began", time.Since(start).Round(time.Millisecond))
			_ = l.Release(context.Background())
		}
	case <-time.After(8 * time.Second):
		t.Error("the Locker never got the key")
	}
	writes.mu.Lock()
	for _, w := range writes.writes {
		if d := w.created.Sub(start); d > -300*time.Millisecond {
			t.Logf("write rev %d %q at %v from Close", w.rev, w.value, d.Round(time.Millisecond))
		}
	}
	writes.mu.Unlock()
	if at := stoppedAt.Load(); at != 0 {
		t.Logf("the service stopped %v after Close began", time.Unix(0, at).Sub(start).Round(time.Millisecond))
	}
	if err := h.Check(); err != nil {
		t.Errorf("overlap: %v", err)
	}
}
