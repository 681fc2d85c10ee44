package tests

import (
	"context"
	"testing"
	"time"

	"github.com/latchkey-go/latchkey/contracttest"
	"github.com/latchkey-go/latchkey/locks"
	"github.com/latchkey-go/latchkey/locks/memlock"
)

// memHarness is the suite's harness on memlock: the lock side of the
// fencing checks, so that they exercise the guards alone.
type memHarness struct {
	store *memlock.Store
	ttl   time.Duration
}

type memClient struct{ c *memlock.Client }

func (c memClient) Locker() locks.Locker { return c.c.Locker() }
func (c memClient) Semaphore(_ context.Context, size int) (locks.Semaphore, error) {
	return c.c.Semaphore(size)
}
func (c memClient) Close(ctx context.Context) error { return c.c.Close(ctx) }

func newMemHarness(context.Context, testing.TB) (contracttest.Harness, error) {
	// Renewed every tenth of its TTL: a loaded machine's stalls of up to
	// nine tenths do not end a lease.
	return &memHarness{store: memlock.New(), ttl: 600 * time.Millisecond}, nil
}

func (h *memHarness) NewClient(context.Context) (contracttest.Client, error) {
	c, err := h.store.NewClient(memlock.WithTTL(h.ttl), memlock.WithRenewInterval(h.ttl/10))
	if err != nil {
		return nil, err
	}
	return memClient{c}, nil
}

func (h *memHarness) Kill(_ context.Context, c contracttest.Client) error {
	return c.(memClient).c.Kill()
}

func (h *memHarness) Capabilities() contracttest.Capabilities {
	return contracttest.Capabilities{
		Fencing:       true,
		Semaphore:     true,
		CrashRecovery: h.ttl,
		LossDetection: 50 * time.Millisecond,
	}
}

func (h *memHarness) Close() error { return nil }
