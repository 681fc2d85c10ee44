package benchmarks

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/latchkey-go/latchkey/locks"
)

// Held is one held lock or semaphore slot, as the scenarios see it. A
// [locks.Lease] is a Held; peers and floors are wrapped to be one.
type Held interface {
	// Release frees the lock at the broker.
	Release(ctx context.Context) error
}

// Locker acquires names. Lock blocks until it holds name or ctx ends; when
// ctx ends first it returns an error matching ctx.Err() and holds nothing.
// A Locker is safe for concurrent use.
type Locker interface {
	Lock(ctx context.Context, name string) (Held, error)
}

// Client is one process's connection to a system: what a Client holds is
// held against every other Client of the same system.
type Client interface {
	Locker
	// Close releases what the client holds and closes its connections.
	Close() error
}

// SemaphoreClient is an optional interface that may be implemented by a
// [Client] whose system has semaphores: Semaphore returns a Locker whose
// Lock acquires one of size slots of a name. Only such systems run the
// semaphore scenario.
type SemaphoreClient interface {
	Client
	Semaphore(ctx context.Context, size int) (Locker, error)
}

// Renewer is an optional interface that may be implemented by a [Held] from
// a system that does not renew its leases by itself (the peers): Renew
// extends the lease by one TTL. The many scenario calls it once per
// [Renewing.RenewInterval] for every lease, as users of such a library must.
type Renewer interface {
	Renew(ctx context.Context) error
}

// System is one lock implementation on its brokers: a backend, a peer
// library or a raw floor.
type System interface {
	// NewClient returns a client on new connections: two clients behave
	// like two processes.
	NewClient(ctx context.Context) (Client, error)
	// Close frees what the system made (not the brokers).
	Close() error
}

// Renewing is an optional interface that may be implemented by a [System]
// whose leases expire unless renewed. Only such systems run the many
// scenario.
type Renewing interface {
	System
	// RenewInterval is how often a lease is renewed: by the backend itself,
	// or by the many scenario through [Renewer].
	RenewInterval() time.Duration
	// Masters is how many independent brokers a lease lives on.
	Masters() int
	// RoundTrips returns how many requests the system's clients have sent
	// to the brokers so far, summed over masters (a pipeline counts once).
	RoundTrips() uint64
}

// Broker is a kind of broker a system needs.
type Broker int

// The brokers systems need.
const (
	NATS        Broker = iota + 1 // a single NATS server with JetStream
	NATSCluster                   // a 3-node NATS JetStream cluster
	Redis                         // independent Redis masters
	AMQP                          // a RabbitMQ broker
)

func (b Broker) String() string {
	switch b {
	case NATS:
		return "NATS"
	case NATSCluster:
		return "NATS cluster"
	case Redis:
		return "Redis"
	case AMQP:
		return "RabbitMQ"
	}
	return "no broker"
}

// DefaultTTL is the lease TTL systems are made with unless [Env.TTL] says
// otherwise.
const DefaultTTL = 3 * time.Second

// Env says where the brokers are. A system needing a broker whose field is
// empty fails to build with an error matching [ErrUnavailable].
type Env struct {
	NATS        string   // client URL of a single NATS server with JetStream
	NATSCluster string   // client URLs, comma-separated, of a 3-node JetStream cluster
	Redis       []string // addresses of independent Redis masters; a system on N masters uses the first N
	AMQP        string   // URL of a RabbitMQ broker

	// TTL is the lease TTL of the systems with TTLs; leases are renewed
	// every TTL/3. The default is [DefaultTTL].
	TTL time.Duration

	// Join, when not empty, builds the system in a worker process of the
	// waiters scenario: on what the parent's system made (a bucket, named
	// by Join), making and deleting nothing. The parent sets it.
	Join string
}

// ErrUnavailable reports that a system cannot be built: its broker is
// missing, or it is not wired into this version of the benchmarks.
var ErrUnavailable = errors.New("benchmarks: system unavailable")

// ErrNotApplicable reports that a scenario does not apply to a system (a
// semaphore scenario on a system without semaphores, say); its message says
// why.
var ErrNotApplicable = errors.New("not applicable")

func notApplicable(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrNotApplicable, fmt.Sprintf(format, args...))
}

func (e Env) ttl() time.Duration {
	if e.TTL > 0 {
		return e.TTL
	}
	return DefaultTTL
}

// need reports an error matching ErrUnavailable unless e provides b, with
// at least masters Redis masters for Redis.
func (e Env) need(b Broker, masters int) error {
	missing := false
	switch b {
	case NATS:
		missing = e.NATS == ""
	case NATSCluster:
		missing = e.NATSCluster == ""
	case Redis:
		if len(e.Redis) < masters {
			return fmt.Errorf("%w: needs %d Redis masters, have %d", ErrUnavailable, masters, len(e.Redis))
		}
	case AMQP:
		missing = e.AMQP == ""
	}
	if missing {
		return fmt.Errorf("%w: needs %s", ErrUnavailable, b)
	}
	return nil
}

// leaseLocker adapts a locks.Locker.
type leaseLocker struct{ l locks.Locker }

func (a leaseLocker) Lock(ctx context.Context, name string) (Held, error) {
	return a.l.Lock(ctx, name)
}

// semLocker adapts a locks.Semaphore.
type semLocker struct{ s locks.Semaphore }

func (a semLocker) Lock(ctx context.Context, name string) (Held, error) {
	return a.s.Acquire(ctx, name)
}
