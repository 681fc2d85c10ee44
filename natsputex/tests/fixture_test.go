package natsputex_test

// The module's fixtures: one way to start each thing a test needs.
//   - An env is a fresh bucket: newEnv, set by envOptions (the local
//     server, an embedded one or a nats-server process of the test's;
//     memory, file or 64 values of history; a leak check); localEnv,
//     supervisorEnv, promiseEnv and binaryEnv are its common settings.
//   - A Supervisor with its own connection and Client is started by
//     startNode or startAgent, both set by nodeOptions (token, client
//     options, connection options). An agent runs like a process until the
//     test ends: its Client closes when Run returns, and kill waits for Run.
//     A node is one whose Client the test holds: every Start and Stop call
//     is recorded with its context, it may be made without running
//     (notRunning) and run again.
//   - A client is newTestClient, newPinnedClient or newClientOn; a link is
//     a connection through a fault proxy of its own (dialLink,
//     proxiedClient). testenv.Proxy is the fault proxy; loseAnswer puts
//     one between a client and the server, ready to lose the answer to
//     the client's next write to a key.
//
// The suite's timing is testR, testF, testC.

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/goleak"

	"github.com/latchkey-go/latchkey/contracttest"
	"github.com/latchkey-go/latchkey/contracttest/testenv"
	"github.com/latchkey-go/latchkey/contracttest/testenv/natsenv"
	"github.com/latchkey-go/latchkey/locks"
	"github.com/latchkey-go/latchkey/natsputex"
)

