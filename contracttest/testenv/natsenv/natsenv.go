// Package natsenv provides NATS servers with JetStream to tests: a single
// node or a cluster, embedded in the test process (nats-server/v2 as a
// library) on loopback ports, so that tests need nothing installed, or
// run from a nats-server program ([Binary], such as an older release than
// the embedded one) as separate processes on loopback ports
// ([StartBinaryServer], [StartBinaryCluster]). [Server.Version] says which
// version each node runs. An embedded server may require TLS, a password
// or, in operator mode, JWT credentials ([ServerConfig]); an embedded
// cluster's routes may go through fault proxies, to partition nodes
// ([ClusterConfig]).
//
// It is a module of its own, separate from testenv, so that the NATS server
// is only in the module graph of the backends that use it.
//
// Servers log through the test (t.Log) when tests run with -v, and are silent
// otherwise. Everything started is shut down by [testing.TB.Cleanup].
package natsenv

import (
	"cmp"
	"errors"
	"fmt"
	"maps"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/latchkey-go/latchkey/contracttest/testenv"
	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nats-server/v2/server"
	"go.uber.org/goleak"
)

// ConsumerGoroutines returns goleak options matching the goroutines an
// embedded server runs for each JetStream consumer. A client that crashes
// (its connection cut, as tests do) leaves its ephemeral consumers, such as
// a KV watch's, on the server until their inactivity threshold passes:
// server state, not a leak of the client's, which leak checks of the client
// should ignore (see contracttest.LeakFilter). The options also match the
// goroutine natsenv waits for a server process with ([ServerConfig.Binary]),
// which a restart during a test starts.
func ConsumerGoroutines() []goleak.Option {
	const consumer = "github.com/nats-io/nats-server/v2/server.(*consumer)."
	opts := []goleak.Option{goleak.IgnoreAnyFunction("github.com/latchkey-go/latchkey/contracttest/testenv/natsenv.(*proc).wait")}
	for _, f := range []string{"loopAndGatherMsgs", "processInboundAcks", "processInboundNextMsgReqs", "loopAndForwardProposals"} {
		opts = append(opts, goleak.IgnoreAnyFunction(consumer+f))
	}
	return opts
}

const (
	// readyTimeout bounds how long a server may take to accept clients.
	readyTimeout = 10 * time.Second
	// clusterTimeout bounds how long a cluster may take to elect a
	// JetStream meta leader and bring every node up to date.
	clusterTimeout = 30 * time.Second
	// quiesceTimeout bounds how long the cleanup waits for a cluster to
	// settle before shutting it down.
	quiesceTimeout = 5 * time.Second
	// startAttempts is how many sets of free ports StartCluster tries, since
	// a port chosen by testenv.FreePort may be taken before a node binds it.
	startAttempts = 3

	maxMemory = 256 << 20
	maxStore  = 1 << 30
)

// URL returns the client URL of a NATS server with JetStream the test can use:
// the LOCKS_NATS_URL environment variable if it is set (it may list several
// URLs, comma-separated), or else the URL of a single embedded server started
// for the test by [StartServer]. A server from the environment is shared, so
// tests use unique bucket and key names. URL must be called from the
// goroutine running the test.
func URL(t testing.TB) string {
	t.Helper()
	if u := strings.TrimSpace(os.Getenv("LOCKS_NATS_URL")); u != "" {
		return u
	}
	return StartServer(t).URL()
}

// A Server is one NATS server with JetStream, alone or a node of a
// [Cluster]: embedded, or a process of a nats-server program
// ([ServerConfig.Binary]). Its client port and store directory stay the
// same across [Server.Restart], so clients reconnect to the same URL and
// find their streams again. Its methods are safe to call from several
// goroutines; each waits for the previous one to finish.
type Server struct {
	name string
	url  string
	log  *logger
	bin  string // the program it runs from, "" when embedded

	mu      sync.Mutex
	opts    *server.Options // the client port is fixed after the first start
	scheme  string          // of URL: "nats", or "tls" with TLS
	ns      *server.Server  // nil while shut down (embedded)
	proc    *proc           // nil while shut down (a process)
	monitor int             // a process's monitoring port, fixed after the first start
	version string
	done    bool // shut down for good by the cleanup
}

