package benchmarks

import (
	"context"

	"github.com/latchkey-go/latchkey/locks/memlock"
)

// memSystem is memlock: one in-memory Store, a client per "process". It is
// the ceiling every broker-backed system is measured against: no network.
type memSystem struct {
	store *memlock.Store
	opts  []memlock.Option
}

func newMemlock(_ context.Context, env Env) (System, error) {
	return &memSystem{store: memlock.New(), opts: []memlock.Option{memlock.WithTTL(env.ttl())}}, nil
}

func (s *memSystem) NewClient(context.Context) (Client, error) {
	c, err := s.store.NewClient(s.opts...)
	if err != nil {
		return nil, err
	}
	return &memClient{c: c, Locker: leaseLocker{c.Locker()}}, nil
}

func (s *memSystem) Close() error { return nil }

// inProcessOnly: the store lives in this process.
func (s *memSystem) inProcessOnly() {}

type memClient struct {
	Locker
	c *memlock.Client
}

func (c *memClient) Semaphore(_ context.Context, size int) (Locker, error) {
	s, err := c.c.Semaphore(size)
	if err != nil {
		return nil, err
	}
	return semLocker{s}, nil
}

func (c *memClient) Close() error { return c.c.Close(context.Background()) }
