package natsputex_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/latchkey-go/latchkey/contracttest"
	"github.com/latchkey-go/latchkey/contracttest/testenv/natsenv"
	"github.com/latchkey-go/latchkey/locks"
	"github.com/latchkey-go/latchkey/natsputex"
)

func newTestClient(t *testing.T, urls, bucket string, opts ...natsputex.Option) *natsputex.Client {
	t.Helper()
	nc, js, err := connect(urls)
	if err != nil {
		t.Fatal(err)
	}
	base := []natsputex.Option{natsputex.WithRenewInterval(testR), natsputex.WithFailureThreshold(testF), natsputex.WithConfirmations(testC)}
	c, err := natsputex.New(context.Background(), js, bucket, append(base, opts...)...)
	if err != nil {
		nc.Close()
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close(); nc.Close() })
	return c
}

// TestClusterLeaderStop: the stream leader of an R3 bucket stops while a
// lock is held and contended. The holder renews or loses cleanly, the
// waiter gets the lock after recovery, and the two never hold at once.
func TestClusterLeaderStop(t *testing.T) {
	if testing.Short() {
		t.Skip("a 3-node cluster is slow to start")
	}
	cluster := natsenv.StartCluster(t, 3)
	urls := cluster.URLs()
	bucket := uniqueBucket("leader")
	prepareBucket(t, urls, bucket, natsputex.WithReplicas(3))
	holder := newTestClient(t, urls, bucket).Locker()
	waiter := newTestClient(t, urls, bucket).Locker()
	ctx, cancel := context.WithTimeout(context.Background(), 40*time.Second)
	defer cancel()

	h := contracttest.NewHistory(1)
	lease, err := holder.TryLock(ctx, "job")
	if err != nil {
		t.Fatal(err)
	}
	// The holder's section ends when its lease does, or just before it
	// releases it, whichever comes first.
	var exitOnce sync.Once
	exitH := h.Enter("holder", lease.Token())
	exit := func() { exitOnce.Do(exitH) }
	ended := make(chan struct{})
	go func() { <-lease.Context().Done(); exit(); close(ended) }()

	// The waiter's section starts as soon as its Lock returns.
	type won struct {
		l    locks.Lease
		exit func()
	}
	got := make(chan won, 1)
	errc := make(chan error, 1)
	go func() {
		l, err := waiter.Lock(ctx, "job")
		if err != nil {
			errc <- err
			return
		}
		got <- won{l, h.Enter("waiter", l.Token())}
	}()
	time.Sleep(2 * testR)

	nc, js, err := connect(urls)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	st, err := js.Stream(ctx, "KV_"+bucket)
	if err != nil {
		t.Fatal(err)
	}
	leader := -1
	for i, s := range cluster.Servers() {
		if st.CachedInfo().Cluster != nil && s.Name() == st.CachedInfo().Cluster.Leader {
			leader = i
		}
	}
	if leader < 0 {
		t.Fatalf("no stream leader in %+v", st.CachedInfo().Cluster)
	}
	t.Logf("stopping the stream leader %s", cluster.Servers()[leader].Name())
	cluster.Stop(leader)
	time.Sleep(2 * time.Second)
	select {
	case <-ended:
		cause := context.Cause(lease.Context())
		if !errors.Is(cause, locks.ErrLost) {
			t.Errorf("the holder's lease ended with %v, want ErrLost", cause)
		}
		t.Logf("the holder lost its lease cleanly: %v", cause)
	default:
		t.Logf("the holder kept renewing through the leader change")
	}
	exit()
	if err := lease.Release(ctx); err != nil && !errors.Is(err, locks.ErrLost) {
		t.Logf("release: %v", err)
	}
	<-ended
	if err := cluster.Restart(leader); err != nil {
		t.Fatal(err)
	}
	select {
	case w := <-got:
		if w.l.Token() <= lease.Token() {
			t.Errorf("the waiter's token %d is not above the holder's %d", w.l.Token(), lease.Token())
		}
		w.exit()
		_ = w.l.Release(ctx)
	case err := <-errc:
		t.Fatalf("the waiter's Lock failed: %v", err)
	case <-ctx.Done():
		t.Fatal("the waiter did not get the lock after recovery")
	}
	if err := h.Check(); err != nil {
		t.Fatalf("double grant: %v", err)
	}
}

