package contracttest

import (
	"context"
	"testing"
	"time"

	"github.com/latchkey-go/latchkey/locks"
	"github.com/latchkey-go/latchkey/locks/memlock"
)

// memHarness runs the suite on memlock. Its TTL is short so that crash
// recovery is fast.
type memHarness struct {
	store *memlock.Store
	ttl   time.Duration
	// breakClient, when set, turns each client's Locker or Semaphore into a
	// broken one, for the suite's self-tests.
	breakClient func(h *memHarness, c *memClient)
	caps        Capabilities
	optionErrs  []error // when set, what InvalidOptions reports instead
}

type memClient struct {
	c         *memlock.Client
	locker    locks.Locker
	semaphore func(size int) (locks.Semaphore, error)
	close     func() error // when set, what Close does instead
}

func (c *memClient) Locker() locks.Locker { return c.locker }
func (c *memClient) Semaphore(_ context.Context, size int) (locks.Semaphore, error) {
	return c.semaphore(size)
}
func (c *memClient) Close(ctx context.Context) error {
	if c.close != nil {
		return c.close()
	}
	return c.c.Close(ctx)
}

func newMemHarness(ctx context.Context, t testing.TB) (Harness, error) {
	const ttl = 300 * time.Millisecond
	return &memHarness{store: memlock.New(), ttl: ttl, caps: Capabilities{
		MaxSemaphoreSize: memlock.MaxSemaphoreSize,
		Fencing:          true,
		Semaphore:        true,
		CrashRecovery:    ttl,
		LossDetection:    50 * time.Millisecond, // memlock ends a killed client's leases at once
		InvalidNames:     []string{"bad\x00name", string([]byte{0xff})},
	}}, nil
}

func (h *memHarness) newClient(opts ...memlock.Option) (Client, error) {
	c, err := h.store.NewClient(append([]memlock.Option{memlock.WithTTL(h.ttl)}, opts...)...)
	if err != nil {
		return nil, err
	}
	mc := &memClient{c: c, locker: c.Locker(), semaphore: func(n int) (locks.Semaphore, error) { return c.Semaphore(n) }}
	if h.breakClient != nil {
		h.breakClient(h, mc)
	}
	return mc, nil
}

func (h *memHarness) NewClient(context.Context) (Client, error) { return h.newClient() }
func (h *memHarness) NewPriorityClient(_ context.Context, p int) (Client, error) {
	return h.newClient(memlock.WithPriority(p))
}
func (h *memHarness) Kill(_ context.Context, c Client) error { return c.(*memClient).c.Kill() }
func (h *memHarness) Capabilities() Capabilities             { return h.caps }
func (h *memHarness) Close() error                           { return nil }
func (h *memHarness) Revoke(_ context.Context, name string) error {
	h.store.Revoke(name)
	return nil
}
func (h *memHarness) InvalidOptions(context.Context) []error {
	if h.optionErrs != nil {
		return h.optionErrs
	}
	var errs []error
	for _, opt := range []memlock.Option{
		memlock.WithTTL(0), memlock.WithTTL(-time.Second), memlock.WithRenewInterval(0),
		memlock.WithBackoff(locks.Backoff{Min: time.Second, Max: time.Millisecond}),
	} {
		_, err := h.store.NewClient(opt)
		errs = append(errs, err)
	}
	_, err := h.store.NewClient(memlock.WithTTL(time.Second), memlock.WithRenewInterval(2*time.Second))
	errs = append(errs, err)
	c, _ := h.store.NewClient()
	_, err = c.Semaphore(0)
	errs = append(errs, err)
	_ = c.Close(context.Background())
	return errs
}

func TestMemlock(t *testing.T) {
	RunConformanceTests(t, newMemHarness)
}

func BenchmarkMemlock(b *testing.B) {
	RunBenchmarks(b, newMemHarness)
}
