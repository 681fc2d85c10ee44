package natsputex_test

// The conformance suite (contracttest) on natsputex: the harness, the
// fault suite's self-test, and the benchmarks.

import (
	"context"
	"fmt"
	"net/url"
	"strings"
	"sync"
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

var _ contracttest.FaultHarness = (*harness)(nil)

// NewFaultyClient connects a client to the first server through a fault
// proxy, ignoring the other servers the cluster advertises, so that every
// byte it exchanges goes through the proxy.
func (h *harness) NewFaultyClient(ctx context.Context) (contracttest.Client, contracttest.Link, error) {
	first, _, _ := strings.Cut(h.urls, ",")
	u, err := url.Parse(first)
	if err != nil {
		return nil, nil, err
	}
	p := testenv.NewProxy(h.t, u.Host)
	h.mu.Lock()
	h.proxies = append(h.proxies, p)
	h.mu.Unlock()
	nc, js, err := connect("nats://"+p.Addr(), nats.IgnoreDiscoveredServers())
	if err != nil {
		return nil, nil, err
	}
	c, err := natsputex.New(ctx, js, h.bucket, h.opts...)
	if err != nil {
		nc.Close()
		return nil, nil, err
	}
	return &client{nc: nc, c: c}, p, nil
}

// TestFaultSuiteCatchesDefects shows the fault tests failing on this
// backend broken on purpose: a holder that learns of its loss late, and
// a Lock that outlives its context.
func TestFaultSuiteCatchesDefects(t *testing.T) {
	url := natsenv.StartServer(t).URL()
	bucket := uniqueBucket("defect")
	prepareBucket(t, url, bucket)
	nh := newHarnessFunc(url, bucket)
	contracttest.RunDefectTests(t, nh)
}

// harness runs the conformance suite on one bucket of a NATS server or
// cluster. The server and the bucket outlive every harness (they are made
// before the suite runs), so that their goroutines are not counted as
// leaks; each harness only owns its connections.
type harness struct {
	t      testing.TB
	urls   string
	bucket string
	opts   []natsputex.Option
	admin  *nats.Conn
	kv     jetstream.KeyValue

	mu      sync.Mutex
	proxies []*testenv.Proxy // of faulty clients, cut at Close
}

type client struct {
	nc *nats.Conn
	c  *natsputex.Client
}

func (c *client) Locker() locks.Locker { return c.c.Locker() }

func (c *client) Semaphore(_ context.Context, size int) (locks.Semaphore, error) {
	return c.c.Semaphore(size)
}

func (c *client) Close(ctx context.Context) error {
	err := c.c.Close(ctx)
	c.nc.Close()
	return err
}

func newHarnessFunc(urls, bucket string, opts ...natsputex.Option) contracttest.NewHarness {
	return func(ctx context.Context, t testing.TB) (contracttest.Harness, error) {
		nc, js, err := connect(urls)
		if err != nil {
			return nil, err
		}
		kv, err := js.KeyValue(ctx, bucket)
		if err != nil {
			nc.Close()
			return nil, err
		}
		base := []natsputex.Option{
			natsputex.WithRenewInterval(testR),
			natsputex.WithFailureThreshold(testF),
			natsputex.WithConfirmations(testC),
		}
		return &harness{t: t, urls: urls, bucket: bucket, opts: append(base, opts...), admin: nc, kv: kv}, nil
	}
}

func (h *harness) NewClient(ctx context.Context) (contracttest.Client, error) {
	nc, js, err := connect(h.urls)
	if err != nil {
		return nil, err
	}
	c, err := natsputex.New(ctx, js, h.bucket, h.opts...)
	if err != nil {
		nc.Close()
		return nil, err
	}
	return &client{nc: nc, c: c}, nil
}

// Kill closes the client's connection abruptly: no release is sent, its
// renewals fail.
func (h *harness) Kill(_ context.Context, c contracttest.Client) error {
	c.(*client).nc.Close()
	return nil
}

func (h *harness) Capabilities() contracttest.Capabilities {
	return contracttest.Capabilities{
		MaxSemaphoreSize: natsputex.MaxSemaphoreSize,
		Fencing:          true,
		Semaphore:        true,
		// T of silence seen by the waiter, C confirmation intervals, and
		// two more intervals for the watch and scheduling.
		CrashRecovery: (testF + testC + 2) * testR,
		// The next renewal (within R) fails.
		LossDetection: 2 * testR,
		CloseBound:    max(testR*testF, time.Second), // one request's bound: Close blanks in parallel
		// A write that takes a key is not cancelled in flight (it may
		// land all the same): it is bounded by max(T, 1s).
		CancelGrace:  time.Second,
		InvalidNames: []string{"a b", "a..b", ".a", "a.", "a*", "a>", "caf\u00e9", "a\x00b", string([]byte{0xff})},
	}
}

// IgnoreLeaks makes the leak checks ignore the consumers a killed client
// leaves on the embedded server until they time out.
func (h *harness) IgnoreLeaks() []goleak.Option { return natsenv.ConsumerGoroutines() }

func (h *harness) Close() error {
	h.mu.Lock()
	proxies := h.proxies
	h.proxies = nil
	h.mu.Unlock()
	for _, p := range proxies {
		p.Cut() // ends its goroutines before the suite looks for leaks
	}
	h.admin.Close()
	return nil
}

// Revoke deletes the key, as an administrator would.
func (h *harness) Revoke(ctx context.Context, name string) error {
	return h.kv.Delete(ctx, name)
}

func (h *harness) InvalidOptions(ctx context.Context) []error {
	var errs []error
	for _, opts := range [][]natsputex.Option{
		{natsputex.WithRenewInterval(0)},
		{natsputex.WithRenewInterval(-time.Second)},
		{natsputex.WithFailureThreshold(0)},
		{natsputex.WithConfirmations(-1)},
		{natsputex.WithSafetyMargin(0)},
		{natsputex.WithRenewInterval(time.Second), natsputex.WithFailureThreshold(1), natsputex.WithSafetyMargin(2 * time.Second)},
		{natsputex.WithReplicas(0)},
		{natsputex.WithReplicas(6)},
		{natsputex.WithStorage(jetstream.StorageType(7))},
		{natsputex.WithHolderID("")},
		{natsputex.WithBackoff(locks.Backoff{Min: time.Second, Max: time.Millisecond})},
	} {
		// A nil JetStream proves the check happens before any I/O.
		_, err := natsputex.New(ctx, nil, h.bucket, opts...)
		errs = append(errs, err)
	}
	nc, js, err := connect(h.urls)
	if err != nil {
		return append(errs, err)
	}
	defer nc.Close()
	c, err := natsputex.New(ctx, js, h.bucket)
	if err != nil {
		return append(errs, err)
	}
	defer c.Close(context.Background())
	_, err = c.Semaphore(0)
	errs = append(errs, err)
	_, err = c.Semaphore(natsputex.MaxSemaphoreSize + 1)
	return append(errs, err)
}

func TestConformance(t *testing.T) {
	url := natsenv.StartServer(t).URL()
	bucket := uniqueBucket("conf")
	prepareBucket(t, url, bucket)
	contracttest.RunConformanceTests(t, newHarnessFunc(url, bucket))
}

func TestConformanceCluster(t *testing.T) {
	if testing.Short() {
		t.Skip("a 3-node cluster is slow to start")
	}
	cluster := natsenv.StartCluster(t, 3)
	bucket := uniqueBucket("conf3")
	prepareBucket(t, cluster.URLs(), bucket, natsputex.WithReplicas(3))
	contracttest.RunConformanceTests(t, newHarnessFunc(cluster.URLs(), bucket))
}

func BenchmarkNatsputex(b *testing.B) {
	url := natsenv.StartServer(b).URL()
	bucket := uniqueBucket("bench")
	prepareBucket(b, url, bucket)
	contracttest.RunBenchmarks(b, newHarnessFunc(url, bucket))
}

// BenchmarkFloor measures the raw round trips natsputex's uncontended
// lock and release stand on: one KV create and one delete.
func BenchmarkFloor(b *testing.B) {
	url := natsenv.StartServer(b).URL()
	nc, js, err := connect(url)
	if err != nil {
		b.Fatal(err)
	}
	defer nc.Close()
	ctx := context.Background()
	kv, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: uniqueBucket("floor")})
	if err != nil {
		b.Fatal(err)
	}
	for i := 0; b.Loop(); i++ {
		key := fmt.Sprintf("k%d", i)
		if _, err := kv.Create(ctx, key, []byte("x")); err != nil {
			b.Fatal(err)
		}
		if err := kv.Delete(ctx, key); err != nil {
			b.Fatal(err)
		}
	}
}

// TestConformanceLocal runs the suite against the NATS server on the
// standard local port, if one answers: it proves natsputex works on the
// oldest server it claims (2.9), which the embedded one is not.
func TestConformanceLocal(t *testing.T) {
	url := localServer(t)
	bucket := uniqueBucket("conflocal")
	prepareBucket(t, url, bucket, natsputex.WithStorage(jetstream.MemoryStorage))
	t.Cleanup(func() { deleteBucket(url, bucket) })
	contracttest.RunConformanceTests(t, newHarnessFunc(url, bucket))
}

var (
	locksErrInvalidName   = locks.ErrInvalidName
	locksErrInvalidOption = locks.ErrInvalidOption
)
