package natsputex_test

// Health checks: one per renewal round of a Client; a failure ends every
// lease of the Client at once, and a hung or slow check ends the hold in
// time.

import (
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/latchkey-go/latchkey/contracttest"
	"github.com/latchkey-go/latchkey/contracttest/testenv"
	"github.com/latchkey-go/latchkey/contracttest/testenv/natsenv"
	"github.com/latchkey-go/latchkey/locks"
	"github.com/latchkey-go/latchkey/natsputex"
)

// TestHealthCheckFailureEndsEveryLeaseOfTheClient: one Client (R = 100ms, F
// = 3, C = 1) holds three Locker leases and runs an active Supervisor (Stop
// takes 200ms); node-b, standby on another client, and a waiting Lock per
// name wait. "a check run before every renewal round of the client's leases,
// once for all of them (told Active; a failure ends every one of them at
// once, then clears their keys)"; the Supervisor's hold "is a lease of the
// client: the client's renewal rounds renew it with its other leases (one
// health check per round for all of them, told Active)", and "once Stop has
// returned, the key is blanked". Before the failure, the client's Active
// checks must number about one per R (not one per lease, nor one more for
// the Supervisor); when the check fails, the three leases must end within R
// (+50ms), the Supervisor's Stop begin within R (+50ms), its key be blanked
// only after Stop returned, and node-b start after that; the waiters get
// their names, never while the holder's lease is live.
func TestHealthCheckFailureEndsEveryLeaseOfTheClient(t *testing.T) {
	url, bucket, key := localEnv(t)
	writes := watchWrites(t, url, bucket, key)
	h := contracttest.NewHistory(1)
	a := startNode(t, url, bucket, key, "node-a", h, withClientOptions(natsputex.WithHolderID("client-a")))
	a.stopDelay.Store(int64(200 * time.Millisecond))
	waitFor(t, 5*time.Second, "node-a starts its service", a.running)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	names := []string{"job1", "job2", "job3"}
	gs := make([]*grants, len(names))
	ended := make([]atomic.Int64, len(names))
	for i, name := range names {
		l, err := a.c.Locker().TryLock(ctx, name)
		if err != nil {
			t.Fatal(err)
		}
		gs[i] = newGrants()
		gs[i].grant("client-a", l)
		go func() { <-l.Context().Done(); ended[i].Store(time.Now().UnixNano()) }()
	}
	b := startNode(t, url, bucket, key, "node-b", h)
	waiter := newTestClient(t, url, bucket, natsputex.WithHolderID("waiter"))
	var wg sync.WaitGroup
	for i, name := range names {
		wg.Add(1)
		go func() {
			defer wg.Done()
			l, err := waiter.Locker().Lock(ctx, name)
			if err != nil {
				t.Errorf("waiter on %s: %v", name, err)
				return
			}
			gs[i].grant("waiter", l)
			_ = l.Release(context.Background())
		}()
	}
	time.Sleep(3 * testR)
	n0 := a.hcActive.Load()
	time.Sleep(time.Second)
	checks := a.hcActive.Load() - n0
	t.Logf("client-a ran %d Active health checks in 1s (R = %v) for 3 leases and a Supervisor's hold", checks, testR)
	if checks > 15 {
		t.Errorf("client-a ran %d Active health checks in 1s with R = %v: not one per round for all its leases", checks, testR)
	}
	failAt := time.Now()
	a.failHC.Store(true)
	wg.Wait()
	waitFor(t, 5*time.Second, "node-b starts its service", b.running)
	for i := range ended {
		at := ended[i].Load()
		if at == 0 {
			t.Errorf("client-a's lease on %s never ended", names[i])
			continue
		}
		if d := time.Unix(0, at).Sub(failAt); d > testR+50*time.Millisecond {
			t.Errorf("client-a's lease on %s ended %v after the check began to fail, beyond R (+50ms)", names[i], d.Round(time.Millisecond))
		}
	}
	stop, ok := a.firstStopAfter(failAt)
	if !ok {
		t.Fatal("node-a never stopped its service")
	}
	bStart := b.getStarts()[0].begin
	blanks := writes.blanksAfter(failAt)
	t.Logf("node-a's Stop began %v and returned %v after the check began to fail; node-b started %v after it; %d blank(s) of the key",
		stop.begin.Sub(failAt).Round(time.Millisecond), stop.end.Sub(failAt).Round(time.Millisecond), bStart.Sub(failAt).Round(time.Millisecond), len(blanks))
	if d := stop.begin.Sub(failAt); d > testR+50*time.Millisecond {
		t.Errorf("node-a's Stop began %v after its check began to fail, beyond R (+50ms)", d.Round(time.Millisecond))
	}
	// The failed check ends the hold before Stop runs, so nothing renews
	// the key meanwhile: when node-a's last write, the wait for Stop and
	// Stop's 200ms add up to about T, node-b may take the silent key over
	// before node-a blanks it, and node-a's blank then finds node-b's
	// write and leaves it (the package doc). So the first write after the
	// failure is either node-a's blank, made after its Stop returned, or
	// node-b's takeover (node-b still starts only after Stop returned,
	// checked below).
	after := writes.writesAfter(failAt)
	switch {
	case len(after) == 0:
		t.Error("the key was never written after node-a's check began to fail: neither blanked nor taken over")
	case after[0].value == "":
		if after[0].created.Before(stop.end) {
			t.Errorf("node-a's key was blanked %v before its Stop returned", stop.end.Sub(after[0].created).Round(time.Millisecond))
		}
	case after[0].value == "node-b":
		t.Logf("node-b took the silent key over %v after the check began to fail, before node-a blanked it", after[0].created.Sub(failAt).Round(time.Millisecond))
	default:
		t.Errorf("the first write after node-a's check began to fail is %q, neither node-a's blank nor node-b's takeover", after[0].value)
	}
	if bStart.Before(stop.end) {
		t.Errorf("node-b started %v before node-a's Stop returned", stop.end.Sub(bStart).Round(time.Millisecond))
	}
	for _, g := range gs {
		g.check(t)
	}
	b.cancel()
	a.cancel()
	a.wait(5 * time.Second)
	b.wait(5 * time.Second)
	if err := h.Check(); err != nil {
		t.Errorf("services overlapped: %v", err)
	}
}

