package redlockprio_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/latchkey-go/latchkey/contracttest"
	"github.com/latchkey-go/latchkey/contracttest/testenv"
	"github.com/latchkey-go/latchkey/redlockprio"
)

// mixedClient is one contender of TestMixedClientsUnderMasterFaults.
type mixedClient struct {
	who       string
	ttl       time.Duration
	drift     float64
	prio      int
	callTO    time.Duration // 0: the default
	immediate bool
}

// TestMixedClientsUnderMasterFaults: five Lockers on one name and 3 masters,
// each through its own proxies, with different TTLs (300ms to 1.5s),
// drift factors (0 to 0.1), priorities (0 to 3), call timeouts and
// acknowledgement modes, loop Lock → work → Release for 8s. Holders with
// WithImmediateAck stop writing when their context ends; the others write
// until they Release (or their validity ends), as the docs allow. Every
// ~500ms a fault: a master paused for 150ms, one client's replies from a
// master delayed by 80ms for 300ms, or dropped for 300ms. Checked: no
// write after a later holder's grant (one monotonic clock), tokens
// strictly increasing in grant order, no context ending after its
// validity deadline. Logged: grants per contender.
func TestMixedClientsUnderMasterFaults(t *testing.T) {
	servers := testenv.StartRedis(t, 3)
	addrs := addrsOf(servers)
	hist := contracttest.NewWriteHistory()
	cfg := []mixedClient{
		{"p0-600ms", 600 * time.Millisecond, 0.01, 0, 0, false},
		{"p1-1.5s-imm", 1500 * time.Millisecond, 0.05, 1, 0, true},
		{"p2-400ms-cto50", 400 * time.Millisecond, 0.1, 2, 50 * time.Millisecond, false},
		{"p0-800ms-imm", 800 * time.Millisecond, 0, 0, 0, true},
		{"p3-300ms", 300 * time.Millisecond, 0.01, 3, 0, false},
	}
	name := uniqueName(t)
	var lockers []*client
	for _, m := range cfg {
		more := []redlockprio.Option{}
		if m.callTO > 0 {
			more = append(more, redlockprio.WithCallTimeout(m.callTO))
		}
		if m.immediate {
			more = append(more, redlockprio.WithImmediateAck())
		}
		lockers = append(lockers, mustClient(t, addrs, viaProxies(), withTiming(m.ttl, m.drift), withPriority(m.prio), with(more...)))
	}
	runFor := 8 * time.Second
	end := time.Now().Add(runFor)
	var wg sync.WaitGroup
	grants := make([]int, len(cfg))
	errs := make([]int, len(cfg))
	for i, m := range cfg {
		wg.Go(func() {
			for time.Now().Before(end) {
				ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
				l, err := lockers[i].l.Lock(ctx, name)
				cancel()
				if err != nil {
					errs[i]++
					time.Sleep(10 * time.Millisecond)
					continue
				}
				grants[i]++
				s := hist.Begin(m.who, l)
				stop := make(chan struct{})
				go func() {
					time.Sleep(time.Duration(10+rand.IntN(50)) * time.Millisecond)
					close(stop)
				}()
				if m.immediate {
					s.WriteWhileLive(stop)
				} else {
					s.WriteUntilDeadline(stop)
				}
				s.LetGo()
				_ = l.Release(context.Background())
				time.Sleep(time.Duration(rand.IntN(20)) * time.Millisecond)
			}
		})
	}
	faults := 0
	for time.Now().Add(600 * time.Millisecond).Before(end) {
		time.Sleep(time.Duration(300+rand.IntN(300)) * time.Millisecond)
		k := rand.IntN(3)
		px := lockers[rand.IntN(len(lockers))].proxies[k]
		switch faults % 3 {
		case 0:
			_ = servers[k].Pause()
			time.Sleep(150 * time.Millisecond)
			_ = servers[k].Resume()
		case 1:
			px.DelayReplies(80 * time.Millisecond)
			time.Sleep(300 * time.Millisecond)
			px.Restore()
		case 2:
			px.DropReplies()
			time.Sleep(300 * time.Millisecond)
			px.Restore()
		}
		faults++
	}
	wg.Wait()
	for i, m := range cfg {
		t.Logf("%-16s grants %4d, failed Locks %d", m.who, grants[i], errs[i])
	}
	t.Logf("%d faults, %d sections", faults, len(hist.Records()))
	if err := hist.Check(); err != nil {
		t.Logf("sections:\n%v", hist)
		t.Error(err)
	}
}

// The ranges the chaos clients' options are drawn from.
const (
	chaosMinTTL   = 300 * time.Millisecond
	chaosMaxTTL   = 1200 * time.Millisecond
	chaosMaxDrift = 0.05
	chaosMaxPrio  = 2
)

