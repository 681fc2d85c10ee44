package natsputex_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
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
func (c *client) Close() error {
	err := c.c.Close(context.Background())
	c.nc.Close()
	return err
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

var (
	locksErrInvalidName   = locks.ErrInvalidName
	locksErrInvalidOption = locks.ErrInvalidOption
)

type atomicBool struct{ v atomic.Bool }

func (b *atomicBool) get() bool { return b.v.Load() }
func (b *atomicBool) set()      { b.v.Store(true) }
