package memlock

import (
	"time"

	"github.com/latchkey-go/latchkey/locks"
	"github.com/latchkey-go/latchkey/locks/driver"
)

type options struct {
	ttl      time.Duration
	renew    time.Duration
	priority int
	backoff  locks.Backoff
}

func defaults() options {
	return options{ttl: 10 * time.Second, backoff: locks.DefaultBackoff}
}

// Option configures a [Client].
type Option func(*options) error

// WithTTL sets how long the Store keeps a lease its holder stopped renewing
// (after [Client.Kill], say). The default is 10s.
func WithTTL(d time.Duration) Option {
	return func(o *options) error {
		o.ttl = d
		return driver.Positive("TTL", d)
	}
}

// WithRenewInterval sets how often leases are renewed; it must be shorter
// than the TTL. The default is a third of the TTL.
func WithRenewInterval(d time.Duration) Option {
	return func(o *options) error {
		o.renew = d
		return driver.Positive("renew interval", d)
	}
}

// WithPriority sets the priority of the client's requests: a request takes
// a name at once from a holder of strictly lower priority, whose lease ends
// with [locks.ErrPreempted]. Equal priorities never take from each other.
// The default is 0.
func WithPriority(p int) Option {
	return func(o *options) error {
		o.priority = p
		return nil
	}
}

// WithBackoff sets the polling schedule of a waiting Lock or Acquire, the
// fallback when no release wakes it (a holder that expired). The default
// is [locks.DefaultBackoff].
func WithBackoff(b locks.Backoff) Option {
	return func(o *options) error {
		o.backoff = b
		return b.Check()
	}
}
