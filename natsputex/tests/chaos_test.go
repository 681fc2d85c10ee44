package natsputex_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/url"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/latchkey-go/latchkey/contracttest"
	"github.com/latchkey-go/latchkey/contracttest/testenv"
	"github.com/latchkey-go/latchkey/contracttest/testenv/natsenv"
	"github.com/latchkey-go/latchkey/natsputex"
)

// The ranges the chaos clients' options are drawn from: R, F, C, and the
// safety margin (anywhere from 1ms to what T allows).
const (
	chaosMinR = 50 * time.Millisecond
	chaosMaxR = 150 * time.Millisecond
	chaosMaxF = 4
	chaosMaxC = 2
)

// chaosRecovery bounds a crashed holder's hand-over whatever the waiter's
// options: its T + C·R, one interval of alignment, and two more for the
// watch and scheduling, at the largest R, F and C drawn.
const chaosRecovery = (chaosMaxF + chaosMaxC + 3) * chaosMaxR

// TestChaos runs the randomized fault run on one embedded node, each
// client with its own R, F, C and safety margin: crashed, closed and
// impatient clients, replies lost or late on a client's connection, the
// server restarted. Every critical section is checked for overlap,
// fencing and recovery. `mage chaos` runs it for minutes; here it runs
// for seconds.
func TestChaos(t *testing.T) {
	if testing.Short() {
		t.Skip("the chaos run takes seconds")
	}
	srv := natsenv.StartServer(t)
	bucket := uniqueBucket("chaos")
	prepareBucket(t, srv.URL(), bucket)
	restart := contracttest.BrokerFault{
		Kind: "server-restarted",
		Inject: func(context.Context, *rand.Rand) (func() error, error) {
			srv.Shutdown()
			return srv.Restart, nil
		},
		Goroutines: []string{"github.com/nats-io/nats-server/"},
	}
	runChaos(t, srv.URL(), bucket, []*natsenv.Server{srv}, restart)
}

// TestChaosBinary is TestChaos on the nats-server program on the PATH
// (the 2.9 server of the README's supported list), run as a process of its
// own and restarted the same way.
func TestChaosBinary(t *testing.T) {
	if testing.Short() {
		t.Skip("the chaos run takes seconds")
	}
	srv := natsenv.StartBinaryServer(t)
	t.Logf("nats-server %s (%s)", srv.Version(), srv.Binary())
	bucket := uniqueBucket("chaosbin")
	prepareBucket(t, srv.URL(), bucket)
	restart := contracttest.BrokerFault{
		Kind: "server-restarted",
		Inject: func(context.Context, *rand.Rand) (func() error, error) {
			srv.Shutdown()
			return srv.Restart, nil
		},
		// natsenv asks the restarted process's monitoring port whether it
		// is healthy: an idle keep-alive connection of that client stays.
		Goroutines: []string{"net/http.(*persistConn)"},
	}
	runChaos(t, srv.URL(), bucket, []*natsenv.Server{srv}, restart)
}

// TestChaosCluster is TestChaos on an embedded 3-node cluster with an R3
// bucket, each client connected to one node; a node is stopped for a
// while, then restarted (the cluster keeps its quorum).
func TestChaosCluster(t *testing.T) {
	if testing.Short() {
		t.Skip("a 3-node cluster is slow to start")
	}
	cluster := natsenv.StartCluster(t, 3)
	bucket := uniqueBucket("chaos3")
	prepareBucket(t, cluster.URLs(), bucket, natsputex.WithReplicas(3))
	servers := cluster.Servers()
	restart := contracttest.BrokerFault{
		Kind: "node-restarted",
		Inject: func(_ context.Context, rng *rand.Rand) (func() error, error) {
			i := rng.IntN(len(servers))
			cluster.Stop(i)
			return func() error { return cluster.Restart(i) }, nil
		},
		Goroutines: []string{"github.com/nats-io/nats-server/"},
	}
	runChaos(t, cluster.URLs(), bucket, servers, restart)
}

func runChaos(t *testing.T, urls, bucket string, servers []*natsenv.Server, faults ...contracttest.BrokerFault) {
	nh := newHarnessFunc(urls, bucket)
	contracttest.RunChaos(t, func(ctx context.Context, t testing.TB) (contracttest.Harness, error) {
		h, err := nh(ctx, t)
		if err != nil {
			return nil, err
		}
		return &chaosHarness{harness: h.(*harness), servers: servers, faults: faults}, nil
	}, contracttest.ChaosConfig{Duration: 5 * time.Second, MaxHold: 500 * time.Millisecond})
}

// chaosHarness is the suite's harness whose chaos clients differ, each
// connected to one of the servers through a fault proxy of its own (its
// Link).
type chaosHarness struct {
	*harness
	servers []*natsenv.Server
	faults  []contracttest.BrokerFault
}

var (
	_ contracttest.ChaosHarness  = (*chaosHarness)(nil)
	_ contracttest.BrokerFaulter = (*chaosHarness)(nil)
)

func (h *chaosHarness) NewChaosClient(ctx context.Context, rng *rand.Rand) (contracttest.ChaosClient, error) {
	r := (chaosMinR + time.Duration(rng.Int64N(int64(chaosMaxR-chaosMinR)+1))).Round(time.Millisecond)
	f := 1 + rng.IntN(chaosMaxF)
	c := rng.IntN(chaosMaxC + 1)
	t := time.Duration(f) * r
	margin := (time.Millisecond + time.Duration(rng.Int64N(int64(t-2*time.Millisecond)))).Truncate(time.Millisecond)

	node := rng.IntN(len(h.servers))
	u, err := url.Parse(h.servers[node].URL())
	if err != nil {
		return contracttest.ChaosClient{}, err
	}
	p := testenv.NewProxy(h.t, u.Host)
	h.mu.Lock()
	h.proxies = append(h.proxies, p)
	h.mu.Unlock()
	nc, js, err := connect("nats://"+p.Addr(), nats.IgnoreDiscoveredServers())
	if err != nil {
		return contracttest.ChaosClient{}, err
	}
	opts := append(h.opts[:len(h.opts):len(h.opts)],
		natsputex.WithRenewInterval(r), natsputex.WithFailureThreshold(f),
		natsputex.WithConfirmations(c), natsputex.WithSafetyMargin(margin))
	cl, err := natsputex.New(ctx, js, h.bucket, opts...)
	if err != nil {
		nc.Close()
		return contracttest.ChaosClient{}, err
	}
	return contracttest.ChaosClient{
		Client:        &client{nc: nc, c: cl},
		Options:       fmt.Sprintf("R=%v F=%d C=%d margin=%v (T=%v) node=%d", r, f, c, margin, t, node),
		CrashRecovery: chaosRecovery,
		Link:          p,
	}, nil
}

// Capabilities are the suite's, with the bounds of the largest options
// drawn.
func (h *chaosHarness) Capabilities() contracttest.Capabilities {
	caps := h.harness.Capabilities()
	caps.CrashRecovery = chaosRecovery
	return caps
}

// BrokerFaults: a server shut down, then restarted on its port with its
// store (the bucket is file-stored, so revisions go on).
func (h *chaosHarness) BrokerFaults() []contracttest.BrokerFault { return h.faults }
