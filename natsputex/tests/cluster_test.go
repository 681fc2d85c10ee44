package natsputex_test

// Clusters: R3 buckets on embedded clusters and clusters of the
// nats-server program, their leaders stopped, stepped down, partitioned.

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/goleak"

	"github.com/latchkey-go/latchkey/contracttest"
	"github.com/latchkey-go/latchkey/contracttest/testenv/natsenv"
	"github.com/latchkey-go/latchkey/locks"
	"github.com/latchkey-go/latchkey/natsputex"
)

// TestBatchedRenewalsAcrossStreamStepDowns: on an embedded 3-node cluster
// with an R3 bucket, one Client pinned to a follower holds 10 leases (R =
// 200ms, F = 3: T = 600ms) while another, pinned to the other follower,
// waits in Lock on each name; the bucket's stream leader steps down three
// times, 800ms apart, while the batched renewals run. No lease may be live
// past its deadline, no name granted while its holder's lease is live,
// tokens rise.
func TestBatchedRenewalsAcrossStreamStepDowns(t *testing.T) {
	if testing.Short() {
		t.Skip("a 3-node cluster")
	}
	cluster := natsenv.StartCluster(t, 3)
	nodes := cluster.Servers()
	bucket := uniqueBucket("cluster")
	prepareBucket(t, cluster.URLs(), bucket, natsputex.WithReplicas(3))
	leader := bucketLeader(t, cluster.URLs(), bucket, nodes, -1)
	opts := []natsputex.Option{natsputex.WithRenewInterval(200 * time.Millisecond), natsputex.WithFailureThreshold(3)}
	holder := newPinnedClient(t, nodes[(leader+1)%3].URL(), bucket, append(opts, natsputex.WithHolderID("holder"))...)
	waiter := newPinnedClient(t, nodes[(leader+2)%3].URL(), bucket, append(opts, natsputex.WithHolderID("waiter"))...)
	v := watchValidity(t)
	ctx, cancel := context.WithTimeout(context.Background(), 25*time.Second)
	defer cancel()
	names := leaseNames(10)
	gs := make([]*grants, len(names))
	for i, n := range names {
		l := tryLockFirst(t, ctx, holder.Locker(), n)
		gs[i] = newGrants()
		gs[i].grant("holder", l)
		v.add(n, l)
	}
	var wg sync.WaitGroup
	var granted atomic.Int32
	for i, n := range names {
		wg.Add(1)
		go func() {
			defer wg.Done()
			l, err := waiter.Locker().Lock(ctx, n)
			if err != nil {
				return
			}
			granted.Add(1)
			gs[i].grant("waiter", l)
			v.add(n+"/waiter", l)
		}()
	}
	nc, _, err := connect(cluster.URLs())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	for range 3 {
		time.Sleep(800 * time.Millisecond)
		sctx, scancel := context.WithTimeout(ctx, 5*time.Second)
		if err := stepDown(sctx, nc, "KV_"+bucket); err != nil {
			t.Logf("step down: %v", err)
		}
		scancel()
	}
	time.Sleep(time.Second)
	var lost int
	for _, g := range gs {
		if g.first().Context().Err() != nil {
			lost++
		}
	}
	t.Logf("after three step-downs: %d of %d holder leases lost, %d names granted to the waiter", lost, len(names), granted.Load())
	cancel()
	wg.Wait()
	for _, g := range gs {
		g.check(t)
	}
	v.check(t)
}

