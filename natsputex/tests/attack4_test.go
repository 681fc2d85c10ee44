package natsputex_test

// Attacks on the Supervisor rebuilt on the Locker's lease: its hold is one
// of the Client's leases, renewed in the Client's batched rounds (one
// health check per round), whose release runs Stop before blanking the
// key, and which Client.Close runs too; and on the kit's change that a
// lease past its deadline stays ended. Most tests run on the NATS server
// on 127.0.0.1:4222 (NATS 2.9 on the reference machine), each on a
// memory bucket of its own.

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/goleak"

	"github.com/latchkey-go/latchkey/contracttest"
	"github.com/latchkey-go/latchkey/contracttest/testenv"
	"github.com/latchkey-go/latchkey/contracttest/testenv/natsenv"
	"github.com/latchkey-go/latchkey/locks"
	"github.com/latchkey-go/latchkey/natsputex"
)

// atk4Env is a fresh memory bucket on the local NATS server (skipped if
// none answers), deleted at the end, with a leak check.
func atk4Env(t *testing.T) (url, bucket, key string) {
	t.Helper()
	ignore := goleak.IgnoreCurrent()
	t.Cleanup(func() { goleak.VerifyNone(t, append(natsenv.ConsumerGoroutines(), ignore)...) })
	url = localServer(t)
	bucket = uniqueBucket("atk4")
	prepareBucket(t, url, bucket, natsputex.WithStorage(jetstream.MemoryStorage))
	t.Cleanup(func() { deleteBucket(url, bucket) })
	return url, bucket, "spof-service"
}

// call4 is one call of a Service function.
type call4 struct {
	token      uint64 // Start's
	begin, end time.Time
	left       time.Duration // ctx deadline − begin; -1: none
	ctxErr     error         // the context's error when the call returned
	err        error
}

// node4 is one agent whose Client the test holds: its service's section
// in h opens when Start begins (a slow Start may have half started it)
// and closes when a Stop that succeeds returns.
type node4 struct {
	t    *testing.T
	name string
	nc   *nats.Conn
	c    *natsputex.Client
	sup  *natsputex.Supervisor
	h    *contracttest.History

	runDone chan error
	ctx     context.Context // Run's
	cancel  context.CancelFunc
	runErr  error

	failHC, hangHC     atomic.Bool // Active checks fail / hang until their ctx ends
	failStop           atomic.Bool
	failStart          atomic.Bool
	startHonoursCtx    atomic.Bool
	stopDelay          atomic.Int64
	startDelay         atomic.Int64
	hcActive, hcStandb atomic.Int32

	onStart atomic.Pointer[func()] // called when Start begins

	mu       sync.Mutex
	outlived []time.Time // a Start returned nil after a Stop had stopped the service it was starting
	exit     func()
	starts   []call4
	stops    []call4
	events   []natsputex.Event
}

// startNode4 connects to url, makes a Client with the suite's timing and
// opts, a Supervisor of key with token, and runs it unless run is false.
func startNode4(t *testing.T, url, bucket, key, name, token string, h *contracttest.History, run bool, opts ...natsputex.Option) *node4 {
	t.Helper()
	return startNodeConn(t, []nats.Option{nats.IgnoreDiscoveredServers()}, url, bucket, key, name, token, h, run, opts...)
}

