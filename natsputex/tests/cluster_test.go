package natsputex_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

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
	return newClientOn(t, nc, js, bucket, opts...)
}

// newPinnedClient is newTestClient on a connection to urls only: it never
// moves to the other nodes the servers announce, so that isolating its
// nodes cuts it off the rest of the cluster.
func newPinnedClient(t *testing.T, urls, bucket string, opts ...natsputex.Option) *natsputex.Client {
	t.Helper()
	nc, js, err := connect(urls, nats.IgnoreDiscoveredServers())
	if err != nil {
		t.Fatal(err)
	}
	return newClientOn(t, nc, js, bucket, opts...)
}

// newClientOn makes a client with the suite's timing on nc, closing both at
// cleanup.
func newClientOn(t *testing.T, nc *nats.Conn, js jetstream.JetStream, bucket string, opts ...natsputex.Option) *natsputex.Client {
	t.Helper()
	base := []natsputex.Option{natsputex.WithRenewInterval(testR), natsputex.WithFailureThreshold(testF), natsputex.WithConfirmations(testC)}
	c, err := natsputex.New(context.Background(), js, bucket, append(base, opts...)...)
	if err != nil {
		nc.Close()
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close(context.Background()); nc.Close() })
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
	endedAt time.Time     // when it ended; read once ended is closed
	got     chan won      // the waiter's lease
	errc    chan error    // the waiter's error
	watch   string        // the name of the waiter's watch consumer
}

type won struct {
	l    locks.Lease
	exit func()
	at   time.Time // when Lock returned
}

// contend starts a 3-node cluster, a holder and a waiter on one key. The
// holder's section ends when its lease does (or at exit); the waiter's
// starts as soon as its Lock returns.
func contend(t *testing.T, prefix string) *contention {
	t.Helper()
	if testing.Short() {
		t.Skip("a 3-node cluster is slow to start")
	}
	c := newContention(t, natsenv.StartCluster(t, 3), prefix)
	c.hold(t, newTestClient(t, c.urls, c.bucket).Locker())
	c.wait(t, newTestClient(t, c.urls, c.bucket).Locker())
	return c
}

// newContention makes an R3 bucket on cluster for a contention that hold
// and wait then begin.
func newContention(t *testing.T, cluster *natsenv.Cluster, prefix string) *contention {
	t.Helper()
	c := &contention{cluster: cluster, urls: cluster.URLs(), bucket: uniqueBucket(prefix), h: contracttest.NewHistory(1),
		ended: make(chan struct{}), got: make(chan won, 1), errc: make(chan error, 1)}
	prepareBucket(t, c.urls, c.bucket, natsputex.WithReplicas(3))
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	c.ctx = ctx
	return c
}

// hold takes the key with holder.
func (c *contention) hold(t *testing.T, holder locks.Locker) {
	t.Helper()
	lease, err := holder.TryLock(c.ctx, "job")
	if err != nil {
		t.Fatal(err)
	}
	c.lease = lease
	c.exit = sync.OnceFunc(c.h.Enter("holder", lease.Token()))
	go func() { <-lease.Context().Done(); c.exit(); c.endedAt = time.Now(); close(c.ended) }()
}

// wait starts waiter's Lock on the key, and returns once the waiter
// watches it, with the node that leads the watch's consumer and a function
// that cancels this Lock and waits for it to return.
func (c *contention) wait(t *testing.T, waiter locks.Locker) (node string, cancel func()) {
	t.Helper()
	ctx, stop := context.WithCancel(c.ctx)
	go func() {
		l, err := waiter.Lock(ctx, "job")
		if err != nil {
			c.errc <- err
			return
		}
		at := time.Now()
		c.got <- won{l, c.h.Enter("waiter", l.Token()), at}
	}()
	var once sync.Once
	cancel = func() {
		once.Do(func() {
			stop()
			select {
			case w := <-c.got: // won just before the cancel
				w.exit()
				_ = w.l.Release(c.ctx)
			case <-c.errc:
			}
		})
	}
	t.Cleanup(stop)
	c.watch, node = c.waitWatching(t, c.watch)
	return node, cancel
}

