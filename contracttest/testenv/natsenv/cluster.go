package natsenv

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	"github.com/latchkey-go/latchkey/contracttest/testenv"
)

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
	// to 127.0.0.1:1 now and then: that is expected. A binary before
	// nats-server 2.10 does not support it.
	ProxyRoutes bool
	// Binary, if set, is the path of a nats-server program (see
	// [Binary]) to run every node from, each a separate process. Unset,
	// the nodes run from [Env.ModuleBinary], the embedded version built
	// as a program, unless Embedded or ProxyRoutes is set. (A cluster of
	// processes with proxied routes runs, but after a heal its meta
	// leader refused to place streams, "peer offline", while every node
	// passed its health check: Heal cannot yet tell when it is over.)
	Binary string
	// Embedded runs the nodes in the test process (nats-server/v2 as a
	// library). The race detector then watches the server's code too,
	// and reports its data races (see [Env.ModuleBinary]).
	Embedded bool
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
	c, err := forTest(t).StartCluster(t.Context(), n, cfg)
	testenv.Require(t, err)
	return c
}

// StartCluster is [StartClusterWith] returning an error if the cluster
// cannot start. The cluster is shut down at the testenv.Env's Close. ctx
// bounds the cluster's start, not its life.
func (e Env) StartCluster(ctx context.Context, n int, cfg ClusterConfig) (*Cluster, error) {
	if n < 2 {
		return nil, fmt.Errorf("natsenv: StartCluster(%d): a cluster needs at least 2 nodes", n)
	}
	if cfg.Binary != "" && cfg.Embedded {
		return nil, errors.New("natsenv: a cluster is either embedded or run from a binary")
	}
	if cfg.Binary == "" && !cfg.Embedded && !cfg.ProxyRoutes {
		bin, err := e.ModuleBinary()
		if err != nil {
			return nil, err
		}
		cfg.Binary = bin
	}
	var err error
	for range startAttempts {
		var c *Cluster
		if c, err = e.startCluster(ctx, n, cfg); err == nil {
			return c, nil
		}
		if ctx.Err() != nil {
			break
		}
	}
	return nil, fmt.Errorf("natsenv: start cluster: %w", err)
}

// startCluster makes the nodes, starts them and waits for the cluster to
// be ready.
func (e Env) startCluster(ctx context.Context, n int, cfg ClusterConfig) (*Cluster, error) {
	c, err := e.newCluster(n, cfg)
	if err != nil {
		return nil, err
	}
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i, s := range c.servers {
		// At once: a node from a binary is only ready (JetStream
		// enabled) once it meets its peers.
		wg.Go(func() { errs[i] = s.start(ctx) })
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		c.shutdown()
		return nil, err
	}
	if err := waitFor(ctx, clusterTimeout, c.ready); err != nil {
		c.shutdown()
		return nil, err
	}
	err = e.OnClose(func() error {
		// Heal a partition the test left, then let nodes finish creating
		// their streams: a node shut down in the middle of it can leak
		// the stream's store goroutines (nats-server 2.11), which goleak
		// then reports.
		_ = c.heal(quiesceTimeout)
		c.shutdown()
		return nil
	})
	if err != nil {
		return nil, err
	}
	return c, nil
}

// newCluster makes the nodes of a cluster, not started, on free ports,
// with the route proxies of cfg.ProxyRoutes.
func (e Env) newCluster(n int, cfg ClusterConfig) (*Cluster, error) {
	id := seq.Add(1)
	ports := make([]int, n)
	routes := make([]string, n)
	for i := range ports {
		p, err := e.FreePort()
		if err != nil {
			return nil, err
		}
		ports[i] = p
		routes[i] = fmt.Sprintf("nats-route://127.0.0.1:%d", p)
	}
	c := &Cluster{isolated: map[int]bool{}}
	if cfg.ProxyRoutes {
		if err := e.proxyRoutes(c, ports); err != nil {
			return nil, err
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
		s, err := newServer(e, fmt.Sprintf("latchkey-%d-n%d", id, i), co)
		if err != nil {
			return nil, err
		}
		s.bin = cfg.Binary
		s.opts.Routes = server.RoutesFromStr(strings.Join(rs, ","))
		c.servers = append(c.servers, s)
	}
	return c, nil
}

// proxyRoutes gives c a proxy per ordered pair of nodes, to the second
// node's cluster port.
func (e Env) proxyRoutes(c *Cluster, ports []int) error {
	n := len(ports)
	c.proxies = make([][]*testenv.Proxy, n)
	for i := range n {
		c.proxies[i] = make([]*testenv.Proxy, n)
		for j := range n {
			if i == j {
				continue
			}
			p, err := e.NewProxy(fmt.Sprintf("127.0.0.1:%d", ports[j]))
			if err != nil {
				return err
			}
			c.proxies[i][j] = p
		}
	}
	return nil
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
	return waitFor(context.Background(), timeout, func() error {
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
		rz, err := s.routes()
		if errors.Is(err, errNotRunning) {
			continue
		}
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

func (c *Cluster) waitReadyWithin(timeout time.Duration) error {
	return waitFor(context.Background(), timeout, c.ready)
}

// ready returns nil if a meta leader is elected among the running nodes,
// it sees all of them, all of them are healthy, and it places a stream on
// them all.
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
	return placeable(leader.URL(), len(running))
}

// placeable returns nil once the meta leader at url places a stream with a
// replica on each of n nodes. A cluster of processes whose meta group sees
// every node healthy still refused that now and then for a moment after a
// start ("no suitable peers for placement, peer offline": the leader had
// not yet heard a new node's statistics), and a test's first bucket
// failed.
func placeable(url string, n int) error {
	nc, err := nats.Connect(url, nats.Name("natsenv readiness"), nats.MaxReconnects(0))
	if err != nil {
		return fmt.Errorf("natsenv: placement probe: %w", err)
	}
	defer nc.Close()
	js, err := nc.JetStream(nats.MaxWait(5 * time.Second))
	if err != nil {
		return fmt.Errorf("natsenv: placement probe: %w", err)
	}
	name := fmt.Sprintf("natsenv_placement_%d", seq.Add(1))
	if _, err := js.AddStream(&nats.StreamConfig{Name: name, Subjects: []string{"natsenv.placement." + name}, Replicas: min(n, 5), Storage: nats.MemoryStorage}); err != nil {
		return fmt.Errorf("natsenv: placement probe: %w", err)
	}
	if err := js.DeleteStream(name); err != nil {
		return fmt.Errorf("natsenv: placement probe: %w", err)
	}
	return nil
}
