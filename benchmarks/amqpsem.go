package benchmarks

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/latchkey-go/latchkey/amqpsem"
	"github.com/latchkey-go/latchkey/locks"
)

// amqpsemSystem is amqpsem: the exclusive-queue Mutex, or the persistent
// Semaphore. As a lock ("amqpsem/semaphore" in the lock scenarios) the
// Semaphore has one slot. Semaphores are created on first acquire
// (WithCreate) and destroyed when the system is closed, so that no durable
// queue outlives the run. Slots live as long as their connection: there is
// no TTL and no renewal traffic.
type amqpsemSystem struct {
	url       string
	semaphore bool
	joined    bool // in a worker process (see Env.Join)

	mu      sync.Mutex
	created map[string]bool // semaphore names acquired, to destroy
}

func newAmqpsem(semaphore bool) func(context.Context, Env) (System, error) {
	return func(_ context.Context, env Env) (System, error) {
		if err := env.need(AMQP, 0); err != nil {
			return nil, err
		}
		return &amqpsemSystem{url: env.AMQP, semaphore: semaphore, joined: env.Join != "", created: map[string]bool{}}, nil
	}
}

func (s *amqpsemSystem) NewClient(ctx context.Context) (Client, error) {
	c, err := amqpsem.Dial(ctx, s.url, amqpsem.WithCreate(true))
	if err != nil {
		return nil, err
	}
	cl := &amqpsemClient{s: s, c: c}
	if s.semaphore {
		sem, err := c.Semaphore(1)
		if err != nil {
			_ = c.Close(ctx)
			return nil, err
		}
		cl.Locker = s.track(semLocker{sem})
	} else {
		cl.Locker = leaseLocker{c.Locker()}
	}
	return cl, nil
}

// track records the names a semaphore locker acquires.
func (s *amqpsemSystem) track(l Locker) Locker { return trackedLocker{l, s} }

type trackedLocker struct {
	Locker
	s *amqpsemSystem
}

func (t trackedLocker) Lock(ctx context.Context, name string) (Held, error) {
	t.s.mu.Lock()
	t.s.created[name] = true
	t.s.mu.Unlock()
	return t.Locker.Lock(ctx, name)
}

// Close destroys the semaphores the system created.
func (s *amqpsemSystem) amqpConnections() {}

func (s *amqpsemSystem) Close() error {
	if s.joined {
		return nil // the parent's system destroys what the run made
	}
	s.mu.Lock()
	names := s.created
	s.created = map[string]bool{}
	s.mu.Unlock()
	if len(names) == 0 {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c, err := amqpsem.Dial(ctx, s.url)
	if err != nil {
		return err
	}
	defer c.Close(ctx)
	a, err := c.Admin()
	if err != nil {
		return err
	}
	var errs []error
	for name := range names {
		if _, err := a.Destroy(ctx, name); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

type amqpsemClient struct {
	Locker
	s *amqpsemSystem
	c *amqpsem.Client
}

// Semaphore returns a semaphore of size slots, created on first acquire.
// The Mutex system has none: amqpsem/semaphore runs that scenario.
func (c *amqpsemClient) Semaphore(_ context.Context, size int) (Locker, error) {
	if !c.s.semaphore {
		return nil, notApplicable("amqpsem/mutex is a mutex; amqpsem/semaphore runs the semaphore scenario")
	}
	sem, err := c.c.Semaphore(size)
	if err != nil {
		return nil, err
	}
	return c.s.track(semLocker{sem}), nil
}

func (c *amqpsemClient) Close() error { return c.c.Close(context.Background()) }

var _ locks.Locker = (*amqpsem.Locker)(nil)

// amqpsemQuorumSystem is amqpsem's quorum layout ("amqpsem/quorum"): a
// lock or semaphore is a quorum queue of token messages, made on first
// acquire (WithCreate) and destroyed when the system is closed.
type amqpsemQuorumSystem struct {
	url    string
	joined bool // in a worker process (see Env.Join)

	mu      sync.Mutex
	created map[string]bool // names acquired, to destroy
}

func newAmqpsemQuorum(_ context.Context, env Env) (System, error) {
	if err := env.need(AMQP, 0); err != nil {
		return nil, err
	}
	return &amqpsemQuorumSystem{url: env.AMQP, joined: env.Join != "", created: map[string]bool{}}, nil
}

func (s *amqpsemQuorumSystem) record(name string) {
	s.mu.Lock()
	s.created[name] = true
	s.mu.Unlock()
}

func (s *amqpsemQuorumSystem) NewClient(ctx context.Context) (Client, error) {
	c, err := amqpsem.Dial(ctx, s.url, amqpsem.WithCreate(true))
	if err != nil {
		return nil, err
	}
	return &amqpsemQuorumClient{Locker: quorumTracked{leaseLocker{c.Quorum().Locker()}, s}, s: s, c: c}, nil
}

// quorumTracked records the names a locker acquires.
type quorumTracked struct {
	Locker
	s *amqpsemQuorumSystem
}

func (t quorumTracked) Lock(ctx context.Context, name string) (Held, error) {
	t.s.record(name)
	return t.Locker.Lock(ctx, name)
}

// Close destroys the token queues the system made.
func (s *amqpsemQuorumSystem) Close() error {
	if s.joined {
		return nil // the parent's system destroys what the run made
	}
	s.mu.Lock()
	names := s.created
	s.created = map[string]bool{}
	s.mu.Unlock()
	if len(names) == 0 {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c, err := amqpsem.Dial(ctx, s.url)
	if err != nil {
		return err
	}
	defer c.Close(ctx)
	var errs []error
	for name := range names {
		if err := c.Quorum().Destroy(ctx, name); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

type amqpsemQuorumClient struct {
	Locker
	s *amqpsemQuorumSystem
	c *amqpsem.Client
}

// Semaphore returns a quorum semaphore of size tokens, made on first
// acquire.
func (c *amqpsemQuorumClient) Semaphore(_ context.Context, size int) (Locker, error) {
	sem, err := c.c.Quorum().Semaphore(size)
	if err != nil {
		return nil, err
	}
	return quorumTracked{semLocker{sem}, c.s}, nil
}

func (c *amqpsemQuorumClient) Close() error { return c.c.Close(context.Background()) }