// TestSupervisorAcrossStreamLeaderRestarts: on an embedded 3-node cluster
// with an R3 bucket (R = 100ms, F = 3, C = 2), the node leading the bucket's
// stream is restarted twice: while node-a is active and its client also
// holds a Locker lease ("job") renewed in the same rounds (mid-renewal),
// then right before a standby takes over from the crashed active agent
// (mid-takeover). The Locker lease must never be live past its Deadline, the
// services never overlap, and every takeover comes T after another token's
// last write and starts C·R after its own first write.
//
// The bucket keeps 64 values of a key (New makes its buckets with 1): the
// test's watch runs on an R1 consumer, which a restart of its node loses,
// and nats.go makes it again from the revision after the last it got; with
// one value kept, a write replaced meanwhile is gone from the stream and the
// watch never delivers it. Reproduced as in a CI run: node-c's takeover
// write was answered with rev 41, node-b's rival write refused with "wrong
// last sequence: 41", node-c's next write, conditional on rev 41, stored
// at rev 43 by the new stream leader; the watch's consumer, lost with the
// restarted node, was made again after that, from rev 38 on, and delivered
// rev 43 first, so node-c's Start with token 41 was "not a revision its
// token was written at". The checks read the writes the watch delivered
// and the key's history in the stream.
func TestSupervisorAcrossStreamLeaderRestarts(t *testing.T) {
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
	bucket := uniqueBucket("cluster")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := mustJS(t, urls).CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: bucket, History: 64, Replicas: 3}); err != nil {
		t.Fatal(err)
	}
	prepareBucket(t, urls, bucket, natsputex.WithReplicas(3))
	const key = "spof-service"
	writes := watchWrites(t, urls, bucket, key)
	h := contracttest.NewHistory(1)
	opts := []natsputex.Option{natsputex.WithConfirmations(C)}
	servers := cluster.Servers()
	nodes := []*node{}
	for i, name := range []string{"node-a", "node-b", "node-c"} {
		n := startNode(t, servers[i].URL(), bucket, key, name, h, withClientOptions(append(opts, natsputex.WithHolderID("client-"+name))...))
		n.stopDelay.Store(int64(30 * time.Millisecond))
		nodes = append(nodes, n)
	}
	active := waitActiveNode(t, 10*time.Second, nodes...)
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
	up := waitActiveNode(t, 30*time.Second, nodes...)
	t.Logf("mid-renewal: restarted the stream leader %s in %v; %s runs %v after it began; the Locker lease: %v",
		servers[leader].Name(), time.Since(began).Round(time.Millisecond), up.name, time.Since(began).Round(time.Millisecond), context.Cause(l.Context()))
	time.Sleep(5 * testR)

	// Mid-takeover.
	up = waitActiveNode(t, 10*time.Second, nodes...)
	leader = bucketLeader(t, urls, bucket, servers, -1)
	up.kill()
	last, _ := writes.lastBy(up.name, time.Now())
	time.Sleep(time.Until(last.seen.Add(T - 50*time.Millisecond)))
	began = time.Now()
	if err := cluster.Restart(leader); err != nil {
		t.Fatal(err)
	}
	var rest []*node
	for _, n := range nodes {
		if n != up {
			rest = append(rest, n)
		}
	}
	next := waitActiveNode(t, 30*time.Second, rest...)
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
	stored := storedWrites(t, writes, urls, bucket, key)
	for _, n := range nodes {
		checkTakeovers(t, stored, n, T, C*testR)
	}
	if err := h.Check(); err != nil {
		t.Errorf("services overlapped: %v", err)
	}
}

// storedWrites returns, in revision order and once each, the writes of key
// that watch delivered, once it has seen the key's last write, and those
// its bucket's history holds: a watch made again across a server restart
// resumes after the last revision it got, and a write the bucket no longer
// keeps by then is never delivered. It logs the revisions only the history
// had.
func storedWrites(t *testing.T, watch *keyWatch, urls, bucket, key string) *keyWatch {
	t.Helper()
	watch.catchUp(t)
	byRev := map[uint64]keyWrite{}
	for _, w := range watch.all() {
		byRev[w.rev] = w
	}
	var missed []uint64
	for _, w := range keyHistory(t, urls, bucket, key).all() {
		if _, ok := byRev[w.rev]; !ok {
			byRev[w.rev] = w
			missed = append(missed, w.rev)
		}
	}
	if len(missed) > 0 {
		t.Logf("the watch did not deliver revisions %v of the key's history", missed)
	}
	out := &keyWatch{urls: urls, bucket: bucket, key: key}
	for _, w := range byRev {
		out.writes = append(out.writes, w)
	}
	slices.SortFunc(out.writes, func(a, b keyWrite) int { return cmp.Compare(a.rev, b.rev) })
	return out
}