// mustJS is JetStream on a connection of its own to url, closed at cleanup.
func mustJS(t *testing.T, url string) jetstream.JetStream {
	t.Helper()
	nc, js, err := connect(url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	return js
}

// proxiedClient is a client on a connection through a fault proxy of its
// own, pinned to url.
func proxiedClient(t *testing.T, url, bucket string, opts ...natsputex.Option) (*natsputex.Client, *testenv.Proxy) {
	t.Helper()
	proxy := testenv.NewProxy(t, strings.TrimPrefix(url, "nats://"))
	nc, js, err := connect("nats://"+proxy.Addr(), nats.IgnoreDiscoveredServers())
	if err != nil {
		t.Fatal(err)
	}
	return newClientOn(t, nc, js, bucket, opts...), proxy
}

func leaseNames(n int) []string {
	names := make([]string, n)
	for i := range names {
		names[i] = fmt.Sprintf("batch%02d", i)
	}
	return names
}

// An env is a fresh bucket for one test: the server's URL, the bucket,
// the key the Supervisor tests use, and the server when the test made it.
type env struct {
	srv              *natsenv.Server // nil on the local server
	url, bucket, key string
}

// An envOption says how newEnv makes an env.
type envOption func(*envConfig)

type envConfig struct {
	server  string // "embedded" (the default), "local" or "binary"
	prefix  string // of the bucket's name
	memory  bool   // the bucket in memory
	history bool   // file storage keeping 64 values per key (historyBucket)
	leaks   bool   // checkLeaks
}

// onLocalServer uses the NATS server on 127.0.0.1:4222 (skipped if none
// answers with JetStream); the bucket is deleted at the end.
func onLocalServer() envOption { return func(c *envConfig) { c.server = "local" } }

// onBinaryServer starts a server of the nats-server program on PATH (see
// natsenv.Binary).
func onBinaryServer() envOption { return func(c *envConfig) { c.server = "binary" } }

// named prefixes the bucket's name.
func named(prefix string) envOption { return func(c *envConfig) { c.prefix = prefix } }

// inMemory makes the bucket with memory storage.
func inMemory() envOption { return func(c *envConfig) { c.memory = true } }

// keepingHistory makes the bucket with file storage and 64 values per key,
// so that keyHistory can read every write after the test.
func keepingHistory() envOption { return func(c *envConfig) { c.history = true } }

// checkingLeaks fails the test if goroutines started during it outlive it.
func checkingLeaks() envOption { return func(c *envConfig) { c.leaks = true } }

// newEnv makes a fresh bucket on an embedded server, or as opts say.
func newEnv(t *testing.T, opts ...envOption) env {
	t.Helper()
	cfg := envConfig{server: "embedded", prefix: "env"}
	for _, o := range opts {
		o(&cfg)
	}
	if cfg.leaks {
		// Goroutines running now are not the test's; IgnoreCurrent must be
		// taken now, not in the cleanup, where it would ignore every leak.
		checkLeaks(t)
	}
	var e env
	switch cfg.server {
	case "local":
		e.url = localServer(t)
	case "binary":
		e.srv = natsenv.StartBinaryServer(t)
		e.url = e.srv.URL()
	default:
		e.srv = natsenv.StartServer(t)
		e.url = e.srv.URL()
	}
	e.bucket, e.key = uniqueBucket(cfg.prefix), "spof-service"
	switch {
	case cfg.history:
		historyBucket(t, e.url, e.bucket)
	case cfg.memory:
		prepareBucket(t, e.url, e.bucket, natsputex.WithStorage(jetstream.MemoryStorage))
	default:
		prepareBucket(t, e.url, e.bucket)
	}
	if cfg.server == "local" {
		t.Cleanup(func() { deleteBucket(e.url, e.bucket) })
	}
	return e
}

// localEnv is a fresh memory bucket on the local NATS server (skipped if
// none answers), deleted at the end, with a leak check.
func localEnv(t *testing.T) (url, bucket, key string) {
	t.Helper()
	e := newEnv(t, onLocalServer(), named("local"), inMemory(), checkingLeaks())
	return e.url, e.bucket, e.key
}

// supervisorEnv is a fresh memory bucket on an embedded server, with a
// leak check.
func supervisorEnv(t *testing.T) (url, bucket, key string) {
	t.Helper()
	e := newEnv(t, named("sup"), inMemory(), checkingLeaks())
	return e.url, e.bucket, e.key
}

// promiseEnv is a fresh bucket on an embedded server.
func promiseEnv(t *testing.T, prefix string) (url, bucket string) {
	t.Helper()
	e := newEnv(t, named(prefix))
	return e.url, e.bucket
}

// binaryEnv is a fresh bucket keeping 64 values per key on a server of
// the nats-server program on PATH, with a leak check.
func binaryEnv(t *testing.T, prefix string) (srv *natsenv.Server, url, bucket, key string) {
	t.Helper()
	e := newEnv(t, onBinaryServer(), named(prefix), keepingHistory(), checkingLeaks())
	return e.srv, e.url, e.bucket, e.key
}

// serviceCall is one call of a Service function.
type serviceCall struct {
	token      uint64 // Start's
	begin, end time.Time
	left       time.Duration // ctx deadline − begin; -1: none
	ctxErr     error         // the context's error when the call returned
	err        error
}

// node is one agent whose Client the test holds: its service's section
// in h opens when Start begins (a slow Start may have half started it)
// and closes when a Stop that succeeds returns.
type node struct {
	t    *testing.T
	name string
	nc   *nats.Conn
	c    *natsputex.Client
	sup  *natsputex.Supervisor
	h    *contracttest.History

	runDone chan error
	ctx     context.Context // Run's
	cancel  context.CancelFunc
	runErr  error

	failHC, hangHC     atomic.Bool // Active checks fail / hang until their ctx ends
	failStop           atomic.Bool
	failStart          atomic.Bool
	startHonoursCtx    atomic.Bool
	stopDelay          atomic.Int64
	startDelay         atomic.Int64
	hcActive, hcStandb atomic.Int32

	onStart atomic.Pointer[func()] // called when Start begins

	mu       sync.Mutex
	outlived []time.Time // a Start returned nil after a Stop had stopped the service it was starting
	exit     func()
	starts   []serviceCall
	stops    []serviceCall
	events   []natsputex.Event
}

// A nodeOption says how startNode or startAgent starts its agent.
type nodeOption func(*nodeConfig)

// nodeConfig is what the nodeOptions set.
type nodeConfig struct {
	token  string             // the Supervisor's token; default the agent's name
	paused bool               // node only: made but not run
	conn   []nats.Option      // the connection's options; default: startNode's to the given URL only, startAgent's nats.go's
	client []natsputex.Option // after the suite's timing
	faults func(*agent)       // agent only: sets its faults before it runs
}

func newNodeConfig(name string, opts []nodeOption) nodeConfig {
	cfg := nodeConfig{token: name}
	for _, o := range opts {
		o(&cfg)
	}
	return cfg
}

// withToken gives the agent a token other than its name.
func withToken(token string) nodeOption { return func(c *nodeConfig) { c.token = token } }

// withClientOptions adds opts after the suite's timing (R, F, C and the
// test's health check).
func withClientOptions(opts ...natsputex.Option) nodeOption {
	return func(c *nodeConfig) { c.client = append(c.client, opts...) }
}

// notRunning makes the node without running its Supervisor; the test
// calls run.
func notRunning() nodeOption { return func(c *nodeConfig) { c.paused = true } }

// onConnectOptions connects with natsputex.ConnectOptions, as the docs
// ask, to the given URL only.
func onConnectOptions() nodeOption {
	return withConn(append(natsputex.ConnectOptions(), nats.IgnoreDiscoveredServers())...)
}

// withConn connects with opts instead of the default.
func withConn(opts ...nats.Option) nodeOption { return func(c *nodeConfig) { c.conn = opts } }

// withFaults lets prepare set an agent's faults before it runs.
func withFaults(prepare func(*agent)) nodeOption { return func(c *nodeConfig) { c.faults = prepare } }

// startNode connects to url, makes a Client of bucket with the suite's
// timing, a Supervisor of key, and runs it (unless notRunning); its
// service's sections are recorded in h under name.
func startNode(t *testing.T, url, bucket, key, name string, h *contracttest.History, opts ...nodeOption) *node {
	t.Helper()
	cfg := newNodeConfig(name, opts)
	if cfg.faults != nil {
		t.Fatal("withFaults is an option of startAgent")
	}
	token, run := cfg.token, !cfg.paused
	if cfg.conn == nil {
		cfg.conn = []nats.Option{nats.IgnoreDiscoveredServers()}
	}
	nc, js, err := connect(url, cfg.conn...)
	if err != nil {
		t.Fatal(err)
	}
	n := &node{t: t, name: name, nc: nc, h: h, runDone: make(chan error, 1)}
	base := []natsputex.Option{
		natsputex.WithRenewInterval(testR), natsputex.WithFailureThreshold(testF), natsputex.WithConfirmations(testC),
		natsputex.WithHealthCheck(func(ctx context.Context, s natsputex.State) error {
			if s == natsputex.Standby {
				n.hcStandb.Add(1)
				return nil
			}
			n.hcActive.Add(1)
			if n.hangHC.Load() {
				<-ctx.Done()
				return ctx.Err()
			}
			if n.failHC.Load() {
				return errors.New("unhealthy (test)")
			}
			return nil
		}),
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	n.c, err = natsputex.New(ctx, js, bucket, append(base, cfg.client...)...)
	if err != nil {
		nc.Close()
		t.Fatal(err)
	}
	n.sup, err = n.c.Supervisor(key, token, natsputex.Service{
		Start: func(ctx context.Context, token uint64) error {
			cl := serviceCall{token: token, begin: time.Now(), left: -1}
			if d, ok := ctx.Deadline(); ok {
				cl.left = d.Sub(cl.begin)
			}
			n.mu.Lock()
			if n.exit == nil {
				n.exit = h.Enter(name, token)
			}
			n.mu.Unlock()
			if f := n.onStart.Load(); f != nil {
				(*f)()
			}
			if d := time.Duration(n.startDelay.Load()); d > 0 {
				if n.startHonoursCtx.Load() {
					cl.err = sleepCtx(ctx, d)
				} else {
					time.Sleep(d)
				}
			}
			if cl.err == nil && n.failStart.Load() {
				cl.err = errors.New("cannot start (test)")
			}
			cl.end, cl.ctxErr = time.Now(), ctx.Err()
			n.mu.Lock()
			// A Start that succeeds leaves the service up, even if a
			// Stop ran while it was starting it.
			if cl.err == nil && n.exit == nil {
				n.exit = h.Enter(name, token)
				n.outlived = append(n.outlived, cl.end)
			}
			n.starts = append(n.starts, cl)
			n.mu.Unlock()
			return cl.err
		},
		Stop: func(ctx context.Context) error {
			cl := serviceCall{begin: time.Now(), left: -1}
			if d, ok := ctx.Deadline(); ok {
				cl.left = d.Sub(cl.begin)
			}
			if n.failStop.Load() {
				cl.err = errors.New("cannot stop (test)")
			} else {
				time.Sleep(time.Duration(n.stopDelay.Load()))
			}
			n.mu.Lock()
			if cl.err == nil && n.exit != nil {
				n.exit()
				n.exit = nil
			}
			cl.end, cl.ctxErr = time.Now(), ctx.Err()
			n.stops = append(n.stops, cl)
			n.mu.Unlock()
			return cl.err
		},
		Observe: func(e natsputex.Event) {
			t.Logf("%s: %v", name, e)
			n.mu.Lock()
			n.events = append(n.events, e)
			n.mu.Unlock()
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	n.ctx, n.cancel = context.WithTimeout(context.Background(), time.Minute)
	if run {
		n.run(n.ctx)
	}
	t.Cleanup(func() {
		n.cancel()
		if run {
			n.wait(10 * time.Second)
		}
		_ = n.c.Close(context.Background())
		n.nc.Close()
	})
	return n
}

func (n *node) run(ctx context.Context) {
	go func() { n.runDone <- n.sup.Run(ctx) }()
}

// wait waits up to within for Run to return and returns its error.
func (n *node) wait(within time.Duration) (error, bool) {
	n.mu.Lock()
	if n.runDone == nil {
		defer n.mu.Unlock()
		return n.runErr, true
	}
	ch := n.runDone
	n.mu.Unlock()
	select {
	case err := <-ch:
		n.mu.Lock()
		n.runErr, n.runDone = err, nil
		n.mu.Unlock()
		return err, true
	case <-time.After(within):
		return nil, false
	}
}

// kill crashes the agent: its service dies with it, its connection closes.
func (n *node) kill() {
	n.mu.Lock()
	if n.exit != nil {
		n.exit()
		n.exit = nil
	}
	n.mu.Unlock()
	n.nc.Close()
	n.cancel()
}

func (n *node) running() bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.exit != nil
}

func (n *node) getStarts() []serviceCall {
	n.mu.Lock()
	defer n.mu.Unlock()
	return append([]serviceCall(nil), n.starts...)
}

func (n *node) getStops() []serviceCall {
	n.mu.Lock()
	defer n.mu.Unlock()
	return append([]serviceCall(nil), n.stops...)
}

func (n *node) sawEvent(f func(natsputex.Event) bool) bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	for _, e := range n.events {
		if f(e) {
			return true
		}
	}
	return false
}

// firstStopAfter returns the first Stop call that began at or after t.
func (n *node) firstStopAfter(t time.Time) (serviceCall, bool) {
	for _, s := range n.getStops() {
		if !s.begin.Before(t) {
			return s, true
		}
	}
	return serviceCall{}, false
}

// cutAfterRenewal waits for a write of token, sleeps half an interval
// and calls cut, if no other write came meanwhile; it returns the time of
// the cut.
func cutAfterRenewal(t *testing.T, writes *keyWatch, token string, cut func()) time.Time {
	t.Helper()
	var at time.Time
	waitFor(t, 5*time.Second, "a renewal of "+token+" to cut after", func() bool {
		w, ok := writes.lastBy(token, time.Now())
		if !ok || time.Since(w.seen) > testR/4 {
			return false
		}
		time.Sleep(time.Until(w.seen.Add(testR / 2)))
		if next, _ := writes.lastBy(token, time.Now()); next.rev != w.rev {
			return false
		}
		cut()
		at = time.Now()
		return true
	})
	return at
}

// waitActiveNode waits until exactly one of nodes runs its service.
func waitActiveNode(t *testing.T, within time.Duration, nodes ...*node) *node {
	t.Helper()
	var up *node
	waitFor(t, within, "one agent active", func() bool {
		up = nil
		for _, n := range nodes {
			if n.running() {
				if up != nil {
					t.Fatalf("%s and %s run at once", up.name, n.name)
				}
				up = n
			}
		}
		return up != nil
	})
	return up
}

// runAgain calls Run again on n's Supervisor with a new context.
func runAgain(n *node) {
	n.mu.Lock()
	n.runDone = make(chan error, 1)
	n.mu.Unlock()
	ctx, cancel := context.WithCancel(context.Background())
	n.cancel = cancel
	n.run(ctx)
}

// historyBucket makes bucket on url (file storage) keeping 64 values per
// key, so that keyHistory can read every write after the test, whatever
// watches lost across a server restart; New uses it as it is.
func historyBucket(t *testing.T, url, bucket string) {
	t.Helper()
	nc, js, err := connect(url)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: bucket, History: 64, Storage: jetstream.FileStorage}); err != nil {
		t.Fatal(err)
	}
}

// checkLeaks fails t if goroutines started during it outlive it (but
// for the servers' consumers).
func checkLeaks(t *testing.T) {
	ignore := goleak.IgnoreCurrent()
	t.Cleanup(func() { goleak.VerifyNone(t, append(natsenv.ConsumerGoroutines(), ignore)...) })
}

// afterRenewal waits for a write of token that a watch delivered less than
// 5ms ago, sleeps offset and calls f; it returns the time f was called.
func afterRenewal(t *testing.T, writes *keyWatch, token string, offset time.Duration, f func()) time.Time {
	t.Helper()
	var at time.Time
	waitFor(t, 5*time.Second, "a renewal of "+token, func() bool {
		w, ok := writes.lastBy(token, time.Now())
		if !ok || time.Since(w.seen) > 5*time.Millisecond {
			return false
		}
		time.Sleep(offset)
		at = time.Now()
		f()
		return true
	})
	return at
}

// loseAnswer is a fault proxy to url for one client, with a trigger, not
// armed, on the client's next write to bucket's key ("PUB $KV.bucket.key ",
// which an HPUB holds too): armed, the write reaches the server and fault
// loses its answer. testenv.LoseReplies(d) loses whatever comes back for d,
// then breaks the connection (nats.go reconnects); testenv.LoseReply(pubAck)
// loses only the acknowledgement of a publish and keeps the connection up,
// so that the write whose answer was lost is known to have landed. The
// trigger's Fired time is before the server stored the write. loseAnswer
// returns the URL to connect through.
func loseAnswer(t *testing.T, url, bucket, key string, fault testenv.ReplyFault) (string, *testenv.Trigger) {
	t.Helper()
	p := testenv.NewProxy(t, strings.TrimPrefix(url, "nats://"))
	return "nats://" + p.Addr(), p.NewTrigger(testenv.Contains("PUB $KV."+bucket+"."+key+" "), fault)
}

// pubAck picks the acknowledgement of a JetStream publish ("seq": in what
// the server sends), and not the answer to a direct read of a stream
// message (STREAM.MSG.GET), which holds one too. A small NATS message is
// one read on loopback.
func pubAck(data []byte) bool {
	return bytes.Contains(data, []byte(`"seq":`)) && !bytes.Contains(data, []byte("stream_msg_get_response"))
}

// activeAndStandby starts node-a on aURL and, once its service runs,
// node-b on bURL (both on ConnectOptions, with opts; each Stop takes
// stop), and returns once node-b has seen node-a hold the key.
func activeAndStandby(t *testing.T, aURL, bURL, bucket, key string, h *contracttest.History, stop time.Duration, opts ...natsputex.Option) (a, b *node) {
	t.Helper()
	a = startNode(t, aURL, bucket, key, "node-a", h, onConnectOptions(), withClientOptions(opts...))
	a.stopDelay.Store(int64(stop))
	waitFor(t, 5*time.Second, "node-a starts its service", a.running)
	b = startNode(t, bURL, bucket, key, "node-b", h, onConnectOptions(), withClientOptions(opts...))
	b.stopDelay.Store(int64(stop))
	waitFor(t, 5*time.Second, "node-b is standby", func() bool {
		return b.sawEvent(func(e natsputex.Event) bool { return e.Holder == "node-a" })
	})
	return a, b
}

// proxiedPair is activeAndStandby on a fresh bucket of the local server
// with node-a behind a proxy (Stop takes 30ms), 2R after node-b first saw
// node-a hold the key; writes watches the key.
func proxiedPair(t *testing.T) (writes *keyWatch, proxy *testenv.Proxy, h *contracttest.History, a, b *node) {
	t.Helper()
	url, bucket, key := localEnv(t)
	writes = watchWrites(t, url, bucket, key)
	proxy = testenv.NewProxy(t, strings.TrimPrefix(url, "nats://"))
	h = contracttest.NewHistory(1)
	a, b = activeAndStandby(t, "nats://"+proxy.Addr(), url, bucket, key, h, 30*time.Millisecond)
	time.Sleep(2 * testR)
	return writes, proxy, h, a, b
}

// stopNodes ends the nodes' Runs (a SIGTERM each) and waits for them.
func stopNodes(nodes ...*node) {
	for _, n := range nodes {
		n.cancel()
	}
	for _, n := range nodes {
		n.wait(5 * time.Second)
	}
}

// proxiedEnv is a fresh bucket of the local server (localEnv) with a watch
// of its key, a fault proxy to the server and a service history.
type proxiedEnv struct {
	url, bucket, key string
	writes           *keyWatch
	proxy            *testenv.Proxy
	h                *contracttest.History
}

func newProxiedEnv(t *testing.T) proxiedEnv {
	url, bucket, key := localEnv(t)
	return proxiedEnv{url, bucket, key, watchWrites(t, url, bucket, key), testenv.NewProxy(t, strings.TrimPrefix(url, "nats://")), contracttest.NewHistory(1)}
}

func (p proxiedEnv) addr() string { return "nats://" + p.proxy.Addr() }

// binaryClusterBucket starts a 3-node cluster of the nats-server program
// (with a leak check) and makes a single-replica bucket with a history of
// 64 values on it; it returns the bucket and the index of the node its
// stream lives on.
func binaryClusterBucket(t *testing.T, prefix string) (cluster *natsenv.Cluster, bucket string, streamNode int) {
	t.Helper()
	checkLeaks(t)
	cluster = natsenv.StartBinaryCluster(t, 3)
	urls, bucket := cluster.URLs(), uniqueBucket(prefix)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := mustJS(t, urls).CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: bucket, History: 64}); err != nil {
		t.Fatal(err)
	}
	streamNode = awaitBucketLeader(t, urls, bucket, cluster.Servers(), func(_ context.Context, _ *nats.Conn, info *jetstream.ClusterInfo, leader int) error {
		if leader < 0 {
			return errors.New("no stream node yet: " + info.Leader)
		}
		return nil
	})
	return cluster, bucket, streamNode
}