// TestChaos runs the randomized fault run on three masters, each client
// with its own TTL, renewal interval, drift factor and priority: crashed,
// closed and impatient clients, replies lost or late on a client's links,
// a minority of masters refusing connections, a master killed and
// restarted empty after more than any TTL. Every critical section is
// checked for overlap, fencing and recovery. `mage chaos` runs it for
// minutes; here it runs for seconds.
func TestChaos(t *testing.T) {
	if testing.Short() {
		t.Skip("the chaos run takes seconds")
	}
	// The masters keep an append-only file, fsynced on every write: a
	// killed master comes back with its keys and fencing counters, the
	// setup the package doc asks of masters that may crash (one that comes
	// back empty forgets its counters however long it was down, and can
	// repeat a token: TestMajorityRestartedEmptyAllowsDoubleGrant and
	// TestBareQuorumLeaseLostToOneEmptyRestart show those limits).
	servers := testenv.StartRedisWith(t, 3, testenv.RedisConfig{
		Args: []string{"--appendonly", "yes", "--appendfsync", "always"},
	})
	// Every client reaches master i through front[i], which a fault cuts
	// to make the master refuse connections without losing its data.
	var front testenv.Proxies
	var addrs []string
	for _, s := range servers {
		p := testenv.NewProxy(t, s.Addr())
		front = append(front, p)
		addrs = append(addrs, p.Addr())
	}
	contracttest.RunChaos(t, func(_ context.Context, t testing.TB) (contracttest.Harness, error) {
		return &chaosHarness{harness: &harness{t: t, addrs: addrs}, servers: servers, front: front}, nil
	}, contracttest.ChaosConfig{Duration: 5 * time.Second, MaxHold: 500 * time.Millisecond})
}

// chaosHarness is the suite's harness whose chaos clients differ, each
// behind proxies of its own (its Link), in front of the shared front
// proxies of the masters.
type chaosHarness struct {
	*harness
	servers []*testenv.RedisServer
	front   testenv.Proxies
}

var (
	_ contracttest.ChaosHarness  = (*chaosHarness)(nil)
	_ contracttest.BrokerFaulter = (*chaosHarness)(nil)
)

func (h *chaosHarness) NewChaosClient(_ context.Context, rng *rand.Rand) (contracttest.ChaosClient, error) {
	ttl := chaosMinTTL + time.Duration(rng.Int64N(int64(chaosMaxTTL-chaosMinTTL))).Round(time.Millisecond)
	drift := float64(rng.IntN(int(chaosMaxDrift*1000)+1)) / 1000
	// The renewal interval must be at most (TTL − drift)/3; draw it in
	// the upper half of what is allowed.
	most := (ttl - time.Duration(drift*float64(ttl)) - 2*time.Millisecond) / 3
	renew := (most/2 + time.Duration(rng.Int64N(int64(most/2)))).Truncate(time.Millisecond)
	prio := rng.IntN(chaosMaxPrio + 1)

	var link testenv.Proxies
	var via []string
	for _, a := range h.addrs {
		p := testenv.NewProxy(h.t, a)
		link = append(link, p)
		via = append(via, p.Addr())
	}
	h.mu.Lock()
	h.proxies = append(h.proxies, link...)
	h.mu.Unlock()
	c, err := newClient(via, redlockprio.WithTTL(ttl), redlockprio.WithRenewInterval(renew),
		redlockprio.WithDriftFactor(drift), redlockprio.WithPriority(prio))
	if err != nil {
		return contracttest.ChaosClient{}, err
	}
	h.mu.Lock()
	h.made = append(h.made, c)
	h.mu.Unlock()
	return contracttest.ChaosClient{
		Client:  c,
		Options: fmt.Sprintf("ttl=%v renew=%v drift=%.3f priority=%d", ttl, renew, drift, prio),
		// A crashed holder's keys expire within its TTL, or, where it
		// displaced a holder of a longer TTL, within that one's: the
		// longest TTL of the mix, and one poll of the waiters.
		CrashRecovery: chaosMaxTTL + 100*time.Millisecond,
		Link:          link,
	}, nil
}

// Capabilities are the suite's, with the bounds of the longest TTL drawn.
func (h *chaosHarness) Capabilities() contracttest.Capabilities {
	caps := h.harness.Capabilities()
	caps.CrashRecovery = chaosMaxTTL + 100*time.Millisecond
	return caps
}

// BrokerFaults: a minority of masters (one of three) refusing
// connections for a while, with their data; a master killed and restarted
// from its append-only file after more than any TTL, as the package doc
// advises.
func (h *chaosHarness) BrokerFaults() []contracttest.BrokerFault {
	minority := (len(h.servers) - 1) / 2
	return []contracttest.BrokerFault{{
		Kind: "minority-refuses",
		Inject: func(_ context.Context, rng *rand.Rand) (func() error, error) {
			var cut testenv.Proxies
			for _, i := range rng.Perm(len(h.front))[:minority] {
				cut = append(cut, h.front[i])
			}
			cut.Cut()
			return func() error { cut.Restore(); return nil }, nil
		},
		// A restored front proxy listens again: its accept loop lives
		// until the test ends (the front proxies are the test's).
		Goroutines: []string{"github.com/latchkey-go/latchkey/contracttest/testenv."},
	}, {
		Kind: "master-killed-restarted",
		Inject: func(_ context.Context, rng *rand.Rand) (func() error, error) {
			s := h.servers[rng.IntN(len(h.servers))]
			if err := s.Kill(); err != nil {
				return nil, err
			}
			return s.Restart, nil
		},
		MinOutage: chaosMaxTTL + 200*time.Millisecond,
		MaxOutage: 2 * chaosMaxTTL,
		// The restarted redis-server's waiter and output copier.
		Goroutines: []string{"github.com/latchkey-go/latchkey/contracttest/testenv.", "os/exec."},
	}}
}
