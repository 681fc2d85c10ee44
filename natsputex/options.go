package natsputex

import (
	"context"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/latchkey-go/latchkey/locks"
)

// State tells a health check which role its agent is in.
type State int

const (
	// Standby: the agent does not hold the key. A health check told
	// Standby says whether it believes the service could run here after the
	// confirmation cycles, before the agent takes the key over.
	Standby State = iota
	// Active: the agent holds the key (its service runs, or is about to).
	// A health check told Active should check the service more thoroughly.
	Active
)

// String returns "standby" or "active", as putex names the states.
func (s State) String() string {
	if s == Active {
		return "active"
	}
	return "standby"
}

// HealthCheck reports whether the agent may hold (Active) or take (Standby)
// the key. A non-nil error fails the check. ctx ends after T = F·R at the
// latest: a check that hangs past it fails.
type HealthCheck func(ctx context.Context, s State) error

type options struct {
	renew    time.Duration // R
	failures int           // F
	confirm  int           // C
	margin   time.Duration // 0 means R/2
	health   HealthCheck
	holderID string
	backoff  locks.Backoff
	replicas int
	storage  jetstream.StorageType
}

func defaults() options {
	return options{
		renew:    time.Second,
		failures: 3,
		confirm:  1,
		backoff:  locks.DefaultBackoff,
		replicas: 1,
		storage:  jetstream.FileStorage,
	}
}

// ttl returns T = F·R, the silence after which a holder is presumed dead.
func (o *options) ttl() time.Duration { return time.Duration(o.failures) * o.renew }

// validity returns how long after the start of its last successful write a
// holder still trusts its hold, and whether that is a safety bound: T
// minus the safety margin, when that leaves room for the next renewal
// (more than R). With F = 1 it does not: the holder then trusts its hold
// for 1.5·R (a liveness backstop only) and stops early only when a write
// fails.
func (o *options) validity() (time.Duration, bool) {
	if v := o.ttl() - o.margin; v > o.renew {
		return v, true
	}
	return o.renew + o.renew/2, false
}

// Option configures a [Client]. Options are checked by [New] before any
// I/O; a value out of range gives an error matching
// [locks.ErrInvalidOption].
type Option func(*options) error

// WithRenewInterval sets R, the lock renewal interval: how often a holder
// runs its health check and rewrites its token to assert it is alive. The
// default is 1s.
func WithRenewInterval(d time.Duration) Option {
	return func(o *options) error {
		o.renew = d
		return locks.Positive("renew interval R", d)
	}
}

// WithFailureThreshold sets F, the number of renewal intervals without any
// write to a key after which a waiter may take the key over: T = F·R is
// the lock timeout. It is also the longest a health check may take. F
// must be at least 1; with F = 1 a holder cut off from NATS only stops at
// its next failed write, so use F >= 2 (see the package doc). The default
// is 3.
func WithFailureThreshold(f int) Option {
	return func(o *options) error {
		o.failures = f
		if f < 1 {
			return locks.InvalidOption("failure threshold F must be >= 1, got %d", f)
		}
		return nil
	}
}

// WithConfirmations sets C, the number of renewal intervals a client that
// took a key over from another holder waits, rewriting its token each
// interval, before it reports the key held. A key that was free (missing
// or blank) is held at once. C must be >= 0. The default is 1.
func WithConfirmations(c int) Option {
	return func(o *options) error {
		o.confirm = c
		if c < 0 {
			return locks.InvalidOption("confirmation count C must be >= 0, got %d", c)
		}
		return nil
	}
}

// WithSafetyMargin sets how long before T a holder that could not renew
// gives its lease up by itself: a lease ends at the start of its last
// successful write plus T minus the margin, so a holder cut off from NATS
// stops before any waiter may take over. It must be > 0 and, for the bound
// to apply, less than T − R (otherwise, as with F = 1, the holder stops
// only when a write fails). The default is R/2.
func WithSafetyMargin(d time.Duration) Option {
	return func(o *options) error {
		o.margin = d
		return locks.Positive("safety margin", d)
	}
}

// WithHealthCheck sets a check run before every renewal (told [Active]; a
// failure ends the lease at once and clears the key) and before taking a
// key over from another holder (told [Standby]; a failure keeps waiting).
// Its context ends after T. The default is no check.
func WithHealthCheck(hc HealthCheck) Option {
	return func(o *options) error {
		o.health = hc
		return nil
	}
}

// WithHolderID sets the identity written, with a random suffix per lease,
// as the value of every key the client holds. It must be non-empty and
// printable. The default is the host name and process id.
func WithHolderID(id string) Option {
	return func(o *options) error {
		o.holderID = id
		if err := (locks.NameRule{What: "holder id", MaxLen: 200}).Check(id); err != nil {
			return locks.InvalidOption("holder id: %v", err)
		}
		return nil
	}
}

// WithBackoff sets the fallback polling schedule of a waiting Lock or
// Acquire, used when no watch notification wakes it. The default is
// [locks.DefaultBackoff].
func WithBackoff(b locks.Backoff) Option {
	return func(o *options) error {
		o.backoff = b
		return b.Check()
	}
}

// WithReplicas sets the number of replicas of the bucket when [New]
// creates it (1 to 5; use 3 on a cluster). An existing bucket is used as it
// is. The default is 1.
func WithReplicas(n int) Option {
	return func(o *options) error {
		o.replicas = n
		if n < 1 || n > 5 {
			return locks.InvalidOption("replicas must be in 1..5, got %d", n)
		}
		return nil
	}
}

// WithStorage sets the storage of the bucket when [New] creates it:
// [jetstream.FileStorage] or [jetstream.MemoryStorage]. The default is
// file storage.
func WithStorage(s jetstream.StorageType) Option {
	return func(o *options) error {
		o.storage = s
		if s != jetstream.FileStorage && s != jetstream.MemoryStorage {
			return locks.InvalidOption("storage must be file or memory, got %v", s)
		}
		return nil
	}
}