// startNodeConn is startNode4 on a connection made with connOpts.
func startNodeConn(t *testing.T, connOpts []nats.Option, url, bucket, key, name, token string, h *contracttest.History, run bool, opts ...natsputex.Option) *node4 {
	t.Helper()
	nc, js, err := connect(url, connOpts...)
	if err != nil {
		t.Fatal(err)
	}
	n := &node4{t: t, name: name, nc: nc, h: h, runDone: make(chan error, 1)}
	base := []natsputex.Option{
		natsputex.WithRenewInterval(testR), natsputex.WithFailureThreshold(testF), natsputex.WithConfirmations(testC),
		natsputex.WithHealthCheck(func(ctx context.Context, s natsputex.State) error {
			if s == natsputex.Standby {
				n.hcStandb.Add(1)
				return nil
			}
			n.hcActive.Add(1)
			if n.hangHC.Load() {
				<-ctx.Done()
				return ctx.Err()
			}
			if n.failHC.Load() {
				return errors.New("unhealthy (test)")
			}
			return nil
		}),
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	n.c, err = natsputex.New(ctx, js, bucket, append(base, opts...)...)
	if err != nil {
		nc.Close()
		t.Fatal(err)
	}
	n.sup, err = n.c.Supervisor(key, token, natsputex.Service{
		Start: func(ctx context.Context, token uint64) error {
			cl := call4{token: token, begin: time.Now(), left: -1}
			if d, ok := ctx.Deadline(); ok {
				cl.left = d.Sub(cl.begin)
			}
			n.mu.Lock()
			if n.exit == nil {
				n.exit = h.Enter(name, token)
			}
			n.mu.Unlock()
			if f := n.onStart.Load(); f != nil {
				(*f)()
			}
			if d := time.Duration(n.startDelay.Load()); d > 0 {
				if n.startHonoursCtx.Load() {
					cl.err = sleepCtx(ctx, d)
				} else {
					time.Sleep(d)
				}
			}
			if cl.err == nil && n.failStart.Load() {
				cl.err = errors.New("cannot start (test)")
			}
			cl.end, cl.ctxErr = time.Now(), ctx.Err()
			n.mu.Lock()
			// A Start that succeeds leaves the service up, even if a
			// Stop ran while it was starting it.
			if cl.err == nil && n.exit == nil {
				n.exit = h.Enter(name, token)
				n.outlived = append(n.outlived, cl.end)
			}
			n.starts = append(n.starts, cl)
			n.mu.Unlock()
			return cl.err
		},
		Stop: func(ctx context.Context) error {
			cl := call4{begin: time.Now(), left: -1}
			if d, ok := ctx.Deadline(); ok {
				cl.left = d.Sub(cl.begin)
			}
			if n.failStop.Load() {
				cl.err = errors.New("cannot stop (test)")
			} else {
				time.Sleep(time.Duration(n.stopDelay.Load()))
			}
			n.mu.Lock()
			if cl.err == nil && n.exit != nil {
				n.exit()
				n.exit = nil
			}
			cl.end, cl.ctxErr = time.Now(), ctx.Err()
			n.stops = append(n.stops, cl)
			n.mu.Unlock()
			return cl.err
		},
		Observe: func(e natsputex.Event) {
			t.Logf("%s: %v", name, e)
			n.mu.Lock()
			n.events = append(n.events, e)
			n.mu.Unlock()
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	n.ctx, n.cancel = context.WithTimeout(context.Background(), time.Minute)
	if run {
		n.run(n.ctx)
	}
	t.Cleanup(func() {
		n.cancel()
		if run {
			n.wait(10 * time.Second)
		}
		_ = n.c.Close(context.Background())
		n.nc.Close()
	})
	return n
}

func (n *node4) run(ctx context.Context) {
	go func() { n.runDone <- n.sup.Run(ctx) }()
}

// wait waits up to within for Run to return and returns its error.
func (n *node4) wait(within time.Duration) (error, bool) {
	n.mu.Lock()
	if n.runDone == nil {
		defer n.mu.Unlock()
		return n.runErr, true
	}
	ch := n.runDone
	n.mu.Unlock()
	select {
	case err := <-ch:
		n.mu.Lock()
		n.runErr, n.runDone = err, nil
		n.mu.Unlock()
		return err, true
	case <-time.After(within):
		return nil, false
	}
}

// kill crashes the agent: its service dies with it, its connection closes.
func (n *node4) kill() {
	n.mu.Lock()
	if n.exit != nil {
		n.exit()
		n.exit = nil
	}
	n.mu.Unlock()
	n.nc.Close()
	n.cancel()
}

func (n *node4) running() bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.exit != nil
}

func (n *node4) getStarts() []call4 {
	n.mu.Lock()
	defer n.mu.Unlock()
	return append([]call4(nil), n.starts...)
}

func (n *node4) getStops() []call4 {
	n.mu.Lock()
	defer n.mu.Unlock()
	return append([]call4(nil), n.stops...)
}

func (n *node4) sawEvent(f func(natsputex.Event) bool) bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	for _, e := range n.events {
		if f(e) {
			return true
		}
	}
	return false
}

// firstStopAfter returns the first Stop call that began at or after t.
func (n *node4) firstStopAfter(t time.Time) (call4, bool) {
	for _, s := range n.getStops() {
		if !s.begin.Before(t) {
			return s, true
		}
	}
	return call4{}, false
}

// writesAfter returns the writes the watch saw stored after t.
func (w *keyWatch) writesAfter(t time.Time) []keyWrite {
	w.mu.Lock()
	defer w.mu.Unlock()
	var out []keyWrite
	for _, kw := range w.writes {
		if kw.created.After(t) {
			out = append(out, kw)
		}
	}
	return out
}

func (w *keyWatch) all() []keyWrite {
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([]keyWrite(nil), w.writes...)
}

func (w *keyWatch) logAll(t *testing.T, base time.Time) {
	for _, kw := range w.all() {
		t.Logf("write rev %d %q stored at %+v", kw.rev, kw.value, kw.created.Sub(base).Round(time.Millisecond))
	}
}

// cutAfterRenewal waits for a write of token, sleeps half an interval
// and calls cut, if no other write came meanwhile; it returns the time of
// the cut.
func cutAfterRenewal(t *testing.T, writes *keyWatch, token string, cut func()) time.Time {
	t.Helper()
	var at time.Time
	waitFor(t, 5*time.Second, "a renewal of "+token+" to cut after", func() bool {
		w, ok := writes.lastBy(token, time.Now())
		if !ok || time.Since(w.seen) > testR/4 {
			return false
		}
		time.Sleep(time.Until(w.seen.Add(testR / 2)))
		if next, _ := writes.lastBy(token, time.Now()); next.rev != w.rev {
			return false
		}
		cut()
		at = time.Now()
		return true
	})
	return at
}

// TestAttack4HungWhileActive: "A Supervisor cut off from NATS begins
// Service.Stop at that same moment [its last successful write + T −
// margin]; a standby starts its service no earlier than T + C·R after
// that write", and "An active agent that has not renewed for T minus the
// safety margin begins to stop its service by itself". node-a (R = 100ms,
// F = 3, C = 2, margin 50ms: T − margin = 250ms) is active behind a proxy
// when, halfway between two renewals, its health check starts to hang
// (until its context ends, after T), its replies are dropped (the broker
// hung for it: its renewals land, it hears nothing), or its link is
// black-holed. Its Stop must begin no later than 250ms after the start
// of its last write it could have heard answered (+30ms of slack), not
// when the hanging check or renewal gives up; node-b, standby on a
// direct link, must start no sooner than T + C·R = 500ms after node-a's
// last write, and after node-a's Stop (220ms) returned.
func TestAttack4HungWhileActive(t *testing.T) {
	const (
		C      = 2
		margin = 50 * time.Millisecond
		T      = testF * testR
		slack  = 30 * time.Millisecond
	)
	for _, mode := range []string{"hc-hangs", "replies-dropped", "blackhole"} {
		t.Run(mode, func(t *testing.T) {
			url, bucket, key := atk4Env(t)
			writes := watchWrites(t, url, bucket, key)
			proxy := testenv.NewProxy(t, strings.TrimPrefix(url, "nats://"))
			h := contracttest.NewHistory(1)
			opts := []natsputex.Option{natsputex.WithConfirmations(C), natsputex.WithSafetyMargin(margin)}
			a := startNode4(t, "nats://"+proxy.Addr(), bucket, key, "node-a", "node-a", h, true, opts...)
			a.stopDelay.Store(int64(220 * time.Millisecond))
			waitFor(t, 5*time.Second, "node-a starts its service", a.running)
			b := startNode4(t, url, bucket, key, "node-b", "node-b", h, true, opts...)
			waitFor(t, 5*time.Second, "node-b is standby", func() bool {
				return b.sawEvent(func(e natsputex.Event) bool { return e.Holder == "node-a" })
			})
			time.Sleep(3 * testR)
			cut := cutAfterRenewal(t, writes, "node-a", func() {
				switch mode {
				case "hc-hangs":
					a.hangHC.Store(true)
				case "replies-dropped":
					proxy.DropReplies()
				case "blackhole":
					proxy.BlackHole()
				}
			})
			waitFor(t, 3*time.Second, "node-a begins to stop its service", func() bool { _, ok := a.firstStopAfter(cut); return ok })
			waitFor(t, 5*time.Second, "node-b starts its service", b.running)
			stop, _ := a.firstStopAfter(cut)
			bStart := b.getStarts()[0].begin
			answered, _ := writes.lastBy("node-a", cut)
			last, _ := writes.lastBy("node-a", bStart)
			t.Logf("%s: last write stored before the cut rev %d %v before it; last of node-a's writes rev %d; node-a's Stop began %v after the first (T − margin = %v) and returned %v after it; node-b started %v after node-a's last write (T + C·R = %v)",
				mode, answered.rev, cut.Sub(answered.created).Round(time.Millisecond), last.rev,
				stop.begin.Sub(answered.created).Round(time.Millisecond), T-margin, stop.end.Sub(answered.created).Round(time.Millisecond),
				bStart.Sub(last.created).Round(time.Millisecond), T+C*testR)
			if d := stop.begin.Sub(answered.created); d > T-margin+slack {
				t.Errorf("node-a began Stop %v after its last write that could have succeeded, later than T − margin = %v (+%v)", d.Round(time.Millisecond), T-margin, slack)
			}
			if d := bStart.Sub(last.created); d < T+C*testR {
				t.Errorf("node-b started %v after node-a's last write, before T + C·R = %v", d.Round(time.Millisecond), T+C*testR)
			}
			if bStart.Before(stop.end) {
				t.Errorf("node-b started %v before node-a's Stop returned", stop.end.Sub(bStart).Round(time.Millisecond))
			}
			proxy.Restore()
			a.hangHC.Store(false)
			time.Sleep(3 * testR)
			b.cancel()
			a.cancel()
			a.wait(5 * time.Second)
			b.wait(5 * time.Second)
			if err := h.Check(); err != nil {
				t.Errorf("services overlapped: %v", err)
			}
		})
	}
}

// blanksAfter returns the blank writes the watch saw stored after t.
func (w *keyWatch) blanksAfter(t time.Time) []keyWrite {
	var out []keyWrite
	for _, kw := range w.writesAfter(t) {
		if kw.value == "" {
			out = append(out, kw)
		}
	}
	return out
}

// TestAttack4SharedClientHealthFails: one Client (R = 100ms, F = 3,
// C = 1) holds three Locker leases and runs an active Supervisor (Stop
// takes 200ms); node-b, standby on another client, and a waiting Lock per
// name wait. "a check run before every renewal round of the client's
// leases, once for all of them (told Active; a failure ends every one of
// them at once, then clears their keys)"; the Supervisor's hold "is a
// lease of the client: the client's renewal rounds renew it with its
// other leases (one health check per round for all of them, told
// Active)", and "once Stop has returned, the key is blanked". Before the
// failure, the client's Active checks must number about one per R (not
// one per lease, nor one more for the Supervisor); when the check fails,
// the three leases must end within R (+50ms), the Supervisor's Stop begin
// within R (+50ms), its key be blanked only after Stop returned, and
// node-b start after that; the waiters get their names, never while the
// holder's lease is live.
func TestAttack4SharedClientHealthFails(t *testing.T) {
	url, bucket, key := atk4Env(t)
	writes := watchWrites(t, url, bucket, key)
	h := contracttest.NewHistory(1)
	a := startNode4(t, url, bucket, key, "node-a", "node-a", h, true, natsputex.WithHolderID("client-a"))
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
	b := startNode4(t, url, bucket, key, "node-b", "node-b", h, true)
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
	// Stop's 200ms add up past T, node-b takes the silent key over first
	// and node-a's blank finds node-b's write and leaves it (the package
	// doc). node-b still starts only after Stop returned (checked below).
	tookOver := false
	if first, ok := writes.firstBy("node-b"); ok && first.created.Before(stop.end) {
		tookOver = true
		t.Logf("node-b took the silent key over %v before node-a's Stop returned", stop.end.Sub(first.created).Round(time.Millisecond))
	}
	if len(blanks) == 0 && !tookOver {
		t.Error("node-a never blanked its key after its failed health check")
	} else if len(blanks) > 0 && blanks[0].created.Before(stop.end) {
		t.Errorf("node-a's key was blanked %v before its Stop returned", stop.end.Sub(blanks[0].created).Round(time.Millisecond))
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

// Found by this test: Close returned nil, 12 runs of 20, though the
// hold's Stop failed (when Run's loop ran that Stop before Close's
// release did, the release found the key kept and said nothing); Close
// now returns the failed Stop either way. Also seen: with a Stop longer
// than T, Close's blank finds node-b's takeover write (nothing renews a
// closed hold while Stop runs), which the package doc now says.
//
// TestAttack4CloseWhileActive: Client.Close "ends every lease of the
// client ... A running Supervisor's hold is one of those leases: Close
// runs its Service.Stop and blanks its key only once Stop has returned
// (not at all when Stop fails, which Close returns), and Run returns an
// error matching locks.ErrClosed"; "when ctx ends first, Close returns an
// error matching ctx.Err() and the rest finishes in the background";
// Stop's "context ends after T + C·R, never sooner". node-a (R = 100ms,
// F = 3, C = 2) is active with a Stop of 300ms; node-b is standby. Close
// with a 20ms context (it must return by then, and Stop must still run to
// its end with its own context), with a 5s one (it returns after Stop
// and the blank), and with a Stop that fails (Close returns that error,
// the key keeps node-a's write, node-b waits T + C·R).
func TestAttack4CloseWhileActive(t *testing.T) {
	const (
		C = 2
		T = testF * testR
	)
	for _, tc := range []struct {
		name     string
		within   time.Duration
		stopFail bool
		stop     time.Duration
		shutdown bool // cancel Run's context instead of closing the client
	}{
		{"short-ctx", 20 * time.Millisecond, false, 300 * time.Millisecond, false},
		{"long-ctx", 5 * time.Second, false, 300 * time.Millisecond, false},
		{"long-ctx-stop-100ms", 5 * time.Second, false, 100 * time.Millisecond, false},
		{"stop-fails", 5 * time.Second, true, 0, false},
		{"run-cancelled", 0, false, 300 * time.Millisecond, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			url, bucket, key := atk4Env(t)
			writes := watchWrites(t, url, bucket, key)
			h := contracttest.NewHistory(1)
			a := startNode4(t, url, bucket, key, "node-a", "node-a", h, true, natsputex.WithConfirmations(C))
			a.stopDelay.Store(int64(tc.stop))
			waitFor(t, 5*time.Second, "node-a starts its service", a.running)
			b := startNode4(t, url, bucket, key, "node-b", "node-b", h, true, natsputex.WithConfirmations(C))
			waitFor(t, 5*time.Second, "node-b is standby", func() bool {
				return b.sawEvent(func(e natsputex.Event) bool { return e.Holder == "node-a" })
			})
			time.Sleep(2 * testR)
			if tc.stopFail {
				a.failStop.Store(true)
			}
			var err error
			var took time.Duration
			closed := time.Now()
			if tc.shutdown {
				a.cancel()
			} else {
				ctx, cancel := context.WithTimeout(context.Background(), tc.within)
				err = a.c.Close(ctx)
				took = time.Since(closed)
				cancel()
				t.Logf("Close took %v: %v", took.Round(time.Millisecond), err)
			}
			runErr, ok := a.wait(5 * time.Second)
			if !ok {
				t.Fatal("Run did not return within 5s of Close")
			}
			t.Logf("Run returned %v after Close began (matches ErrStopFailed: %t; %d Stop calls): %v", time.Since(closed).Round(time.Millisecond), errors.Is(runErr, natsputex.ErrStopFailed), len(a.getStops()), runErr)
			if want := locks.ErrClosed; !tc.shutdown && !errors.Is(runErr, want) {
				t.Errorf("Run's error %v does not match locks.ErrClosed", runErr)
			}
			if tc.shutdown && !errors.Is(runErr, context.Canceled) {
				t.Errorf("Run's error %v does not match context.Canceled", runErr)
			}
			waitFor(t, 5*time.Second, "node-b starts its service", b.running)
			bStart := b.getStarts()[0].begin
			stop, ok := a.firstStopAfter(closed)
			if !ok {
				t.Fatal("node-a's Stop was not called after Close")
			}
			blanks := writes.blanksAfter(closed)
			last, _ := writes.lastBy("node-a", bStart)
			t.Logf("node-a's Stop began %v after Close, context %v long, returned %v after Close (its context: %v); %d blank(s); node-b started %v after Close, %v after node-a's last write",
				stop.begin.Sub(closed).Round(time.Millisecond), stop.left.Round(time.Millisecond), stop.end.Sub(closed).Round(time.Millisecond), stop.ctxErr,
				len(blanks), bStart.Sub(closed).Round(time.Millisecond), bStart.Sub(last.created).Round(time.Millisecond))
			for _, w := range writes.writesAfter(closed.Add(-testR)) {
				t.Logf("write rev %d %q stored %v after Close", w.rev, w.value, w.created.Sub(closed).Round(time.Millisecond))
			}
			if stop.left >= 0 && stop.left < T+C*testR-5*time.Millisecond {
				t.Errorf("the Stop run by Close has a context of %v, shorter than T + C·R = %v", stop.left.Round(time.Millisecond), T+C*testR)
			}
			if stop.ctxErr != nil {
				t.Errorf("the context of the Stop run by Close had ended (%v) when it returned after %v", stop.ctxErr, stop.end.Sub(stop.begin).Round(time.Millisecond))
			}
			switch {
			case tc.stopFail:
				if !errors.Is(err, natsputex.ErrStopFailed) {
					t.Errorf("Close = %v, want the failed Stop (ErrStopFailed)", err)
				}
				if len(blanks) > 0 {
					t.Errorf("the key was blanked (rev %d) though node-a's Stop failed", blanks[0].rev)
				}
				if d := bStart.Sub(last.created); d < T+C*testR {
					t.Errorf("node-b started %v after node-a's last write, before T + C·R = %v", d.Round(time.Millisecond), T+C*testR)
				}
			case tc.shutdown:
			case tc.within < time.Second:
				if !errors.Is(err, context.DeadlineExceeded) {
					t.Errorf("Close with a %v context = %v, want an error matching context.DeadlineExceeded", tc.within, err)
				}
				if took > tc.within+150*time.Millisecond {
					t.Errorf("Close with a %v context took %v", tc.within, took.Round(time.Millisecond))
				}
			default:
				if err != nil {
					t.Errorf("Close = %v", err)
				}
				if time.Now().Before(stop.end) || closed.Add(took).Before(stop.end) {
					t.Errorf("Close returned before node-a's Stop did")
				}
			}
			// Close ends the hold before Stop runs, so nothing renews the
			// key meanwhile: a Stop longer than T lets node-b take the
			// silent key over (it still starts only T + C·R after
			// node-a's last write), and node-a's blank then finds node-b's
			// write and leaves it (the package doc). When Run's context
			// ends instead, node-a renews while Stop runs and blanks.
			tookOver := false
			if first, ok := writes.firstBy("node-b"); ok && first.created.Before(stop.end) {
				tookOver = true
				if tc.shutdown {
					t.Errorf("node-b took the key over %v before node-a's Stop returned, though node-a's Run was only cancelled (it holds the key while Stop runs)", stop.end.Sub(first.created).Round(time.Millisecond))
				}
			}
			if !tc.stopFail {
				if len(blanks) == 0 && !tookOver {
					t.Error("node-a's key was not blanked after its Stop returned")
				} else if len(blanks) > 0 && blanks[0].created.Before(stop.end) {
					t.Errorf("node-a's key was blanked %v before its Stop returned", stop.end.Sub(blanks[0].created).Round(time.Millisecond))
				}
				if bStart.Before(stop.end) {
					t.Errorf("node-b started %v before node-a's Stop returned", stop.end.Sub(bStart).Round(time.Millisecond))
				}
				if d := bStart.Sub(stop.end); d > T && !tookOver {
					t.Errorf("node-b started %v after node-a's Stop returned: as if the key had not been blanked", d.Round(time.Millisecond))
				}
				if err := h.Check(); err != nil {
					t.Errorf("services overlapped: %v", err)
				}
			}
			b.cancel()
			b.wait(5 * time.Second)
		})
	}
}

// TestAttack4CloseWhileNotActive: Client.Close "does not wait for Run
// itself, nor for a Stop of an agent that did not hold the key", and "a
// confirmer that gives up, for any reason, never blanks the key". In
// "standby", node-a (Stop 300ms) stands by while a Locker of another
// client holds the key: Close must return at once, Run with ErrClosed,
// and the Locker's lease and its write stay. In "confirming", node-c dies,
// node-a (C = 6) takes its key over and, while it confirms, its client is
// closed: node-a never starts, does not blank the key, Run returns
// ErrClosed, and node-b (C = 1) starts no sooner than T + node-a's C·R
// (300ms + 600ms) after node-a's last write.
func TestAttack4CloseWhileNotActive(t *testing.T) {
	const T = testF * testR
	t.Run("standby", func(t *testing.T) {
		url, bucket, key := atk4Env(t)
		writes := watchWrites(t, url, bucket, key)
		holder := newTestClient(t, url, bucket, natsputex.WithHolderID("locker"))
		l, err := holder.Locker().TryLock(context.Background(), key)
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = l.Release(context.Background()) }()
		a := startNode4(t, url, bucket, key, "node-a", "node-a", contracttest.NewHistory(1), true)
		waitFor(t, 5*time.Second, "node-a is standby", func() bool {
			return a.sawEvent(func(e natsputex.Event) bool { return e.Holder != "" && e.Phase == natsputex.PhaseStandby })
		})
		time.Sleep(2 * testR)
		a.stopDelay.Store(int64(300 * time.Millisecond))
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		closed := time.Now()
		err = a.c.Close(ctx)
		took := time.Since(closed)
		runErr, ok := a.wait(5 * time.Second)
		t.Logf("Close took %v: %v; Run returned (%t) %v after: %v", took.Round(time.Millisecond), err, ok, time.Since(closed).Round(time.Millisecond), runErr)
		if err != nil {
			t.Errorf("Close = %v", err)
		}
		if took > 150*time.Millisecond {
			t.Errorf("Close of a standby agent took %v: it waited for its Stop (300ms)", took.Round(time.Millisecond))
		}
		if !ok || !errors.Is(runErr, locks.ErrClosed) {
			t.Errorf("Run = %v (returned: %t), want an error matching ErrClosed", runErr, ok)
		}
		time.Sleep(2 * testR)
		if l.Context().Err() != nil {
			t.Errorf("the Locker's lease ended when the standby's client closed: %v", context.Cause(l.Context()))
		}
		for _, w := range writes.writesAfter(closed) {
			if w.value != "locker" && !strings.HasPrefix(w.value, "locker") {
				t.Errorf("write rev %d %q after the standby's client closed", w.rev, w.value)
			}
		}
	})
	t.Run("confirming", func(t *testing.T) {
		const Ca = 6
		url, bucket, key := atk4Env(t)
		writes := watchWrites(t, url, bucket, key)
		h := contracttest.NewHistory(1)
		c := startNode4(t, url, bucket, key, "node-c", "node-c", h, true)
		waitFor(t, 5*time.Second, "node-c starts its service", c.running)
		a := startNode4(t, url, bucket, key, "node-a", "node-a", h, true, natsputex.WithConfirmations(Ca))
		a.stopDelay.Store(int64(300 * time.Millisecond))
		waitFor(t, 5*time.Second, "node-a is standby", func() bool {
			return a.sawEvent(func(e natsputex.Event) bool { return e.Holder == "node-c" })
		})
		time.Sleep(2 * testR)
		c.kill()
		waitFor(t, 3*time.Second, "node-a confirms", func() bool { return a.sup.Phase() == natsputex.PhaseConfirming })
		b := startNode4(t, url, bucket, key, "node-b", "node-b", h, true)
		time.Sleep(2 * testR)
		if a.sup.Phase() != natsputex.PhaseConfirming {
			t.Fatalf("node-a is %v, no longer confirming", a.sup.Phase())
		}
		closed := time.Now()
		err := a.c.Close(context.Background())
		took := time.Since(closed)
		runErr, ok := a.wait(5 * time.Second)
		t.Logf("Close took %v: %v; Run returned (%t) %v after: %v", took.Round(time.Millisecond), err, ok, time.Since(closed).Round(time.Millisecond), runErr)
		if !ok || !errors.Is(runErr, locks.ErrClosed) {
			t.Errorf("Run = %v (returned: %t), want an error matching ErrClosed", runErr, ok)
		}
		waitFor(t, 5*time.Second, "node-b starts its service", b.running)
		bStart := b.getStarts()[0].begin
		last, _ := writes.lastBy("node-a", bStart)
		t.Logf("node-b started %v after node-a's last write (T + node-a's C·R = %v)", bStart.Sub(last.created).Round(time.Millisecond), T+Ca*testR)
		if len(a.getStarts()) > 0 {
			t.Error("node-a started its service though its client closed while it confirmed")
		}
		if bl := writes.blanksAfter(closed.Add(-testR)); len(bl) > 0 {
			t.Errorf("the key was blanked (rev %d, %v after Close) though node-a closed while confirming", bl[0].rev, bl[0].created.Sub(closed).Round(time.Millisecond))
		}
		if d := bStart.Sub(last.created); d < T+Ca*testR {
			t.Errorf("node-b started %v after node-a's last write, before T + node-a's C·R = %v", d.Round(time.Millisecond), T+Ca*testR)
		}
		b.cancel()
		b.wait(5 * time.Second)
		if err := h.Check(); err != nil {
			t.Errorf("services overlapped: %v", err)
		}
	})
}

// checkTakeovers fails t if a Start of n's began less than C·R after the
// first write of the run of n's writes before it, when that run took the
// key from another token's write (which must then have been T old).
func checkTakeovers(t *testing.T, writes *keyWatch, n *node4, T, CR time.Duration) {
	t.Helper()
	all := writes.all()
	for _, st := range n.getStarts() {
		// The start's fencing token is the revision of the write that won
		// the key: find it by revision, not by the server's stamp, which a
		// cluster's follower may set after the holder's Start began.
		first := -1
		for i, w := range all {
			if w.rev == st.token {
				first = i
				break
			}
		}
		if first < 0 || all[first].value != n.name {
			t.Errorf("%s started at %v with fencing token %d, not a revision its token was written at", n.name, st.begin.Format("15:04:05.000"), st.token)
			continue
		}
		for first > 0 && all[first-1].value == n.name {
			first--
		}
		if first == 0 || all[first-1].value == "" {
			continue // a free key, held at once
		}
		p, w := all[first-1], all[first]
		if d := w.created.Sub(p.created); d < T-10*time.Millisecond {
			t.Errorf("%s took the key (rev %d) %v after %q's write (rev %d), before T = %v", n.name, w.rev, d.Round(time.Millisecond), p.value, p.rev, T)
		}
		if d := st.begin.Sub(w.created); d < CR-10*time.Millisecond {
			t.Errorf("%s started %v after its takeover write (rev %d), before C·R = %v", n.name, d.Round(time.Millisecond), w.rev, CR)
		}
	}
}

// TestAttack4LostReplies: the answer to one write of node-a's, and to it
// only, is lost (its proxy drops what comes back for 150ms, then closes
// the connection; nats.go reconnects): its claim of a free key, a renewal,
// a confirmation write after a takeover, the blank after a failed health
// check. "it starts the service only after C·R of its own writes that it
// saw succeed, on every path", "a write whose answer was lost ... It then
// writes at the revision it read and confirms for C intervals as after a
// takeover". So every Start of node-a's after the lost write begins no
// sooner than C·R (C = 3) after the first write of its stored after the
// lost one; node-b, standby on a direct link, takes the key over only T
// after another token's write and starts C·R after that; the services
// never overlap.
func TestAttack4LostReplies(t *testing.T) {
	const (
		C = 3
		T = testF * testR
	)
	for _, mode := range []string{"free-claim", "renewal", "confirmation", "blank"} {
		t.Run(mode, func(t *testing.T) {
			url, bucket, key := atk4Env(t)
			writes := watchWrites(t, url, bucket, key)
			proxy := newTriggerProxy(t, strings.TrimPrefix(url, "nats://"), "PUB $KV."+bucket+"."+key+" ", 150*time.Millisecond)
			h := contracttest.NewHistory(1)
			opts := []natsputex.Option{natsputex.WithConfirmations(C)}
			var a, b, c *node4
			agents := []*node4{}
			switch mode {
			case "free-claim":
				proxy.armed.Store(true)
				a = startNode4(t, "nats://"+proxy.Addr(), bucket, key, "node-a", "node-a", h, true, opts...)
				b = startNode4(t, url, bucket, key, "node-b", "node-b", h, true, opts...)
			case "renewal", "blank":
				a = startNode4(t, "nats://"+proxy.Addr(), bucket, key, "node-a", "node-a", h, true, opts...)
				a.stopDelay.Store(int64(50 * time.Millisecond))
				waitFor(t, 5*time.Second, "node-a starts its service", a.running)
				b = startNode4(t, url, bucket, key, "node-b", "node-b", h, true, opts...)
				waitFor(t, 5*time.Second, "node-b is standby", func() bool {
					return b.sawEvent(func(e natsputex.Event) bool { return e.Holder == "node-a" })
				})
				time.Sleep(2 * testR)
				if mode == "blank" {
					a.failHC.Store(true)
				}
				proxy.armed.Store(true)
			case "confirmation":
				c = startNode4(t, url, bucket, key, "node-c", "node-c", h, true, opts...)
				waitFor(t, 5*time.Second, "node-c starts its service", c.running)
				a = startNode4(t, "nats://"+proxy.Addr(), bucket, key, "node-a", "node-a", h, true, opts...)
				waitFor(t, 5*time.Second, "node-a is standby", func() bool {
					return a.sawEvent(func(e natsputex.Event) bool { return e.Holder == "node-c" })
				})
				time.Sleep(2 * testR)
				c.kill()
				waitFor(t, 3*time.Second, "node-a confirms", func() bool { return a.sup.Phase() == natsputex.PhaseConfirming })
				proxy.armed.Store(true)
				b = startNode4(t, url, bucket, key, "node-b", "node-b", h, true, opts...)
			}
			agents = append(agents, a, b)
			var fired time.Time
			select {
			case fired = <-proxy.fired:
			case <-time.After(3 * time.Second):
				t.Fatal("node-a wrote nothing to lose the answer of")
			}
			time.Sleep(2 * (T + C*testR))
			waitActive4(t, 5*time.Second, agents...)
			lost := writes.writesAfter(fired.Add(-5 * time.Millisecond))
			if len(lost) == 0 {
				t.Fatal("the watch saw no write after the fault fired")
			}
			t.Logf("the answer to rev %d %q was lost", lost[0].rev, lost[0].value)
			var next keyWrite
			for _, w := range lost[1:] {
				if w.value == "node-a" {
					next = w
					break
				}
			}
			for _, st := range a.getStarts() {
				if st.begin.Before(fired) {
					continue
				}
				t.Logf("node-a started %v after the lost write, %v after its next write (rev %d)", st.begin.Sub(lost[0].created).Round(time.Millisecond), st.begin.Sub(next.created).Round(time.Millisecond), next.rev)
				if next.rev == 0 || st.begin.Sub(next.created) < C*testR-10*time.Millisecond {
					t.Errorf("node-a started %v after its first write since the lost one (rev %d), before C·R = %v", st.begin.Sub(next.created).Round(time.Millisecond), next.rev, C*testR)
				}
			}
			for _, n := range agents {
				checkTakeovers(t, writes, n, T, C*testR)
			}
			for _, n := range agents {
				n.cancel()
				n.wait(5 * time.Second)
			}
			if err := h.Check(); err != nil {
				writes.logAll(t, fired)
				t.Errorf("services overlapped: %v", err)
			}
		})
	}
}

// waitActive4 waits until exactly one of nodes runs its service.
func waitActive4(t *testing.T, within time.Duration, nodes ...*node4) *node4 {
	t.Helper()
	var up *node4
	waitFor(t, within, "one agent active", func() bool {
		up = nil
		for _, n := range nodes {
			if n.running() {
				if up != nil {
					t.Fatalf("%s and %s run at once", up.name, n.name)
				}
				up = n
			}
		}
		return up != nil
	})
	return up
}

// TestAttack4SlowStart: "the renewals go on while Service.Start runs";
// "Start's context ends when the agent's hold would run out. An error
// counts as a failed health check: the agent runs Stop, then blanks the
// key"; Stop "kills (or fences) the service". node-a (R = 100ms, F = 3,
// C = 1, margin 50ms) takes a free key; node-b stands by.
//   - ignores-ctx: Start takes 700ms (> 2T) and ignores its context:
//     node-a's writes go on every R meanwhile, node-b never starts, and
//     Start's context ends no later than T − margin after the call.
//   - honours-ctx: Start waits for its context (which must end within
//     T − margin) and fails: node-a runs Stop, the key is blanked only
//     after Stop returned, node-b starts after that.
//   - hc-fails / stolen: Start takes 200ms honouring its context; as it
//     begins, node-a's health check starts failing (or another token is
//     written in the key): the hold ends while Start runs. A Start that
//     then returns nil has started the service: Stop must come after it,
//     or Start's context must have ended with the hold, so that it does
//     not. The services must never overlap (the model: a service is up
//     from Start's call until a Stop that succeeds returns, and again
//     after a Start that returns nil).
func TestAttack4SlowStart(t *testing.T) {
	const (
		margin = 50 * time.Millisecond
		T      = testF * testR
	)
	for _, mode := range []string{"ignores-ctx", "honours-ctx", "hc-fails", "stolen"} {
		t.Run(mode, func(t *testing.T) {
			url, bucket, key := atk4Env(t)
			writes := watchWrites(t, url, bucket, key)
			kv := mustBucket(t, url, bucket)
			h := contracttest.NewHistory(1)
			opts := []natsputex.Option{natsputex.WithSafetyMargin(margin)}
			a := startNode4(t, url, bucket, key, "node-a", "node-a", h, false, opts...)
			a.stopDelay.Store(int64(50 * time.Millisecond))
			switch mode {
			case "ignores-ctx":
				a.startDelay.Store(int64(700 * time.Millisecond))
			case "honours-ctx":
				a.startDelay.Store(int64(700 * time.Millisecond))
				a.startHonoursCtx.Store(true)
			case "hc-fails", "stolen":
				a.startDelay.Store(int64(200 * time.Millisecond))
				a.startHonoursCtx.Store(true)
				var once sync.Once
				f := func() {
					once.Do(func() {
						if mode == "hc-fails" {
							a.failHC.Store(true)
							return
						}
						go func() {
							time.Sleep(20 * time.Millisecond)
							if _, err := kv.Put(context.Background(), key, []byte("intruder")); err != nil {
								t.Error(err)
							}
						}()
					})
				}
				a.onStart.Store(&f)
			}
			a.run(a.ctx)
			waitFor(t, 5*time.Second, "node-a's Start is called", func() bool {
				a.mu.Lock()
				defer a.mu.Unlock()
				return a.exit != nil || len(a.starts) > 0
			})
			b := startNode4(t, url, bucket, key, "node-b", "node-b", h, true, opts...)
			waitFor(t, 3*time.Second, "node-a's first Start returns", func() bool { return len(a.getStarts()) > 0 })
			time.Sleep(2*(T+testC*testR) + 200*time.Millisecond)
			st := a.getStarts()[0]
			t.Logf("node-a's Start: context %v long, returned %v after its call (its context: %v): %v", st.left.Round(time.Millisecond), st.end.Sub(st.begin).Round(time.Millisecond), st.ctxErr, st.err)
			for _, sp := range a.getStops() {
				t.Logf("node-a's Stop: %v to %v after its Start began: %v", sp.begin.Sub(st.begin).Round(time.Millisecond), sp.end.Sub(st.begin).Round(time.Millisecond), sp.err)
			}
			if st.left < 0 || st.left > T-margin+5*time.Millisecond {
				t.Errorf("Start's context ends %v after its call, not within the hold (T − margin = %v)", st.left.Round(time.Millisecond), T-margin)
			}
			switch mode {
			case "ignores-ctx":
				prev := time.Time{}
				for _, w := range writes.all() {
					if w.value != "node-a" || w.created.After(st.end) {
						continue
					}
					if !prev.IsZero() && w.created.Sub(prev) > T-margin {
						t.Errorf("node-a's writes during its Start were %v apart (rev %d), beyond T − margin = %v", w.created.Sub(prev).Round(time.Millisecond), w.rev, T-margin)
					}
					prev = w.created
				}
				if d := st.end.Sub(prev); d > T-margin {
					t.Errorf("node-a's last write during its Start was %v before Start returned", d.Round(time.Millisecond))
				}
				if len(b.getStarts()) > 0 {
					t.Errorf("node-b started (%v after node-a's Start began) while node-a held the key", b.getStarts()[0].begin.Sub(st.begin).Round(time.Millisecond))
				}
				if p := a.sup.Phase(); p != natsputex.PhaseActive {
					t.Errorf("node-a is %v after its slow Start succeeded, want active", p)
				}
			case "honours-ctx":
				stop, ok := a.firstStopAfter(st.begin)
				if !ok {
					t.Fatal("node-a did not run Stop after its Start failed")
				}
				bl := writes.blanksAfter(st.begin)
				if len(bl) == 0 {
					t.Error("node-a did not blank the key after its Start failed")
				} else if bl[0].created.Before(stop.end) {
					t.Errorf("the key was blanked %v before node-a's Stop returned", stop.end.Sub(bl[0].created).Round(time.Millisecond))
				}
				if bs := b.getStarts(); len(bs) == 0 {
					t.Error("node-b never started after node-a's Start failed")
				} else if bs[0].begin.Before(stop.end) {
					t.Errorf("node-b started %v before node-a's Stop returned", stop.end.Sub(bs[0].begin).Round(time.Millisecond))
				}
			}
			a.mu.Lock()
			outlived := append([]time.Time(nil), a.outlived...)
			a.mu.Unlock()
			for _, at := range outlived {
				t.Errorf("node-a's Start returned nil %v after its call, after a Stop had run: its service is up while node-a counts it stopped", at.Sub(st.begin).Round(time.Millisecond))
			}
			a.cancel()
			b.cancel()
			a.wait(5 * time.Second)
			b.wait(5 * time.Second)
			if err := h.Check(); err != nil {
				writes.logAll(t, st.begin)
				t.Errorf("services overlapped: %v", err)
			}
		})
	}
}

// TestAttack4SameTokenRestart: "An agent that does not hold the key may
// find its own token in it: its own last write (its hold ran out, or
// Stop or the blank failed, and no one wrote since) ... It then writes at
// the revision it read and confirms for C intervals as after a takeover.
// Otherwise its own token at a revision it did not write is another
// agent's ... or an earlier run's: it waits for T without a write". C = 3.
//   - new-process: the active node-a crashes (no blank) and a new process
//     with the same token starts at once: it must start no sooner than
//     T + C·R after the crashed one's last write.
//   - rerun-after-failed-stop: node-a's Run ends while its Stop fails (the
//     key keeps its write); Run is called again on the same Supervisor: it
//     must Stop first, and start only C·R after its first new write.
//   - rerun-after-confirming: node-a's Run ends while it confirms a
//     takeover from the crashed node-c; Run again on the same Supervisor:
//     it must start no sooner than T + C·R after node-c's last write and
//     C·R after its first new write.
//
// node-b stands by throughout; the services never overlap.
func TestAttack4SameTokenRestart(t *testing.T) {
	const (
		C = 3
		T = testF * testR
	)
	opts := []natsputex.Option{natsputex.WithConfirmations(C)}
	t.Run("new-process", func(t *testing.T) {
		url, bucket, key := atk4Env(t)
		writes := watchWrites(t, url, bucket, key)
		h := contracttest.NewHistory(1)
		a := startNode4(t, url, bucket, key, "node-a", "node-a", h, true, opts...)
		waitFor(t, 5*time.Second, "node-a starts its service", a.running)
		b := startNode4(t, url, bucket, key, "node-b", "node-b", h, true, opts...)
		time.Sleep(3 * testR)
		a.kill()
		killed := time.Now()
		a2 := startNode4(t, url, bucket, key, "node-a2", "node-a", h, true, opts...)
		up := waitActive4(t, 5*time.Second, a2, b)
		last, _ := writes.lastBy("node-a", killed)
		st := up.getStarts()[0].begin
		t.Logf("%s started %v after the crashed node-a's last write (rev %d); T + C·R = %v", up.name, st.Sub(last.created).Round(time.Millisecond), last.rev, T+C*testR)
		if d := st.Sub(last.created); d < T+C*testR {
			t.Errorf("%s started %v after the crashed node-a's last write, before T + C·R = %v", up.name, d.Round(time.Millisecond), T+C*testR)
		}
		time.Sleep(T)
		for _, n := range []*node4{a2, b} {
			n.cancel()
			n.wait(5 * time.Second)
		}
		if err := h.Check(); err != nil {
			t.Errorf("services overlapped: %v", err)
		}
	})
	t.Run("rerun-after-failed-stop", func(t *testing.T) {
		url, bucket, key := atk4Env(t)
		writes := watchWrites(t, url, bucket, key)
		h := contracttest.NewHistory(1)
		a := startNode4(t, url, bucket, key, "node-a", "node-a", h, true, opts...)
		waitFor(t, 5*time.Second, "node-a starts its service", a.running)
		b := startNode4(t, url, bucket, key, "node-b", "node-b", h, true, opts...)
		time.Sleep(3 * testR)
		a.failStop.Store(true)
		a.cancel()
		err, ok := a.wait(5 * time.Second)
		t.Logf("Run returned (%t) with its Stop failing: %v", ok, err)
		if !errors.Is(err, natsputex.ErrStopFailed) {
			t.Errorf("Run = %v, want an error matching ErrStopFailed", err)
		}
		if bl := writes.blanksAfter(time.Time{}); len(bl) > 0 {
			t.Errorf("the key was blanked (rev %d) though Stop failed", bl[0].rev)
		}
		a.failStop.Store(false)
		rerun := time.Now()
		nStops := len(a.getStops())
		a.mu.Lock()
		a.runDone = make(chan error, 1)
		a.mu.Unlock()
		ctx, cancel := context.WithCancel(context.Background())
		a.cancel = cancel
		a.run(ctx)
		waitFor(t, 2*time.Second, "the new Run stops the service", func() bool { return len(a.getStops()) > nStops })
		up := waitActive4(t, 5*time.Second, a, b)
		time.Sleep(T)
		stops := a.getStops()
		if len(stops) == nStops || stops[nStops].err != nil {
			t.Error("the new Run did not begin with a Stop that succeeded")
		}
		if up == a {
			var st time.Time
			for _, s := range a.getStarts() {
				if s.begin.After(rerun) {
					st = s.begin
					break
				}
			}
			if st.IsZero() {
				t.Fatal("node-a runs but did not start again")
			}
			ws := writes.writesAfter(rerun)
			if len(ws) == 0 || ws[0].value != "node-a" {
				t.Fatalf("node-a started without writing first: %v", ws)
			}
			t.Logf("node-a started %v after its first write (rev %d) of the new Run (C·R = %v)", st.Sub(ws[0].created).Round(time.Millisecond), ws[0].rev, C*testR)
			if d := st.Sub(ws[0].created); d < C*testR-10*time.Millisecond {
				t.Errorf("node-a started %v after its first write of the new Run, before C·R = %v", d.Round(time.Millisecond), C*testR)
			}
		}
		for _, n := range []*node4{a, b} {
			n.cancel()
			n.wait(5 * time.Second)
		}
		if err := h.Check(); err != nil {
			t.Errorf("services overlapped: %v", err)
		}
	})
	t.Run("rerun-after-confirming", func(t *testing.T) {
		url, bucket, key := atk4Env(t)
		writes := watchWrites(t, url, bucket, key)
		h := contracttest.NewHistory(1)
		c := startNode4(t, url, bucket, key, "node-c", "node-c", h, true, opts...)
		waitFor(t, 5*time.Second, "node-c starts its service", c.running)
		a := startNode4(t, url, bucket, key, "node-a", "node-a", h, true, opts...)
		waitFor(t, 5*time.Second, "node-a is standby", func() bool {
			return a.sawEvent(func(e natsputex.Event) bool { return e.Holder == "node-c" })
		})
		time.Sleep(2 * testR)
		c.kill()
		killed := time.Now()
		waitFor(t, 3*time.Second, "node-a confirms", func() bool { return a.sup.Phase() == natsputex.PhaseConfirming })
		b := startNode4(t, url, bucket, key, "node-b", "node-b", h, true, opts...)
		time.Sleep(testR)
		a.cancel()
		err, _ := a.wait(5 * time.Second)
		t.Logf("Run returned while confirming: %v", err)
		rerun := time.Now()
		a.mu.Lock()
		a.runDone = make(chan error, 1)
		a.mu.Unlock()
		ctx, cancel := context.WithCancel(context.Background())
		a.cancel = cancel
		a.run(ctx)
		up := waitActive4(t, 5*time.Second, a, b)
		time.Sleep(T)
		last, _ := writes.lastBy("node-c", killed)
		st := up.getStarts()[0].begin
		t.Logf("%s started %v after node-c's last write (T + C·R = %v)", up.name, st.Sub(last.created).Round(time.Millisecond), T+C*testR)
		if d := st.Sub(last.created); d < T+C*testR {
			t.Errorf("%s started %v after the crashed node-c's last write, before T + C·R = %v", up.name, d.Round(time.Millisecond), T+C*testR)
		}
		if up == a {
			ws := writes.writesAfter(rerun)
			if len(ws) > 0 && ws[0].value == "node-a" {
				t.Logf("node-a started %v after its first write (rev %d) of the new Run (C·R = %v)", st.Sub(ws[0].created).Round(time.Millisecond), ws[0].rev, C*testR)
				if d := st.Sub(ws[0].created); d < C*testR-10*time.Millisecond {
					t.Errorf("node-a started %v after its first write of the new Run, before C·R = %v", d.Round(time.Millisecond), C*testR)
				}
			}
		}
		for _, n := range []*node4{a, b} {
			n.cancel()
			n.wait(5 * time.Second)
		}
		if err := h.Check(); err != nil {
			t.Errorf("services overlapped: %v", err)
		}
	})
}

// TestAttack4MixedChurn: "Supervisors on one key with different R, F or C
// (a rolling change) ... keep these bounds", and "a call waits for the
// longer of its own T and the T its holder's value carries, and confirms
// for the longer of its own C·R and the holder's (a Supervisor's value
// carries it)". Three Supervisors with different timing (R/F/C
// 100ms/3/1, 50ms/4/4, 150ms/2/2), each with a Stop of 60ms, and a Locker
// (R = 60ms, F = 2, C = 0) looping Lock (hold 150ms) on the same key, for
// about 10s; every 1.2s the agent whose service runs is killed (no Stop,
// no blank) or shut down (Stop, blank), alternately, and replaced by a
// new agent with its timing and a new token. No two sections (services or
// Locker leases) may overlap, and each section's fencing token must be
// above every earlier section's.
func TestAttack4MixedChurn(t *testing.T) {
	url, bucket, key := atk4Env(t)
	writes := watchWrites(t, url, bucket, key)
	h := contracttest.NewHistory(1)
	timings := [][]natsputex.Option{
		{natsputex.WithRenewInterval(100 * time.Millisecond), natsputex.WithFailureThreshold(3), natsputex.WithConfirmations(1)},
		{natsputex.WithRenewInterval(50 * time.Millisecond), natsputex.WithFailureThreshold(4), natsputex.WithConfirmations(4)},
		{natsputex.WithRenewInterval(150 * time.Millisecond), natsputex.WithFailureThreshold(2), natsputex.WithConfirmations(2)},
	}
	var mu sync.Mutex
	var nodes []*node4
	gen := 0
	spawn := func(slot int) *node4 {
		gen++
		name := fmt.Sprintf("node%d-%d", slot, gen)
		n := startNode4(t, url, bucket, key, name, name, h, true, timings[slot]...)
		n.stopDelay.Store(int64(60 * time.Millisecond))
		mu.Lock()
		nodes = append(nodes, n)
		mu.Unlock()
		return n
	}
	live := []*node4{spawn(0), spawn(1), spawn(2)}
	locker := newTestClient(t, url, bucket, natsputex.WithHolderID("locker"),
		natsputex.WithRenewInterval(60*time.Millisecond), natsputex.WithFailureThreshold(2), natsputex.WithConfirmations(0))
	ctx, cancel := context.WithCancel(context.Background())
	var lockerSpans []call4
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for ctx.Err() == nil {
			lctx, lcancel := context.WithTimeout(ctx, 3*time.Second)
			l, err := locker.Locker().Lock(lctx, key)
			lcancel()
			if err != nil {
				continue
			}
			begin := time.Now()
			exit := sync.OnceFunc(h.Enter("locker", l.Token()))
			stop := context.AfterFunc(l.Context(), exit)
			_ = sleepCtx(l.Context(), 150*time.Millisecond)
			stop()
			exit()
			_ = l.Release(context.Background())
			mu.Lock()
			lockerSpans = append(lockerSpans, call4{token: l.Token(), begin: begin, end: time.Now()})
			mu.Unlock()
			_ = sleepCtx(ctx, 200*time.Millisecond)
		}
	}()
	kills := 0
	for i := 0; i < 8; i++ {
		time.Sleep(1200 * time.Millisecond)
		for slot, n := range live {
			if !n.running() {
				continue
			}
			if i%2 == 0 {
				n.kill()
				kills++
			} else {
				n.cancel()
				n.wait(5 * time.Second)
			}
			time.Sleep(100 * time.Millisecond)
			live[slot] = spawn(slot)
			break
		}
	}
	cancel()
	wg.Wait()
	for _, n := range live {
		n.cancel()
		n.wait(5 * time.Second)
	}
	mu.Lock()
	defer mu.Unlock()
	type sec struct {
		who   string
		token uint64
		at    time.Time
	}
	var secs []sec
	for _, n := range nodes {
		for _, st := range n.getStarts() {
			secs = append(secs, sec{n.name, st.token, st.begin})
		}
	}
	for _, ls := range lockerSpans {
		secs = append(secs, sec{"locker", ls.token, ls.begin})
	}
	slices.SortFunc(secs, func(a, b sec) int { return a.at.Compare(b.at) })
	var maxTok uint64
	var maxWho string
	for _, s := range secs {
		if s.token <= maxTok && !(s.who == maxWho && s.token == maxTok) {
			t.Errorf("%s's section at %v has token %d, not above %s's %d before it", s.who, s.at.Format("15:04:05.000"), s.token, maxWho, maxTok)
		}
		if s.token > maxTok {
			maxTok, maxWho = s.token, s.who
		}
	}
	t.Logf("%d sections (%d of the Locker), %d agents, %d killed, %d writes", len(secs), len(lockerSpans), len(nodes), kills, len(writes.all()))
	if len(secs) < 8 {
		t.Errorf("only %d sections in 10s", len(secs))
	}
	if err := h.Check(); err != nil {
		t.Errorf("sections overlapped: %v", err)
	}
}

// TestAttack4LateAnswers: "a lease whose validity deadline has passed
// stays ended (a late renewal no longer revives it)": "A holder that
// cannot renew ends its lease by itself at the start of its last
// successful write plus T minus a safety margin". One Client behind a
// proxy (R = 100ms, F = 3, C = 2, margin 50ms: T − margin = 250ms) holds a
// Locker lease on "job" and runs an active Supervisor; another client
// waits in Lock on "job" (looping) and node-b stands by on the
// Supervisor's key. The proxy delays every answer by 150ms, 240ms, 300ms,
// then 450ms, 1.5s each. The Locker lease must never be live past its
// Deadline; "job" never granted twice at once; the services never
// overlap; and whenever node-a starts again it has either taken a blank
// key or confirmed C·R after its first write since it last stopped.
func TestAttack4LateAnswers(t *testing.T) {
	const (
		C      = 2
		margin = 50 * time.Millisecond
	)
	url, bucket, key := atk4Env(t)
	writes := watchWrites(t, url, bucket, key)
	proxy := testenv.NewProxy(t, strings.TrimPrefix(url, "nats://"))
	h := contracttest.NewHistory(1)
	opts := []natsputex.Option{natsputex.WithConfirmations(C), natsputex.WithSafetyMargin(margin)}
	a := startNode4(t, "nats://"+proxy.Addr(), bucket, key, "node-a", "node-a", h, true, append(opts, natsputex.WithHolderID("client-a"))...)
	a.stopDelay.Store(int64(30 * time.Millisecond))
	waitFor(t, 5*time.Second, "node-a starts its service", a.running)
	b := startNode4(t, url, bucket, key, "node-b", "node-b", h, true, opts...)
	v := watchValidity(t)
	g := newGrants()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	l, err := a.c.Locker().TryLock(ctx, "job")
	if err != nil {
		t.Fatal(err)
	}
	v.add("client-a job", l)
	g.grant("client-a", l)
	waiter := newTestClient(t, url, bucket, natsputex.WithHolderID("waiter"))
	loopCtx, stopLoops := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for loopCtx.Err() == nil {
			l, err := waiter.Locker().Lock(loopCtx, "job")
			if err != nil {
				continue
			}
			g.grant("waiter", l)
			_ = sleepCtx(loopCtx, 100*time.Millisecond)
			_ = l.Release(context.Background())
			// client-a takes it back when it can.
			if l2, err := a.c.Locker().TryLock(loopCtx, "job"); err == nil {
				v.add("client-a job", l2)
				g.grant("client-a", l2)
			}
		}
	}()
	time.Sleep(3 * testR)
	faultAt := time.Now()
	for _, d := range []time.Duration{150 * time.Millisecond, 240 * time.Millisecond, 300 * time.Millisecond, 450 * time.Millisecond} {
		proxy.DelayReplies(d)
		time.Sleep(1500 * time.Millisecond)
	}
	proxy.Restore()
	time.Sleep(time.Second)
	stopLoops()
	wg.Wait()
	a.cancel()
	b.cancel()
	a.wait(5 * time.Second)
	b.wait(5 * time.Second)
	v.check(t)
	g.check(t)
	all := writes.all()
	stops := a.getStops()
	for _, st := range a.getStarts() {
		if st.begin.Before(faultAt) {
			continue
		}
		var lastStop time.Time
		for _, sp := range stops {
			if sp.begin.Before(st.begin) {
				lastStop = sp.begin
			}
		}
		first := -1
		for i, w := range all {
			if w.created.After(lastStop) && w.value == "node-a" {
				first = i
				break
			}
		}
		if first < 0 {
			t.Errorf("node-a started at %v without a write since its last Stop", st.begin.Format("15:04:05.000"))
			continue
		}
		free := first == 0 || all[first-1].value == ""
		t.Logf("node-a started %v after its first write (rev %d) since its last Stop; it took a free key: %t", st.begin.Sub(all[first].created).Round(time.Millisecond), all[first].rev, free)
		if !free && st.begin.Sub(all[first].created) < C*testR-10*time.Millisecond {
			t.Errorf("node-a started %v after its first write since it last stopped (rev %d, over %q), before C·R = %v",
				st.begin.Sub(all[first].created).Round(time.Millisecond), all[first].rev, all[first-1].value, C*testR)
		}
	}
	a.mu.Lock()
	t.Logf("node-a: %d starts, %d stops; node-b: %d starts", len(a.starts), len(a.stops), len(b.getStarts()))
	a.mu.Unlock()
	if err := h.Check(); err != nil {
		t.Errorf("services overlapped: %v", err)
	}
}

