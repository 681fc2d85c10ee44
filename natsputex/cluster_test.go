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

// contention is a lock held on an R3 cluster's bucket with another client
// blocked in Lock on it; every section is recorded in h.
type contention struct {
	cluster *natsenv.Cluster
	urls    string
	bucket  string
	ctx     context.Context
	h       *contracttest.History
	lease   locks.Lease   // the holder's
	exit    func()        // ends the holder's section (once)
	ended   chan struct{} // closed when the holder's lease has ended
	got     chan won      // the waiter's lease
	errc    chan error    // the waiter's error
}

type won struct {
	l    locks.Lease
	exit func()
}

// contend starts a 3-node cluster, a holder and a waiter on one key. The
// holder's section ends when its lease does (or at exit); the waiter's
// starts as soon as its Lock returns.
func contend(t *testing.T, prefix string) *contention {
	t.Helper()
	if testing.Short() {
		t.Skip("a 3-node cluster is slow to start")
	}
	c := &contention{cluster: natsenv.StartCluster(t, 3), bucket: uniqueBucket(prefix), h: contracttest.NewHistory(1),
		ended: make(chan struct{}), got: make(chan won, 1), errc: make(chan error, 1)}
	c.urls = c.cluster.URLs()
	prepareBucket(t, c.urls, c.bucket, natsputex.WithReplicas(3))
	holder := newTestClient(t, c.urls, c.bucket).Locker()
	waiter := newTestClient(t, c.urls, c.bucket).Locker()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	c.ctx = ctx
	lease, err := holder.TryLock(ctx, "job")
	if err != nil {
		t.Fatal(err)
	}
	c.lease = lease
	c.exit = sync.OnceFunc(c.h.Enter("holder", lease.Token()))
	go func() { <-lease.Context().Done(); c.exit(); close(c.ended) }()
	go func() {
		l, err := waiter.Lock(ctx, "job")
		if err != nil {
			c.errc <- err
			return
		}
		c.got <- won{l, c.h.Enter("waiter", l.Token())}
	}()
	time.Sleep(2 * testR)
	return c
}

// waiterWins checks that the waiter gets the lock with a higher token and
// that the two sections never overlapped.
func (c *contention) waiterWins(t *testing.T) {
	t.Helper()
	select {
	case w := <-c.got:
		if w.l.Token() <= c.lease.Token() {
			t.Errorf("the waiter's token %d is not above the holder's %d", w.l.Token(), c.lease.Token())
		}
		w.exit()
		_ = w.l.Release(c.ctx)
	case err := <-c.errc:
		t.Fatalf("the waiter's Lock failed: %v", err)
	case <-c.ctx.Done():
		t.Fatal("the waiter did not get the lock after recovery")
	}
	if err := c.h.Check(); err != nil {
		t.Fatalf("double grant: %v", err)
	}
}

// TestClusterLeaderStop: the stream leader of an R3 bucket stops while a
// lock is held and contended. The holder renews or loses cleanly, the
// waiter gets the lock after recovery, and the two never hold at once.
func TestClusterLeaderStop(t *testing.T) {
	c := contend(t, "leader")
	nc, js, err := connect(c.urls)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	st, err := js.Stream(c.ctx, "KV_"+c.bucket)
	if err != nil {
		t.Fatal(err)
	}
	leader := -1
	for i, s := range c.cluster.Servers() {
		if st.CachedInfo().Cluster != nil && s.Name() == st.CachedInfo().Cluster.Leader {
			leader = i
		}
	}
	if leader < 0 {
		t.Fatalf("no stream leader in %+v", st.CachedInfo().Cluster)
	}
	t.Logf("stopping the stream leader %s", c.cluster.Servers()[leader].Name())
	c.cluster.Stop(leader)
	time.Sleep(2 * time.Second)
	select {
	case <-c.ended:
		cause := context.Cause(c.lease.Context())
		if !errors.Is(cause, locks.ErrLost) {
			t.Errorf("the holder's lease ended with %v, want ErrLost", cause)
		}
		t.Logf("the holder lost its lease cleanly: %v", cause)
	default:
		t.Logf("the holder kept renewing through the leader change")
	}
	c.exit() // the holder's section ends before it releases
	if err := c.lease.Release(c.ctx); err != nil && !errors.Is(err, locks.ErrLost) {
		t.Logf("release: %v", err)
	}
	<-c.ended
	if err := c.cluster.Restart(leader); err != nil {
		t.Fatal(err)
	}
	c.waiterWins(t)
}

// TestClusterWholeRestart: every node of an R3 cluster stops while a lock
// is held and contended. The holder, unable to renew, loses its lease with
// ErrLost before anyone may take over; after the cluster comes back from
// disk, the waiter gets the lock with a higher token, and the two never
// hold at once.
func TestClusterWholeRestart(t *testing.T) {
	c := contend(t, "restart")
	for i := range c.cluster.Servers() {
		c.cluster.Stop(i)
	}
	select {
	case <-c.ended:
	case <-time.After(10 * time.Second):
		t.Fatal("the holder's lease outlived the whole cluster's stop by 10s")
	}
	if cause := context.Cause(c.lease.Context()); !errors.Is(cause, locks.ErrLost) {
		t.Errorf("the holder's lease ended with %v, want ErrLost", cause)
	}
	if err := c.cluster.RestartAll(); err != nil {
		t.Fatal(err)
	}
	c.waiterWins(t)
	_ = c.lease.Release(c.ctx) // lost: may fail, must not matter
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
