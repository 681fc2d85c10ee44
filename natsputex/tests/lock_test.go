package natsputex_test

// Locker: Lock, TryLock and Release.

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/latchkey-go/latchkey/contracttest/testenv"
	"github.com/latchkey-go/latchkey/contracttest/testenv/natsenv"
	"github.com/latchkey-go/latchkey/locks"
	"github.com/latchkey-go/latchkey/natsputex"
)

// TestTryLocksRaceForCrashedHoldersKey: a holder crashes (its connection
// closed, no release); two TryLock clients, each in a loop, race for its
// key. Exactly one gets it at a time, the first within T + R + C·R of the
// crash, and tokens rise in grant order.
func TestTryLocksRaceForCrashedHoldersKey(t *testing.T) {
	url, bucket := promiseEnv(t, "race")
	writes := watchWrites(t, url, bucket, "job")
	nc, js, err := connect(url)
	if err != nil {
		t.Fatal(err)
	}
	crashed, err := natsputex.New(context.Background(), js, bucket, natsputex.WithHolderID("crashed"),
		natsputex.WithRenewInterval(testR), natsputex.WithFailureThreshold(testF), natsputex.WithConfirmations(testC))
	if err != nil {
		t.Fatal(err)
	}
	g := newGrants()
	held, err := crashed.Locker().TryLock(context.Background(), "job")
	if err != nil {
		t.Fatal(err)
	}
	g.grant("crashed", held)
	time.Sleep(2*testR + testR/2)
	nc.Close()
	crash := time.Now()
	t.Cleanup(func() { _ = crashed.Close(context.Background()) })

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var wg sync.WaitGroup
	var first sync.Once
	var firstAt time.Duration
	for i := range 2 {
		who := fmt.Sprintf("trylock-%d", i)
		c := newTestClient(t, url, bucket, natsputex.WithHolderID(who))
		wg.Add(1)
		go func() {
			defer wg.Done()
			end := time.Now().Add(3 * time.Second)
			for time.Now().Before(end) {
				l, err := c.Locker().TryLock(ctx, "job")
				if errors.Is(err, locks.ErrNotAcquired) {
					time.Sleep(5 * time.Millisecond)
					continue
				}
				if err != nil {
					t.Errorf("%s: %v", who, err)
					return
				}
				first.Do(func() { firstAt = time.Since(crash) })
				g.grant(who, l)
				time.Sleep(50 * time.Millisecond)
				_ = l.Release(context.Background())
			}
		}()
	}
	wg.Wait()
	g.check(t)
	silence(t, writes, "crashed", testF*testR)
	bound := testF*testR + testR + testC*testR
	t.Logf("first TryLock grant %v after the crash (bound T + R + C·R = %v)", firstAt.Round(time.Millisecond), bound)
	if firstAt == 0 || firstAt > bound+200*time.Millisecond {
		t.Errorf("the crashed holder's key came back %v after the crash, want within %v (+200ms)", firstAt, bound)
	}
}