// TestHealthCheckIgnoringContextStillEndsHold: a health check "ctx ends
// after T = F·R at the latest: a check that hangs past it fails"; "An active
// agent that has not renewed for T minus the safety margin begins to stop
// its service by itself, before any other agent may take over"; a holder
// "ends its lease by itself at the start of its last successful write plus T
// minus a safety margin". node-a (R = 100ms, F = 3, C = 2, margin 50ms) is
// active and its client also holds a Locker lease ("job"). Halfway between
// two renewals its Active health check starts to ignore its context and
// return only 1.5s later (nil in "late-pass", an error in "late-fail").
// node-a's Stop must begin no later than T − margin (+30ms) after its last
// write, not when the check returns; the Locker lease must not be live past
// its Deadline; node-b must start no sooner than T + C·R after node-a's last
// write, after node-a's Stop returned; no overlap.
func TestHealthCheckIgnoringContextStillEndsHold(t *testing.T) {
	const (
		C      = 2
		margin = 50 * time.Millisecond
		T      = testF * testR
		slack  = 30 * time.Millisecond
	)
	for _, mode := range []string{"late-pass", "late-fail"} {
		t.Run(mode, func(t *testing.T) {
			url, bucket, key := localEnv(t)
			writes := watchWrites(t, url, bucket, key)
			h := contracttest.NewHistory(1)
			var stuck atomic.Bool
			var checks, returnedLate atomic.Int32
			hc := natsputex.WithHealthCheck(func(ctx context.Context, s natsputex.State) error {
				if s != natsputex.Active || !stuck.Load() {
					return nil
				}
				checks.Add(1)
				time.Sleep(1500 * time.Millisecond) // ignores ctx
				returnedLate.Add(1)
				if mode == "late-fail" {
					return errors.New("unhealthy (test)")
				}
				return nil
			})
			opts := []natsputex.Option{natsputex.WithConfirmations(C), natsputex.WithSafetyMargin(margin)}
			a := startNode(t, url, bucket, key, "node-a", h, withClientOptions(append(opts, hc)...))
			a.stopDelay.Store(int64(100 * time.Millisecond))
			waitFor(t, 5*time.Second, "node-a starts its service", a.running)
			l, err := a.c.Locker().TryLock(context.Background(), "job")
			if err != nil {
				t.Fatal(err)
			}
			v := watchValidity(t)
			v.add("node-a's client job", l)
			var lEnded atomic.Int64
			go func() { <-l.Context().Done(); lEnded.Store(time.Now().UnixNano()) }()
			b := startNode(t, url, bucket, key, "node-b", h, withClientOptions(opts...))
			waitFor(t, 5*time.Second, "node-b is standby", func() bool {
				return b.sawEvent(func(e natsputex.Event) bool { return e.Holder == "node-a" })
			})
			time.Sleep(3 * testR)
			cut := cutAfterRenewal(t, writes, "node-a", func() { stuck.Store(true) })
			waitFor(t, 3*time.Second, "node-a begins to stop its service", func() bool { _, ok := a.firstStopAfter(cut); return ok })
			waitFor(t, 5*time.Second, "node-b starts its service", b.running)
			stop, _ := a.firstStopAfter(cut)
			bStart := b.getStarts()[0].begin
			answered, _ := writes.lastBy("node-a", cut)
			last, _ := writes.lastBy("node-a", bStart)
			t.Logf("node-a's last write before the check hung rev %d, its last before node-b started rev %d; its Stop began %v after the first (T − margin = %v); the Locker lease ended %v after it (%v); node-b started %v after node-a's last write (T + C·R = %v)",
				answered.rev, last.rev, stop.begin.Sub(answered.created).Round(time.Millisecond), T-margin,
				func() time.Duration {
					<-l.Context().Done()
					waitFor(t, time.Second, "the lease's end is recorded", func() bool { return lEnded.Load() != 0 })
					return time.Unix(0, lEnded.Load()).Sub(answered.created).Round(time.Millisecond)
				}(), context.Cause(l.Context()), bStart.Sub(last.created).Round(time.Millisecond), T+C*testR)
			if d := stop.begin.Sub(answered.created); d > T-margin+slack {
				t.Errorf("node-a began Stop %v after its last write, later than T − margin = %v (+%v)", d.Round(time.Millisecond), T-margin, slack)
			}
			if d := bStart.Sub(last.created); d < T+C*testR {
				t.Errorf("node-b started %v after node-a's last write, before T + C·R = %v", d.Round(time.Millisecond), T+C*testR)
			}
			if bStart.Before(stop.end) {
				t.Errorf("node-b started %v before node-a's Stop returned", stop.end.Sub(bStart).Round(time.Millisecond))
			}
			waitFor(t, 3*time.Second, "the check returns", func() bool { return returnedLate.Load() > 0 })
			stuck.Store(false)
			time.Sleep(5 * testR)
			t.Logf("%d stuck checks began", checks.Load())
			if a.running() && b.running() {
				t.Error("both agents run")
			}
			b.cancel()
			a.cancel()
			a.wait(5 * time.Second)
			b.wait(5 * time.Second)
			_ = l.Release(context.Background())
			v.check(t)
			if err := h.Check(); err != nil {
				writes.logAll(t, cut)
				t.Errorf("services overlapped: %v", err)
			}
		})
	}
}