// TestAttack4NatslockPausedWhileConfirming: natslock with -r 100ms -f 3
// -c 5 (T = 300ms, C·R = 500ms). node-a, active behind a proxy, is cut off;
// a standby takes its key over and, while it confirms, is paused with
// SIGSTOP for 1.2s, then resumed. "it starts the service only once C
// intervals (C·R) have passed since the start of its first write of the
// hold that it saw succeed, every write since having succeeded too":
//   - alone: the paused node is the only standby; resumed, it must write
//     (successfully) before it starts, and start no sooner than C·R after
//     its takeover write;
//   - with-rival: node-c takes the key over from the paused node (T of
//     silence, then C·R); resumed, the paused node must not start at all.
//
// The services (as their commands timed them) never overlap.
func TestAttack4NatslockPausedWhileConfirming(t *testing.T) {
	requireNanoDate(t)
	if testing.Short() {
		t.Skip("builds and runs natslock")
	}
	bin := buildNatslock(t)
	const CR = 500 * time.Millisecond
	for _, rival := range []bool{false, true} {
		t.Run(map[bool]string{false: "alone", true: "with-rival"}[rival], func(t *testing.T) {
			url, bucket, key := atk4Env(t)
			writes := watchWrites(t, url, bucket, key)
			proxy := testenv.NewProxy(t, strings.TrimPrefix(url, "nats://"))
			flags := []string{"-r", "100ms", "-f", "3", "-c", "5"}
			a := startNatslock(t, bin, "nats://"+proxy.Addr(), bucket, key, "node-a", flags...)
			waitFor(t, 10*time.Second, "node-a starts its service", func() bool { return a.lastState() == "start" })
			b := startNatslock(t, bin, url, bucket, key, "node-b", flags...)
			waitFor(t, 10*time.Second, "node-b is standby", func() bool { return strings.Contains(b.logs(), "standby: the key is held") })
			time.Sleep(300 * time.Millisecond)
			proxy.BlackHole()
			waitFor(t, 5*time.Second, "node-b takes the key over", func() bool { _, ok := writes.firstBy("node-b"); return ok })
			time.Sleep(100 * time.Millisecond)
			if err := b.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
				t.Fatal(err)
			}
			paused := time.Now()
			var c *lockProc
			if rival {
				c = startNatslock(t, bin, url, bucket, key, "node-c", flags...)
			}
			time.Sleep(1200 * time.Millisecond)
			if b.lastState() == "start" {
				t.Fatalf("node-b started its service before it was paused, %v after its first write", CR)
			}
			resumed := time.Now()
			_ = b.cmd.Process.Signal(syscall.SIGCONT)
			t.Logf("node-b paused %v while confirming", resumed.Sub(paused).Round(time.Millisecond))
			procs := []*lockProc{a, b}
			if rival {
				procs = append(procs, c)
				waitFor(t, 5*time.Second, "node-c starts its service", func() bool { return c.lastState() == "start" })
				time.Sleep(time.Second)
				if e := b.last(t, "start"); !e.at.IsZero() {
					t.Errorf("node-b started its service %v after it resumed, though node-c took the key over meanwhile", e.at.Sub(resumed).Round(time.Millisecond))
				}
			} else {
				waitFor(t, 5*time.Second, "node-b starts its service", func() bool { return b.lastState() == "start" })
				st := b.last(t, "start").at
				ws := writes.writesAfter(resumed)
				var first keyWrite
				for _, w := range ws {
					if w.value == "node-b" {
						first = w
						break
					}
				}
				t.Logf("node-b started %v after it resumed, %v after its first write since (rev %d)", st.Sub(resumed).Round(time.Millisecond), st.Sub(first.created).Round(time.Millisecond), first.rev)
				// It does not wait C·R again (seen: it starts ~5ms after its
				// first write since it resumed): the docs' rule is met, as
				// C·R passed since the takeover write and every write since
				// succeeded; what it must not do is start on its pre-pause
				// writes alone, nor sooner than C·R after the takeover.
				takeover, _ := writes.firstBy("node-b")
				if first.rev == 0 || st.Before(first.created) {
					t.Errorf("node-b started its service %v after it resumed, before any write of its own succeeded since", st.Sub(resumed).Round(time.Millisecond))
				}
				if st.Before(takeover.created.Add(CR - 10*time.Millisecond)) {
					t.Errorf("node-b started its service %v after its takeover write, before C·R = %v", st.Sub(takeover.created).Round(time.Millisecond), CR)
				}
			}
			proxy.Restore()
			checkNoOverlap(t, procs...)
			if t.Failed() {
				writes.logAll(t, paused)
			}
		})
	}
}