// StartServer starts a single NATS server with JetStream on a free port of
// 127.0.0.1, storing in a temporary directory, and returns once it accepts
// clients. It is shut down at the end of the test. The test fails if the
// server cannot start. StartServer must be called from the goroutine running
// the test.
func StartServer(t testing.TB) *Server {
	t.Helper()
	return StartServerWith(t, ServerConfig{})
}

// ServerConfig is what [StartServerWith] adds to a server.
type ServerConfig struct {
	// TLS, if set, makes the server require TLS with TLS's certificate
	// (clients trust TLS.CAFile); client certificates are verified if
	// given. URL then starts with tls://.
	TLS *testenv.TLS
	// User and Password, if set, are the one user clients must
	// authenticate as.
	User, Password string
	// Operator, if set, runs the server in operator (JWT) mode with
	// Operator's accounts in a memory resolver: clients authenticate
	// with the credentials of a user of Operator ([Operator.NewUser]),
	// and have JetStream. It excludes User and Password.
	Operator *Operator
	// Binary, if set, is the path of a nats-server program (see
	// [Binary]) to run the server from, as a separate process, instead
	// of embedding it. It excludes TLS, User, Password and Operator.
	Binary string
}

// StartServerWith is [StartServer] with cfg.
func StartServerWith(t testing.TB, cfg ServerConfig) *Server {
	t.Helper()
	if cfg.Operator != nil && (cfg.User != "" || cfg.Password != "") {
		t.Fatalf("natsenv: a server in operator mode has no user and password of its own")
	}
	s := newServer(t, fmt.Sprintf("latchkey-%d", seq.Add(1)), nil)
	s.bin = cfg.Binary
	if op := cfg.Operator; op != nil {
		s.opts.TrustedOperators = []*jwt.OperatorClaims{op.claims}
		s.opts.AccountResolver = op.resolver
		s.opts.SystemAccount = op.claims.SystemAccount
	}
	if cfg.TLS != nil {
		s.opts.TLS = true
		s.opts.TLSConfig = cfg.TLS.Server.Clone()
		s.opts.TLSTimeout = 5
		s.scheme = "tls"
	}
	s.opts.Username, s.opts.Password = cfg.User, cfg.Password
	if err := s.start(); err != nil {
		t.Fatalf("natsenv: %v", err)
	}
	t.Cleanup(func() {
		if s.Running() { // settle first, as a cluster does
			_ = waitFor(quiesceTimeout, s.healthy)
		}
		s.close()
	})
	return s
}

var seq atomic.Uint64

func newServer(t testing.TB, name string, cluster *server.ClusterOpts) *Server {
	opts := &server.Options{
		ServerName:             name,
		Host:                   "127.0.0.1",
		Port:                   server.RANDOM_PORT,
		NoLog:                  true,
		NoSigs:                 true,
		DisableJetStreamBanner: true,
		JetStream:              true,
		JetStreamMaxMemory:     maxMemory,
		JetStreamMaxStore:      maxStore,
		StoreDir:               t.TempDir(),
	}
	if cluster != nil {
		opts.Cluster = *cluster
	}
	return &Server{name: name, opts: opts, log: newLogger(t)}
}

// URL returns the server's client URL, "nats://127.0.0.1:port".
func (s *Server) URL() string { return s.url }

// Name returns the server's name, as JetStream reports it (for example as
// the leader in a stream's cluster information).
func (s *Server) Name() string { return s.name }

// Version returns the version of nats-server the server runs, without a
// leading "v": the embedded library's, or the one the program reported
// when the server last started.
func (s *Server) Version() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.version
}

