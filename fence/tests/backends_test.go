package tests

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/redis/go-redis/v9"
	"go.uber.org/goleak"

	"github.com/latchkey-go/latchkey/contracttest"
	"github.com/latchkey-go/latchkey/contracttest/testenv"
	"github.com/latchkey-go/latchkey/contracttest/testenv/natsenv"
	"github.com/latchkey-go/latchkey/locks"
	"github.com/latchkey-go/latchkey/natsputex"
	"github.com/latchkey-go/latchkey/redlockprio"
)

// The lock side of the fencing matrix: natsputex and redlockprio on real
// brokers, each client able to sit behind a fault proxy (a
// contracttest.FaultHarness) so that the matrix pauses a holder by
// black-holing its link. Timings are short, as in the backends' own
// suites.

// natsputex: a crashed or silent holder's key comes back after F renewal
// intervals of silence plus C confirmation intervals.
const (
	natsR = 100 * time.Millisecond
	natsF = 3
	natsC = 1
)

var bucketSeq atomic.Int64

// natsHarness runs natsputex on one bucket of an embedded server made
// before the checks (whose leak checks must not see its goroutines).
type natsHarness struct {
	t      testing.TB
	url    string
	bucket string

	mu      sync.Mutex
	proxies []*testenv.Proxy
}

type natsClient struct {
	nc *nats.Conn
	c  *natsputex.Client
}

func (c *natsClient) Locker() locks.Locker { return c.c.Locker() }
func (c *natsClient) Semaphore(_ context.Context, size int) (locks.Semaphore, error) {
	return c.c.Semaphore(size)
}
func (c *natsClient) Close(ctx context.Context) error {
	err := c.c.Close(ctx)
	c.nc.Close()
	return err
}

// newNatsputexHarness starts a server, creates a lock bucket on it and
// returns the harness maker.
func newNatsputexHarness(t testing.TB) contracttest.NewHarness {
	t.Helper()
	url := natsenv.StartServer(t).URL()
	bucket := fmt.Sprintf("fence-locks-%d", bucketSeq.Add(1))
	c, err := natsputexClient(t.Context(), url, bucket)
	if err != nil {
		t.Fatalf("creating the lock bucket: %v", err)
	}
	_ = c.Close(t.Context())
	return func(_ context.Context, t testing.TB) (contracttest.Harness, error) {
		return &natsHarness{t: t, url: url, bucket: bucket}, nil
	}
}

func natsputexClient(ctx context.Context, url, bucket string, opts ...nats.Option) (*natsClient, error) {
	nc, err := nats.Connect(url, append([]nats.Option{nats.MaxReconnects(-1), nats.ReconnectWait(50 * time.Millisecond)}, opts...)...)
	if err != nil {
		return nil, err
	}
	js, err := jetstream.New(nc)
	if err != nil {
		nc.Close()
		return nil, err
	}
	c, err := natsputex.New(ctx, js, bucket,
		natsputex.WithRenewInterval(natsR), natsputex.WithFailureThreshold(natsF), natsputex.WithConfirmations(natsC))
	if err != nil {
		nc.Close()
		return nil, err
	}
	return &natsClient{nc: nc, c: c}, nil
}

func (h *natsHarness) NewClient(ctx context.Context) (contracttest.Client, error) {
	return natsputexClient(ctx, h.url, h.bucket)
}

// NewFaultyClient connects a client through a fault proxy of its own.
func (h *natsHarness) NewFaultyClient(ctx context.Context) (contracttest.Client, contracttest.Link, error) {
	p := testenv.NewProxy(h.t, h.url[len("nats://"):])
	h.mu.Lock()
	h.proxies = append(h.proxies, p)
	h.mu.Unlock()
	c, err := natsputexClient(ctx, "nats://"+p.Addr(), h.bucket, nats.IgnoreDiscoveredServers())
	if err != nil {
		return nil, nil, err
	}
	return c, p, nil
}

// Kill closes the client's connection abruptly.
func (h *natsHarness) Kill(_ context.Context, c contracttest.Client) error {
	c.(*natsClient).nc.Close()
	return nil
}

