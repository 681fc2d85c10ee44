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
			_ = c.Close()
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
