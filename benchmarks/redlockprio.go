package benchmarks

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/latchkey-go/latchkey/locks"
	"github.com/latchkey-go/latchkey/redlockprio"
	"github.com/redis/go-redis/v9"
)

// redlockprioSystem is redlockprio on N masters, one Locker per client,
// with the benchmark TTL (renewed every third of it, in one batch per
// master per tick).
type redlockprioSystem struct {
	redisTTL

	proxyMu sync.Mutex
	proxy   *hangProxy // in front of the first master, for HungMinority
}

var (
	_ PrioritySystem = (*redlockprioSystem)(nil)
	_ HangSystem     = (*redlockprioSystem)(nil)
)

func newRedlockprio(masters int) func(context.Context, Env) (System, error) {
	return func(_ context.Context, env Env) (System, error) {
		b, err := newRedisBase(env, masters)
		if err != nil {
			return nil, err
		}
		return &redlockprioSystem{redisTTL: redisTTL{b}}, nil
	}
}

func (s *redlockprioSystem) NewClient(ctx context.Context) (Client, error) {
	return s.newClient(ctx, s.addrs)
}

// NewPriorityClient is a client whose Locker has the given priority
// ([redlockprio.WithPriority]).
func (s *redlockprioSystem) NewPriorityClient(ctx context.Context, priority int) (Client, error) {
	return s.newClient(ctx, s.addrs, redlockprio.WithPriority(priority))
}

// NewHangableClient is a client that reaches the first master through
// the system's hang proxy (see Hang); N must be at least 3, so that the
// others still make a quorum.
func (s *redlockprioSystem) NewHangableClient(ctx context.Context) (Client, error) {
	if len(s.addrs) < 3 {
		return nil, notApplicable("needs 3 masters or more to hang one")
	}
	s.proxyMu.Lock()
	if s.proxy == nil {
		p, err := newHangProxy(s.addrs[0])
		if err != nil {
			s.proxyMu.Unlock()
			return nil, err
		}
		s.proxy = p
	}
	addrs := append([]string{s.proxy.Addr()}, s.addrs[1:]...)
	s.proxyMu.Unlock()
	return s.newClient(ctx, addrs)
}

// Hang hangs (or resumes) the first master for the clients made by
// NewHangableClient.
func (s *redlockprioSystem) Hang(hung bool) {
	s.proxyMu.Lock()
	defer s.proxyMu.Unlock()
	if s.proxy != nil {
		s.proxy.Hang(hung)
	}
}

func (s *redlockprioSystem) Close() error {
	s.proxyMu.Lock()
	defer s.proxyMu.Unlock()
	if s.proxy != nil {
		err := s.proxy.Close()
		s.proxy = nil
		return err
	}
	return nil
}

func (s *redlockprioSystem) newClient(ctx context.Context, addrs []string, opts ...redlockprio.Option) (Client, error) {
	cs, err := s.dialAddrs(ctx, addrs)
	if err != nil {
		return nil, err
	}
	rc, err := redlockprio.New(cs, append([]redlockprio.Option{redlockprio.WithTTL(s.ttl)}, opts...)...)
	if err != nil {
		_ = closeRedis(cs)
		return nil, err
	}
	return &redlockprioClient{Locker: leaseLocker{rc.Locker()}, rc: rc, cs: cs}, nil
}

type redlockprioClient struct {
	Locker
	rc *redlockprio.Client
	cs []*redis.Client
}

// LocksLocker returns the backend's own Locker.
func (c *redlockprioClient) LocksLocker() locks.Locker { return c.rc.Locker() }

// LocksSemaphore returns the backend's own Semaphore of size slots.
func (c *redlockprioClient) LocksSemaphore(size int) (locks.Semaphore, error) {
	s, err := c.rc.Semaphore(size)
	if err != nil {
		return nil, err // not a nil *Semaphore in a non-nil interface
	}
	return s, nil
}

func (c *redlockprioClient) Semaphore(_ context.Context, size int) (Locker, error) {
	s, err := c.LocksSemaphore(size)
	if err != nil {
		return nil, err
	}
	return semLocker{s}, nil
}

func (c *redlockprioClient) Close() error {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second) // the bound Close had inside before
	defer cancel()
	return errors.Join(c.rc.Close(ctx), closeRedis(c.cs))
}

// dialAddrs is redisBase.dial on addrs (a proxy in place of a master):
// one go-redis client per address, counting round trips.
func (s *redlockprioSystem) dialAddrs(ctx context.Context, addrs []string) ([]*redis.Client, error) {
	cs := make([]*redis.Client, 0, len(addrs))
	for _, a := range addrs {
		c := redis.NewClient(&redis.Options{Addr: a, PoolSize: 16, MinIdleConns: 1, MaxRetries: -1, ContextTimeoutEnabled: true})
		c.AddHook(countHook{&s.rt})
		if err := c.Ping(ctx).Err(); err != nil {
			_ = c.Close()
			_ = closeRedis(cs)
			return nil, fmt.Errorf("redis %s: %w", a, err)
		}
		cs = append(cs, c)
	}
	s.rt.Add(^uint64(len(cs) - 1)) // the PINGs are not the system's
	return cs, nil
}