// Binary returns the path of the program the server runs from, or "" for
// an embedded server.
func (s *Server) Binary() string { return s.bin }

// Running reports whether the server is running.
func (s *Server) Running() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.ns != nil || s.proc != nil
}

// Kill stops a server process at once with SIGKILL, as a crash would: no
// leadership is handed over, nothing is flushed. It returns once the
// process has exited. For an embedded server, Kill is Shutdown. Killing a
// server that is not running does nothing.
func (s *Server) Kill() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.proc != nil {
		s.proc.stop(syscall.SIGKILL)
		s.proc = nil
		return
	}
	s.shutdownLocked()
}

// Shutdown stops the server, closing its client and route connections; a
// cluster node hands over its leaderships first, as a node being shut down
// cleanly does. It returns once the server is down. Shutting down a server
// that is not running does nothing.
func (s *Server) Shutdown() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.shutdownLocked()
}

func (s *Server) shutdownLocked() {
	if s.proc != nil {
		s.proc.stop(syscall.SIGTERM)
		s.proc = nil
	}
	if s.ns == nil {
		return
	}
	s.ns.Shutdown()
	s.ns.WaitForShutdown()
	s.ns = nil
}

// Restart shuts the server down if it is running, then starts it again on the
// same client (and cluster) port with the same store directory, and returns
// once it accepts clients and, for a cluster node, once its JetStream state is
// up to date: its JetStream state is current with the meta leader and every
// stream and consumer it holds runs and is current. It returns an error if the
// server cannot start or catch up, or at the end of the test.
func (s *Server) Restart() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.done {
		return fmt.Errorf("natsenv: restart %s: test is over", s.name)
	}
	s.shutdownLocked()
	if err := s.startLocked(); err != nil {
		return err
	}
	return waitFor(clusterTimeout, s.healthyLocked)
}

// healthy reports whether the server runs and passes its own health check
// (see [healthy]).
func (s *Server) healthy() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.healthyLocked()
}

func (s *Server) healthyLocked() error {
	switch {
	case s.ns != nil:
		return healthy(s.ns)
	case s.proc != nil:
		return s.proc.healthy(s.name)
	}
	return fmt.Errorf("natsenv: %s is not running", s.name)
}

// meta returns whether the server is the JetStream meta leader and how
// many peers of the meta group, itself included, it sees online.
func (s *Server) meta() (leader bool, peers int, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	switch {
	case s.ns != nil:
		return s.ns.JetStreamIsLeader(), len(s.ns.JetStreamClusterPeers()), nil
	case s.proc != nil:
		l, n, err := s.proc.meta()
		return l == s.name, n, err
	}
	return false, 0, fmt.Errorf("natsenv: %s is not running", s.name)
}

// healthy reports whether ns passes its own health check (/healthz): it
// accepts clients, its JetStream is current with the meta leader, and every
// stream and consumer assigned to it runs and is current.
func healthy(ns *server.Server) error {
	if h := ns.Healthz(nil); h.StatusCode != http.StatusOK {
		return fmt.Errorf("natsenv: %s: unhealthy: %s %s", ns.Name(), h.Status, h.Error)
	}
	return nil
}

func (s *Server) start() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.startLocked()
}

