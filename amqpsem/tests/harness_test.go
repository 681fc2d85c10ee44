package amqpsem_test

import (
	"context"
	"errors"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/latchkey-go/latchkey/contracttest"
	"github.com/latchkey-go/latchkey/contracttest/testenv"
	"github.com/latchkey-go/latchkey/locks"

	"github.com/latchkey-go/latchkey/amqpsem"
)

// killMode says how a harness kills a client.
type killMode int

const (
	// blackHole silences the client's proxy: neither side hears of it
	// until heartbeats time out (the heartbeat bound).
	blackHole killMode = iota
	// closeSocket cuts the client's proxy (testenv.Proxy.Cut): its TCP
	// connection closes without an AMQP close, and the broker sees the
	// socket close at once.
	closeSocket
	// direct dials the broker without a proxy, for benchmarks: Kill
	// fails.
	direct
)

// harness runs the conformance suite. With semLocker, the suite's Locker
// is a one-slot persistent semaphore (which makes Revoke possible:
// destroying the semaphore); otherwise it is the exclusive-queue Mutex.
type harness struct {
	t         testing.TB
	url       string
	upstream  string
	kill      killMode
	semLocker bool

	mu      sync.Mutex
	names   map[string]bool // semaphores to destroy at Close
	proxies []*testenv.Proxy
}

func newHarness(kill killMode, semLocker bool) contracttest.NewHarness {
	return func(ctx context.Context, t testing.TB) (contracttest.Harness, error) {
		raw, host := amqpURL(t)
		h := &harness{t: t, url: raw, upstream: host, kill: kill, semLocker: semLocker, names: map[string]bool{}}
		if semLocker {
			return revokingHarness{h}, nil
		}
		return h, nil
	}
}

func (h *harness) record(name string) {
	h.mu.Lock()
	h.names[name] = true
	h.mu.Unlock()
}

type client struct {
	h      *harness
	c      *amqpsem.Client
	proxy  *testenv.Proxy // every client's faults, Kill's too
	locker locks.Locker
}

func (h *harness) NewClient(ctx context.Context) (contracttest.Client, error) {
	return h.newClient(ctx, amqpsem.WithCreate(true))
}

// newClient makes a client behind a fault proxy of its own (but for the
// direct harness), with testOptions and then opts.
func (h *harness) newClient(ctx context.Context, opts ...amqpsem.Option) (*client, error) {
	cl := &client{h: h}
	opts = append(testOptions(), opts...)
	if h.kill != direct {
		cl.proxy = testenv.NewProxy(h.t, h.upstream)
		h.mu.Lock()
		h.proxies = append(h.proxies, cl.proxy)
		h.mu.Unlock()
		opts = append(opts, through(cl.proxy))
	}
	c, err := amqpsem.Dial(ctx, h.url, opts...)
	if err != nil {
		return nil, err
	}
	cl.c = c
	if h.semLocker {
		s, err := c.Semaphore(1)
		if err != nil {
			return nil, errors.Join(err, c.Close(context.Background()))
		}
		cl.locker = semLocker{recSem{s, h}}
	} else {
		m := c.Locker()
		cl.locker = m
	}
	return cl, nil
}

func (cl *client) Locker() locks.Locker { return cl.locker }

func (cl *client) Semaphore(ctx context.Context, size int) (locks.Semaphore, error) {
	s, err := cl.c.Semaphore(size)
	if err != nil {
		return nil, err
	}
	return recSem{s, cl.h}, nil
}

func (cl *client) Close(ctx context.Context) error { return cl.c.Close(ctx) }

func (h *harness) Kill(ctx context.Context, c contracttest.Client) error {
	cl := c.(*client)
	switch h.kill {
	case blackHole:
		cl.proxy.BlackHole()
	case closeSocket:
		cl.proxy.Cut()
	default:
		return errors.New("kill: this harness's clients have no proxy")
	}
	return nil
}

func (h *harness) Capabilities() contracttest.Capabilities {
	caps := contracttest.Capabilities{
		MaxSemaphoreSize: amqpsem.MaxSemaphoreSize,
		Fencing:          false,
		Semaphore:        true,
		InvalidNames:     []string{strings.Repeat("x", 256), "amq.reserved", "bad\x00name", string([]byte{0xff})},
		CrashRecovery:    time.Second,
		// A paused holder's socket stays open: the broker drops it after
		// two or three missed heartbeats.
		PauseRecovery: 3*testHeartbeat + 500*time.Millisecond,
		LossDetection: 600 * time.Millisecond,
		CloseBound:    2 * testHeartbeat,
		// A call in flight when its context ends is waited for up to one
		// heartbeat, to undo what it declared.
		CancelGrace: testHeartbeat,
	}
	if h.kill == blackHole {
		// The broker drops a silent connection after two or three missed
		// heartbeats; the holder's lease ends within one heartbeat of its
		// last successful verification.
		caps.CrashRecovery = 3*testHeartbeat + 500*time.Millisecond
		caps.LossDetection = testHeartbeat + testVerify + 100*time.Millisecond
	}
	return caps
}