// waitWatching waits until the waiter watches the key: its KV watch is the
// only consumer of the bucket's stream (none other than not), made once
// its first attempt found the key held. It returns the consumer's name and
// the node that leads it.
func (c *contention) waitWatching(t *testing.T, not string) (name, node string) {
	t.Helper()
	nc, js, err := connect(c.urls)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	err = retryFor(10*time.Second, func(ctx context.Context) error {
		st, err := js.Stream(ctx, "KV_"+c.bucket)
		if err != nil {
			return err
		}
		var infos []*jetstream.ConsumerInfo
		list := st.ListConsumers(ctx)
		for info := range list.Info() {
			infos = append(infos, info)
		}
		if err := list.Err(); err != nil {
			return err
		}
		if len(infos) != 1 || infos[0].Name == not {
			return fmt.Errorf("%d consumers on the bucket, want the waiter's watch alone", len(infos))
		}
		if infos[0].Cluster == nil || infos[0].Cluster.Leader == "" {
			return errors.New("the waiter's watch has no leader")
		}
		name, node = infos[0].Name, infos[0].Cluster.Leader
		return nil
	})
	if err != nil {
		t.Fatalf("the waiter does not watch the key: %v", err)
	}
	return name, node
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

// retryFor calls f, each time with a context of its own bounded by a
// second, until it returns nil or within has passed; it returns f's last
// error then.
func retryFor(within time.Duration, f func(ctx context.Context) error) error {
	deadline := time.Now().Add(within)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		err := f(ctx)
		cancel()
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%w (after %v)", err, within)
		}
		time.Sleep(20 * time.Millisecond)
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

// TestClusterPartition: the node a lock's holder is connected to is cut
// off from the other two nodes of an R3 cluster (a network partition, not
// a crash: its routes go silent, and it keeps running and serving the
// holder) while a waiter connected to the other two is blocked in Lock.
// The holder, unable to renew, loses its lease with ErrLost by itself
// within T minus the margin; the waiter gets the lock within T + C·R (plus
// an interval of alignment) of the other side being able to use the
// bucket, with a higher token; the two never hold at once. Healed, the
// holder's stale Release leaves the key to the waiter.
//
// Each case fixes what the cut-off node runs besides the holder's
// connection, as all of it is cut off with it:
//   - Follower: a follower of the bucket's stream, nothing else.
//   - StreamLeader: the stream's leader: the other side elects another
//     (seconds) before it can write.
//   - WatchNode: a follower, and the consumer of the waiter's KV watch
//     (which Lock deletes before it returns).
//
// None of them is the JetStream meta leader.
func TestClusterPartition(t *testing.T) {
	if testing.Short() {
		t.Skip("a 3-node cluster is slow to start")
	}
	cluster := natsenv.StartClusterWith(t, 3, natsenv.ClusterConfig{ProxyRoutes: true})
	for _, pc := range []partitionCase{
		{name: "Follower"},
		{name: "StreamLeader", leader: true},
		{name: "WatchNode", watch: true},
	} {
		t.Run(pc.name, func(t *testing.T) { testPartition(t, cluster, pc) })
	}
}

type partitionCase struct {
	name   string
	leader bool // the cut-off node leads the bucket's stream (else it follows)
	watch  bool // it leads the waiter's watch consumer (else it does not)
}

func testPartition(t *testing.T, cluster *natsenv.Cluster, pc partitionCase) {
	t.Cleanup(func() { _ = cluster.Heal() }) // for the next case, if this one fails while isolated
	nodes := cluster.Servers()
	c := newContention(t, cluster, "part")
	meta := cluster.MetaLeader()
	if meta < 0 {
		t.Fatal("no meta leader")
	}
	leader := bucketLeader(t, c.urls, c.bucket, nodes, meta)
	// x, the node to cut off: the stream's leader, or else the third
	// node, neither the stream's leader nor the meta leader.
	x := leader
	if !pc.leader {
		x = 3 - leader - meta
	}
	var others []string
	for i, s := range nodes {
		if i != x {
			others = append(others, s.URL())
		}
	}
	c.hold(t, newPinnedClient(t, nodes[x].URL(), c.bucket, natsputex.WithHolderID("holder")).Locker())
	// The watch's consumer is placed on a random replica: start the
	// waiter's Lock again until it lands where the case wants it.
	waiter := newPinnedClient(t, strings.Join(others, ","), c.bucket, natsputex.WithHolderID("waiter")).Locker()
	for attempt := 0; ; attempt++ {
		node, cancel := c.wait(t, waiter)
		if (node == nodes[x].Name()) == pc.watch {
			break
		}
		if attempt == 30 {
			t.Fatalf("the waiter's watch never landed where the case wants it (%d attempts)", attempt+1)
		}
		cancel()
	}
	taken := watchTakeover(t, strings.Join(others, ","), c.bucket, "waiter/")

	cluster.Isolate(x)
	isolated := time.Now()
	t.Logf("isolated %s (stream leader: %v, watch: %v; meta leader: %s)", nodes[x].Name(), pc.leader, pc.watch, nodes[meta].Name())

	// The holder stops by itself: its last write began before the
	// partition, and it trusts a write for T minus the margin (R/2) only.
	select {
	case <-c.ended:
	case <-time.After(10 * time.Second):
		t.Fatal("the holder's lease outlived the partition by 10s")
	}
	lost := c.endedAt.Sub(isolated)
	t.Logf("the holder's lease ended %v after the partition: %v", lost.Round(time.Millisecond), context.Cause(c.lease.Context()))
	if cause := context.Cause(c.lease.Context()); !errors.Is(cause, locks.ErrLost) {
		t.Errorf("the holder's lease ended with %v, want ErrLost", cause)
	}
	if want := testF*testR - testR/2 + 200*time.Millisecond; lost > want { // T - margin, 200ms for scheduling
		t.Errorf("the holder's lease ended %v after the partition, want <= %v", lost, want)
	}

	// The moment the other side can use the bucket again: at once if it
	// kept the stream's leader, else once it has elected another that
	// takes writes.
	ready := isolated
	if pc.leader {
		l := newBucketLeader(t, strings.Join(others, ","), c.bucket, nodes, x)
		elected := time.Now()
		ready = bucketWritable(t, strings.Join(others, ","), c.bucket)
		t.Logf("the other side elected %s the stream's leader %v after the partition; it took writes %v later",
			nodes[l].Name(), elected.Sub(isolated).Round(time.Millisecond), ready.Sub(elected).Round(time.Millisecond))
	}

	var w won
	select {
	case w = <-c.got:
	case err := <-c.errc:
		t.Fatalf("the waiter's Lock failed: %v", err)
	case <-c.ctx.Done():
		t.Fatal("the waiter did not get the lock during the partition")
	}
	t.Logf("the waiter's Lock returned %v after the partition, %v after the other side could use the bucket",
		w.at.Sub(isolated).Round(time.Millisecond), w.at.Sub(ready).Round(time.Millisecond))
	if !c.endedAt.Before(w.at) {
		t.Errorf("the waiter got the lock %v before the holder's lease ended", c.endedAt.Sub(w.at))
	}
	if w.l.Token() <= c.lease.Token() {
		t.Errorf("the waiter's token %d is not above the holder's %d", w.l.Token(), c.lease.Token())
	}
	// doc.go: a silent holder's key is taken over after T + C·R, plus up
	// to one interval of alignment; 500ms more for scheduling. Without a
	// stream leader, a read the waiter had sent to the old one waits out
	// its timeout (max(T, 1s)) first.
	bound := (testF+testC+1)*testR + 500*time.Millisecond
	if pc.leader {
		bound += time.Second
	}
	select {
	case at := <-taken:
		took := at.Sub(ready)
		t.Logf("the test saw the waiter's token in the key %v after the other side could use the bucket, %v before its Lock returned",
			took.Round(time.Millisecond), w.at.Sub(at).Round(time.Millisecond))
		if took > bound {
			t.Errorf("the waiter took the key over %v after the other side could use the bucket, want <= %v", took, bound)
		}
	case <-time.After(5 * time.Second):
		t.Errorf("the test never saw the waiter's token in the key")
	}
	if took := w.at.Sub(ready); took > bound {
		t.Errorf("the waiter's Lock returned %v after the other side could use the bucket, want <= %v", took, bound)
	}

	if err := cluster.Heal(); err != nil {
		t.Fatal(err)
	}
	// The holder's node is back. Its stale Release must find the key
	// written since and leave it. (Once the node takes writes: a node that
	// called elections while cut off may depose leaders as it comes back.)
	bucketWritable(t, nodes[x].URL(), c.bucket)
	err := c.lease.Release(c.ctx)
	t.Logf("the holder's stale Release: %v", err)
	if err := w.l.Context().Err(); err != nil {
		// The lease may not survive those leader changes. Then its key
		// is blanked, or goes silent and is taken over after T (a TryLock
		// measures the silence by the server's clock): a third client
		// taking it proves nothing about the stale Release, so that
		// check is skipped, and says so.
		t.Logf("the waiter's lease ended during the heal (%v): the stale-Release check is skipped", context.Cause(w.l.Context()))
	} else {
		checkStaleRelease(t, c.urls, c.bucket)
	}
	w.exit()
	_ = w.l.Release(c.ctx)
	if err := c.h.Check(); err != nil {
		t.Fatalf("double grant: %v", err)
	}
}

// bucketLeader waits until the bucket's stream has a leader other than
// node avoid and every replica is current, asking the leader to step down
// while it is avoid, and returns the leader's index in nodes.
func bucketLeader(t *testing.T, urls, bucket string, nodes []*natsenv.Server, avoid int) int {
	t.Helper()
	stepDowns := 0
	return awaitBucketLeader(t, urls, bucket, nodes, func(ctx context.Context, nc *nats.Conn, info *jetstream.ClusterInfo, leader int) error {
		if leader < 0 {
			return fmt.Errorf("stream leader %q is no node", info.Leader)
		}
		if n := len(info.Replicas); n != len(nodes)-1 {
			return fmt.Errorf("%d followers, want %d", n, len(nodes)-1)
		}
		for _, p := range info.Replicas {
			if !p.Current || p.Offline {
				return fmt.Errorf("replica %s: current=%v offline=%v", p.Name, p.Current, p.Offline)
			}
		}
		if leader != avoid {
			return nil
		}
		if stepDowns++; stepDowns > 10 {
			return fmt.Errorf("stream leader is still %s after 10 step-downs", info.Leader)
		}
		if err := stepDown(ctx, nc, "KV_"+bucket); err != nil {
			return err
		}
		return fmt.Errorf("stream leader is %s: asked it to step down", info.Leader)
	})
}

// newBucketLeader waits until the bucket's stream, seen through urls, has
// a leader other than node old, and returns its index in nodes.
func newBucketLeader(t *testing.T, urls, bucket string, nodes []*natsenv.Server, old int) int {
	t.Helper()
	return awaitBucketLeader(t, urls, bucket, nodes, func(_ context.Context, _ *nats.Conn, info *jetstream.ClusterInfo, leader int) error {
		if leader < 0 || leader == old {
			return fmt.Errorf("stream leader: %q", info.Leader)
		}
		return nil
	})
}

// awaitBucketLeader asks, through urls only, for the cluster information
// of the bucket's stream until it has a leader and check, given it, the
// connection and the leader's index in nodes (-1 if none), returns nil;
// it fails t after 30s. It returns the leader's index.
func awaitBucketLeader(t *testing.T, urls, bucket string, nodes []*natsenv.Server,
	check func(ctx context.Context, nc *nats.Conn, info *jetstream.ClusterInfo, leader int) error) int {
	t.Helper()
	nc, js, err := connect(urls, nats.IgnoreDiscoveredServers())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	leader := -1
	err = retryFor(30*time.Second, func(ctx context.Context) error {
		info, err := bucketCluster(ctx, js, bucket)
		if err != nil {
			return err
		}
		leader = nodeIndex(nodes, info.Leader)
		return check(ctx, nc, info, leader)
	})
	if err != nil {
		t.Fatal(err)
	}
	return leader
}

// bucketCluster returns the cluster information of the bucket's stream,
// or an error if it has no leader.
func bucketCluster(ctx context.Context, js jetstream.JetStream, bucket string) (*jetstream.ClusterInfo, error) {
	st, err := js.Stream(ctx, "KV_"+bucket)
	if err != nil {
		return nil, err
	}
	info, err := st.Info(ctx)
	if err != nil {
		return nil, err
	}
	if info.Cluster == nil || info.Cluster.Leader == "" {
		return nil, errors.New("no stream leader")
	}
	return info.Cluster, nil
}

func nodeIndex(nodes []*natsenv.Server, name string) int {
	for i, s := range nodes {
		if s.Name() == name {
			return i
		}
	}
	return -1
}

// stepDown asks the leader of stream to hand its leadership to another
// replica.
func stepDown(ctx context.Context, nc *nats.Conn, stream string) error {
	m, err := nc.RequestWithContext(ctx, "$JS.API.STREAM.LEADER.STEPDOWN."+stream, nil)
	if err != nil {
		return err
	}
	var resp struct {
		Success bool `json:"success"`
		Error   *struct {
			Description string `json:"description"`
		} `json:"error"`
	}
	if err := json.Unmarshal(m.Data, &resp); err != nil {
		return err
	}
	if !resp.Success {
		return fmt.Errorf("stream leader step-down: %+v", resp.Error)
	}
	return nil
}

// bucketWritable waits until a write to the bucket through urls succeeds,
// trying every 50ms with a timeout of 200ms each, and returns when the
// first one that succeeded began.
func bucketWritable(t *testing.T, urls, bucket string) time.Time {
	t.Helper()
	kv := mustBucket(t, urls, bucket, nats.IgnoreDiscoveredServers())
	deadline := time.Now().Add(30 * time.Second)
	for {
		start := time.Now()
		ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
		_, err := kv.Put(ctx, "probe", []byte("x"))
		cancel()
		if err == nil {
			return start
		}
		if time.Now().After(deadline) {
			t.Fatalf("the bucket takes no write through %s: %v", urls, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// watchTakeover reads the key "job" through urls every 10ms (direct gets,
// which any replica answers) until its value starts with prefix, and
// sends the time of that read on the channel it returns.
func watchTakeover(t *testing.T, urls, bucket, prefix string) <-chan time.Time {
	t.Helper()
	kv := mustBucket(t, urls, bucket, nats.IgnoreDiscoveredServers())
	ctx, cancel := context.WithCancel(context.Background())
	taken := make(chan time.Time, 1)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for ctx.Err() == nil {
			rctx, rcancel := context.WithTimeout(ctx, 200*time.Millisecond)
			e, err := kv.Get(rctx, "job")
			rcancel()
			if err == nil && strings.HasPrefix(string(e.Value()), prefix) {
				taken <- time.Now()
				return
			}
			select {
			case <-ctx.Done():
			case <-time.After(10 * time.Millisecond):
			}
		}
	}()
	t.Cleanup(func() { cancel(); <-done }) // before mustBucket's close
	return taken
}

// checkStaleRelease checks that a third client finds the key of job held
// by the waiter: the holder's stale Release left it alone.
func checkStaleRelease(t *testing.T, urls, bucket string) {
	t.Helper()
	third := newTestClient(t, urls, bucket, natsputex.WithHolderID("third"))
	err := retryFor(30*time.Second, func(ctx context.Context) error {
		l, err := third.Locker().TryLock(ctx, "job")
		var held *locks.HeldError
		switch {
		case err == nil:
			_ = l.Release(ctx)
			t.Fatal("the holder's stale Release freed the waiter's key: a third client took it")
		case errors.As(err, &held):
			t.Logf("after the holder's stale Release the key is held by %q", held.Holder)
			if !strings.HasPrefix(held.Holder, "waiter/") {
				t.Errorf("after the holder's stale Release the key is held by %q, want the waiter", held.Holder)
			}
			return nil
		}
		return err // no answer: try again
	})
	if err != nil {
		t.Errorf("TryLock after the holder's stale Release: %v", err)
	}
}
