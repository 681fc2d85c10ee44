package natsputex_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/latchkey-go/latchkey/contracttest"
	"github.com/latchkey-go/latchkey/contracttest/testenv/natsenv"
	"github.com/latchkey-go/latchkey/locks"
	"github.com/latchkey-go/latchkey/natsputex"
)

// TestAttackMixedTimingTryLock: T = F·R is an option of each client. A
// live, healthy holder with R = 400ms, F = 3 (T = 1.2s) renews every
// 400ms; a TryLock client with R = 50ms, F = 2, C = 1 (T = 100ms) finds
// the key silent for its own T between two renewals. "two leases on one
// name are never granted at once": it must not get the key while the
// holder's lease is live. (Failed before commit 753903a: the TryLock got
// the key 190ms in, the holder's lease lived 210ms more; now a Locker's
// token carries its T.)
func TestAttackMixedTimingTryLock(t *testing.T) {
	url, bucket := promiseEnv(t, "atkmixed")
	holder := newTestClient(t, url, bucket,
		natsputex.WithRenewInterval(400*time.Millisecond), natsputex.WithFailureThreshold(3), natsputex.WithConfirmations(1))
	taker := newTestClient(t, url, bucket,
		natsputex.WithRenewInterval(50*time.Millisecond), natsputex.WithFailureThreshold(2), natsputex.WithConfirmations(1))
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	h := contracttest.NewHistory(1)
	held, err := holder.Locker().TryLock(ctx, "job")
	if err != nil {
		t.Fatal(err)
	}
	exitHolder := h.Enter("holder", held.Token())
	holderEnded := make(chan time.Time, 1)
	go func() { <-held.Context().Done(); exitHolder(); holderEnded <- time.Now() }()
	defer held.Release(context.Background())

	deadline := time.Now().Add(2500 * time.Millisecond)
	for time.Now().Before(deadline) {
		lease, err := taker.Locker().TryLock(ctx, "job")
		if errors.Is(err, locks.ErrNotAcquired) {
			time.Sleep(20 * time.Millisecond)
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		granted := time.Now()
		holderLive := held.Context().Err() == nil
		exit := h.Enter("taker", lease.Token())
		var overlap time.Duration
		select {
		case ended := <-holderEnded:
			if holderLive {
				overlap = ended.Sub(granted)
			}
		case <-time.After(2 * time.Second):
			overlap = -1
		}
		exit()
		_ = lease.Release(context.Background())
		t.Logf("the TryLock client (T = %v) got token %d; the holder (T = %v, token %d) was live then: %t; its lease ended %v later; cause %v",
			taker.TTL(), lease.Token(), holder.TTL(), held.Token(), holderLive, overlap.Round(time.Millisecond), context.Cause(held.Context()))
		if holderLive {
			t.Errorf("a TryLock client with a shorter T took a live holder's key: two leases on one name at once (for %v)", overlap.Round(time.Millisecond))
		}
		if err := h.Check(); err != nil {
			t.Errorf("sections overlapped: %v", err)
		}
		return
	}
	t.Logf("the TryLock client never took the live holder's key in 2.5s")
}

// TestAttackMixedTimingSupervisor: the same with two Supervisors on one
// key (natslock nodes started with different -r/-f): the active node-a has
// R = 400ms, F = 3; the standby node-b R = 50ms, F = 2, C = 1. "a rolling
// change of them is safe": node-b must not start its service while
// node-a's runs. (Failed before commit 1afea34: node-b started 190ms in,
// both ran for 207–217ms; now each agent's timing is in the key's value,
// after its token.)
func TestAttackMixedTimingSupervisor(t *testing.T) {
	url, bucket, key := supervisorEnv(t)
	h := contracttest.NewHistory(1)
	a := startAgentWith(t, url, bucket, key, "node-a", "node-a", h, nil,
		natsputex.WithRenewInterval(400*time.Millisecond), natsputex.WithFailureThreshold(3), natsputex.WithConfirmations(1))
	waitFor(t, 5*time.Second, "node-a starts its service", a.running)
	b := startAgentWith(t, url, bucket, key, "node-b", "node-b", h, nil,
		natsputex.WithRenewInterval(50*time.Millisecond), natsputex.WithFailureThreshold(2), natsputex.WithConfirmations(1))
	deadline := time.Now().Add(2500 * time.Millisecond)
	both := false
	for time.Now().Before(deadline) && !both {
		both = a.running() && b.running()
		time.Sleep(time.Millisecond)
	}
	var overlap time.Duration
	if both {
		overlap = waitFor(t, 2*time.Second, "one of the two stops", func() bool { return !a.running() || !b.running() })
	}
	a.stop()
	b.stop()
	t.Logf("node-a (T = 1.2s) started %d time(s), node-b (T = 100ms) %d time(s); seen running at once: %t, for %v", len(a.started), len(b.started), both, overlap.Round(time.Millisecond))
	if err := h.Check(); err != nil {
		t.Errorf("two services ran at once: %v", err)
	}
}

// TestAttackBucketWithTTL: "An existing bucket is used as it is." A bucket
// made beforehand by an operator with a TTL (MaxAge) of 150ms, shorter
// than R = 200ms: the holder's key aged out between two renewals, so the
// key looked missing ("free") and another client's TryLock took it while
// the holder's lease was live. (Failed before the fix: New said nothing
// about the bucket's TTL.) Now New refuses a bucket whose TTL is shorter
// than T + C·R (800ms here), and one whose stream discards its oldest
// messages when full, with an error matching ErrInvalidOption that names
// the bucket and its TTL; a bucket whose TTL is T + C·R is accepted, and
// the TryLock loop never takes the live holder's key.
func TestAttackBucketWithTTL(t *testing.T) {
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
		bucket := uniqueBucket("atkttl")
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
	full := uniqueBucket("atkdiscard")
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

	bucket := uniqueBucket("atkttl")
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

// TestAttackNatslockMixedFlags: two natslock nodes on one key with
// different -r/-f (node-a -r 400ms -f 3, node-b -r 50ms -f 2), a rolling
// change the usage says is safe. (Failed before commit 1afea34: node-b
// started 196–200ms after node-a and both services ran for ~205ms, by the
// commands' own clocks, 3 runs of 3.)
func TestAttackNatslockMixedFlags(t *testing.T) {
	requireNanoDate(t)
	bin, url, bucket := natslockEnv(t, "atknatslockmixed")
	const key = "spof-service"
	a := startNatslock(t, bin, url, bucket, key, "node-a", "-r", "400ms", "-f", "3")
	waitFor(t, 10*time.Second, "node-a starts its service", func() bool { return a.lastState() == "start" })
	b := startNatslock(t, bin, url, bucket, key, "node-b", "-r", "50ms", "-f", "2")
	time.Sleep(2 * time.Second)
	for _, p := range []*lockProc{a, b} {
		for _, e := range p.events(t) {
			t.Logf("%s %s %s", e.node, e.kind, e.at.Format("15:04:05.000"))
		}
	}
	checkNoOverlap(t, a, b)
}

// TestAttackMixedTimingSemaphore: TestAttackMixedTimingTryLock on a
// Semaphore's slot: a holder of the only slot of "jobs" with R = 400ms,
// F = 3 and a TryAcquire loop with R = 50ms, F = 2 (T = 100ms). "Each
// held by the rules of a lock": the slot is never granted twice at once.
func TestAttackMixedTimingSemaphore(t *testing.T) {
	url, bucket := promiseEnv(t, "atkmixedsem")
	holder := newTestClient(t, url, bucket,
		natsputex.WithRenewInterval(400*time.Millisecond), natsputex.WithFailureThreshold(3), natsputex.WithConfirmations(1))
	taker := newTestClient(t, url, bucket,
		natsputex.WithRenewInterval(50*time.Millisecond), natsputex.WithFailureThreshold(2), natsputex.WithConfirmations(1))
	hs, err := holder.Semaphore(1)
	if err != nil {
		t.Fatal(err)
	}
	ts, err := taker.Semaphore(1)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	held, err := hs.TryAcquire(ctx, "jobs")
	if err != nil {
		t.Fatal(err)
	}
	defer held.Release(context.Background())
	deadline := time.Now().Add(2500 * time.Millisecond)
	for time.Now().Before(deadline) {
		l, err := ts.TryAcquire(ctx, "jobs")
		if errors.Is(err, locks.ErrNotAcquired) {
			time.Sleep(10 * time.Millisecond)
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		live := held.Context().Err() == nil
		_ = l.Release(context.Background())
		t.Logf("the TryAcquire client got token %d; the holder (token %d) was live then: %t", l.Token(), held.Token(), live)
		if live {
			t.Errorf("a TryAcquire client with a shorter T took a live holder's slot: two leases on one slot at once")
		}
		return
	}
	t.Logf("the TryAcquire client never took the live holder's slot in 2.5s")
}

// TestAttackDuplicateTokenMixedTiming: the timing a Supervisor advertised
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
func TestAttackDuplicateTokenMixedTiming(t *testing.T) {
	url, bucket, key := supervisorEnv(t)
	h := contracttest.NewHistory(1)
	slow := []natsputex.Option{natsputex.WithRenewInterval(400 * time.Millisecond), natsputex.WithFailureThreshold(3), natsputex.WithConfirmations(1)}
	fast := []natsputex.Option{natsputex.WithRenewInterval(50 * time.Millisecond), natsputex.WithFailureThreshold(2), natsputex.WithConfirmations(1)}
	a := startAgentWith(t, url, bucket, key, "node-a", "node-x", h, nil, slow...)
	waitFor(t, 5*time.Second, "node-a starts its service", a.running)
	b := startAgentWith(t, url, bucket, key, "agent-2", "node-x", h, nil, fast...)
	time.Sleep(200 * time.Millisecond)
	c := startAgentWith(t, url, bucket, key, "node-y", "node-y", h, nil, fast...)
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

// TestAttackTimingKeyTakenByLocker: the key in which a Supervisor
// advertised its timing, <key>.natsputex-timing.<hash of its token>, was
// an ordinary key of the bucket, and a Locker could lock a name equal to
// it and write its own token over the advertised timing; a standby with
// a shorter T (R = 50ms, F = 2) then went by its own T and started while
// the live node-a (R = 400ms, F = 3) ran (failed before the fix: ~235ms
// of overlap). Now an agent's timing is in the supervised key's own value,
// after its token: no key of the bucket but the supervised one is
// written, and a Locker holding the name the timing key had changes
// nothing.
func TestAttackTimingKeyTakenByLocker(t *testing.T) {
	url, bucket, key := supervisorEnv(t)
	h := contracttest.NewHistory(1)
	a := startAgentWith(t, url, bucket, key, "node-a", "node-a", h, nil,
		natsputex.WithRenewInterval(400*time.Millisecond), natsputex.WithFailureThreshold(3), natsputex.WithConfirmations(1))
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
	b := startAgentWith(t, url, bucket, key, "node-b", "node-b", h, nil,
		natsputex.WithRenewInterval(50*time.Millisecond), natsputex.WithFailureThreshold(2), natsputex.WithConfirmations(1))
	time.Sleep(2 * time.Second)
	a.stop()
	b.stop()
	if err := h.Check(); err != nil {
		t.Errorf("two services ran at once: %v", err)
	}
}

// TestAttackTimingLostWithMemoryBucket: a memory-stored bucket
// (WithStorage) is lost when its server restarts ("a memory-stored bucket
// whose servers all restarted counts from 1 again"), and New on any
// client makes it again, empty, while the agents keep running. node-a
// (R = 400ms, F = 3) takes the key again (node-b's health check fails
// meanwhile); node-b (R = 50ms, F = 2), healthy again, and node-c, started
// after the bucket was lost, must wait for node-a's T, and node-b and
// node-c for each other's. (Failed before the fix: agents advertised
// their timing in keys of their own, lost with the bucket, and node-a did
// not advertise again, so node-b and node-c went by their own T; and the
// waiters' silence clocks ignored the new bucket's revisions, lower than
// the old ones, as stale, so node-b took node-c's key 3–40ms after its
// write. Now the timing is in the supervised key's value, and a clock
// restarts on any change of revision.)
func TestAttackTimingLostWithMemoryBucket(t *testing.T) {
	for _, C := range []int{1, 0} {
		t.Run(fmt.Sprintf("C=%d", C), func(t *testing.T) { timingLostWithMemoryBucket(t, C) })
	}
}

func timingLostWithMemoryBucket(t *testing.T, C int) {
	srv := natsenv.StartServer(t)
	url := srv.URL()
	bucket := uniqueBucket("atkmemtiming")
	prepareBucket(t, url, bucket, natsputex.WithStorage(jetstream.MemoryStorage))
	const key = "spof-service"
	h := contracttest.NewHistory(1)
	hbc := h
	a := startAgentWith(t, url, bucket, key, "node-a", "node-a", h, nil,
		natsputex.WithRenewInterval(400*time.Millisecond), natsputex.WithFailureThreshold(3), natsputex.WithConfirmations(C))
	waitFor(t, 5*time.Second, "node-a starts its service", a.running)
	b := startAgentWith(t, url, bucket, key, "node-b", "node-b", hbc, nil,
		natsputex.WithRenewInterval(50*time.Millisecond), natsputex.WithFailureThreshold(2), natsputex.WithConfirmations(C))
	time.Sleep(time.Second)
	if err := h.Check(); err != nil {
		t.Fatalf("overlap before the restart: %v", err)
	}
	if err := hbc.Check(); err != nil {
		t.Fatalf("overlap before the restart: %v", err)
	}
	var writes *keyWatch
	b.failHC.Store(true)
	if err := srv.Restart(); err != nil {
		t.Fatal(err)
	}
	prepareBucket(t, url, bucket, natsputex.WithStorage(jetstream.MemoryStorage))
	writes = watchWrites(t, url, bucket, key)
	waitFor(t, 10*time.Second, "node-a starts its service again", func() bool {
		a.mu.Lock()
		defer a.mu.Unlock()
		return len(a.started) > 1 && a.exit != nil
	})
	kv := mustBucket(t, url, bucket)
	keys, _ := kv.ListKeys(context.Background())
	var all []string
	for k := range keys.Keys() {
		all = append(all, k)
	}
	t.Logf("node-a active again; keys in the new bucket: %v", all)
	b.failHC.Store(false)
	time.Sleep(time.Second)
	// A node that joins now (node-c, R = 50ms, F = 2) has seen no timing
	// of node-a's before the bucket was lost.
	c := startAgentWith(t, url, bucket, key, "node-c", "node-c", hbc, nil,
		natsputex.WithRenewInterval(50*time.Millisecond), natsputex.WithFailureThreshold(2), natsputex.WithConfirmations(C))
	time.Sleep(1500 * time.Millisecond)
	for _, ag := range []*agent{a, b, c} {
		ag.stop()
		ag.mu.Lock()
		t.Logf("%s started %d time(s)", ag.name, len(ag.started))
		ag.mu.Unlock()
	}
	writes.mu.Lock()
	ws := append([]keyWrite(nil), writes.writes...)
	writes.mu.Unlock()
	for i := 1; i < len(ws); i++ {
		prev, w := ws[i-1], ws[i]
		if w.value == "" || prev.value == "" || w.value == prev.value {
			continue
		}
		T := 100 * time.Millisecond // node-b's and node-c's
		if prev.value == "node-a" {
			T = 1200 * time.Millisecond
		}
		gap := w.created.Sub(prev.created)
		t.Logf("rev %d %q took over rev %d %q %v after it (the holder's T = %v)", w.rev, w.value, prev.rev, prev.value, gap.Round(time.Millisecond), T)
		if gap < T {
			t.Errorf("rev %d %q took over rev %d %q %v after it, before T = %v", w.rev, w.value, prev.rev, prev.value, gap.Round(time.Millisecond), T)
		}
	}
	if err := h.Check(); err != nil {
		t.Errorf("two services ran at once: %v", err)
	}
}