func (h *natsHarness) Capabilities() contracttest.Capabilities {
	return contracttest.Capabilities{
		Fencing:       true,
		Semaphore:     true,
		CrashRecovery: (natsF + natsC + 2) * natsR,
		LossDetection: 2 * natsR,
		CancelGrace:   time.Second,
	}
}

// IgnoreLeaks ignores the consumers a cut-off client leaves on the
// embedded server until they time out.
func (h *natsHarness) IgnoreLeaks() []goleak.Option { return natsenv.ConsumerGoroutines() }

func (h *natsHarness) Close() error {
	h.mu.Lock()
	proxies := h.proxies
	h.proxies = nil
	h.mu.Unlock()
	for _, p := range proxies {
		p.Cut()
	}
	return nil
}

// redlockprio: leases of 600ms renewed every 190ms.
const (
	redisTTL   = 600 * time.Millisecond
	redisRenew = 190 * time.Millisecond
)

// redlockHarness runs redlockprio on masters started once per test.
type redlockHarness struct {
	t       testing.TB
	addrs   []string
	mu      sync.Mutex
	made    []*redlockClient
	proxies testenv.Proxies
}

type redlockClient struct {
	rcs    []*redis.Client
	c      *redlockprio.Client
	closed sync.Once
}

func (c *redlockClient) Locker() locks.Locker { return c.c.Locker() }
func (c *redlockClient) Semaphore(_ context.Context, size int) (locks.Semaphore, error) {
	return c.c.Semaphore(size)
}
func (c *redlockClient) Close(ctx context.Context) error {
	var err error
	c.closed.Do(func() {
		err = c.c.Close(ctx)
		for _, rc := range c.rcs {
			_ = rc.Close()
		}
	})
	return err
}

// newRedlockprioHarness starts n masters and returns the harness maker.
func newRedlockprioHarness(t testing.TB, n int) contracttest.NewHarness {
	t.Helper()
	var addrs []string
	for _, s := range testenv.StartRedis(t, n) {
		addrs = append(addrs, s.Addr())
	}
	return func(_ context.Context, t testing.TB) (contracttest.Harness, error) {
		return &redlockHarness{t: t, addrs: addrs}, nil
	}
}

func (h *redlockHarness) newClient(addrs []string) (*redlockClient, error) {
	c := &redlockClient{}
	var ms []*redis.Client
	for _, a := range addrs {
		rc := redis.NewClient(&redis.Options{Addr: a, ContextTimeoutEnabled: true, MaxRetries: -1, DialTimeout: time.Second})
		c.rcs = append(c.rcs, rc)
		ms = append(ms, rc)
	}
	rc, err := redlockprio.New(ms, redlockprio.WithTTL(redisTTL), redlockprio.WithRenewInterval(redisRenew))
	if err != nil {
		for _, r := range c.rcs {
			_ = r.Close()
		}
		return nil, err
	}
	c.c = rc
	h.mu.Lock()
	h.made = append(h.made, c)
	h.mu.Unlock()
	return c, nil
}

func (h *redlockHarness) NewClient(context.Context) (contracttest.Client, error) {
	return h.newClient(h.addrs)
}

// NewFaultyClient puts a fault proxy on the client's link to every
// master; the link faults them together.
func (h *redlockHarness) NewFaultyClient(context.Context) (contracttest.Client, contracttest.Link, error) {
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
	c, err := h.newClient(via)
	if err != nil {
		return nil, nil, err
	}
	return c, link, nil
}

// Kill closes the client's connections abruptly.
func (h *redlockHarness) Kill(_ context.Context, c contracttest.Client) error {
	for _, rc := range c.(*redlockClient).rcs {
		_ = rc.Close()
	}
	return nil
}

func (h *redlockHarness) Capabilities() contracttest.Capabilities {
	return contracttest.Capabilities{
		Fencing:       true,
		Semaphore:     true,
		CrashRecovery: redisTTL + 100*time.Millisecond,
		LossDetection: 2 * redisRenew,
		CancelGrace:   200 * time.Millisecond,
	}
}

func (h *redlockHarness) Close() error {
	h.mu.Lock()
	made, proxies := h.made, h.proxies
	h.made, h.proxies = nil, nil
	h.mu.Unlock()
	for _, c := range made {
		_ = c.Close(context.Background())
	}
	proxies.Cut()
	return nil
}
