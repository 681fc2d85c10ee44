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

const (
	testTTL   = 600 * time.Millisecond
	testRenew = 190 * time.Millisecond // at most (TTL − drift)/3
)

// newRedis returns a go-redis client for one master, as the tests use
// them: calls bounded by their contexts, no retries (a test that kills a
// master wants to see it fail at once).
func newRedis(addr string) *redis.Client {
	return redis.NewClient(clientOptions(addr).Simple())
}

// clientOptions are the options of the tests' clients of the master (or
// one-node cluster) at addr.
func clientOptions(addr string) *redis.UniversalOptions {
	return &redis.UniversalOptions{
		Addrs:                 []string{addr},
		ContextTimeoutEnabled: true,
		MaxRetries:            -1,
		DialTimeout:           time.Second,
		ReadTimeout:           2 * time.Second,
		WriteTimeout:          2 * time.Second,
		PoolSize:              32,
	}
}

// harness runs the conformance suite on masters started once per test
// function (so that their goroutines predate each subtest's leak check).
type harness struct {
	t       testing.TB // for NewFaultyClient's proxies
	addrs   []string
	mu      sync.Mutex
	made    []*client
	proxies testenv.Proxies // of faulty clients, cut at Close
}

type client struct {
	rcs    []*redis.Client
	c      *redlockprio.Client
	l      *redlockprio.Locker // c's
	closed sync.Once
}

func (c *client) Locker() locks.Locker { return c.l }
func (c *client) Semaphore(_ context.Context, size int) (locks.Semaphore, error) {
	return c.c.Semaphore(size)
}

func (c *client) Close() error {
	var err error
	c.closed.Do(func() {
		err = c.c.Close(context.Background())
		for _, rc := range c.rcs {
			_ = rc.Close() // already closed after a Kill
		}
	})
	return err
}

func newClient(addrs []string, opts ...redlockprio.Option) (*client, error) {
	c := &client{}
	var ms []redis.UniversalClient
	for _, a := range addrs {
		rc := newRedis(a)
		c.rcs = append(c.rcs, rc)
		ms = append(ms, rc)
	}
	rc, err := redlockprio.New(ms, append([]redlockprio.Option{
		redlockprio.WithTTL(testTTL), redlockprio.WithRenewInterval(testRenew),
	}, opts...)...)
	if err != nil {
		for _, rc := range c.rcs {
			_ = rc.Close()
		}
		return nil, err
	}
	c.c, c.l = rc, rc.Locker()
	return c, nil
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
		_ = c.Close()
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
