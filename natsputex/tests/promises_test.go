package natsputex_test

import (
	"context"
	"errors"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/latchkey-go/latchkey/contracttest"
	"github.com/latchkey-go/latchkey/contracttest/testenv"
	"github.com/latchkey-go/latchkey/contracttest/testenv/natsenv"
	"github.com/latchkey-go/latchkey/locks"
	"github.com/latchkey-go/latchkey/natsputex"
)

// promiseEnv is a fresh bucket on an embedded server.
func promiseEnv(t *testing.T, prefix string) (url, bucket string) {
	t.Helper()
	url = natsenv.StartServer(t).URL()
	bucket = uniqueBucket(prefix)
	prepareBucket(t, url, bucket)
	return url, bucket
}

// TestWaiterWokenByWatch: a waiting Lock is woken by its KV watch when the
// key is released, not by polling: with a 5s backoff it still gets the
// key within a fraction of a second of the Release.
func TestWaiterWokenByWatch(t *testing.T) {
	url, bucket := promiseEnv(t, "wake")
	slow := locks.Backoff{Min: 5 * time.Second, Max: 5 * time.Second}
	holder := newTestClient(t, url, bucket).Locker()
	waiter := newTestClient(t, url, bucket, natsputex.WithBackoff(slow)).Locker()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	lease, err := holder.TryLock(ctx, "job")
	if err != nil {
		t.Fatal(err)
	}
	got := lockBehind(ctx, waiter, "job", lease)
	time.Sleep(3 * testR) // the waiter has tried once and watches; the holder renews
	released := time.Now()
	if err := lease.Release(ctx); err != nil {
		t.Fatal(err)
	}
	mustGrant(t, got)
	took := time.Since(released)
	t.Logf("the waiter held the key %v after the Release (backoff %v)", took.Round(time.Microsecond), slow.Min)
	if took > time.Second {
		t.Errorf("the waiter got the key %v after the Release: it was not woken by its watch (its backoff is %v)", took, slow.Min)
	}
}

// TestLossNoticedWithinR: a holder whose key is deleted behind its back
// learns it at its next renewal: its lease ends with ErrLost within R
// (plus one write's time).
func TestLossNoticedWithinR(t *testing.T) {
	url, bucket := promiseEnv(t, "loss")
	holder := newTestClient(t, url, bucket).Locker()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	lease, err := holder.TryLock(ctx, "job")
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(2 * testR)
	kv := mustBucket(t, url, bucket)
	if err := kv.Delete(ctx, "job"); err != nil {
		t.Fatal(err)
	}
	deleted := time.Now()
	const slack = 150 * time.Millisecond // one write, and a loaded machine
	select {
	case <-lease.Context().Done():
	case <-time.After(testR + slack + time.Second):
		t.Fatalf("the lease is still live %v after its key was deleted", time.Since(deleted).Round(time.Millisecond))
	}
	took := time.Since(deleted)
	t.Logf("the holder saw its loss %v after the delete (R = %v)", took.Round(time.Millisecond), testR)
	if took > testR+slack {
		t.Errorf("the holder saw its loss %v after the delete, want within R = %v (+%v)", took.Round(time.Millisecond), testR, slack)
	}
	if cause := context.Cause(lease.Context()); !errors.Is(cause, locks.ErrLost) {
		t.Errorf("the lease ended with %v, want ErrLost", cause)
	}
}

// TestTakeoverWaitsTPlusCR: a waiter takes a silent holder's key over no
// sooner than T of silence since the holder's last write plus C
// confirmation intervals, and not much later. (The server runs on this
// machine: the time it stamped on the last write is on the test's clock.)
func TestTakeoverWaitsTPlusCR(t *testing.T) {
	url, bucket := promiseEnv(t, "takeover")
	proxy := testenv.NewProxy(t, strings.TrimPrefix(url, "nats://"))
	holder := newTestClient(t, "nats://"+proxy.Addr(), bucket)
	waiter := newTestClient(t, url, bucket).Locker()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	lease, err := holder.Locker().TryLock(ctx, "job")
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(2 * testR)
	proxy.BlackHole() // the holder goes silent, without blanking the key
	defer proxy.Restore()
	time.Sleep(testR) // a renewal in flight, black-holed, is never stored
	last, err := mustBucket(t, url, bucket).Get(ctx, "job")
	if err != nil {
		t.Fatal(err)
	}
	start := last.Created() // the holder's last write
	g := mustGrant(t, lockBehind(ctx, waiter, "job", lease))
	took := time.Since(start)
	T := holder.TTL()
	least := T + testC*testR
	t.Logf("took the silent holder's key over %v after its last write (T + C·R = %v)", took.Round(time.Millisecond), least)
	if took < least {
		t.Errorf("took the key over %v after the holder's last write, sooner than T + C·R = %v", took, least)
	}
	if most := least + 2*testR + 500*time.Millisecond; took > most {
		t.Errorf("took the key over after %v, want within %v", took, most)
	}
	if g.otherLive {
		t.Error("double grant: the silent holder's lease was live when the waiter got the key")
	}
}