func (s *Server) startLocked() error {
	if s.bin != "" {
		if err := s.startProcess(); err != nil {
			return err
		}
		v, err := s.proc.version()
		if err != nil {
			v, err = BinaryVersion(s.bin)
		}
		if err != nil {
			return err
		}
		s.version = strings.TrimPrefix(v, "v")
		return nil
	}
	ns, err := server.NewServer(s.opts.Clone())
	if err != nil {
		return fmt.Errorf("natsenv: %s: %w", s.name, err)
	}
	if s.log != nil {
		ns.SetLoggerV2(s.log, false, false, false)
	}
	ns.Start()
	if !ns.ReadyForConnections(readyTimeout) {
		ns.Shutdown()
		ns.WaitForShutdown()
		return fmt.Errorf("natsenv: %s: not ready for connections after %v", s.name, readyTimeout)
	}
	if !ns.JetStreamEnabled() {
		ns.Shutdown()
		ns.WaitForShutdown()
		return fmt.Errorf("natsenv: %s: JetStream did not start", s.name)
	}
	if s.opts.Port == server.RANDOM_PORT {
		s.opts.Port = ns.Addr().(*net.TCPAddr).Port
		s.url = cmp.Or(s.scheme, "nats") + "://" + net.JoinHostPort("127.0.0.1", strconv.Itoa(s.opts.Port))
	}
	s.ns = ns
	s.version = server.VERSION
	return nil
}

// close shuts the server down for good, at the end of the test.
func (s *Server) close() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.done = true
	s.shutdownLocked()
	s.log.close()
}

// server returns the running server, or nil.
func (s *Server) server() *server.Server {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.ns
}

// A Cluster is a JetStream cluster of embedded NATS servers on loopback,
// started by [StartCluster] or [StartClusterWith]. Its methods are safe to
// call from several goroutines.
type Cluster struct {
	servers []*Server
	// proxies[i][j] carries the route node i dials to node j (nil for
	// i == j), with [ClusterConfig.ProxyRoutes]; nil otherwise.
	proxies [][]*testenv.Proxy

	mu       sync.Mutex
	isolated map[int]bool
}

// ClusterConfig is what [StartClusterWith] adds to a cluster.
type ClusterConfig struct {
	// ProxyRoutes, if set, carries every route connection through a
	// [testenv.Proxy] of its own, one per ordered pair of nodes (node i
	// dials node j through proxy (i, j)), so that [Cluster.Isolate] can
	// cut nodes off. Routes are not pooled then: a pair of nodes has
	// one route connection. Nodes advertise 127.0.0.1:1, where nothing
	// listens, as their route address, so that the routes they learn
	// from each other by gossip (implicit routes, which nats-server
	// dials at the advertised address, once) fail instead of bypassing
	// the proxies. Server logs (with -v) then show one refused connection
	// to 127.0.0.1:1 now and then: that is expected. Only embedded
	// clusters support it.
	ProxyRoutes bool
	// Binary, if set, is the path of a nats-server program (see
	// [Binary]) to run every node from, each a separate process, instead
	// of embedding them. It excludes ProxyRoutes.
	Binary string
}

// unroutable is the route address nodes advertise with
// [ClusterConfig.ProxyRoutes]: port 1 on loopback, which nothing listens
// on, so that a node dialling it is refused at once, and gives up since
// implicit routes are not retried (Cluster.ConnectRetries is 0).
const unroutable = "127.0.0.1:1"

// StartCluster starts an n-node JetStream cluster (n >= 2; use 3 for a
// cluster that survives losing one node) on free ports of 127.0.0.1, each
// node with its own store directory and routes to all the others. It returns
// once the nodes accept clients, a JetStream meta leader is elected, it sees
// every node, and every node passes its health check. The cluster is shut down at the
// end of the test. The test fails if it cannot start. StartCluster must be
// called from the goroutine running the test.
func StartCluster(t testing.TB, n int) *Cluster {
	t.Helper()
	return StartClusterWith(t, n, ClusterConfig{})
}

// StartClusterWith is [StartCluster] with cfg.
func StartClusterWith(t testing.TB, n int, cfg ClusterConfig) *Cluster {
	t.Helper()
	if n < 2 {
		t.Fatalf("natsenv: StartCluster(%d): a cluster needs at least 2 nodes", n)
	}
	if cfg.Binary != "" && cfg.ProxyRoutes {
		t.Fatalf("natsenv: proxied routes are only supported on embedded clusters")
	}
	var err error
	for range startAttempts {
		var c *Cluster
		if c, err = startCluster(t, n, cfg); err == nil {
			return c
		}
	}
	t.Fatalf("natsenv: start cluster: %v", err)
	return nil
}