// TestLockCancelledWhileConfirmingLeavesKeyFree: "On failure Lock returns an
// error and holds nothing; when ctx ends first, the error matches
// ctx.Err()." A waiting Lock with C = 10 takes a crashed holder's key over,
// and its context ends while it confirms. It must return ctx's error, write
// the key no more after it returned, and leave the key to others (another
// client's TryLock gets it within T + C·R + R of the return).
func TestLockCancelledWhileConfirmingLeavesKeyFree(t *testing.T) {
	const C = 10
	url, bucket := promiseEnv(t, "cancelconf")
	writes := watchWrites(t, url, bucket, "job")
	nc, js, err := connect(url)
	if err != nil {
		t.Fatal(err)
	}
	crashed, err := natsputex.New(context.Background(), js, bucket, natsputex.WithHolderID("crashed"),
		natsputex.WithRenewInterval(testR), natsputex.WithFailureThreshold(testF), natsputex.WithConfirmations(testC))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := crashed.Locker().TryLock(context.Background(), "job"); err != nil {
		t.Fatal(err)
	}
	time.Sleep(2 * testR)
	nc.Close()
	t.Cleanup(func() { _ = crashed.Close(context.Background()) })
	waiter := newTestClient(t, url, bucket, natsputex.WithConfirmations(C), natsputex.WithHolderID("waiter"))
	ctx, cancel := context.WithTimeout(context.Background(), testF*testR+5*testR)
	defer cancel()
	l, err := waiter.Locker().Lock(ctx, "job")
	returned := time.Now()
	if err == nil {
		t.Fatalf("Lock returned a lease (token %d) though its context ended during confirmation", l.Token())
	}
	t.Logf("Lock returned after its context ended mid-confirmation: %v", err)
	if !errors.Is(err, ctx.Err()) {
		t.Errorf("Lock's error %v does not match ctx.Err() = %v", err, ctx.Err())
	}
	other := newTestClient(t, url, bucket, natsputex.WithHolderID("other"))
	var got time.Duration
	for time.Since(returned) < 3*time.Second {
		ol, err := other.Locker().TryLock(context.Background(), "job")
		if err == nil {
			got = time.Since(returned)
			_ = ol.Release(context.Background())
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	writes.mu.Lock()
	late := 0
	for _, w := range writes.writes {
		if strings.HasPrefix(w.value, "waiter") && w.created.After(returned.Add(20*time.Millisecond)) {
			late++
		}
	}
	writes.mu.Unlock()
	t.Logf("another client got the key %v after the cancelled Lock returned; the cancelled waiter wrote %d time(s) after it returned", got.Round(time.Millisecond), late)
	if late > 0 {
		t.Errorf("the cancelled Lock's token was written %d time(s) after it returned", late)
	}
	if got == 0 || got > testF*testR+C*testR+testR {
		t.Errorf("the key was not free for others within T + C·R + R = %v of the cancelled Lock's return (got %v)", testF*testR+C*testR+testR, got)
	}
}

// grant is what a waiting Lock got, and whether the other lease was still
// live when it got it.
type grant struct {
	lease     locks.Lease
	err       error
	otherLive bool
}

// lockBehind starts a Lock of name on l that records, as soon as it
// returns, whether other is still live.
func lockBehind(ctx context.Context, l locks.Locker, name string, other locks.Lease) <-chan grant {
	ch := make(chan grant, 1)
	go func() {
		lease, err := l.Lock(ctx, name)
		ch <- grant{lease: lease, err: err, otherLive: other.Context().Err() == nil}
	}()
	return ch
}

// mustGrant waits for a waiting Lock's grant, fails t if the Lock failed,
// and releases the waiter's lease at cleanup.
func mustGrant(t *testing.T, got <-chan grant) grant {
	t.Helper()
	g := <-got
	if g.err != nil {
		t.Fatalf("the waiter's Lock: %v", g.err)
	}
	t.Cleanup(func() { _ = g.lease.Release(context.Background()) })
	return g
}

// TestCancelledLockLeavesNothing: a Lock whose context ends while its
// write that takes a free key is in flight (the write lands, its answer
// comes 200ms late through a proxy) either returns the lease or leaves
// the key free: never a key held by a token no lease owns, which no one
// could take for T.
func TestCancelledLockLeavesNothing(t *testing.T) {
	url := natsenv.StartServer(t).URL()
	bucket := uniqueBucket("cancelwrite")
	prepareBucket(t, url, bucket)
	proxy := testenv.NewProxy(t, strings.TrimPrefix(url, "nats://"))
	slow := newTestClient(t, "nats://"+proxy.Addr(), bucket).Locker()
	other := newTestClient(t, url, bucket).Locker()
	proxy.DelayReplies(200 * time.Millisecond)
	// The read's answer comes at ~200ms, the write is sent then and lands
	// at once, its answer comes at ~400ms: the context ends in between.
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	lease, err := slow.Lock(ctx, "job")
	proxy.Restore()
	if err == nil {
		t.Logf("the Lock returned its lease after its context ended")
		if err := lease.Release(context.Background()); err != nil {
			t.Fatal(err)
		}
	} else {
		t.Logf("the Lock returned %v", err)
	}
	octx, ocancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer ocancel()
	l, err := other.TryLock(octx, "job")
	if err != nil {
		t.Fatalf("after the cancelled Lock, another client's TryLock: %v", err)
	}
	_ = l.Release(octx)
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

// TestLossMessage: a lease lost to a foreign write ends with a cause that
// names the lock once, says "nats: " once, and still matches ErrLost and
// the JetStream conflict it wraps.
func TestLossMessage(t *testing.T) {
	url, bucket := promiseEnv(t, "loss")
	c := newTestClient(t, url, bucket, natsputex.WithRenewInterval(50*time.Millisecond))
	ctx := context.Background()
	name := "nightly-report"
	lease, err := c.Locker().TryLock(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	nc, js, err := connect(url)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	kv, err := js.KeyValue(ctx, bucket)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := kv.Put(ctx, name, []byte("someone else")); err != nil {
		t.Fatal(err)
	}
	select {
	case <-lease.Context().Done():
	case <-time.After(5 * time.Second): // T = 150ms: the next renewal meets the write
		t.Fatal("the lease is still live 5s after a foreign write of its key")
	}
	cause := context.Cause(lease.Context())
	msg := cause.Error()
	var apiErr *jetstream.APIError
	if strings.Contains(msg, "nats: nats: ") || strings.Count(msg, name) != 1 || !errors.Is(cause, locks.ErrLost) || !errors.As(cause, &apiErr) {
		t.Errorf("the lease ended with %q: want the name once, \"nats: \" never twice, ErrLost and the JetStream API error", msg)
	}
}

// TestBusyMessage: a TryLock (TryAcquire) of a name held elsewhere fails
// with an error in the one shape of errors, as redlockprio's does:
// "natsputex: trylock: locks: not acquired: "name" is held by …", the
// name once, "natsputex: " and "locks: " once, matching ErrNotAcquired and
// a *locks.HeldError of the name.
func TestBusyMessage(t *testing.T) {
	url, bucket := promiseEnv(t, "busy")
	a := newTestClient(t, url, bucket)
	b := newTestClient(t, url, bucket)
	ctx := context.Background()
	name := "nightly-report"
	held, err := a.Locker().TryLock(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	defer held.Release(ctx)
	semA, err := a.Semaphore(1)
	if err != nil {
		t.Fatal(err)
	}
	semB, err := b.Semaphore(1)
	if err != nil {
		t.Fatal(err)
	}
	slot, err := semA.TryAcquire(ctx, "builds")
	if err != nil {
		t.Fatal(err)
	}
	defer slot.Release(ctx)
	for _, tc := range []struct {
		what, name, want string
		call             func() (locks.Lease, error)
	}{
		{"TryLock", name, `natsputex: trylock: locks: not acquired: "nightly-report" is held by `, func() (locks.Lease, error) { return b.Locker().TryLock(ctx, name) }},
		{"TryAcquire", "builds", `natsputex: tryacquire: locks: not acquired: "builds" is held`, func() (locks.Lease, error) { return semB.TryAcquire(ctx, "builds") }},
	} {
		l, err := tc.call()
		if err == nil {
			_ = l.Release(ctx)
			t.Errorf("%s of a held name succeeded", tc.what)
			continue
		}
		msg := err.Error()
		var he *locks.HeldError
		if !errors.Is(err, locks.ErrNotAcquired) || !errors.As(err, &he) || he.Name != tc.name {
			t.Errorf("%s of a held name = %v, want ErrNotAcquired and a *locks.HeldError of %q", tc.what, err, tc.name)
		}
		if !strings.HasPrefix(msg, tc.want) || strings.Count(msg, "natsputex: ") != 1 || strings.Count(msg, "locks: ") != 1 || strings.Count(msg, `"`+tc.name+`"`) != 1 {
			t.Errorf("%s of a held name: %q, want it to start %q, \"natsputex: \", \"locks: \" and the name once", tc.what, msg, tc.want)
		}
	}
}