// TestSupervisorCutOff: an active agent cut off from NATS begins Stop
// when its hold runs out (T − margin after its last write began); a
// standby starts no sooner than T + C·R after that write. A Stop that
// ends within margin + C·R never overlaps the standby's service; a much
// slower one does, which is the limit the package doc states.
func TestSupervisorCutOff(t *testing.T) {
	run := func(t *testing.T, stop time.Duration) error {
		url, bucket, key := supervisorEnv(t)
		proxy := testenv.NewProxy(t, strings.TrimPrefix(url, "nats://"))
		h := contracttest.NewHistory(1)
		a := startAgent(t, "nats://"+proxy.Addr(), bucket, key, "node-a", h)
		waitFor(t, 2*handoverBound, "node-a starts its service", a.running)
		b := startAgent(t, url, bucket, key, "node-b", h)
		time.Sleep(3 * testR) // b watches the key
		a.stopDelay.Store(int64(stop))
		proxy.BlackHole()
		cut := time.Now()
		waitFor(t, handoverBound+stop+time.Second, "node-b starts its service", b.running)
		t.Logf("node-b started %v after node-a was cut off (node-a's Stop takes %v)", time.Since(cut).Round(time.Millisecond), stop)
		waitFor(t, stop+time.Second, "node-a stops its service", func() bool { return !a.running() })
		proxy.Restore()
		a.stop()
		b.stop()
		return h.Check()
	}
	const margin = testR / 2 // the default
	t.Run("StopWithinBound", func(t *testing.T) {
		if err := run(t, (margin+testC*testR)/2); err != nil {
			t.Errorf("a Stop within margin + C·R overlapped the standby's service: %v", err)
		}
	})
	t.Run("StopBeyondBound", func(t *testing.T) {
		if err := run(t, 6*(margin+testC*testR)); err == nil {
			t.Errorf("a Stop far beyond margin + C·R did not overlap the standby's service: the documented limit is wrong, or the test")
		} else {
			t.Logf("as documented, a Stop slower than margin + C·R overlaps: %v", err)
		}
	})
}

// TestReleaseAfterLostRenewalReply: a renewal that reached the key but
// whose answer was lost moved the key's revision behind the holder's back;
// the holder's lease ends (it could not confirm its hold), and its Release
// re-reads the key, finds its own token, and blanks it: the next holder
// gets the key at once, not T later.
func TestReleaseAfterLostRenewalReply(t *testing.T) {
	url, bucket := promiseEnv(t, "lostreply")
	proxy := testenv.NewProxy(t, strings.TrimPrefix(url, "nats://"))
	nc, js, err := connect("nats://" + proxy.Addr())
	if err != nil {
		t.Fatal(err)
	}
	holder := newClientOn(t, nc, js, bucket).Locker()
	kv := mustBucket(t, url, bucket)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	lease, err := holder.TryLock(ctx, "job")
	if err != nil {
		t.Fatal(err)
	}
	before, err := kv.Get(ctx, "job")
	if err != nil {
		t.Fatal(err)
	}
	proxy.DropReplies() // renewals still reach the broker
	select {
	case <-lease.Context().Done():
	case <-time.After(5 * time.Second):
		t.Fatal("the lease outlived renewals that got no answer")
	}
	after, err := kv.Get(ctx, "job")
	if err != nil {
		t.Fatal(err)
	}
	if after.Revision() <= before.Revision() || string(after.Value()) != string(before.Value()) {
		t.Fatalf("no renewal reached the key (revision %d → %d, value %q → %q): the test proves nothing", before.Revision(), after.Revision(), before.Value(), after.Value())
	}
	proxy.Restore() // closes the holder's connection, which had lost data
	waitFor(t, 5*time.Second, "the holder reconnects", func() bool { return nc.Stats().Reconnects > 0 && nc.IsConnected() })
	err = lease.Release(ctx)
	if !errors.Is(err, locks.ErrLost) {
		t.Errorf("Release of a lease that had ended: %v, want an error matching ErrLost", err)
	}
	e, err := kv.Get(ctx, "job")
	if err != nil || len(e.Value()) != 0 {
		t.Fatalf("after Release the key should be blank (it held the lease's own token at a newer revision): %v %v", e, err)
	}
	taken, err := newTestClient(t, url, bucket).Locker().TryLock(ctx, "job")
	if err != nil {
		t.Fatalf("TryLock after the Release: %v", err)
	}
	_ = taken.Release(ctx)
}