func startCluster(t testing.TB, n int, cfg ClusterConfig) (*Cluster, error) {
	id := seq.Add(1)
	ports := make([]int, n)
	routes := make([]string, n)
	for i := range ports {
		ports[i] = testenv.FreePort(t)
		routes[i] = fmt.Sprintf("nats-route://127.0.0.1:%d", ports[i])
	}
	c := &Cluster{isolated: map[int]bool{}}
	if cfg.ProxyRoutes {
		c.proxies = make([][]*testenv.Proxy, n)
		for i := range n {
			c.proxies[i] = make([]*testenv.Proxy, n)
			for j := range n {
				if i != j {
					c.proxies[i][j] = testenv.NewProxy(t, fmt.Sprintf("127.0.0.1:%d", ports[j]))
				}
			}
		}
	}
	for i := range n {
		co := &server.ClusterOpts{
			Name: fmt.Sprintf("latchkey-%d", id),
			Host: "127.0.0.1",
			Port: ports[i],
		}
		// Routes list every node, this one included (a route to itself is
		// ignored): JetStream sizes its meta group from them.
		rs := routes
		if cfg.ProxyRoutes {
			co.Advertise = unroutable
			co.PoolSize = -1
			rs = make([]string, n)
			for j := range n {
				if i == j {
					rs[j] = routes[j]
				} else {
					rs[j] = "nats-route://" + c.proxies[i][j].Addr()
				}
			}
		}
		s := newServer(t, fmt.Sprintf("latchkey-%d-n%d", id, i), co)
		s.bin = cfg.Binary
		s.opts.Routes = server.RoutesFromStr(strings.Join(rs, ","))
		c.servers = append(c.servers, s)
	}
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i, s := range c.servers {
		// At once: a node from a binary is only ready (JetStream
		// enabled) once it meets its peers.
		wg.Go(func() { errs[i] = s.start() })
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		c.shutdown()
		return nil, err
	}
	if err := c.waitReady(); err != nil {
		c.shutdown()
		return nil, err
	}
	t.Cleanup(func() {
		// Heal a partition the test left, then let nodes finish creating
		// their streams: a node shut down in the middle of it can leak
		// the stream's store goroutines (nats-server 2.11), which goleak
		// then reports.
		_ = c.heal(quiesceTimeout)
		c.shutdown()
	})
	return c, nil
}

// shutdown stops every node for good.
func (c *Cluster) shutdown() {
	for _, s := range c.servers {
		s.close()
	}
}

// URLs returns the client URLs of all the nodes, comma-separated, as NATS
// clients accept them. It includes nodes that are stopped.
func (c *Cluster) URLs() string {
	urls := make([]string, len(c.servers))
	for i, s := range c.servers {
		urls[i] = s.URL()
	}
	return strings.Join(urls, ",")
}

// Servers returns the nodes, in a fixed order: Stop(i) and Restart(i) act on
// Servers()[i].
func (c *Cluster) Servers() []*Server { return c.servers }

// Stop shuts node i down (see [Server.Shutdown]). The others go on; a new
// meta leader is elected if node i was the leader.
func (c *Cluster) Stop(i int) { c.servers[i].Shutdown() }

// RestartAll restarts every node at once, as after a whole-cluster outage
// (one at a time could not work: a node waits for a meta leader, which
// needs a quorum of nodes up), then waits until the cluster is ready.
func (c *Cluster) RestartAll() error {
	errs := make([]error, len(c.servers))
	var wg sync.WaitGroup
	for i, s := range c.servers {
		wg.Go(func() { errs[i] = s.Restart() })
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return err
	}
	return c.waitReady()
}