// TestHealthCheckHangs: a health check that hangs past T ends the lease
// with ErrLost (and blanks the key), it does not block the holder.
func TestHealthCheckHangs(t *testing.T) {
	url := natsenv.StartServer(t).URL()
	bucket := uniqueBucket("hang")
	prepareBucket(t, url, bucket)
	release := make(chan struct{})
	defer close(release)
	var hang atomicBool
	c := newTestClient(t, url, bucket, natsputex.WithHealthCheck(func(ctx context.Context, s natsputex.State) error {
		if hang.get() {
			<-release // ignores ctx: the lease must end anyway
		}
		return nil
	}))
	lease, err := c.Locker().TryLock(context.Background(), "hc")
	if err != nil {
		t.Fatal(err)
	}
	hang.set()
	start := time.Now()
	select {
	case <-lease.Context().Done():
	case <-time.After(testF*testR + 2*testR + time.Second):
		t.Fatal("a hanging health check did not end the lease")
	}
	t.Logf("lease ended %v after the check started hanging: %v", time.Since(start).Round(time.Millisecond), context.Cause(lease.Context()))
	if !errors.Is(context.Cause(lease.Context()), locks.ErrLost) {
		t.Errorf("cause = %v, want ErrLost", context.Cause(lease.Context()))
	}
	other := newTestClient(t, url, bucket).Locker()
	l2, err := other.Lock(context.Background(), "hc")
	if err != nil {
		t.Fatal(err)
	}
	_ = l2.Release(context.Background())
	_ = lease.Release(context.Background())
}

// TestClusterWholeRestart: every node of an R3 cluster stops while a lock
// is held and contended. The holder, unable to renew, loses its lease with
// ErrLost before anyone may take over; after the cluster comes back from
// disk, the waiter gets the lock with a higher token, and the two never
// hold at once.
func TestClusterWholeRestart(t *testing.T) {
	if testing.Short() {
		t.Skip("a 3-node cluster is slow to start")
	}
	cluster := natsenv.StartCluster(t, 3)
	urls := cluster.URLs()
	bucket := uniqueBucket("restart")
	prepareBucket(t, urls, bucket, natsputex.WithReplicas(3))
	holder := newTestClient(t, urls, bucket).Locker()
	waiter := newTestClient(t, urls, bucket).Locker()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	h := contracttest.NewHistory(1)
	lease, err := holder.TryLock(ctx, "job")
	if err != nil {
		t.Fatal(err)
	}
	exit := h.Enter("holder", lease.Token())
	ended := make(chan struct{})
	go func() { <-lease.Context().Done(); exit(); close(ended) }()
	type won struct {
		l    locks.Lease
		exit func()
	}
	got := make(chan won, 1)
	errc := make(chan error, 1)
	go func() {
		l, err := waiter.Lock(ctx, "job")
		if err != nil {
			errc <- err
			return
		}
		got <- won{l, h.Enter("waiter", l.Token())}
	}()
	time.Sleep(2 * testR)

	for i := range cluster.Servers() {
		cluster.Stop(i)
	}
	select {
	case <-ended:
	case <-time.After(10 * time.Second):
		t.Fatal("the holder's lease outlived the whole cluster's stop by 10s")
	}
	if cause := context.Cause(lease.Context()); !errors.Is(cause, locks.ErrLost) {
		t.Errorf("the holder's lease ended with %v, want ErrLost", cause)
	}
	if err := cluster.RestartAll(); err != nil {
		t.Fatal(err)
	}
	select {
	case w := <-got:
		if w.l.Token() <= lease.Token() {
			t.Errorf("the waiter's token %d is not above the holder's %d", w.l.Token(), lease.Token())
		}
		w.exit()
		_ = w.l.Release(ctx)
	case err := <-errc:
		t.Fatalf("the waiter's Lock failed: %v", err)
	case <-ctx.Done():
		t.Fatal("the waiter did not get the lock after the cluster came back")
	}
	_ = lease.Release(ctx) // lost: may fail, must not matter
	if err := h.Check(); err != nil {
		t.Fatalf("double grant: %v", err)
	}
}
