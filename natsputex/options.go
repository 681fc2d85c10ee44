package natsputex

import (
	"context"
	"math"
	"time"
	"unicode"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/latchkey-go/latchkey/locks"
	"github.com/latchkey-go/latchkey/locks/driver"
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

	unsafeServer bool        // WithUnsafeServer
	warn         func(error) // its warning, nil for the standard logger
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
// holder still trusts its hold: T minus the safety margin, always less
// than T, so that a holder cut off from NATS stops before any waiter may
// take over.
func (o *options) validity() time.Duration { return o.ttl() - o.margin }

// validUntil returns when a hold whose last successful write began at
// start stops being trusted: start plus the validity. It is the deadline
// of a Locker's lease and of a Supervisor's hold alike.
func (o *options) validUntil(start time.Time) time.Time { return start.Add(o.validity()) }

// timing returns the client's own T and C·R, as its values carry them.
func (o *options) timing() timing {
	return timing{o.ttl(), time.Duration(o.confirm) * o.renew}
}

// renewEvery returns how often a holder rewrites its token: every R, or
// more often when R would not leave room for a second attempt within the
// validity (F = 1, or a margin close to T).
func (o *options) renewEvery() time.Duration { return min(o.renew, o.validity()/2) }

// minValidity is the shortest validity (T minus the margin) a client
// accepts: no renewal to a broker completes faster.
const minValidity = time.Millisecond

// newOptions applies opts to the defaults and checks what no single
// option can: that F·R and C·R fit in a [time.Duration] and that T minus
// the safety margin leaves a validity of at least [minValidity].
func newOptions(opts []Option) (options, error) {
	o := defaults()
	if err := driver.Apply(&o, opts); err != nil {
		return o, err
	}
	if o.renew > math.MaxInt64/time.Duration(o.failures) {
		return o, driver.InvalidOption("T = F·R overflows: F = %d, R = %v", o.failures, o.renew)
	}
	if o.confirm > 0 && o.renew > math.MaxInt64/time.Duration(o.confirm) {
		return o, driver.InvalidOption("C·R overflows: C = %d, R = %v", o.confirm, o.renew)
	}
	if o.margin == 0 {
		o.margin = max(o.renew/2, time.Nanosecond)
	}
	if o.ttl()-o.margin < minValidity {
		return o, driver.InvalidOption("safety margin %v must be shorter than T = F·R = %v by at least %v", o.margin, o.ttl(), minValidity)
	}
	return o, nil
}

// Option configures a [Client]. Options are checked by [New] before any
// I/O; a value out of range gives an error matching
// [locks.ErrInvalidOption].
type Option func(*options) error

// WithRenewInterval sets R, the lock renewal interval: how often a holder
// runs its health check and rewrites its token to assert it is alive (more
// often when T minus the safety margin is under 2·R, as with F = 1: see
// [WithSafetyMargin]). F·R and C·R must fit in a [time.Duration]. The
// default is 1s.
func WithRenewInterval(d time.Duration) Option {
	return func(o *options) error {
		o.renew = d
		return driver.Positive("renew interval R", d)
	}
}

// WithFailureThreshold sets F, the number of renewal intervals without any
// write to a key after which a waiter may take the key over: T = F·R is
// the lock timeout. It is also the longest a health check may take. F
// must be at least 1; with F = 1 a holder renews every (T − margin)/2
// rather than every R (see [WithSafetyMargin]). The default is 3.
func WithFailureThreshold(f int) Option {
	return func(o *options) error {
		o.failures = f
		if f < 1 {
			return driver.InvalidOption("failure threshold F must be >= 1, got %d", f)
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
			return driver.InvalidOption("confirmation count C must be >= 0, got %d", c)
		}
		return nil
	}
}

// WithSafetyMargin sets how long before T a holder that could not renew
// gives its lease up by itself: a lease ends at the start of its last
// successful write plus T minus the margin, so a holder cut off from NATS
// stops before any waiter may take over. It must be > 0 and shorter than
// T by at least 1ms; when T minus the margin is under 2·R, a holder renews
// every (T − margin)/2 instead of every R. The default is R/2.
func WithSafetyMargin(d time.Duration) Option {
	return func(o *options) error {
		o.margin = d
		return driver.Positive("safety margin", d)
	}
}

// WithHealthCheck sets a check run before every renewal round of the
// client's leases, once for all of them (told [Active]; a failure ends
// every one of them at once, then clears their keys), before every
// renewal of a Supervisor's key, and before taking a key over from
// another holder (told [Standby]; a failure keeps waiting). Its context
// ends after T. The default is no check.
func WithHealthCheck(hc HealthCheck) Option {
	return func(o *options) error {
		o.health = hc
		return nil
	}
}

// printable is the rule for holder ids and Supervisor tokens: printable
// characters ([unicode.IsPrint], which also refuses a newline, the
// separator of a Supervisor's value), not merely no control characters:
// line and paragraph separators, zero-width and bidirectional format
// characters would make the key's value and the logs that show it lie.
func printable(r rune) bool { return unicode.IsPrint(r) }

// WithHolderID sets the identity written, with a random suffix per lease
// and the client's T, as the value of every key the client holds. It is
// checked by [driver.CheckHolderID], every backend's one rule (1 to 200
// bytes, every character printable by [unicode.IsPrint]: no newline,
// line separator or format character; none of '|', '{', '}'), else New
// returns an error matching [locks.ErrInvalidOption]. The default is the
// host name and process id.
func WithHolderID(id string) Option {
	return func(o *options) error {
		o.holderID = id
		return driver.CheckHolderID(id)
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
// creates it (1 to 5; use 3 on a cluster). An existing bucket keeps its
// own (see [New] for what it checks). The default is 1.
func WithReplicas(n int) Option {
	return func(o *options) error {
		o.replicas = n
		if n < 1 || n > 5 {
			return driver.InvalidOption("replicas must be in 1..5, got %d", n)
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
			return driver.InvalidOption("storage must be file or memory, got %v", s)
		}
		return nil
	}
}

// WithUnsafeServer makes [New] accept a replicated bucket (more than one
// replica) on a NATS server older than [MinClusterVersion], which it
// otherwise refuses with an error matching [ErrUnsafeServer]: New calls
// warn with that error instead (or, if warn is nil, writes it with the
// standard logger) and goes on. On such a server two clients can hold one
// lock at once, with no fault at all (nats-server issue #4320): the
// package's promises do not hold, and only fencing tokens, passed to
// every protected resource, limit the damage. The default is to refuse.
func WithUnsafeServer(warn func(err error)) Option {
	return func(o *options) error {
		o.unsafeServer, o.warn = true, warn
		return nil
	}
}