// Restart starts node i again with its ports and store directory, and returns
// once the cluster is ready again as after [StartCluster], counting only the
// nodes that are running: a meta leader sees them all, and each is healthy
// (current with the meta leader, its streams and consumers running and
// current).
func (c *Cluster) Restart(i int) error {
	if err := c.servers[i].Restart(); err != nil {
		return err
	}
	return c.waitReady()
}

// Isolate cuts node i off the other nodes, as a network partition would,
// and returns at once. Its route connections stay open but carry nothing
// in either direction, not even a close, and new ones get no answer (see
// [testenv.Proxy.BlackHole]); its clients stay connected to it, and it
// keeps running. The nodes find out as in a real partition, by missed
// heartbeats: within seconds the others, if they are a majority, elect
// JetStream leaders (the meta leader, each stream's) among themselves,
// and node i, without a quorum, commits no JetStream write. Isolating
// another node cuts it off too (from every other node, isolated or not);
// isolating an isolated node does nothing. [Cluster.Restart] and
// [Cluster.RestartAll] wait for every running node to be healthy,
// isolated ones included: heal first.
//
// Isolate panics if the cluster was started without
// [ClusterConfig.ProxyRoutes].
func (c *Cluster) Isolate(i int) {
	if c.proxies == nil {
		panic("natsenv: Isolate needs a cluster started with ClusterConfig.ProxyRoutes")
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.isolated[i] = true
	for j := range c.servers {
		if j != i {
			c.proxies[i][j].BlackHole()
			c.proxies[j][i].BlackHole()
		}
	}
}

// Heal ends every isolation. The route connections of the nodes that
// were isolated are closed, as a partition that lasted leaves them broken,
// and the nodes dial them again through the proxies (within about a
// second). Heal returns once those routes are back and the cluster is
// ready as after [StartCluster] (a meta leader sees every running node,
// and each passes its health check: current with the meta leader, its
// streams and consumers caught up), or an error if that takes more than
// 30 seconds. Healing a cluster with no isolated node only waits for it to
// be ready.
//
// A node cut off for longer than an election timeout (4 to 9 seconds in
// nats-server 2.11) called elections alone, and comes back with a higher
// Raft term: as nats-server's Raft has no pre-vote, the leaders it
// meets step down and are elected again, which may briefly make streams
// unavailable also just after Heal has returned.
func (c *Cluster) Heal() error { return c.heal(clusterTimeout) }

func (c *Cluster) heal(timeout time.Duration) error {
	since := time.Now()
	cut := c.reconnect()
	return waitFor(timeout, func() error {
		if err := c.routedSince(cut, since); err != nil {
			return err
		}
		return c.ready()
	})
}

// reconnect ends every isolation: it closes every connection through the
// isolated nodes' proxies, then lets every proxy carry data again. It
// returns the nodes that were isolated.
func (c *Cluster) reconnect() map[int]bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	cut := maps.Clone(c.isolated)
	clear(c.isolated)
	for i := range cut {
		for j := range c.servers {
			if j != i {
				c.proxies[i][j].Cut()
				c.proxies[j][i].Cut()
			}
		}
	}
	for _, ps := range c.proxies {
		for _, p := range ps {
			if p != nil {
				p.Restore()
			}
		}
	}
	return cut
}

// routedSince returns nil once every running node has a route to every
// other, and the routes of the nodes in cut were made after since (their
// old ones, closed by reconnect, may linger a moment before their nodes
// see the close).
func (c *Cluster) routedSince(cut map[int]bool, since time.Time) error {
	for i, s := range c.servers {
		ns := s.server()
		if ns == nil {
			continue
		}
		rz, err := ns.Routez(nil)
		if err != nil {
			return fmt.Errorf("natsenv: %s: routes: %w", s.name, err)
		}
		for j, o := range c.servers {
			if j == i || !o.Running() {
				continue
			}
			fresh := !cut[i] && !cut[j]
			found := false
			for _, r := range rz.Routes {
				if r.RemoteName == o.name {
					found = true
					fresh = fresh || r.Start.After(since)
				}
			}
			switch {
			case !found:
				return fmt.Errorf("natsenv: %s has no route to %s", s.name, o.name)
			case !fresh:
				return fmt.Errorf("natsenv: %s's route to %s is from before the heal", s.name, o.name)
			}
		}
	}
	return nil
}