// TestSupervisorStartFails: Stop runs once when Run begins, before any
// Start; a Start that fails counts as a failed health check: Stop runs,
// then the key is blanked, so a standby takes it over at once (not T
// later).
func TestSupervisorStartFails(t *testing.T) {
	url, bucket, key := supervisorEnv(t)
	var mu sync.Mutex
	var calls []string // of node-a's service
	record := func(c string) {
		mu.Lock()
		calls = append(calls, c)
		mu.Unlock()
	}
	proceed := make(chan struct{})
	ctx, cancel := context.WithCancel(context.Background())
	stopA := cancel
	nc, js, err := connect(url)
	if err != nil {
		t.Fatal(err)
	}
	a := newClientOn(t, nc, js, bucket)
	sup, err := a.Supervisor(key, "node-a", natsputex.Service{
		Start: func(context.Context, uint64) error {
			record("start")
			<-proceed // node-b is standby by now
			return errors.New("cannot start (test)")
		},
		Stop: func(context.Context) error {
			record("stop")
			mu.Lock()
			failed := len(calls) == 3
			mu.Unlock()
			if failed {
				stopA() // node-a blanks the key and leaves, so it cannot take it back
			}
			return nil
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- sup.Run(ctx) }()
	defer func() { cancel(); <-done }()
	waitFor(t, 5*time.Second, "node-a holds the key and starts", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(calls) == 2
	})
	b := startAgent(t, url, bucket, key, "node-b", contracttest.NewHistory(1))
	time.Sleep(3 * testR) // node-b has found node-a's token and watches the key
	failed := time.Now()
	close(proceed)
	waitFor(t, testF*testR+time.Second, "node-b starts its service", b.running)
	took := time.Since(failed)
	t.Logf("node-b started %v after node-a's Start failed", took.Round(time.Millisecond))
	if took >= testF*testR {
		t.Errorf("node-b started %v after node-a's Start failed: the key was not blanked (a blank key is taken at once, not after T = %v)", took, testF*testR)
	}
	mu.Lock()
	first := slices.Clone(calls[:min(3, len(calls))])
	mu.Unlock()
	if !slices.Equal(first, []string{"stop", "start", "stop"}) {
		t.Errorf("node-a's service calls began %q, want stop (Run begins), start, stop (Start failed)", first)
	}
}

// TestShortValidityRenewsOften: a holder renews every R, unless its
// validity T − margin is shorter than 2R; it then renews every
// (T − margin)/2, so that one late renewal does not end the lease
// (F = 1, R = 200ms: T − margin = 100ms, a renewal every 50ms, not every
// R). With F = 10 (T − margin = 950ms) it renews every R = 100ms, not
// every (T − margin)/2. The writes are counted by a watch on the bucket
// for one second.
func TestShortValidityRenewsOften(t *testing.T) {
	url, bucket := promiseEnv(t, "cadence")
	kv := mustBucket(t, url, bucket)
	for _, tc := range []struct {
		what     string
		opts     []natsputex.Option
		interval time.Duration
	}{
		{"F=10 R=100ms: every R", []natsputex.Option{natsputex.WithRenewInterval(100 * time.Millisecond), natsputex.WithFailureThreshold(10)}, 100 * time.Millisecond},
		{"F=1 R=200ms: every (T-margin)/2", []natsputex.Option{natsputex.WithRenewInterval(200 * time.Millisecond), natsputex.WithFailureThreshold(1)}, 50 * time.Millisecond},
	} {
		t.Run(tc.what, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			name := "cadence-" + strconv.Itoa(int(tc.interval/time.Millisecond))
			lease, err := newTestClient(t, url, bucket, tc.opts...).Locker().TryLock(ctx, name)
			if err != nil {
				t.Fatal(err)
			}
			defer func() { _ = lease.Release(ctx) }()
			w, err := kv.Watch(ctx, name, jetstream.UpdatesOnly())
			if err != nil {
				t.Fatal(err)
			}
			defer func() { _ = w.Stop() }()
			const window = time.Second
			end := time.After(window)
			writes := 0
		count:
			for {
				select {
				case e := <-w.Updates():
					if e != nil {
						writes++
					}
				case <-end:
					break count
				}
			}
			if err := context.Cause(lease.Context()); err != nil {
				t.Fatalf("the lease ended while it was renewed: %v", err)
			}
			want := int(window / tc.interval)
			t.Logf("%d renewals in %v (one every %v would be %d)", writes, window, tc.interval, want)
			if writes < want*6/10 || writes > want*14/10 {
				t.Errorf("%d renewals in %v, want about %d (one every %v)", writes, window, want, tc.interval)
			}
		})
	}
}