func (h *harness) Close() error {
	h.mu.Lock()
	names, proxies := h.names, h.proxies
	h.names, h.proxies = map[string]bool{}, nil
	h.mu.Unlock()
	// Cut ends the proxies' goroutines now, before the suite looks for
	// leaks; the test's cleanup closes them for good.
	for _, p := range proxies {
		p.Cut()
	}
	if len(names) == 0 {
		return nil
	}
	return destroyAll(h.url, names)
}

// destroyAll destroys the semaphores named, on a connection of its own.
func destroyAll(rawURL string, names map[string]bool) error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := amqpsem.Dial(ctx, rawURL, amqpsem.WithHeartbeat(testHeartbeat))
	if err != nil {
		return err
	}
	defer c.Close(context.Background())
	a, err := c.Admin()
	if err != nil {
		return err
	}
	var errs []error
	for name := range names {
		if _, err := a.Destroy(ctx, name); err != nil && !errors.Is(err, locks.ErrInvalidName) {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// revokingHarness is a harness whose Locker is a one-slot semaphore.
type revokingHarness struct{ *harness }

// Revoke destroys the one-slot semaphore name, as an administrator would,
// and waits for its holder to let go: the holder's next verification
// finds its slot gone, ends its lease and deletes its holder queue. (An exclusive queue
// of another connection cannot be deleted over AMQP, so the Mutex harness
// is not a Revoker.)
func (h revokingHarness) Revoke(ctx context.Context, name string) error {
	c, err := amqpsem.Dial(ctx, h.url, amqpsem.WithHeartbeat(testHeartbeat))
	if err != nil {
		return err
	}
	defer c.Close(context.Background())
	a, err := c.Admin()
	if err != nil {
		return err
	}
	if _, err := a.Destroy(ctx, name); err != nil {
		return err
	}
	// As the specification's administrator does after removing slots:
	// wait for their holders to let go (they do at their next
	// verification).
	return a.WaitReleased(ctx, name)
}

func (h *harness) InvalidOptions(ctx context.Context) []error {
	var errs []error
	for _, opt := range []amqpsem.Option{
		amqpsem.WithHeartbeat(0), amqpsem.WithHeartbeat(500 * time.Millisecond),
		amqpsem.WithVerifyInterval(0), amqpsem.WithVerifyInterval(-time.Second),
		amqpsem.WithBackoff(locks.Backoff{Min: time.Second, Max: time.Millisecond}),
		amqpsem.WithMaxAttempts(0), amqpsem.WithSkew(-1), amqpsem.WithOvershoot(-1),
		amqpsem.WithConnectTimeout(0), amqpsem.WithTLS(nil), amqpsem.WithDial(nil),
		amqpsem.WithLayout(amqpsem.Layout{}), amqpsem.WithWakeExchange(strings.Repeat("e", 256)),
		amqpsem.WithConnectionName(strings.Repeat("n", 256)),
	} {
		_, err := amqpsem.Dial(ctx, "amqp://nobody:nothing@127.0.0.1:1/", opt)
		errs = append(errs, err)
	}
	_, err := amqpsem.Dial(ctx, "http://not-amqp/")
	errs = append(errs, err)
	c, err := amqpsem.Dial(ctx, h.url, testOptions()...)
	if err != nil {
		return append(errs, err)
	}
	defer c.Close(context.Background())
	_, err = c.Admin(amqpsem.WithHeartbeat(2 * time.Second)) // a connection option
	errs = append(errs, err)
	_, err = c.Admin(amqpsem.WithMaxAttempts(-1))
	errs = append(errs, err)
	_, err = c.Semaphore(0)
	errs = append(errs, err)
	_, err = c.Semaphore(amqpsem.MaxSemaphoreSize + 1)
	errs = append(errs, err)
	a, _ := c.Admin()
	errs = append(errs, a.Create(ctx, "n", 0))
	_, err = a.Add(ctx, "n", -1)
	errs = append(errs, err)
	_, err = a.Resize(ctx, "n", -1)
	errs = append(errs, err)
	return errs
}

// recSem records the names it is used on, for cleanup.
type recSem struct {
	s *amqpsem.Semaphore
	h *harness
}

func (r recSem) Acquire(ctx context.Context, name string) (locks.Lease, error) {
	r.h.record(name)
	return r.s.Acquire(ctx, name)
}

func (r recSem) TryAcquire(ctx context.Context, name string) (locks.Lease, error) {
	r.h.record(name)
	return r.s.TryAcquire(ctx, name)
}

// semLocker is a one-slot semaphore seen as a Locker.
// semLocker is a Semaphore of size 1 used as a Locker; its leases say
// Slot 0, as a Locker's do (asLock).
type semLocker struct{ s locks.Semaphore }

func (l semLocker) Lock(ctx context.Context, name string) (locks.Lease, error) {
	return asLock(l.s.Acquire(ctx, name))
}

func (l semLocker) TryLock(ctx context.Context, name string) (locks.Lease, error) {
	return asLock(l.s.TryAcquire(ctx, name))
}

// lockLease is a semaphore slot held as a lock.
type lockLease struct{ locks.Lease }

func (lockLease) Slot() int { return 0 }

// Unwrap returns the semaphore's lease, for the tests that look at its queue.
func (l lockLease) Unwrap() locks.Lease { return l.Lease }

func asLock(l locks.Lease, err error) (locks.Lease, error) {
	if err != nil {
		return nil, err
	}
	return lockLease{l}, nil
}

// TestConformanceMutex runs the suite on the exclusive-queue Mutex, each
// client behind a fault proxy that Kill black-holes: crash recovery takes
// the heartbeat bound.
func TestConformanceMutex(t *testing.T) {
	contracttest.RunConformanceTests(t, newHarness(blackHole, false))
}

// TestConformanceSemaphore runs the suite with a one-slot persistent
// semaphore as the Locker; Kill closes the client's socket; Revoke
// destroys the semaphore.
func TestConformanceSemaphore(t *testing.T) {
	contracttest.RunConformanceTests(t, newHarness(closeSocket, true))
}

var _ contracttest.FaultHarness = (*harness)(nil)

// NewFaultyClient makes a client whose connection goes through a fault
// proxy of its own.
func (h *harness) NewFaultyClient(ctx context.Context) (contracttest.Client, contracttest.Link, error) {
	cl, err := h.newClient(ctx, amqpsem.WithCreate(true))
	if err != nil {
		return nil, nil, err
	}
	return cl, cl.proxy, nil
}

// TestFaultSuiteCatchesDefects shows the fault tests failing on the mutex
// broken on purpose: a holder that learns of its loss late, and
// a Lock that outlives its context.
func TestFaultSuiteCatchesDefects(t *testing.T) {
	nh := newHarness(blackHole, false)
	contracttest.RunDefectTests(t, nh)
}

var _ contracttest.ProcessHarness = (*harness)(nil)

// The environment of a holder process the suite starts (PausedHolder):
// the broker's URL, and "semaphore" for a one-slot semaphore as the
// Locker rather than the Mutex.
const (
	childURLEnv  = "AMQPSEM_TEST_URL"
	childModeEnv = "AMQPSEM_TEST_MODE"
)

func TestMain(m *testing.M) { contracttest.Main(m, newChildLocker) }

// ChildEnv lets a holder process reach the broker directly (no proxy: a
// pause is the fault), with the suite's heartbeat and verify interval.
func (h *harness) ChildEnv() []string {
	mode := "mutex"
	if h.semLocker {
		mode = "semaphore"
	}
	return []string{childURLEnv + "=" + h.url, childModeEnv + "=" + mode}
}

// newChildLocker is the Locker of a holder process, as NewClient makes it.
func newChildLocker(ctx context.Context) (locks.Locker, func() error, error) {
	c, err := amqpsem.Dial(ctx, os.Getenv(childURLEnv), append(testOptions(), amqpsem.WithCreate(true))...)
	if err != nil {
		return nil, nil, err
	}
	if os.Getenv(childModeEnv) == "semaphore" {
		s, err := c.Semaphore(1)
		if err != nil {
			return nil, nil, errors.Join(err, c.Close(context.Background()))
		}
		return semLocker{s}, closeFunc(c), nil
	}
	m := c.Locker()
	return m, closeFunc(c), nil
}

// closeFunc returns c's Close as the process harness wants it.
func closeFunc(c *amqpsem.Client) func() error {
	return func() error { return c.Close(context.Background()) }
}
