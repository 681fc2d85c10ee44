package natsputex_test

// Chaos: random faults and mixed clients over time.

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/url"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/latchkey-go/latchkey/contracttest"
	"github.com/latchkey-go/latchkey/contracttest/testenv"
	"github.com/latchkey-go/latchkey/contracttest/testenv/natsenv"
	"github.com/latchkey-go/latchkey/locks"
	"github.com/latchkey-go/latchkey/natsputex"
)

// TestFlappingMixedClientsNeverOverlap: "two leases on one name are never
// granted at once"; "A holder that cannot renew ends its lease by itself at
// the start of its last successful write plus T minus a safety margin";
// Lock: "when ctx ends first, the error matches ctx.Err()", a take write in
// flight answered "at most max(T, 1s) later"; Close "Every wait is bounded
// by ctx" and ends every lease of the client. Four clients of mixed timing
// lock two names in loops (Lock or TryLock, ctx 700ms; hold 40–120ms;
// Release, ctx 200ms): c1 (R = 100ms, F = 3, C = 0) and c2 (R = 50ms, F = 4,
// C = 1) and c4 (R = 100ms, F = 3, C = 2) on links cut and restored every
// 150ms for 2s (c2's out of phase), c3 (R = 100ms, F = 5, C = 0) on a direct
// link; with 1.6s of flapping gone, c4 is closed (ctx 300ms) while its link
// flaps. No lease may be granted while another of its name is live, tokens
// must rise, no lease be live past its deadline (+3ms), each Lock and
// TryLock return within its ctx + 1s (+60ms), each Release within 200ms
// (+60ms), Close within 300ms (+60ms) with c4's leases ended, and some
// grants be made by the flapping clients.
func TestFlappingMixedClientsNeverOverlap(t *testing.T) {
	url, bucket, _ := localEnv(t)
	l1, l2, l4 := dialLink(t, url), dialLink(t, url), dialLink(t, url)
	type member struct {
		name string
		c    *natsputex.Client
	}
	members := []member{
		{"c1", l1.client(t, bucket, natsputex.WithConfirmations(0), natsputex.WithHolderID("c1"))},
		{"c2", l2.client(t, bucket, natsputex.WithRenewInterval(testR/2), natsputex.WithFailureThreshold(4), natsputex.WithHolderID("c2"))},
		{"c3", newTestClient(t, url, bucket, natsputex.WithFailureThreshold(5), natsputex.WithConfirmations(0), natsputex.WithHolderID("c3"))},
		{"c4", l4.client(t, bucket, natsputex.WithConfirmations(2), natsputex.WithHolderID("c4"))},
	}
	names := []string{"a", "b"}
	grants := map[string]*grants{"a": newGrants(), "b": newGrants()}
	v := watchValidity(t)
	var (
		mu       sync.Mutex
		problems []string
		byWho    = map[string]int{}
		c4Leases []locks.Lease
	)
	report := func(format string, args ...any) {
		mu.Lock()
		defer mu.Unlock()
		if len(problems) < 20 {
			problems = append(problems, fmt.Sprintf(format, args...))
		}
	}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for _, m := range members {
		for i, name := range names {
			wg.Add(1)
			go func(m member, name string, try bool) {
				defer wg.Done()
				for n := 0; ; n++ {
					select {
					case <-stop:
						return
					default:
					}
					ctx, cancel := context.WithTimeout(context.Background(), 700*time.Millisecond)
					began := time.Now()
					var lease locks.Lease
					var err error
					if try && n%2 == 0 {
						lease, err = m.c.Locker().TryLock(ctx, name)
					} else {
						lease, err = m.c.Locker().Lock(ctx, name)
					}
					cancel()
					if d := time.Since(began); d > 700*time.Millisecond+time.Second+timingSlack {
						report("%s's call on %q returned %v after it began (ctx 700ms): %v", m.name, name, ms(d), err)
					}
					if err != nil {
						if errors.Is(err, locks.ErrClosed) {
							return
						}
						time.Sleep(10 * time.Millisecond)
						continue
					}
					grants[name].grant(m.name, lease)
					v.add(m.name+" "+name, lease)
					mu.Lock()
					byWho[m.name]++
					if m.name == "c4" {
						c4Leases = append(c4Leases, lease)
					}
					mu.Unlock()
					select {
					case <-time.After(time.Duration(40+n*37%80) * time.Millisecond):
					case <-lease.Context().Done():
					}
					rctx, rcancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
					began = time.Now()
					_ = lease.Release(rctx)
					rcancel()
					if d := time.Since(began); d > 200*time.Millisecond+timingSlack {
						report("%s's Release of %q returned %v after it began (ctx 200ms)", m.name, name, ms(d))
					}
				}
			}(m, name, i == 1)
		}
	}
	flapStart := time.Now()
	var closed time.Duration
	var closeErr error
	for i := 0; time.Since(flapStart) < 2*time.Second; i++ {
		if i%2 == 0 {
			l1.proxy.Cut()
			l4.proxy.Cut()
		} else {
			l1.proxy.Restore()
			l4.proxy.Restore()
		}
		time.Sleep(75 * time.Millisecond)
		if i%2 == 0 {
			l2.proxy.Cut()
		} else {
			l2.proxy.Restore()
		}
		time.Sleep(75 * time.Millisecond)
		if closed == 0 && time.Since(flapStart) > 1600*time.Millisecond {
			ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
			began := time.Now()
			closeErr = members[3].c.Close(ctx)
			closed = time.Since(began)
			cancel()
			mu.Lock()
			for _, l := range c4Leases {
				if l.Context().Err() == nil {
					report("c4's lease (token %d) live after Close returned", l.Token())
				}
			}
			mu.Unlock()
		}
	}
	l1.proxy.Restore()
	l2.proxy.Restore()
	l4.proxy.Restore()
	time.Sleep(500 * time.Millisecond)
	close(stop)
	wg.Wait()
	t.Logf("grants by client: %v; c4's Close (ctx 300ms, its link flapping) returned in %v: %v", byWho, ms(closed), closeErr)
	if closed > 300*time.Millisecond+timingSlack {
		t.Errorf("c4's Close returned %v after it began, its ctx 300ms", ms(closed))
	}
	if byWho["c1"]+byWho["c2"]+byWho["c4"] == 0 {
		t.Error("no grant to a client on a flapping link")
	}
	for _, p := range problems {
		t.Error(p)
	}
	v.check(t)
	for _, name := range names {
		grants[name].check(t)
	}
}

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