// TestSupervisorAcrossClusterLeaderChanges: an embedded 3-node cluster (the
// nats-server library, 2.11; the nats-server 2.9.10 on PATH is older than
// MinClusterVersion, so New refuses an R3 bucket on it) with an R3 bucket.
// node-a and node-b (R = 100ms, F = 3, C = 2, on ConnectOptions, each
// connected to all the nodes) on one key; the active agent's client also
// holds a Locker lease. The bucket's stream leader is asked to step down
// three times, at 0, R/3 and 2R/3 after a renewal of the active agent's,
// then the leader node is shut down mid-interval. Writes in flight across
// a leader change may be answered late or not at all, and the next
// renewal is made at the agent's last revision. The Locker lease is
// never live past its Deadline; every takeover comes T after another
// token's write and starts C·R after its first write; one agent is active
// again within 15s of each change; the services never overlap.
func TestSupervisorAcrossClusterLeaderChanges(t *testing.T) {
	const (
		C = 2
		T = testF * testR
	)
	if testing.Short() {
		t.Skip("starts a 3-node cluster")
	}
	checkLeaks(t)
	cluster := natsenv.StartCluster(t, 3)
	urls := cluster.URLs()
	servers := cluster.Servers()
	bucket := uniqueBucket("cluster")
	js := mustJS(t, urls)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: bucket, History: 64, Replicas: 3}); err != nil {
		t.Fatal(err)
	}
	const key = "spof-service"
	hist := newHistoryLog(t, urls, bucket, key)
	h := contracttest.NewHistory(1)
	conn := natsputex.ConnectOptions()
	var nodes []*node
	for _, name := range []string{"node-a", "node-b"} {
		n := startNode(t, urls, bucket, key, name, h, withConn(conn...), withClientOptions(natsputex.WithConfirmations(C), natsputex.WithHolderID("client-"+name)))
		n.stopDelay.Store(int64(20 * time.Millisecond))
		nodes = append(nodes, n)
	}
	up := waitActiveNode(t, 10*time.Second, nodes...)
	v := watchValidity(t)
	lease, err := up.c.Locker().TryLock(ctx, "job")
	if err != nil {
		t.Fatal(err)
	}
	v.add(up.name+" job", lease)
	for i, offset := range []time.Duration{0, testR / 3, 2 * testR / 3} {
		up = waitActiveNode(t, 15*time.Second, nodes...)
		writes := watchWrites(t, urls, bucket, key)
		time.Sleep(3 * testR)
		at := afterRenewal(t, writes, up.name, offset, func() {
			if err := stepDown(ctx, js.Conn(), "KV_"+bucket); err != nil {
				t.Logf("step-down %d: %v", i, err)
			}
		})
		next := waitActiveNode(t, 15*time.Second, nodes...)
		t.Logf("step-down %d, %v after a renewal of %s's: %s active %v after it; the lease: %v", i, offset, up.name, next.name, time.Since(at).Round(time.Millisecond), context.Cause(lease.Context()))
		time.Sleep(T + C*testR + 3*testR)
		hist.collect()
	}
	up = waitActiveNode(t, 15*time.Second, nodes...)
	leader := bucketLeader(t, urls, bucket, servers, -1)
	writes := watchWrites(t, urls, bucket, key)
	time.Sleep(3 * testR)
	at := afterRenewal(t, writes, up.name, testR/2, func() { cluster.Stop(leader) })
	next := waitActiveNode(t, 15*time.Second, nodes...)
	t.Logf("stream leader %s shut down halfway between two renewals of %s's: %s active %v after it", servers[leader].Name(), up.name, next.name, time.Since(at).Round(time.Millisecond))
	time.Sleep(T + C*testR + 3*testR)
	stopNodes(nodes...)
	hist.collect()
	_ = lease.Release(context.Background())
	v.check(t)
	for _, n := range nodes {
		checkTakeovers(t, hist.watch(), n, T, C*testR)
	}
	if err := h.Check(); err != nil {
		t.Errorf("services overlapped: %v", err)
	}
}

