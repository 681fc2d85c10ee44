package natsputex_test

// The regression table: scenarios that exist because a specific finding
// was made, each a named entry (the finding it guards, the promise it
// checks) run by one driver, TestRegressions. Tests of a promise in
// general stay in their topic's file.

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/latchkey-go/latchkey/contracttest"
	"github.com/latchkey-go/latchkey/contracttest/testenv/natsenv"
	"github.com/latchkey-go/latchkey/locks"
	"github.com/latchkey-go/latchkey/locks/driver"
	"github.com/latchkey-go/latchkey/natsputex"
)

// regression is one scenario of the regression table.
type regression struct {
	name    string
	finding string // what was found, the defect the scenario guards against
	promise string // the promise it checks, in the docs' words
	run     func(t *testing.T)
}

var regressions = []regression{
	{
		name:    "close-short-ctx-still-blanks-keys",
		finding: "Close's releases ran with the caller's ctx: when it ended the background blanks were cancelled, so every waiter paid T + C·R of silence (20 of 20 keys still held 700ms after the replies came back)",
		promise: "Client.Close: Every wait is bounded by ctx: when ctx ends first, Close returns an error matching ctx.Err() and the rest finishes in the background",
		run:     closeWithShortContextStillBlanksKeys,
	},
	{
		name:    "close-under-running-supervisor",
		finding: "Close returned at once without waiting for a running Supervisor; once the connection was closed too, Run took 5.3s to return (T = 300ms), its watch's stop waiting up to 5s",
		promise: "Client.Close is bounded by its ctx; Run returns, matching ErrClosed, with the service stopped",
		run:     closeUnderRunningSupervisorIsBounded,
	},
	{
		name:    "health-check-failure-ends-many-leases-at-once",
		finding: "the blanks after a failed health check ran one after the other, each lease ended only just before its own blank: 10 blanks over 2.3s, leases past the first ended at their validity deadline",
		promise: "a failed health check ends every lease of the Client at once, then clears their keys",
		run:     healthCheckFailureEndsManyLeasesAtOnce,
	},
	{
		name:    "unprintable-holder-ids-and-tokens",
		finding: "U+2028, U+2029, zero-width and byte-order-mark characters were accepted by WithHolderID and CheckSupervisor and written into the key",
		promise: "holder ids (WithHolderID) and Supervisor tokens must be printable, else ErrInvalidOption",
		run:     unprintableHolderIDsAndTokensRefused,
	},
	{
		name:    "bucket-with-short-ttl",
		finding: "a bucket made beforehand with a TTL shorter than R aged the holder's key out between two renewals, and another client's TryLock took it while the lease was live; New said nothing about the TTL",
		promise: "New refuses an existing bucket that drops a key's last write by itself (a TTL shorter than T + C·R, or a stream discarding its oldest messages)",
		run:     newRefusesBucketWithShortTTL,
	},
	{
		name:    "timing-key-taken-by-locker",
		finding: "a Supervisor's timing was advertised in an ordinary key of the bucket, which a Locker could lock and overwrite; a standby with a shorter T then started while the active agent ran (~235ms of overlap)",
		promise: "an agent's timing is in the supervised key's own value: at most one runs the service at a time whatever else holds the bucket's other keys",
		run:     timingLivesInTheSupervisedKey,
	},
	{
		name:    "duplicate-token-timing",
		finding: "two agents given the same token shared one timing key: the second's T = 100ms overwrote the active one's 1.2s, and it started while the active agent ran (~200ms of overlap)",
		promise: "two agents given the same token by mistake do not both hold the key; a rolling change of timing is safe",
		run:     duplicateTokenKeepsActiveTiming,
	},
}

// TestRegressions runs the regression table.
func TestRegressions(t *testing.T) {
	for _, r := range regressions {
		t.Run(r.name, func(t *testing.T) {
			t.Logf("guards: %s", r.finding)
			t.Logf("promise: %s", r.promise)
			r.run(t)
		})
	}
}