func tokenOf(l locks.Lease) uint64 {
	if l == nil {
		return 0
	}
	return l.Token()
}

// holdAndCut takes key with holder's TryLock and, if waiter is not nil,
// starts waiter's Lock of it (ctx 10s); 3R later it cuts l halfway
// between two renewals of the lease and waits for nats.go to see it. It
// returns the lease, its token in the key, the waiting Lock and the time
// of the cut.
func holdAndCut(t *testing.T, l *link, holder, waiter *natsputex.Client, writes *keyWatch, key string) (lease locks.Lease, token string, waiting <-chan outcome, cut time.Time) {
	t.Helper()
	lease, err := holder.Locker().TryLock(context.Background(), key)
	if err != nil {
		t.Fatal(err)
	}
	token = writeAt(t, writes, lease.Token()).value
	if waiter != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		t.Cleanup(cancel)
		waiting = goLock(ctx, waiter.Locker(), key, false)
	}
	time.Sleep(3 * testR)
	cut = cutAfterRenewal(t, writes, token, l.proxy.Cut)
	waitFor(t, 2*time.Second, "nats.go sees the link cut", l.nc.IsReconnecting)
	return lease, token, waiting, cut
}

// reconnects records when nats.go said a connection was back.
type reconnects struct {
	mu sync.Mutex
	at []time.Time
}