// TestTakeoverResentAcrossClusterNodeRestart: the same on a 3-node cluster
// of the nats-server program (2.9.10: a single-replica bucket, which New
// accepts on it), the taker connected (ConnectOptions, every node's URL, its
// node first) to the node its Standby check shuts down, which is started
// again (Cluster.Restart: back once current). "other-node": the bucket's
// stream lives on another node, and nats.go reconnects to one of the others;
// "stream-node": on the node restarted, so no write is answered until it is
// back. Lock (ctx 15s) must return the lease with the bounds above.
func TestTakeoverResentAcrossClusterNodeRestart(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a 3-node cluster")
	}
	cluster, bucket, sn := binaryClusterBucket(t, "cluster")
	servers := cluster.Servers()
	for _, tc := range []struct {
		name string
		node int
	}{{"other-node", (sn + 1) % 3}, {"stream-node", sn}} {
		t.Run(tc.name, func(t *testing.T) {
			key := "job-" + tc.name
			i := tc.node
			var ordered []string
			for j := range servers {
				ordered = append(ordered, servers[(i+j)%3].URL())
			}
			nc, js, err := connect(strings.Join(ordered, ","), append(natsputex.ConnectOptions(), nats.DontRandomize())...)
			if err != nil {
				t.Fatal(err)
			}
			t.Logf("the stream lives on %s; the taker is on %s, which is restarted", servers[sn].Name(), servers[i].Name())
			admin := servers[(i+1)%3].URL()
			if i != sn {
				admin = servers[sn].URL()
			}
			kv := mustBucket(t, admin, bucket)
			takeAcrossFault(t, nc, js, kv, newHistoryLog(t, admin, bucket, key), bucket, key, func() { cluster.Stop(i) }, func() {
				if err := cluster.Restart(i); err != nil {
					t.Fatal(err)
				}
			})
		})
	}
}