// TestSlowHealthCheckHolderEndsBeforeTakeover: a live holder whose health
// check takes 270ms of T = 300ms (R = 100ms) writes less often than every T;
// a waiting Lock and a TryLock loop on the same name (same options) may take
// the key over, but never while the holder's lease is live: its validity
// (last write's start + T − margin) must end first.
func TestSlowHealthCheckHolderEndsBeforeTakeover(t *testing.T) {
	url, bucket := promiseEnv(t, "slowhc")
	var slow atomicBool
	holder := newTestClient(t, url, bucket, natsputex.WithHealthCheck(func(ctx context.Context, s natsputex.State) error {
		if slow.get() {
			return sleepCtx(ctx, 270*time.Millisecond)
		}
		return nil
	}))
	g := newGrants()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	l, err := holder.Locker().TryLock(ctx, "job")
	if err != nil {
		t.Fatal(err)
	}
	g.grant("holder", l)
	slow.set()
	waiter := newTestClient(t, url, bucket)
	trier := newTestClient(t, url, bucket)
	done := make(chan struct{})
	go func() {
		defer close(done)
		wl, err := waiter.Locker().Lock(ctx, "job")
		if err != nil {
			t.Errorf("waiter: %v", err)
			return
		}
		g.grant("waiter", wl)
		time.Sleep(100 * time.Millisecond)
		_ = wl.Release(context.Background())
	}()
	end := time.Now().Add(3 * time.Second)
	for time.Now().Before(end) {
		tl, err := trier.Locker().TryLock(ctx, "job")
		if err == nil {
			g.grant("trier", tl)
			time.Sleep(100 * time.Millisecond)
			_ = tl.Release(context.Background())
		}
		time.Sleep(10 * time.Millisecond)
	}
	<-done
	t.Logf("the holder's lease ended with: %v", context.Cause(l.Context()))
	g.check(t)
}