// closeWithShortContextStillBlanksKeys: a Client with 20 leases whose replies
// are held for 600ms is closed with a 50ms context while its renewals
// run. Close must return within its context (plus slack) with an error
// matching context.DeadlineExceeded, every lease must have ended by then
// with a cause matching ErrLost and ErrClosed, later calls must fail with
// ErrClosed; a waiter of another client must still get every key, never
// while the closed client's lease is live.
func closeWithShortContextStillBlanksKeys(t *testing.T) {
	url, bucket := promiseEnv(t, "close")
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
		t.Errorf("%d of %d keys never blanked after Close(ctx) returned on its deadline (\"the rest finishes in the background\")", len(held), len(names))
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

// closeUnderRunningSupervisorIsBounded: an active Supervisor's Client,
// whose replies are delayed 500ms, is closed with a 30ms context. Close
// must return within its context (plus slack); Run must return, matching
// ErrClosed, with the service stopped; a Locker waiting on the key must
// get it, never while the service runs.
func closeUnderRunningSupervisorIsBounded(t *testing.T) {
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
			t.Errorf("Run returned %v after Close, beyond %v (its watch's stop waits up to 5s)", d.Round(time.Millisecond), runBound)
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

// healthCheckFailureEndsManyLeasesAtOnce: a Client holds 10 leases; its health
// check fails once. "a failure ends every one of them at once, then
// clears their keys": waiters on a direct connection, one per name, must
// each get its key only after the holder's lease on it ended (the holder's
// blanks and their answers are delayed 100ms each way by its proxy), and
// soon, well before T + C·R of silence.
func healthCheckFailureEndsManyLeasesAtOnce(t *testing.T) {
	url, bucket := promiseEnv(t, "hc")
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
		t.Errorf("the holder's last lease ended %v after the failed health check, not at once", lastEnd.Round(time.Millisecond))
	}
	var worst time.Duration
	for _, d := range took {
		worst = max(worst, d)
	}
	t.Logf("after the failed check, the slowest waiter got its key in %v", worst.Round(time.Millisecond))
	// T + C·R of silence would be 400ms; the blanks come back sooner.
	if worst > 1200*time.Millisecond {
		t.Errorf("a waiter took %v after the failed health check: the keys were blanked one at a time", worst.Round(time.Millisecond))
	}
	for _, g := range gs {
		g.check(t)
	}
}

// unprintableHolderIDsAndTokensRefused: WithHolderID: "It must be non-empty and
// printable"; Client.Supervisor: "an empty or unprintable token one
// matching locks.ErrInvalidOption". Unicode's line and paragraph
// separators, zero-width and byte-order-mark format characters are not
// printable (unicode.IsPrint is false for each, as for the right-to-left
// override U+202E): each must be refused, by New and CheckSupervisor
// alike.
func unprintableHolderIDsAndTokensRefused(t *testing.T) {
	url, bucket := promiseEnv(t, "unprint")
	js := mustJS(t, url)
	bad := []string{"x\u2028y", "x\u2029y", "x\u200by", "x\ufeffy", "x\u202ey"}
	for _, id := range bad {
		c, err := natsputex.New(context.Background(), js, bucket, natsputex.WithHolderID(id))
		if err == nil {
			_ = c.Close(context.Background())
		}
		if !errors.Is(err, locks.ErrInvalidOption) || !strings.Contains(err.Error(), "holder id") {
			t.Errorf("WithHolderID(%q) (unicode.IsPrint false): New returned %v, want ErrInvalidOption", id, err)
		}
		if err := natsputex.CheckSupervisor("b", "k", id); !errors.Is(err, locks.ErrInvalidOption) {
			t.Errorf("CheckSupervisor token %q (unicode.IsPrint false): %v, want ErrInvalidOption", id, err)
		}
	}
}

// newRefusesBucketWithShortTTL: "An existing bucket is used as it is." A bucket
// made beforehand by an operator with a TTL (MaxAge) of 150ms, shorter
// than R = 200ms: the holder's key aged out between two renewals, so the
// key looked missing ("free") and another client's TryLock took it while
// the holder's lease was live. Now New refuses a bucket whose TTL is shorter
// than T + C·R (800ms here), and one whose stream discards its oldest
// messages when full, with an error matching ErrInvalidOption that names
// the bucket and its TTL; a bucket whose TTL is T + C·R is accepted, and
// the TryLock loop never takes the live holder's key.
func newRefusesBucketWithShortTTL(t *testing.T) {
	url := natsenv.StartServer(t).URL()
	nc, js, err := connect(url)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	opts := []natsputex.Option{natsputex.WithRenewInterval(200 * time.Millisecond), natsputex.WithFailureThreshold(3), natsputex.WithConfirmations(1)}
	for _, ttl := range []time.Duration{150 * time.Millisecond, 600 * time.Millisecond, 799 * time.Millisecond} {
		bucket := uniqueBucket("ttl")
		if _, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: bucket, TTL: ttl}); err != nil {
			t.Fatal(err)
		}
		c, err := natsputex.New(ctx, js, bucket, opts...)
		if err == nil {
			_ = c.Close(context.Background())
			t.Fatalf("New accepted bucket %q whose TTL %v is shorter than T + C·R = 800ms", bucket, ttl)
		}
		t.Logf("TTL %v: %v", ttl, err)
		if !errors.Is(err, locks.ErrInvalidOption) || !strings.Contains(err.Error(), bucket) || !strings.Contains(err.Error(), ttl.String()) {
			t.Errorf("New's refusal of a bucket with TTL %v does not match ErrInvalidOption or name the bucket and its TTL: %v", ttl, err)
		}
	}
	// A stream edited to discard its oldest messages when full.
	full := uniqueBucket("discard")
	if _, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: full}); err != nil {
		t.Fatal(err)
	}
	s, err := js.Stream(ctx, "KV_"+full)
	if err != nil {
		t.Fatal(err)
	}
	cfg := s.CachedInfo().Config
	cfg.Discard, cfg.MaxMsgs = jetstream.DiscardOld, 100
	if _, err := js.UpdateStream(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	if c, err := natsputex.New(ctx, js, full, opts...); err == nil {
		_ = c.Close(context.Background())
		t.Errorf("New accepted bucket %q, which discards its oldest messages when full", full)
	} else if !errors.Is(err, locks.ErrInvalidOption) || !strings.Contains(err.Error(), full) {
		t.Errorf("New's refusal of a bucket that discards old messages: %v", err)
	} else {
		t.Logf("discard old: %v", err)
	}

	bucket := uniqueBucket("ttl")
	if _, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: bucket, TTL: 800 * time.Millisecond}); err != nil {
		t.Fatal(err)
	}
	holder := newTestClient(t, url, bucket, opts...)
	other := newTestClient(t, url, bucket, opts...)
	// Rounds: the holder takes the name, another client TryLocks it in a
	// loop for 2s; a grant ends the round.
	for round := range 3 {
		var held locks.Lease
		waitFor(t, 3*time.Second, "the holder takes the name", func() bool {
			l, err := holder.Locker().TryLock(ctx, "job")
			held = l
			return err == nil
		})
		deadline := time.Now().Add(2 * time.Second)
		for time.Now().Before(deadline) {
			l, err := other.Locker().TryLock(ctx, "job")
			if errors.Is(err, locks.ErrNotAcquired) {
				time.Sleep(5 * time.Millisecond)
				continue
			}
			if err != nil {
				t.Fatal(err)
			}
			granted := time.Now()
			live := held.Context().Err() == nil
			select {
			case <-held.Context().Done():
			case <-time.After(2 * time.Second):
			}
			_ = l.Release(context.Background())
			t.Logf("round %d: another client got token %d; the holder (token %d) was live then: %t, for %v more (%v)", round, l.Token(), held.Token(), live,
				time.Since(granted).Round(time.Millisecond), context.Cause(held.Context()))
			if live {
				t.Fatalf("two leases on one name at once: a bucket TTL of T + C·R freed a live holder's key")
			}
			break
		}
		_ = held.Release(context.Background())
	}
}