func (r *reconnects) option() nats.Option {
	return nats.ReconnectHandler(func(*nats.Conn) {
		r.mu.Lock()
		r.at = append(r.at, time.Now())
		r.mu.Unlock()
	})
}

func (r *reconnects) count() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.at)
}

// link is a connection made with ConnectOptions, as the docs ask,
// through a fault proxy of its own to url.
type link struct {
	reconnects
	nc    *nats.Conn
	js    jetstream.JetStream
	proxy *testenv.Proxy
}

func dialLink(t *testing.T, url string) *link {
	t.Helper()
	l := &link{proxy: testenv.NewProxy(t, strings.TrimPrefix(url, "nats://"))}
	var err error
	l.nc, l.js, err = connect("nats://"+l.proxy.Addr(), append(natsputex.ConnectOptions(), nats.IgnoreDiscoveredServers(), l.option())...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(l.nc.Close)
	return l
}

// client makes a Client with the suite's timing and opts on the link.
func (l *link) client(t *testing.T, bucket string, opts ...natsputex.Option) *natsputex.Client {
	t.Helper()
	return newClientOn(t, l.nc, l.js, bucket, opts...)
}

// cut cuts the link and waits until nats.go reconnects (and so refuses
// every write); it returns when the cut was made.
func (l *link) cut(t *testing.T) time.Time {
	t.Helper()
	at := time.Now()
	l.proxy.Cut()
	waitFor(t, 2*time.Second, "nats.go sees the link cut", l.nc.IsReconnecting)
	return at
}

// restore restores the link and returns when nats.go said it was back.
func (l *link) restore(t *testing.T) time.Time {
	t.Helper()
	n := l.count()
	l.proxy.Restore()
	waitFor(t, 3*time.Second, "nats.go reconnects", func() bool { return l.count() > n })
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.at[n]
}

// outcome is what a Lock, TryLock or Release returned, and when.
type outcome struct {
	lease locks.Lease
	err   error
	at    time.Time
}

func goLock(ctx context.Context, l *natsputex.Locker, name string, try bool) <-chan outcome {
	ch := make(chan outcome, 1)
	go func() {
		var o outcome
		if try {
			o.lease, o.err = l.TryLock(ctx, name)
		} else {
			o.lease, o.err = l.Lock(ctx, name)
		}
		o.at = time.Now()
		ch <- o
	}()
	return ch
}

func waitOutcome(t *testing.T, ch <-chan outcome, within time.Duration, what string) outcome {
	t.Helper()
	select {
	case o := <-ch:
		return o
	case <-time.After(within):
		t.Fatalf("%s did not return within %v", what, within)
		return outcome{}
	}
}

// faultHook returns a health check that, the first time it is told
// Standby at or after the time armed holds (none: never), calls fault and
// waits for down to hold (nats.go reconnecting), so that the takeover
// write the check precedes is made while nats.go reconnects; it sends the
// time of the fault on the channel.
func faultHook(armed *atomic.Pointer[time.Time], fault func(), down func() bool) (natsputex.HealthCheck, <-chan time.Time) {
	ch := make(chan time.Time, 1)
	var done atomic.Bool
	return func(ctx context.Context, s natsputex.State) error {
		from := armed.Load()
		if s != natsputex.Standby || from == nil || time.Now().Before(*from) || !done.CompareAndSwap(false, true) {
			return nil
		}
		at := time.Now()
		fault()
		for !down() && time.Since(at) < 2*time.Second {
			time.Sleep(time.Millisecond)
		}
		ch <- at
		return nil
	}, ch
}

// holdWatched takes key with holder's TryLock and returns the lease, its
// token in the key, a validity watch and the name's grants holding it,
// and the lease's deadlines sampled from now on.
func holdWatched(t *testing.T, holder *natsputex.Client, writes *keyWatch, key string) (locks.Lease, string, *validity, *grants, *deadlines) {
	t.Helper()
	v, g := watchValidity(t), newGrants()
	lease, err := holder.Locker().TryLock(context.Background(), key)
	if err != nil {
		t.Fatal(err)
	}
	v.add("holder", lease)
	g.grant("holder", lease)
	return lease, writeAt(t, writes, lease.Token()).value, v, g, sampleDeadlines(t, lease)
}

// pausable is a nats-server process of the program on PATH, on a port of
// its own, that the test can pause with SIGSTOP.
type pausable struct {
	cmd *exec.Cmd
	url string
}

func startPausable(t *testing.T) *pausable {
	t.Helper()
	bin := natsenv.Binary(t)
	port := testenv.FreePort(t)
	p := &pausable{url: fmt.Sprintf("nats://127.0.0.1:%d", port)}
	p.cmd = exec.Command(bin, "-a", "127.0.0.1", "-p", strconv.Itoa(port), "-js", "-sd", t.TempDir())
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = p.cmd.Process.Signal(syscall.SIGCONT)
		_ = p.cmd.Process.Kill()
		_ = p.cmd.Wait()
	})
	waitFor(t, 10*time.Second, "the nats-server process accepts clients", func() bool {
		c, err := net.DialTimeout("tcp", p.url[len("nats://"):], 100*time.Millisecond)
		if err == nil {
			_ = c.Close()
			nc, js, err := connect(p.url)
			if err == nil {
				defer nc.Close()
				ctx, cancel := context.WithTimeout(context.Background(), time.Second)
				defer cancel()
				_, err = js.AccountInfo(ctx)
				return err == nil
			}
		}
		return false
	})
	return p
}

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