// TestSlowFailingHealthCheckStopsInTime: the active node-a's health check
// becomes slow and then fails (or hangs until its context ends at T). Its
// Stop takes 220ms, less than the margin + C·R = 250ms the docs give Stop
// "at least" (R = 100ms, F = 3, C = 2, margin R/2): "A Supervisor cut off
// from NATS begins Service.Stop at that same moment [last write + T −
// margin] ... The same bound holds whenever the agent stops its service
// itself (a failed health check or write, or shutdown)", and "An active
// agent that has not renewed for T minus the safety margin begins to stop
// its service by itself". node-b must not start before node-a's Stop has
// returned.
func TestSlowFailingHealthCheckStopsInTime(t *testing.T) {
	const C = 2
	for _, hc := range []time.Duration{180 * time.Millisecond, 280 * time.Millisecond, time.Second} {
		t.Run(hc.String(), func(t *testing.T) {
			url, bucket, key := supervisorEnv(t)
			h := contracttest.NewHistory(1)
			a := startAgent(t, url, bucket, key, "node-a", h, withClientOptions(natsputex.WithConfirmations(C)))
			waitFor(t, 5*time.Second, "node-a starts its service", a.running)
			b := startAgent(t, url, bucket, key, "node-b", h, withClientOptions(natsputex.WithConfirmations(C)))
			time.Sleep(3 * testR)
			a.stopDelay.Store(int64(220 * time.Millisecond))
			a.hcDelay.Store(int64(hc))
			a.failHC.Store(true)
			waitFor(t, (testF+C+2)*testR+3*time.Second, "node-b starts its service", b.running)
			a.mu.Lock()
			stopped := append([]time.Time(nil), a.stopped...)
			a.mu.Unlock()
			if len(stopped) > 0 {
				t.Logf("health check %v: node-a's service stopped %v before node-b's started", hc, b.lastStart().Sub(stopped[len(stopped)-1]).Round(time.Millisecond))
			} else {
				t.Logf("health check %v: node-a's service has not stopped when node-b's started", hc)
			}
			a.stop()
			b.stop()
			if err := h.Check(); err != nil {
				t.Errorf("services overlapped: %v", err)
			}
		})
	}
}

// TestHealthCheckFailureEndsLeaseFirst: a holder whose health check fails
// ends its lease before it blanks the key. Its connection runs through a
// proxy that, from the failure on, delays the blank (and its answer) by
// 100ms each way, so a waiter on a direct connection takes the blank key
// long before the holder hears back: the lease must be over by then.
func TestHealthCheckFailureEndsLeaseFirst(t *testing.T) {
	url := natsenv.StartServer(t).URL()
	bucket := uniqueBucket("hcfail")
	prepareBucket(t, url, bucket)
	proxy := testenv.NewProxy(t, strings.TrimPrefix(url, "nats://"))
	var fail atomicBool
	holder := newTestClient(t, "nats://"+proxy.Addr(), bucket,
		natsputex.WithHealthCheck(func(ctx context.Context, s natsputex.State) error {
			if s == natsputex.Active && fail.get() {
				proxy.Latency(100 * time.Millisecond)
				return errors.New("unhealthy (test)")
			}
			return nil
		})).Locker()
	waiter := newTestClient(t, url, bucket).Locker()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	lease, err := holder.TryLock(ctx, "job")
	if err != nil {
		t.Fatal(err)
	}
	got := lockBehind(ctx, waiter, "job", lease)
	time.Sleep(2 * testR) // the waiter watches; the holder renews
	fail.set()
	g := mustGrant(t, got)
	if g.otherLive {
		t.Fatal("double grant: the waiter got the key while the unhealthy holder's lease was live")
	}
	if cause := context.Cause(lease.Context()); !errors.Is(cause, locks.ErrLost) {
		t.Errorf("the holder's lease ended with %v, want ErrLost", cause)
	}
	proxy.Restore()
}
