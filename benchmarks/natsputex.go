package benchmarks

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/latchkey-go/latchkey/locks"
	"github.com/latchkey-go/latchkey/natsputex"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// natsputexSystem is natsputex on one bucket (file storage, the default),
// with R = TTL/3 and the default F = 3, so a lease's timeout T = F·R is
// the benchmark TTL. On the cluster the bucket has 3 replicas.
type natsputexSystem struct {
	natsBase
	bucket string
}

func newNatsputex(replicas int) func(context.Context, Env) (System, error) {
	return func(_ context.Context, env Env) (System, error) {
		b, url := NATS, env.NATS
		if replicas > 1 {
			b, url = NATSCluster, env.NATSCluster
		}
		if err := env.need(b, 0); err != nil {
			return nil, err
		}
		return &natsputexSystem{
			natsBase: natsBase{url: url, ttl: env.ttl(), replicas: replicas, joined: env.Join != ""},
			bucket:   cmp.Or(env.Join, uniqueBucket("lockbench_putex")),
		}, nil
	}
}

func (s *natsputexSystem) NewClient(ctx context.Context) (Client, error) {
	nc, js, err := s.connect()
	if err != nil {
		return nil, err
	}
	c, err := natsputex.New(ctx, js, s.bucket,
		natsputex.WithRenewInterval(s.ttl/3), natsputex.WithReplicas(s.replicas))
	if err != nil {
		nc.Close()
		return nil, err
	}
	return &natsputexClient{Locker: leaseLocker{c.Locker()}, c: c, nc: nc}, nil
}

func (s *natsputexSystem) RenewInterval() time.Duration { return s.ttl / 3 }
func (s *natsputexSystem) Masters() int                 { return 1 }
func (s *natsputexSystem) RoundTrips() uint64           { return s.roundTrips() }

func (s *natsputexSystem) joinKey() string { return s.bucket }

// Close deletes the bucket, unless the system joined another's.
func (s *natsputexSystem) Close() error {
	if s.joined {
		return nil
	}
	nc, js, err := s.connect()
	if err != nil {
		return err
	}
	defer nc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := js.DeleteKeyValue(ctx, s.bucket); err != nil && !errors.Is(err, jetstream.ErrBucketNotFound) {
		return fmt.Errorf("natsputex: delete bucket %s: %w", s.bucket, err)
	}
	return nil
}

type natsputexClient struct {
	Locker
	c  *natsputex.Client
	nc *nats.Conn
}

// LocksLocker returns the backend's own Locker.
func (c *natsputexClient) LocksLocker() locks.Locker { return c.c.Locker() }

// LocksSemaphore returns the backend's own Semaphore of size slots.
func (c *natsputexClient) LocksSemaphore(size int) (locks.Semaphore, error) {
	s, err := c.c.Semaphore(size)
	if err != nil {
		return nil, err // not a nil *Semaphore in a non-nil interface
	}
	return s, nil
}

func (c *natsputexClient) Semaphore(_ context.Context, size int) (Locker, error) {
	s, err := c.LocksSemaphore(size)
	if err != nil {
		return nil, err
	}
	return semLocker{s}, nil
}

func (c *natsputexClient) Close() error {
	err := c.c.Close(context.Background())
	c.nc.Close()
	return err
}
