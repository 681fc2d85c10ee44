package benchmarks

import (
	"context"
	"errors"
	"fmt"

	"github.com/latchkey-go/latchkey/redlockprio"
	"github.com/redis/go-redis/v9"
)

// redlockprioSystem is redlockprio on N masters, one Locker per client,
// with the benchmark TTL (renewed every third of it, in one batch per
// master per tick).
type redlockprioSystem struct{ redisTTL }

func newRedlockprio(masters int) func(context.Context, Env) (System, error) {
	return func(_ context.Context, env Env) (System, error) {
		b, err := newRedisBase(env, masters)
		if err != nil {
			return nil, err
		}
		return &redlockprioSystem{redisTTL{b}}, nil
	}
}

func (s *redlockprioSystem) NewClient(ctx context.Context) (Client, error) {
	cs, err := s.dial(ctx)
	if err != nil {
		return nil, err
	}
	ms := make([]redis.UniversalClient, len(cs))
	for i, c := range cs {
		ms[i] = c
	}
	l, err := redlockprio.New(ms, redlockprio.WithTTL(s.ttl))
	if err != nil {
		_ = closeRedis(cs)
		return nil, err
	}
	return &redlockprioClient{Locker: leaseLocker{l}, l: l, cs: cs}, nil
}

type redlockprioClient struct {
	Locker
	l  *redlockprio.Locker
	cs []*redis.Client
}

func (c *redlockprioClient) Semaphore(_ context.Context, size int) (Locker, error) {
	s, err := c.l.Semaphore(size)
	if err != nil {
		return nil, fmt.Errorf("redlockprio: semaphore: %w", err)
	}
	return semLocker{s}, nil
}

func (c *redlockprioClient) Close() error {
	return errors.Join(c.l.Close(), closeRedis(c.cs))
}