// timingLivesInTheSupervisedKey: the key in which a Supervisor advertised
// its timing, <key>.natsputex-timing.<hash of its token>, was an ordinary
// key of the bucket, and a Locker could lock a name equal to it and write
// its own token over the advertised timing; a standby with a shorter T (R =
// 50ms, F = 2) then went by its own T and started while the live node-a (R =
// 400ms, F = 3) ran. Now an agent's timing is in the supervised key's own
// value, after its token: no key of the bucket but the supervised one is
// written, and a Locker holding the name the timing key had changes nothing.
func timingLivesInTheSupervisedKey(t *testing.T) {
	url, bucket, key := supervisorEnv(t)
	h := contracttest.NewHistory(1)
	a := startAgent(t, url, bucket, key, "node-a", h, withClientOptions(natsputex.WithRenewInterval(400*time.Millisecond), natsputex.WithFailureThreshold(3), natsputex.WithConfirmations(1)))
	waitFor(t, 5*time.Second, "node-a starts its service", a.running)
	kv := mustBucket(t, url, bucket)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	keys, err := kv.ListKeys(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for k := range keys.Keys() {
		if strings.HasPrefix(k, key+".") {
			t.Errorf("node-a wrote a key of its own besides the supervised key: %s", k)
		}
	}
	e, err := kv.Get(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("the supervised key holds %q", e.Value())
	if !strings.Contains(string(e.Value()), "T=1.2s") {
		t.Errorf("node-a's value does not carry its T = 1.2s: %q", e.Value())
	}
	sum := sha256.Sum256([]byte("node-a"))
	timing := key + ".natsputex-timing." + hex.EncodeToString(sum[:8])
	locker := newTestClient(t, url, bucket).Locker()
	lease, err := locker.TryLock(ctx, timing)
	if err != nil {
		t.Fatal(err)
	}
	defer lease.Release(context.Background())
	b := startAgent(t, url, bucket, key, "node-b", h, withClientOptions(natsputex.WithRenewInterval(50*time.Millisecond), natsputex.WithFailureThreshold(2), natsputex.WithConfirmations(1)))
	time.Sleep(2 * time.Second)
	a.stop()
	b.stop()
	if err := h.Check(); err != nil {
		t.Errorf("two services ran at once: %v", err)
	}
}

// duplicateTokenKeepsActiveTiming: the timing a Supervisor advertised
// was keyed by its token (<key>.natsputex-timing.<hash of token>), so two
// agents given the same token by mistake shared one timing key. node-a
// (token "node-x", R = 400ms, F = 3) is active; agent-2, also "node-x",
// with R = 50ms, F = 2, begins Run (and advertised its T = 100ms over
// node-a's 1.2s); a third agent (token "node-y", R = 50ms, F = 2) then
// read the holder's timing as 100ms. The docs: "two agents given the same
// token by mistake do not both hold the key" and "a rolling change of
// them is safe": no two services may run at once. (Failed before the
// fix: agent-2 started while node-a ran, ~200ms of overlap. Now each
// agent's timing is in the key's value, after its token: agent-2 reads
// node-a's own.)
func duplicateTokenKeepsActiveTiming(t *testing.T) {
	url, bucket, key := supervisorEnv(t)
	h := contracttest.NewHistory(1)
	slow := []natsputex.Option{natsputex.WithRenewInterval(400 * time.Millisecond), natsputex.WithFailureThreshold(3), natsputex.WithConfirmations(1)}
	fast := []natsputex.Option{natsputex.WithRenewInterval(50 * time.Millisecond), natsputex.WithFailureThreshold(2), natsputex.WithConfirmations(1)}
	a := startAgent(t, url, bucket, key, "node-a", h, withToken("node-x"), withClientOptions(slow...))
	waitFor(t, 5*time.Second, "node-a starts its service", a.running)
	b := startAgent(t, url, bucket, key, "agent-2", h, withToken("node-x"), withClientOptions(fast...))
	time.Sleep(200 * time.Millisecond)
	c := startAgent(t, url, bucket, key, "node-y", h, withClientOptions(fast...))
	agents := []*agent{a, b, c}
	// Let them run: each overlap ends by itself (node-a's next renewal
	// fails, or its hold runs out).
	deadline := time.Now().Add(2 * time.Second)
	seen := map[string]bool{}
	for time.Now().Before(deadline) {
		var up []string
		for _, ag := range agents {
			if ag.running() {
				up = append(up, ag.name)
			}
		}
		if len(up) > 1 && !seen[fmt.Sprint(up)] {
			seen[fmt.Sprint(up)] = true
			t.Logf("running at once: %v", up)
		}
		time.Sleep(time.Millisecond)
	}
	for _, ag := range agents {
		ag.stop()
	}
	for _, ag := range agents {
		ag.mu.Lock()
		t.Logf("%s started %d time(s)", ag.name, len(ag.started))
		ag.mu.Unlock()
	}
	if err := h.Check(); err != nil {
		t.Errorf("two services ran at once: %v", err)
	}
}
