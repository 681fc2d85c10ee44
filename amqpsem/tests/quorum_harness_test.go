package amqpsem_test

import (
	"context"
	"errors"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/latchkey-go/latchkey/contracttest"
	"github.com/latchkey-go/latchkey/locks"

	"github.com/latchkey-go/latchkey/amqpsem"
)

// quorumHarness runs the conformance suite on the quorum layout: Kill
// closes the client's sockets (the broker returns its tokens at once);
// Revoke destroys the token queue.
type quorumHarness struct {
	t   testing.TB
	url string

	mu    sync.Mutex
	names map[string]bool // token queues to destroy at Close
}

func newQuorumHarness(ctx context.Context, t testing.TB) (contracttest.Harness, error) {
	raw, _ := amqpURL(t)
	return &quorumHarness{t: t, url: raw, names: map[string]bool{}}, nil
}

func (h *quorumHarness) record(name string) {
	h.mu.Lock()
	h.names[name] = true
	h.mu.Unlock()
}

type quorumClient struct {
	h     *quorumHarness
	c     *amqpsem.Client
	mu    sync.Mutex
	conns []net.Conn
}

func (h *quorumHarness) NewClient(ctx context.Context) (contracttest.Client, error) {
	return h.newClient(ctx)
}

func (h *quorumHarness) newClient(ctx context.Context) (*quorumClient, error) {
	cl := &quorumClient{h: h}
	dial := func(ctx context.Context, network, addr string) (net.Conn, error) {
		var d net.Dialer
		conn, err := d.DialContext(ctx, network, addr)
		if err == nil {
			cl.mu.Lock()
			cl.conns = append(cl.conns, conn)
			cl.mu.Unlock()
		}
		return conn, err
	}
	c, err := amqpsem.Dial(ctx, h.url, append(testOptions(), amqpsem.WithDial(dial), amqpsem.WithCreate(true))...)
	if err != nil {
		return nil, err
	}
	cl.c = c
	return cl, nil
}

func (cl *quorumClient) Locker() locks.Locker { return recQuorumLocker{cl.c.Quorum().Locker(), cl.h} }

func (cl *quorumClient) Semaphore(ctx context.Context, size int) (locks.Semaphore, error) {
	s, err := cl.c.Quorum().Semaphore(size)
	if err != nil {
		return nil, err
	}
	return recQuorumSem{s, cl.h}, nil
}

func (cl *quorumClient) Close(ctx context.Context) error { return cl.c.Close(ctx) }

func (h *quorumHarness) Kill(ctx context.Context, c contracttest.Client) error {
	cl := c.(*quorumClient)
	cl.mu.Lock()
	defer cl.mu.Unlock()
	for _, conn := range cl.conns {
		if tc, ok := conn.(*net.TCPConn); ok {
			_ = tc.SetLinger(0)
		}
		_ = conn.Close()
	}
	return nil
}

func (h *quorumHarness) Capabilities() contracttest.Capabilities {
	return contracttest.Capabilities{
		MaxSemaphoreSize: amqpsem.MaxSemaphoreSize,
		Fencing:          true,
		Semaphore:        true,
		InvalidNames:     []string{strings.Repeat("x", 254), "amq.reserved", "bad\x00name", string([]byte{0xff})},
		// A closed socket: the broker returns the token at once.
		CrashRecovery: time.Second,
		PauseRecovery: 3*testHeartbeat + 500*time.Millisecond,
		// A deleted queue is seen at the next verification.
		LossDetection: testVerify + testHeartbeat,
		CancelGrace:   testHeartbeat,
		CloseBound:    2 * testHeartbeat,
	}
}

func (h *quorumHarness) Close() error {
	h.mu.Lock()
	names := h.names
	h.names = map[string]bool{}
	h.mu.Unlock()
	if len(names) == 0 {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := amqpsem.Dial(ctx, h.url, amqpsem.WithHeartbeat(testHeartbeat))
	if err != nil {
		return err
	}
	defer c.Close(context.Background())
	var errs []error
	for name := range names {
		if err := c.Quorum().Destroy(ctx, name); err != nil && !errors.Is(err, locks.ErrInvalidName) {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// Revoke destroys name's token queue, as an administrator would.
func (h *quorumHarness) Revoke(ctx context.Context, name string) error {
	c, err := amqpsem.Dial(ctx, h.url, amqpsem.WithHeartbeat(testHeartbeat))
	if err != nil {
		return err
	}
	defer c.Close(context.Background())
	return c.Quorum().Destroy(ctx, name)
}

// recQuorumLocker and recQuorumSem record the names they are used on,
// for cleanup.
type recQuorumLocker struct {
	l *amqpsem.QuorumLocker
	h *quorumHarness
}

func (r recQuorumLocker) Lock(ctx context.Context, name string) (locks.Lease, error) {
	r.h.record(name)
	return r.l.Lock(ctx, name)
}

func (r recQuorumLocker) TryLock(ctx context.Context, name string) (locks.Lease, error) {
	r.h.record(name)
	return r.l.TryLock(ctx, name)
}

type recQuorumSem struct {
	s *amqpsem.QuorumSemaphore
	h *quorumHarness
}

func (r recQuorumSem) Acquire(ctx context.Context, name string) (locks.Lease, error) {
	r.h.record(name)
	return r.s.Acquire(ctx, name)
}

func (r recQuorumSem) TryAcquire(ctx context.Context, name string) (locks.Lease, error) {
	r.h.record(name)
	return r.s.TryAcquire(ctx, name)
}

// TestConformanceQuorum runs the suite on the quorum layout, with
// fencing tokens from the broker's delivery count.
func TestConformanceQuorum(t *testing.T) {
	contracttest.RunConformanceTests(t, newQuorumHarness)
}