// holdFirst takes the test's lock "job" with l before any waiter comes:
// tryLockFirst.
func holdFirst(t *testing.T, ctx context.Context, l locks.Locker) locks.Lease {
	t.Helper()
	return tryLockFirst(t, ctx, l, "job")
}

// tryLockFirst takes name with l on a fresh key: a TryLock asked again
// while it fails, for up to 10s (a winning write slower than the lease's
// validity, T − margin, on a loaded machine, or a cluster between
// leaders, fails it without a fault of the test's).
func tryLockFirst(t *testing.T, ctx context.Context, l locks.Locker, name string) locks.Lease {
	t.Helper()
	var lease locks.Lease
	err := retryFor(10*time.Second, func(context.Context) error {
		var err error
		lease, err = l.TryLock(ctx, name)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return lease
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

func waitFor(t *testing.T, within time.Duration, what string, cond func() bool) time.Duration {
	t.Helper()
	start := time.Now()
	for !cond() {
		if time.Since(start) > within {
			t.Fatalf("%s: not within %v", what, within)
		}
		time.Sleep(5 * time.Millisecond)
	}
	return time.Since(start)
}

// Timing of the suite's clients: T = 300ms, a crashed holder's key comes
// back after T of silence plus one confirmation interval.
const (
	testR = 100 * time.Millisecond
	testF = 3
	testC = 1
)

var bucketSeq atomic.Int64

// uniqueBucket returns a bucket name unique to this test run.
func uniqueBucket(prefix string) string {
	return fmt.Sprintf("%s-%d-%d", prefix, time.Now().UnixNano()%1e9, bucketSeq.Add(1))
}

// connect returns JetStream on a connection to urls that reconnects
// quickly, with more options if given (nats.IgnoreDiscoveredServers pins
// it to urls).
func connect(urls string, opts ...nats.Option) (*nats.Conn, jetstream.JetStream, error) {
	nc, err := nats.Connect(urls, append([]nats.Option{nats.MaxReconnects(-1), nats.ReconnectWait(50 * time.Millisecond)}, opts...)...)
	if err != nil {
		return nil, nil, err
	}
	js, err := jetstream.New(nc)
	if err != nil {
		nc.Close()
		return nil, nil, err
	}
	return nc, js, nil
}

// mustBucket returns bucket's KeyValue on a connection of its own to urls
// (made with opts, as connect), for a test to read or write the keys
// behind the clients' backs; the connection is closed at cleanup.
func mustBucket(t testing.TB, urls, bucket string, opts ...nats.Option) jetstream.KeyValue {
	t.Helper()
	nc, js, err := connect(urls, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	kv, err := js.KeyValue(ctx, bucket)
	if err != nil {
		t.Fatal(err)
	}
	return kv
}

// prepareBucket creates bucket on urls before the suite runs.
func prepareBucket(t testing.TB, urls, bucket string, opts ...natsputex.Option) {
	t.Helper()
	nc, js, err := connect(urls)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := natsputex.New(ctx, js, bucket, opts...)
	if err != nil {
		t.Fatal(err)
	}
	_ = c.Close(context.Background())
	// A replicated bucket answers writes once its stream has a leader and
	// every replica has caught up; before that a write may get "no
	// response from stream", which the tests would take for a fault.
	err = retryFor(30*time.Second, func(ctx context.Context) error {
		st, err := js.Stream(ctx, "KV_"+bucket)
		if err != nil {
			return err
		}
		info, err := st.Info(ctx)
		if err != nil || info.Config.Replicas <= 1 {
			return err
		}
		if info.Cluster == nil || info.Cluster.Leader == "" {
			return errors.New("no stream leader")
		}
		for _, p := range info.Cluster.Replicas {
			if !p.Current || p.Offline {
				return fmt.Errorf("replica %s: current=%v offline=%v", p.Name, p.Current, p.Offline)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatalf("bucket %s not ready: %v", bucket, err)
	}
}

// localNATS is the NATS server a developer or CI machine may run on its
// standard port (NATS 2.9 on the reference machine).
const localNATS = "nats://127.0.0.1:4222"

// localServer returns localNATS if it answers with JetStream, and skips
// otherwise. The test's bucket is deleted at the end.
func localServer(t testing.TB) string {
	t.Helper()
	nc, err := nats.Connect(localNATS, nats.Timeout(time.Second))
	if err != nil {
		t.Skipf("no NATS server on %s: %v", localNATS, err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := js.AccountInfo(ctx); err != nil {
		t.Skipf("NATS on %s has no JetStream: %v", localNATS, err)
	}
	t.Logf("NATS %s on %s", nc.ConnectedServerVersion(), localNATS)
	return localNATS
}

func deleteBucket(url, bucket string) {
	nc, js, err := connect(url)
	if err != nil {
		return
	}
	defer nc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = js.DeleteKeyValue(ctx, bucket)
}

type atomicBool struct{ v atomic.Bool }

func (b *atomicBool) get() bool { return b.v.Load() }

func (b *atomicBool) set() { b.v.Store(true) }

// agent is one in-process putex agent with its own connection, recording
// the intervals in which its service runs in a shared History.
type agent struct {
	t       *testing.T
	name    string
	nc      *nats.Conn
	sup     *natsputex.Supervisor
	cancel  context.CancelFunc
	done    chan error
	history *contracttest.History
	failHC  atomic.Bool // the health check fails while set
	// stopDelay makes Stop take this long (a time.Duration) before the
	// service stops.
	stopDelay atomic.Int64
	// stopHonoursCtx makes a slow Stop give up when its context ends,
	// leaving the service running, as a stop command killed at its
	// deadline does.
	stopHonoursCtx atomic.Bool
	// failStop makes Stop fail, leaving the service running, while set.
	failStop            atomic.Bool
	stopCalls, stopsCut atomic.Int32 // Stop calls; those cut short by their context

	// hcDelay makes the health check take this long (a time.Duration).
	hcDelay atomic.Int64
	// failStart makes Start fail while set.
	failStart     atomic.Bool
	startFailures atomic.Int32

	mu      sync.Mutex
	exit    func() // ends the open service interval, nil when stopped
	dead    bool
	started []time.Time
	stopped []time.Time
	tokens  []uint64 // the fencing token each Start was given
	events  []natsputex.Event
}

// sawEvent reports whether the agent was told of an event matching f.
func (a *agent) sawEvent(f func(natsputex.Event) bool) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	return slices.ContainsFunc(a.events, f)
}

// sleepCtx waits for d or until ctx ends, and returns ctx's error then.
func sleepCtx(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// startAgent starts an agent named name, with the suite's timing, whose
// service's sections are recorded in h; it runs until the test ends.
func startAgent(t *testing.T, url, bucket, key, name string, h *contracttest.History, opts ...nodeOption) *agent {
	t.Helper()
	cfg := newNodeConfig(name, opts)
	if cfg.paused {
		t.Fatal("notRunning is an option of startNode")
	}
	token, prepare := cfg.token, cfg.faults
	nc, js, err := connect(url, cfg.conn...)
	if err != nil {
		t.Fatal(err)
	}
	a := &agent{t: t, name: name, nc: nc, history: h, done: make(chan error, 1)}
	if prepare != nil {
		prepare(a)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	a.cancel = cancel
	base := []natsputex.Option{
		natsputex.WithRenewInterval(testR), natsputex.WithFailureThreshold(testF), natsputex.WithConfirmations(testC),
		natsputex.WithHealthCheck(func(ctx context.Context, s natsputex.State) error {
			if d := time.Duration(a.hcDelay.Load()); d > 0 {
				if err := sleepCtx(ctx, d); err != nil {
					return err
				}
			}
			if a.failHC.Load() {
				return errors.New("unhealthy (test)")
			}
			return nil
		}),
	}
	c, err := natsputex.New(ctx, js, bucket, append(base, cfg.client...)...)
	if err != nil {
		t.Fatal(err)
	}
	a.sup, err = c.Supervisor(key, token, natsputex.Service{
		Start: func(_ context.Context, fence uint64) error {
			if a.failStart.Load() {
				a.startFailures.Add(1)
				return errors.New("cannot start (test)")
			}
			a.mu.Lock()
			defer a.mu.Unlock()
			if a.exit == nil && !a.dead {
				a.exit = h.Enter(name, fence)
				a.started = append(a.started, time.Now())
				a.tokens = append(a.tokens, fence)
			}
			return nil
		},
		Stop: func(ctx context.Context) error {
			a.stopCalls.Add(1)
			if a.failStop.Load() {
				return errors.New("cannot stop (test)")
			}
			d := time.Duration(a.stopDelay.Load())
			if a.stopHonoursCtx.Load() {
				if err := sleepCtx(ctx, d); err != nil {
					a.stopsCut.Add(1)
					return err // killed: the service runs on
				}
			} else {
				time.Sleep(d)
			}
			a.mu.Lock()
			defer a.mu.Unlock()
			a.stopLocked()
			return nil
		},
		Observe: func(e natsputex.Event) {
			t.Logf("%s: %v", name, e)
			a.mu.Lock()
			a.events = append(a.events, e)
			a.mu.Unlock()
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	go func() {
		err := a.sup.Run(ctx)
		_ = c.Close(context.Background())
		a.done <- err
	}()
	t.Cleanup(a.stop)
	return a
}

func (a *agent) stopLocked() {
	if a.exit != nil {
		a.exit()
		a.exit = nil
		a.stopped = append(a.stopped, time.Now())
	}
}

// running reports whether the agent's service runs.
func (a *agent) running() bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.exit != nil
}

func (a *agent) lastStart() time.Time {
	a.mu.Lock()
	defer a.mu.Unlock()
	if len(a.started) == 0 {
		return time.Time{}
	}
	return a.started[len(a.started)-1]
}

// kill crashes the agent: its service dies with it, and it can tell NATS
// nothing more.
func (a *agent) kill() {
	a.mu.Lock()
	a.dead = true
	a.stopLocked()
	a.mu.Unlock()
	a.nc.Close()
	a.cancel()
	<-a.done
	a.done <- nil
}

// stop ends the agent cleanly (a SIGTERM).
func (a *agent) stop() {
	a.cancel()
	err := <-a.done
	a.done <- err
	a.nc.Close()
}

// waitActive waits until exactly one of agents runs its service and
// returns it.
func waitActive(t *testing.T, within time.Duration, agents ...*agent) *agent {
	t.Helper()
	deadline := time.Now().Add(within)
	for time.Now().Before(deadline) {
		var up []*agent
		for _, a := range agents {
			if a.running() {
				up = append(up, a)
			}
		}
		if len(up) > 1 {
			t.Fatalf("%d agents run the service at once", len(up))
		}
		if len(up) == 1 {
			return up[0]
		}
		time.Sleep(5 * time.Millisecond)
	}
	t.Fatalf("no agent became active within %v", within)
	return nil
}

// localJetStream returns localNATS if a server with JetStream answers
// there, else "".
func localJetStream() string {
	nc, js, err := connect(localNATS)
	if err != nil {
		return ""
	}
	defer nc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if _, err := js.AccountInfo(ctx); err != nil {
		return ""
	}
	return localNATS
}