// TestClientsNodeRestartInCluster: on a 3-node cluster of the nats-server
// program (2.9.10: a single-replica bucket), one client, connected with
// ConnectOptions to a node that does not hold the bucket's stream (the
// others' URLs after it), runs a Supervisor (node-a: R = 100ms, F = 10,
// C = 1) and holds four Locker leases it took; a second client on the
// stream's node runs node-b and waits in Lock (R = 50ms, C = 0) for each
// name. The first client's node is shut down 50ms after one of node-a's
// renewals and started again (Cluster.Restart): its requests are refused
// while nats.go reconnects to another node, and sent again there. No
// lease may be live past its deadline (+3ms); no waiter granted a name
// while its holder's lease is live; node-a and node-b never both run
// their services (History), and node-b's takeover, if any, comes T after
// node-a's write and starts C·R after it (checkTakeovers).
func TestClientsNodeRestartInCluster(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a 3-node cluster")
	}
	const F = 10
	cluster, bucket, sn := binaryClusterBucket(t, "cluster")
	servers, key := cluster.Servers(), "spof-service"
	i := (sn + 1) % 3
	ordered := servers[i].URL() + "," + servers[(i+1)%3].URL() + "," + servers[(i+2)%3].URL()
	writes := watchWrites(t, servers[sn].URL(), bucket, key)
	h := contracttest.NewHistory(1)
	a := startNode(t, ordered, bucket, key, "node-a", h, withConn(append(natsputex.ConnectOptions(), nats.DontRandomize())...), withClientOptions(natsputex.WithFailureThreshold(F)))
	waitActiveNode(t, 10*time.Second, a)
	b := startNode(t, servers[sn].URL(), bucket, key, "node-b", h, onConnectOptions(), withClientOptions(natsputex.WithFailureThreshold(F)))
	bnc, bjs, err := connect(servers[sn].URL(), append(natsputex.ConnectOptions(), nats.IgnoreDiscoveredServers())...)
	if err != nil {
		t.Fatal(err)
	}
	waiter := newClientOn(t, bnc, bjs, bucket, natsputex.WithRenewInterval(testR/2), natsputex.WithConfirmations(0), natsputex.WithHolderID("waiter"))
	v := watchValidity(t)
	names := []string{"j1", "j2", "j3", "j4"}
	leases := map[string]locks.Lease{}
	gs := map[string]*grants{}
	waits := map[string]<-chan outcome{}
	wctx, wcancel := context.WithTimeout(context.Background(), 12*time.Second)
	defer wcancel()
	for _, name := range names {
		l, err := a.c.Locker().TryLock(context.Background(), name)
		if err != nil {
			t.Fatal(err)
		}
		leases[name], gs[name] = l, newGrants()
		v.add("holder "+name, l)
		gs[name].grant("holder", l)
		waits[name] = goLock(wctx, waiter.Locker(), name, false)
	}
	time.Sleep(5 * testR)
	down := afterRenewal(t, writes, "node-a", 50*time.Millisecond, func() { cluster.Stop(i) })
	if err := cluster.Restart(i); err != nil {
		t.Fatal(err)
	}
	t.Logf("%s (node-a's and the holder's) stopped and back %v later; the stream on %s", servers[i].Name(), ms(time.Since(down)), servers[sn].Name())
	time.Sleep(2 * time.Second)
	kept := 0
	for _, name := range names {
		if leases[name].Context().Err() == nil {
			kept++
			_ = leases[name].Release(context.Background())
		} else {
			t.Logf("%s: the holder's lease ended: %v", name, context.Cause(leases[name].Context()))
		}
	}
	for _, name := range names {
		o := waitOutcome(t, waits[name], 12*time.Second, "the waiter's Lock of "+name)
		if o.err != nil {
			t.Errorf("%s: the waiter's Lock: %v", name, o.err)
			continue
		}
		gs[name].grant("waiter", o.lease)
		v.add("waiter "+name, o.lease)
		_ = o.lease.Release(context.Background())
	}
	t.Logf("holder leases kept across the restart: %d of %d; node-a running: %v, node-b running: %v", kept, len(names), a.running(), b.running())
	a.cancel()
	a.wait(5 * time.Second)
	b.cancel()
	b.wait(5 * time.Second)
	checkTakeovers(t, writes, b, F*testR, testC*testR)
	if err := h.Check(); err != nil {
		t.Errorf("services overlapped: %v", err)
	}
	v.check(t)
	for _, name := range names {
		gs[name].check(t)
	}
}

