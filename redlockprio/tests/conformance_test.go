package redlockprio_test

import (
	"context"
	"math"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/latchkey-go/latchkey/contracttest"
	"github.com/latchkey-go/latchkey/contracttest/testenv"
	"github.com/latchkey-go/latchkey/locks"
	"github.com/latchkey-go/latchkey/redlockprio"
)

// harness runs the conformance suite on masters started once per test
// function (so that their goroutines predate each subtest's leak check).
type harness struct {
	t       testing.TB // for NewFaultyClient's proxies
	addrs   []string
	mu      sync.Mutex
	made    []*client
	proxies testenv.Proxies // of faulty clients, cut at Close
}

func (h *harness) newClient(opts ...redlockprio.Option) (contracttest.Client, error) {
	c, err := newClient(h.addrs, opts...)
	if err != nil {
		return nil, err
	}
	h.mu.Lock()
	h.made = append(h.made, c)
	h.mu.Unlock()
	return c, nil
}

func (h *harness) NewClient(context.Context) (contracttest.Client, error) { return h.newClient() }

func (h *harness) NewPriorityClient(_ context.Context, p int) (contracttest.Client, error) {
	return h.newClient(redlockprio.WithPriority(p))
}

// Kill closes the client's go-redis clients abruptly: its leases can no
// longer be renewed nor released, as for a crashed process.
func (h *harness) Kill(_ context.Context, c contracttest.Client) error {
	for _, rc := range c.(*client).rcs {
		_ = rc.Close()
	}
	return nil
}

func (h *harness) Capabilities() contracttest.Capabilities {
	return contracttest.Capabilities{
		MaxSemaphoreSize: redlockprio.MaxSemaphoreSize,
		Fencing:          true,
		Semaphore:        true,
		CrashRecovery:    testTTL + 100*time.Millisecond,
		LossDetection:    2 * testRenew,
		CloseBound:       200 * time.Millisecond, // the call timeout of testTTL
		// A call whose context ends deletes what its attempt got before
		// it returns, waiting up to the call timeout (by default
		// testTTL/10, at least 200ms) for a master that does not answer.
		CancelGrace:  200 * time.Millisecond,
		InvalidNames: []string{"bad\x00name", string([]byte{0xff}), "has{brace", "has}brace", strings.Repeat("x", 1025)},
	}
}

func (h *harness) Close() error {
	h.mu.Lock()
	made := h.made
	proxies := h.proxies
	h.made, h.proxies = nil, nil
	h.mu.Unlock()
	for _, c := range made {
		_ = c.Close(context.Background())
	}
	proxies.Cut() // ends their goroutines before the suite looks for leaks
	return nil
}

// Revoke deletes the name's keys on every master, as an administrator
// would.
func (h *harness) Revoke(ctx context.Context, name string) error {
	for _, a := range h.addrs {
		rc := newRedis(a)
		var keys []string
		for s := 1; s <= 8; s++ {
			keys = append(keys, "latchkey:{"+name+"}:"+strconv.Itoa(s))
		}
		err := rc.Del(ctx, keys...).Err()
		_ = rc.Close()
		if err != nil {
			return err
		}
	}
	return nil
}

func (h *harness) InvalidOptions(context.Context) []error {
	rc := newRedis(h.addrs[0])
	defer rc.Close()
	ms := []redis.UniversalClient{rc}
	var errs []error
	for _, opts := range [][]redlockprio.Option{
		{redlockprio.WithTTL(0)},
		{redlockprio.WithTTL(-time.Second)},
		{redlockprio.WithRenewInterval(0)},
		{redlockprio.WithTTL(time.Second), redlockprio.WithRenewInterval(2 * time.Second)},
		{redlockprio.WithTTL(time.Second), redlockprio.WithRenewInterval(time.Second / 2)},
		{redlockprio.WithDriftFactor(1)},
		{redlockprio.WithDriftFactor(-0.1)},
		{redlockprio.WithDriftFactor(math.NaN())},
		{redlockprio.WithPriority(math.MaxInt32 + 1)},
		{redlockprio.WithBackoff(locks.Backoff{Min: time.Second, Max: time.Millisecond})},
		{redlockprio.WithHolderID("")},
		{redlockprio.WithHolderID("a|b")},
		{redlockprio.WithKeyPrefix("x{")},
		{redlockprio.WithKeyPrefix("x|")},
		{redlockprio.WithUnsafeStolenConsistencyFactor(1.5)},
		{redlockprio.WithUnsafeStolenConsistencyFactor(-1)},
	} {
		_, err := redlockprio.New(ms, opts...)
		errs = append(errs, err)
	}
	for _, bad := range [][]redis.UniversalClient{nil, {nil}, {(*redis.Client)(nil)}, {rc, rc}} {
		_, err := redlockprio.New(bad)
		errs = append(errs, err)
	}
	c, err := redlockprio.New(ms)
	if err == nil {
		_, err = c.Semaphore(0)
		errs = append(errs, err)
		_ = c.Close(context.Background())
	}
	return errs
}

func runConformance(t *testing.T, n int) {
	contracttest.RunConformanceTests(t, harnessOn(addrsOf(testenv.StartRedis(t, n))))
}

// harnessOn makes the suite's harness on the masters at addrs.
func harnessOn(addrs []string) contracttest.NewHarness {
	return func(_ context.Context, t testing.TB) (contracttest.Harness, error) {
		return &harness{t: t, addrs: addrs}, nil
	}
}

func TestConformance1(t *testing.T) { runConformance(t, 1) }

func TestConformance3(t *testing.T) { runConformance(t, 3) }

func TestConformance5(t *testing.T) { runConformance(t, 5) }

func runBenchmarks(b *testing.B, n int) {
	addrs := addrsOf(testenv.StartRedis(b, n))
	contracttest.RunBenchmarks(b, func(context.Context, testing.TB) (contracttest.Harness, error) {
		return &harness{addrs: addrs}, nil
	})
}

func BenchmarkRedlockprio1(b *testing.B) { runBenchmarks(b, 1) }

func BenchmarkRedlockprio3(b *testing.B) { runBenchmarks(b, 3) }

func BenchmarkRedlockprio5(b *testing.B) { runBenchmarks(b, 5) }

var _ contracttest.FaultHarness = (*harness)(nil)

// NewFaultyClient makes a client whose link to every master goes through a
// fault proxy of its own; the link faults them all together.
func (h *harness) NewFaultyClient(context.Context) (contracttest.Client, contracttest.Link, error) {
	var (
		link testenv.Proxies
		via  []string
	)
	for _, a := range h.addrs {
		p := testenv.NewProxy(h.t, a)
		link = append(link, p)
		via = append(via, p.Addr())
	}
	h.mu.Lock()
	h.proxies = append(h.proxies, link...)
	h.mu.Unlock()
	c, err := newClient(via)
	if err != nil {
		return nil, nil, err
	}
	h.mu.Lock()
	h.made = append(h.made, c)
	h.mu.Unlock()
	return c, link, nil
}

// TestFaultSuiteCatchesDefects shows the fault tests failing on this
// backend (3 masters) broken on purpose: a holder that learns of its loss
// late, and a Lock that outlives its context.
func TestFaultSuiteCatchesDefects(t *testing.T) {
	nh := harnessOn(addrsOf(testenv.StartRedis(t, 3)))
	contracttest.RunDefectTests(t, nh)
}
