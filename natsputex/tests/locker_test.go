package natsputex_test

import (
	"context"
	"errors"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/latchkey-go/latchkey/contracttest/testenv"
	"github.com/latchkey-go/latchkey/contracttest/testenv/natsenv"
	"github.com/latchkey-go/latchkey/locks"
	"github.com/latchkey-go/latchkey/natsputex"
)

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

// TestCutOffHolderStopsBeforeT: with F = 1 (T = R) and no confirmation, a
// holder cut off from NATS ends its lease before a waiter, taking over
// after T of silence, gets the key; and a lease is never valid for T or
// more ahead.
func TestCutOffHolderStopsBeforeT(t *testing.T) {
	const R = 200 * time.Millisecond
	opts := []natsputex.Option{natsputex.WithRenewInterval(R), natsputex.WithFailureThreshold(1), natsputex.WithConfirmations(0)}
	url := natsenv.StartServer(t).URL()
	bucket := uniqueBucket("cutoff")
	prepareBucket(t, url, bucket)
	proxy := testenv.NewProxy(t, strings.TrimPrefix(url, "nats://"))
	holder := newTestClient(t, "nats://"+proxy.Addr(), bucket, opts...)
	waiter := newTestClient(t, url, bucket, opts...).Locker()
	T := holder.TTL()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	lease, err := holder.Locker().TryLock(ctx, "job")
	if err != nil {
		t.Fatal(err)
	}
	dl, ok := lease.(interface{ Deadline() time.Time })
	if !ok {
		t.Fatalf("%T has no Deadline method", lease)
	}
	if ahead := time.Until(dl.Deadline()); ahead >= T {
		t.Errorf("a new lease is valid for %v, want < T = %v", ahead, T)
	}
	got := lockBehind(ctx, waiter, "job", lease)
	for range 4 { // renewals
		time.Sleep(R / 2)
		if ahead := time.Until(dl.Deadline()); lease.Context().Err() == nil && ahead >= T {
			t.Errorf("a renewed lease is valid for %v, want < T = %v", ahead, T)
		}
	}
	if lease.Context().Err() != nil {
		t.Fatalf("the holder lost its lease before it was cut off: %v", context.Cause(lease.Context()))
	}
	proxy.BlackHole()
	g := mustGrant(t, got)
	if g.otherLive {
		t.Fatal("double grant: the waiter took the key over while the cut-off holder's lease was live")
	}
	if cause := context.Cause(lease.Context()); !errors.Is(cause, locks.ErrLost) {
		t.Errorf("the holder's lease ended with %v, want ErrLost", cause)
	}
	proxy.Restore()
}

// TestOptionLimits: values whose products overflow a time.Duration, and
// semaphores too large to try slot by slot, are invalid options.
func TestOptionLimits(t *testing.T) {
	url := natsenv.StartServer(t).URL()
	bucket := uniqueBucket("limits")
	nc, js, err := connect(url)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	ctx := context.Background()
	for _, opts := range [][]natsputex.Option{
		// 5·2⁶² wraps around to 2⁶², a plausible T.
		{natsputex.WithRenewInterval(1 << 62), natsputex.WithFailureThreshold(5)},
		{natsputex.WithRenewInterval(1 << 62), natsputex.WithFailureThreshold(1), natsputex.WithConfirmations(5)},
	} {
		c, err := natsputex.New(ctx, js, bucket, opts...)
		if err == nil {
			_ = c.Close(context.Background())
		}
		if !errors.Is(err, locks.ErrInvalidOption) {
			t.Errorf("New with an overflowing F·R or C·R = %v, want ErrInvalidOption", err)
		}
	}
	c := newTestClient(t, url, bucket)
	if _, err := c.Semaphore(natsputex.MaxSemaphoreSize); err != nil {
		t.Errorf("Semaphore(%d) = %v", natsputex.MaxSemaphoreSize, err)
	}
	for _, size := range []int{natsputex.MaxSemaphoreSize + 1, 1 << 40, math.MaxInt} {
		if _, err := c.Semaphore(size); !errors.Is(err, locks.ErrInvalidOption) {
			t.Errorf("Semaphore(%d) = %v, want ErrInvalidOption", size, err)
		}
	}
}