// TestClusterLeaderStopMidTakeover: on an embedded 3-node cluster
// with an R3 bucket, a holder connected to a follower crashes; a waiting
// Lock and two TryLock loops (on the other nodes) race for its key, and
// the bucket's stream leader is stopped just before T of silence has
// passed (mid-takeover), then restarted. Every grant is checked: no lease
// live when another is granted, tokens rising.
func TestClusterLeaderStopMidTakeover(t *testing.T) {
	if testing.Short() {
		t.Skip("a 3-node cluster")
	}
	cluster := natsenv.StartCluster(t, 3)
	nodes := cluster.Servers()
	bucket := uniqueBucket("cluster")
	prepareBucket(t, cluster.URLs(), bucket, natsputex.WithReplicas(3))
	leader := bucketLeader(t, cluster.URLs(), bucket, nodes, -1)
	follower := (leader + 1) % 3
	writes := watchWrites(t, nodes[follower].URL(), bucket, "job")
	nc, js, err := connect(nodes[follower].URL(), nats.IgnoreDiscoveredServers())
	if err != nil {
		t.Fatal(err)
	}
	crashed, err := natsputex.New(context.Background(), js, bucket, natsputex.WithHolderID("crashed"),
		natsputex.WithRenewInterval(testR), natsputex.WithFailureThreshold(testF), natsputex.WithConfirmations(testC))
	if err != nil {
		t.Fatal(err)
	}
	g := newGrants()
	// The first write may find the new cluster's stream between leaders
	// ("no response from stream"), or take longer than the lease's
	// validity on a loaded machine: tryLockFirst tries again.
	held := tryLockFirst(t, context.Background(), crashed.Locker(), "job")
	g.grant("crashed", held)
	ctx, cancel := context.WithTimeout(context.Background(), 40*time.Second)
	defer cancel()
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for i := range 3 {
		who := fmt.Sprintf("c%d", i)
		c := newTestClient(t, cluster.URLs(), bucket, natsputex.WithHolderID(who))
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				var l locks.Lease
				var err error
				if i == 0 {
					lctx, lcancel := context.WithTimeout(ctx, 3*time.Second)
					l, err = c.Locker().Lock(lctx, "job")
					lcancel()
				} else {
					l, err = c.Locker().TryLock(ctx, "job")
				}
				if err != nil {
					if !errors.Is(err, locks.ErrNotAcquired) && !errors.Is(err, context.DeadlineExceeded) {
						t.Logf("%s: %v", who, err)
					}
					time.Sleep(10 * time.Millisecond)
					continue
				}
				g.grant(who, l)
				select {
				case <-l.Context().Done():
				case <-time.After(150 * time.Millisecond):
				}
				_ = l.Release(context.Background())
			}
		}()
	}
	time.Sleep(3 * testR)
	nc.Close() // the holder crashes
	t.Cleanup(func() { _ = crashed.Close(context.Background()) })
	time.Sleep(time.Until(writes.lastWrite().Add(testF*testR - 30*time.Millisecond)))
	stopped := time.Now()
	cluster.Stop(leader)
	t.Logf("stopped the stream leader (node %d) %v after the crashed holder's last write seen", leader, stopped.Sub(writes.lastWrite()).Round(time.Millisecond))
	time.Sleep(3 * time.Second)
	if err := cluster.Restart(leader); err != nil {
		t.Fatal(err)
	}
	time.Sleep(time.Second)
	close(stop)
	wg.Wait()
	g.mu.Lock()
	t.Logf("%d grants", len(g.leases))
	g.mu.Unlock()
	g.check(t)
	silence(t, writes, "crashed", testF*testR)
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
	lease := holdFirst(t, c.ctx, holder)
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

// waitWatching waits until the waiter watches the key: it is the head of
// the key's queue (natsputex/queue.go: the queue's consumer, the only
// consumer of the bucket's stream, has delivered the baton and has no
// other request waiting), made once its first attempt found the key
// held. It returns the consumer's name and the node that leads it. not is
// the name of a KV watch to skip (a Semaphore's or a Supervisor's); the
// queue's consumer keeps its name when it is made again.
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
		queue := len(infos) == 1 && strings.HasPrefix(infos[0].Name, "natsputex_turn_")
		if len(infos) != 1 || !queue && infos[0].Name == not {
			return fmt.Errorf("%d consumers on the bucket, want the waiter's queue alone", len(infos))
		}
		if queue {
			cons, err := st.Consumer(ctx, infos[0].Name)
			if err != nil {
				return err
			}
			info, err := cons.Info(ctx)
			if err != nil {
				return err
			}
			if info.NumAckPending != 1 || info.NumPending != 0 || info.NumWaiting != 0 {
				return fmt.Errorf("the waiter is not the head of the queue yet: %d pending, %d unacknowledged, %d waiting",
					info.NumPending, info.NumAckPending, info.NumWaiting)
			}
			infos[0] = info
		}
		if infos[0].Cluster == nil || infos[0].Cluster.Leader == "" {
			return errors.New("the waiter's queue has no leader")
		}
		name, node = infos[0].Name, infos[0].Cluster.Leader
		return nil
	})
	if err != nil {
		t.Fatalf("the waiter does not watch the key: %v", err)
	}
	return name, node
}