// TestAttack4ClusterLeaderRestart: on an embedded 3-node cluster with an
// R3 bucket (R = 100ms, F = 3, C = 2), the node leading the bucket's
// stream is restarted twice: while node-a is active and its client also
// holds a Locker lease ("job") renewed in the same rounds (mid-renewal),
// then right before a standby takes over from the crashed active agent
// (mid-takeover). The Locker lease must never be live past its Deadline,
// the services never overlap, and every takeover comes T after another
// token's last write and starts C·R after its own first write.
func TestAttack4ClusterLeaderRestart(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a 3-node cluster")
	}
	const (
		C = 2
		T = testF * testR
	)
	ignore := goleak.IgnoreCurrent()
	t.Cleanup(func() { goleak.VerifyNone(t, append(natsenv.ConsumerGoroutines(), ignore)...) })
	cluster := natsenv.StartCluster(t, 3)
	urls := cluster.URLs()
	bucket := uniqueBucket("atk4cluster")
	prepareBucket(t, urls, bucket, natsputex.WithReplicas(3))
	const key = "spof-service"
	writes := watchWrites(t, urls, bucket, key)
	h := contracttest.NewHistory(1)
	opts := []natsputex.Option{natsputex.WithConfirmations(C)}
	servers := cluster.Servers()
	nodes := []*node4{}
	for i, name := range []string{"node-a", "node-b", "node-c"} {
		n := startNode4(t, servers[i].URL(), bucket, key, name, name, h, true, append(opts, natsputex.WithHolderID("client-"+name))...)
		n.stopDelay.Store(int64(30 * time.Millisecond))
		nodes = append(nodes, n)
	}
	active := waitActive4(t, 10*time.Second, nodes...)
	v := watchValidity(t)
	l, err := active.c.Locker().TryLock(context.Background(), "job")
	if err != nil {
		t.Fatal(err)
	}
	v.add(active.name+" job", l)
	time.Sleep(5 * testR)

	// Mid-renewal.
	leader := bucketLeader(t, urls, bucket, servers, -1)
	began := time.Now()
	if err := cluster.Restart(leader); err != nil {
		t.Fatal(err)
	}
	up := waitActive4(t, 30*time.Second, nodes...)
	t.Logf("mid-renewal: restarted the stream leader %s in %v; %s runs %v after it began; the Locker lease: %v",
		servers[leader].Name(), time.Since(began).Round(time.Millisecond), up.name, time.Since(began).Round(time.Millisecond), context.Cause(l.Context()))
	time.Sleep(5 * testR)

	// Mid-takeover.
	up = waitActive4(t, 10*time.Second, nodes...)
	leader = bucketLeader(t, urls, bucket, servers, -1)
	up.kill()
	last, _ := writes.lastBy(up.name, time.Now())
	time.Sleep(time.Until(last.seen.Add(T - 50*time.Millisecond)))
	began = time.Now()
	if err := cluster.Restart(leader); err != nil {
		t.Fatal(err)
	}
	var rest []*node4
	for _, n := range nodes {
		if n != up {
			rest = append(rest, n)
		}
	}
	next := waitActive4(t, 30*time.Second, rest...)
	t.Logf("mid-takeover: %s crashed; restarted the stream leader %s; %s runs %v after the restart began", up.name, servers[leader].Name(), next.name, time.Since(began).Round(time.Millisecond))
	time.Sleep(5 * testR)
	for _, n := range nodes {
		n.cancel()
	}
	for _, n := range nodes {
		n.wait(10 * time.Second)
	}
	_ = l.Release(context.Background())
	v.check(t)
	for _, n := range nodes {
		checkTakeovers(t, writes, n, T, C*testR)
	}
	if err := h.Check(); err != nil {
		t.Errorf("services overlapped: %v", err)
	}
}