// TestCloseEndsLeasesAndBlanksKeys: Client.Close ends the client's leases
// (lock and semaphore slot) with a cause matching both ErrLost and
// ErrClosed before it returns, blanks their keys, so that another client's
// TryLock (which never takes a key over from a live-looking holder) gets
// them right after Close, not T later; and a Lock of the closing client
// waiting on a name held elsewhere returns with ErrClosed.
func TestCloseEndsLeasesAndBlanksKeys(t *testing.T) {
	url, bucket := promiseEnv(t, "close")
	closing := newTestClient(t, url, bucket)
	other := newTestClient(t, url, bucket)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	lease, err := closing.Locker().TryLock(ctx, "job")
	if err != nil {
		t.Fatal(err)
	}
	sem, err := closing.Semaphore(1)
	if err != nil {
		t.Fatal(err)
	}
	slot, err := sem.TryAcquire(ctx, "pool")
	if err != nil {
		t.Fatal(err)
	}
	busy, err := other.Locker().TryLock(ctx, "busy")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = busy.Release(context.Background()) }()
	waiting := lockBehind(ctx, closing.Locker(), "busy", busy)
	time.Sleep(2 * testR) // the closing client's Lock waits; its leases renew
	select {
	case g := <-waiting:
		t.Fatalf("the Lock of a name held by another client returned before Close: %v", g.err)
	default:
	}

	closed := time.Now()
	if err := closing.Close(context.Background()); err != nil {
		t.Errorf("Close: %v", err)
	}
	for what, l := range map[string]locks.Lease{"lock": lease, "semaphore slot": slot} {
		if l.Context().Err() == nil {
			t.Errorf("the %s's lease is live after Close returned", what)
			continue
		}
		cause := context.Cause(l.Context())
		if !errors.Is(cause, locks.ErrLost) || !errors.Is(cause, locks.ErrClosed) {
			t.Errorf("the %s's lease ended with %v, want an error matching both ErrLost and ErrClosed", what, cause)
		}
	}
	// Right after Close: well within T = F·R (300ms), and TryLock would
	// not take over a key still holding the closed client's token anyway.
	again, err := other.Locker().TryLock(ctx, "job")
	if err != nil {
		t.Errorf("TryLock of the closed client's lock right after Close: %v, want the key blanked", err)
	} else {
		_ = again.Release(ctx)
	}
	otherSem, err := other.Semaphore(1)
	if err != nil {
		t.Fatal(err)
	}
	if again, err := otherSem.TryAcquire(ctx, "pool"); err != nil {
		t.Errorf("TryAcquire of the closed client's slot right after Close: %v, want the key blanked", err)
	} else {
		_ = again.Release(ctx)
	}
	t.Logf("the other client's TryLock and TryAcquire returned %v after Close began (T = %v)", time.Since(closed).Round(time.Millisecond), other.TTL())

	select {
	case g := <-waiting:
		t.Logf("the waiting Lock returned %v after Close began: %v", time.Since(closed).Round(time.Millisecond), g.err)
		if g.err == nil {
			_ = g.lease.Release(ctx)
			t.Fatal("the waiting Lock of a name held by another client got it when its client closed")
		}
		if !errors.Is(g.err, locks.ErrClosed) {
			t.Errorf("the waiting Lock returned %v, want an error matching ErrClosed", g.err)
		}
	case <-time.After(2 * time.Second):
		t.Fatal("the waiting Lock did not return within 2s of Close")
	}
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

// TestShorterTWaitsForHolderT: clients of one name may have different
// timing. A live holder with R = 400ms, F = 3 (T = 1.2s) renews every
// 400ms; a waiting Lock and a TryLock loop with R = 50ms, F = 2 (T =
// 100ms) see its key silent for their own T between two renewals, but
// its token carries its T, and they wait for that: neither gets the key
// while the holder's lease is live; the waiter gets it once it is
// released.
func TestShorterTWaitsForHolderT(t *testing.T) {
	url := natsenv.StartServer(t).URL()
	bucket := uniqueBucket("mixedt")
	prepareBucket(t, url, bucket)
	holder := newTestClient(t, url, bucket, natsputex.WithRenewInterval(400*time.Millisecond), natsputex.WithFailureThreshold(3))
	short := []natsputex.Option{natsputex.WithRenewInterval(50 * time.Millisecond), natsputex.WithFailureThreshold(2)}
	waiter := newTestClient(t, url, bucket, short...).Locker()
	trier := newTestClient(t, url, bucket, short...).Locker()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	lease, err := holder.Locker().TryLock(ctx, "job")
	if err != nil {
		t.Fatal(err)
	}
	got := lockBehind(ctx, waiter, "job", lease)
	for end := time.Now().Add(2 * time.Second); time.Now().Before(end); time.Sleep(20 * time.Millisecond) {
		if l, err := trier.TryLock(ctx, "job"); err == nil {
			live := lease.Context().Err() == nil
			_ = l.Release(ctx)
			t.Fatalf("a TryLock client with T = 100ms took the key of a holder with T = 1.2s (holder live: %t)", live)
		}
		select {
		case g := <-got:
			if g.err == nil {
				_ = g.lease.Release(ctx)
			}
			t.Fatalf("a waiting Lock with T = 100ms returned while a holder with T = 1.2s held the key (holder live: %t, err %v)", g.otherLive, g.err)
		default:
		}
	}
	if err := lease.Context().Err(); err != nil {
		t.Fatalf("the holder's lease ended: %v", context.Cause(lease.Context()))
	}
	if err := lease.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if g := mustGrant(t, got); g.otherLive {
		t.Fatal("double grant")
	}
}