// dropQueue deletes the queue consumers of the bucket's stream, so that
// the next waiter makes its queue again, on a node of the cluster's
// choosing.
func dropQueue(t *testing.T, urls, bucket string) {
	t.Helper()
	nc, js, err := connect(urls)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	err = retryFor(10*time.Second, func(ctx context.Context) error {
		st, err := js.Stream(ctx, "KV_"+bucket)
		if err != nil {
			return err
		}
		for name := range st.ListConsumers(ctx).Info() {
			if strings.HasPrefix(name.Name, "natsputex_turn_") {
				if err := st.DeleteConsumer(ctx, name.Name); err != nil {
					return err
				}
			}
		}
		return nil
	})
	if err != nil {
		t.Fatalf("deleting the queue: %v", err)
	}
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
	// The queue's consumer is placed on a random replica: delete it and
	// start the waiter's Lock again until it lands where the case wants
	// it. (The head needs the consumer only to be handed the baton: once
	// it has it, it watches the key by a core subscription.)
	waiter := newPinnedClient(t, strings.Join(others, ","), c.bucket, natsputex.WithHolderID("waiter")).Locker()
	for attempt := 0; ; attempt++ {
		node, cancel := c.wait(t, waiter)
		if (node == nodes[x].Name()) == pc.watch {
			break
		}
		if attempt == 30 {
			t.Fatalf("the waiter's queue never landed where the case wants it (%d attempts)", attempt+1)
		}
		cancel()
		dropQueue(t, strings.Join(others, ","), c.bucket)
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
		// The test's own watch may run on the node cut off, and see the
		// write only once nats.go has made it again; the token was in
		// the key when the waiter's Lock returned at the latest.
		if w.at.Before(at) {
			at = w.at
		}
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

// TestSupervisorClusterLeaderRestart: on a 3-node cluster with an R3
// bucket, restarting the node that leads the bucket's stream never lets
// two agents run the service at once, and one runs it again within 30s
// (a generous liveness bound: the figure is logged).
func TestSupervisorClusterLeaderRestart(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a 3-node cluster")
	}
	ignore := goleak.IgnoreCurrent()
	t.Cleanup(func() { goleak.VerifyNone(t, append(natsenv.ConsumerGoroutines(), ignore)...) })
	cluster := natsenv.StartCluster(t, 3)
	urls := cluster.URLs()
	bucket := uniqueBucket("supcluster")
	prepareBucket(t, urls, bucket, natsputex.WithReplicas(3))
	const key = "spof-service"
	h := contracttest.NewHistory(1)
	agents := []*agent{
		startAgent(t, urls, bucket, key, "node-a", h),
		startAgent(t, urls, bucket, key, "node-b", h),
	}
	waitActive(t, 10*time.Second, agents...)
	kv := mustBucket(t, urls, bucket)
	for round := range 2 {
		time.Sleep(3 * testR)
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		st, err := kv.Status(ctx)
		cancel()
		if err != nil {
			t.Fatal(err)
		}
		info := st.(*jetstream.KeyValueBucketStatus).StreamInfo()
		leader := -1
		for i, s := range cluster.Servers() {
			if info.Cluster != nil && s.Name() == info.Cluster.Leader {
				leader = i
			}
		}
		if leader < 0 {
			t.Fatalf("no stream leader in %+v", info.Cluster)
		}
		began := time.Now()
		if err := cluster.Restart(leader); err != nil {
			t.Fatal(err)
		}
		back := time.Now()
		active := waitActive(t, 30*time.Second, agents...)
		t.Logf("round %d: restarting the stream leader %s took %v; %s runs the service %v after it began", round, cluster.Servers()[leader].Name(), back.Sub(began).Round(time.Millisecond), active.name, time.Since(began).Round(time.Millisecond))
	}
	for _, a := range agents {
		a.stop()
	}
	if err := h.Check(); err != nil {
		t.Fatalf("services overlapped: %v", err)
	}
}