// Isolated reports whether node i is isolated by [Cluster.Isolate].
func (c *Cluster) Isolated(i int) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.isolated[i]
}

// MetaLeader returns the index of the node that is the JetStream meta
// leader, or -1 if no running node is. It ignores isolated nodes (see
// [Cluster.Isolate]): one that led when it was cut off may believe it
// still does for a while, without a quorum to lead.
func (c *Cluster) MetaLeader() int {
	for i, s := range c.servers {
		if c.Isolated(i) {
			continue
		}
		if leader, _, err := s.meta(); err == nil && leader {
			return i
		}
	}
	return -1
}

// Versions returns the version each node runs, in the order of Servers
// (see [Server.Version]).
func (c *Cluster) Versions() []string {
	vs := make([]string, len(c.servers))
	for i, s := range c.servers {
		vs[i] = s.Version()
	}
	return vs
}

// waitReady waits until a meta leader is elected among the running nodes, it
// sees all of them, and all of them are healthy.
func (c *Cluster) waitReady() error { return c.waitReadyWithin(clusterTimeout) }

func (c *Cluster) waitReadyWithin(timeout time.Duration) error { return waitFor(timeout, c.ready) }

// ready returns nil if a meta leader is elected among the running nodes,
// it sees all of them, and all of them are healthy.
func (c *Cluster) ready() error {
	var running []*Server
	for _, s := range c.servers {
		if s.Running() {
			running = append(running, s)
		}
	}
	i := c.MetaLeader()
	if i < 0 {
		return errors.New("natsenv: no JetStream meta leader")
	}
	leader := c.servers[i]
	isLeader, peers, err := leader.meta()
	switch {
	case err != nil:
		return err
	case !isLeader:
		return errors.New("natsenv: meta leader stepped down")
	case peers != len(running):
		return fmt.Errorf("natsenv: meta leader %s sees %d of %d nodes", leader.name, peers, len(running))
	}
	for _, s := range running {
		if err := s.healthy(); err != nil {
			return err
		}
	}
	return nil
}

// waitFor calls probe until it returns nil or timeout passes, and returns its
// last error.
func waitFor(timeout time.Duration, probe func() error) error {
	deadline := time.Now().Add(timeout)
	delay := 10 * time.Millisecond
	for {
		err := probe()
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%w (after %v)", err, timeout)
		}
		time.Sleep(delay)
		delay = min(2*delay, 250*time.Millisecond)
	}
}

// logger passes a server's notices, warnings and errors to t.Log while the
// test runs with -v. It is nil otherwise, and its methods do nothing.
type logger struct {
	t      testing.TB
	mu     sync.Mutex
	closed bool
}

func newLogger(t testing.TB) *logger {
	if !testing.Verbose() {
		return nil
	}
	return &logger{t: t}
}

func (l *logger) logf(level, format string, v ...any) {
	if l == nil {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	// t.Log panics once the test is over: servers stop logging at cleanup.
	if !l.closed {
		l.t.Logf("nats-server: "+level+" "+format, v...)
	}
}

func (l *logger) close() {
	if l == nil {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.closed = true
}

func (l *logger) Noticef(format string, v ...any) { l.logf("[INF]", format, v...) }
func (l *logger) Warnf(format string, v ...any)   { l.logf("[WRN]", format, v...) }
func (l *logger) Fatalf(format string, v ...any)  { l.logf("[FTL]", format, v...) }
func (l *logger) Errorf(format string, v ...any)  { l.logf("[ERR]", format, v...) }
func (l *logger) Debugf(format string, v ...any)  {}
func (l *logger) Tracef(format string, v ...any)  {}
