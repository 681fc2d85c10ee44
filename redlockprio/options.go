package redlockprio

import (
	"math"
	"strings"
	"time"

	"github.com/latchkey-go/latchkey/locks"
	"github.com/latchkey-go/latchkey/locks/driver"
)

// driftConstant is added to TTL·driftFactor to allow for the masters'
// expiry resolution and the Go runtime's timer granularity.
const driftConstant = 2 * time.Millisecond

type options struct {
	ttl         time.Duration
	renew       time.Duration
	drift       float64
	priority    int
	backoff     locks.Backoff
	holderID    string
	prefix      string
	unsafeSteal float64       // < 0: disabled (the safe default)
	callTimeout time.Duration // 0: the default (see callTimeoutFor)
	immediate   bool          // acknowledge a theft when the lease's context ends
	twoMasters  bool          // N = 2 allowed
}

func defaults() options {
	return options{
		ttl:         10 * time.Second,
		drift:       0.01,
		backoff:     locks.DefaultBackoff,
		prefix:      "latchkey:",
		unsafeSteal: -1,
	}
}

// driftFor is the clock drift allowance for a lease of the options' TTL.
func (o *options) driftFor() time.Duration { return o.driftOver(o.ttl) }

// driftOver is the clock drift allowance for a wait of d: d·driftFactor
// plus driftConstant.
func (o *options) driftOver(d time.Duration) time.Duration {
	return time.Duration(float64(d)*o.drift) + driftConstant
}

// minCallTimeout is the shortest per-master call timeout: no round trip
// to a master, even a local one, can be promised in less. A TTL that
// leaves less than this per call ((TTL − drift)/2) is refused.
const minCallTimeout = 5 * time.Millisecond

// The default per-master call timeout is TTL/10, but at least
// minDefaultCallTimeout (a new connection's dial and TLS handshake) as
// long as that is within (TTL − drift)/2, and at most
// maxDefaultCallTimeout.
const (
	minDefaultCallTimeout = 200 * time.Millisecond
	maxDefaultCallTimeout = time.Second
)

// callTimeoutFor is the per-master call timeout: the option's, or the
// default (see minDefaultCallTimeout).
func (o *options) callTimeoutFor() time.Duration {
	if o.callTimeout > 0 {
		return o.callTimeout
	}
	floor := min(minDefaultCallTimeout, (o.ttl-o.driftFor())/2)
	return min(max(o.ttl/10, floor), maxDefaultCallTimeout)
}

// Option configures a [Client]; see [New].
type Option func(*options) error

// WithTTL sets how long each master keeps a key that its holder stopped
// renewing (after a crash, say), and so the longest a dead holder blocks a
// name — unless it took the name from a holder of a longer TTL: its keys
// then keep that holder's remaining PTTL, and a crash blocks the name up
// to that. A lease is valid for the TTL minus the time the acquisition
// took minus the drift allowance ([WithDriftFactor]); it is renewed in the
// background. The default is 10s.
func WithTTL(d time.Duration) Option {
	return func(o *options) error {
		o.ttl = d
		return driver.Positive("TTL", d)
	}
}

// WithRenewInterval sets how often held leases are renewed, all of a
// Client's leases in one batch. It must be at most (TTL − drift)/3, where
// drift is the allowance of [WithDriftFactor]: a renewal round that hangs
// is given up to one interval, and the next round may start one interval
// after the last successful one, so that with a third interval to spare
// a lease whose renewals fail still ends before its validity runs out
// ([New] checks it). The default is (TTL − drift)/3.
func WithRenewInterval(d time.Duration) Option {
	return func(o *options) error {
		o.renew = d
		return driver.Positive("renew interval", d)
	}
}

// WithDriftFactor sets the fraction of the TTL subtracted from each
// lease's validity to allow for clocks that run at different rates on the
// client and the masters (2ms more are always subtracted). It must be in
// [0, 1). The default is 0.01.
func WithDriftFactor(f float64) Option {
	return func(o *options) error {
		o.drift = f
		return driver.Fraction("drift factor", f)
	}
}

// WithPriority sets the priority of the Client's requests: a request takes
// a name from a holder of strictly lower priority, whose lease then ends
// with [locks.ErrPreempted]. Equal priorities never take from each other.
// The priority must be within the range of an int32. The default is 0.
func WithPriority(p int) Option {
	return func(o *options) error {
		o.priority = p
		if p < math.MinInt32 || p > math.MaxInt32 {
			return driver.InvalidOption("priority must be within [%d, %d], got %d", math.MinInt32, math.MaxInt32, p)
		}
		return nil
	}
}

// WithBackoff sets the polling schedule of a waiting Acquire, the
// fallback when no release notification wakes it (a holder that expired).
// A waiting Lock does not poll on it: it waits in the name's queue, and
// tries again when woken, when its entry's refresh (every TTL/2) finds it
// the head of a free name, when the holder's keys would have expired, or,
// next in line, when the head's entry would have expired. The default is [locks.DefaultBackoff].
func WithBackoff(b locks.Backoff) Option {
	return func(o *options) error {
		o.backoff = b
		return b.Check()
	}
}

// WithHolderID sets the readable part of the Client's holder identity, as
// reported in [locks.HeldError.Holder] and stored at the masters (a host
// name and process id, say). Each lease still gets its own id (this one,
// a random part drawn per Client and a counter), so that two leases never
// pass for one another. The id must pass [driver.CheckHolderID], the one
// rule of every latchkey backend: 1 to 200 bytes of printable UTF-8,
// without '|', '{' or '}'. The default is a random id.
func WithHolderID(id string) Option {
	return func(o *options) error {
		o.holderID = id
		return driver.CheckHolderID(id)
	}
}

// WithKeyPrefix sets the prefix of every key and channel name the Client
// uses at the masters. Clients that should contend must use the same
// prefix. It must not contain '{', '}' (hash tags) nor '|' (which
// separates the fields of theft notices). The default is "latchkey:".
func WithKeyPrefix(p string) Option {
	return func(o *options) error {
		o.prefix = p
		if strings.ContainsAny(p, "{}|") || strings.IndexFunc(p, isControl) >= 0 {
			return driver.InvalidOption("key prefix must not contain '{', '}', '|' or control characters, got %q", p)
		}
		return nil
	}
}

// WithUnsafeStolenConsistencyFactor is the spec's "stolenConsistencyFactor",
// kept as an explicit opt-in because it is UNSAFE: a thief that displaced a
// holder stops waiting for the victim's acknowledgement after f·TTL
// (0 ≤ f ≤ 1; 0 means it does not wait at all) instead of waiting until
// the victim's remaining validity has provably run out. With it, a victim
// that is alive but did not hear of the theft (a partition, a paused
// process) may still be in its critical section when the thief's Lock
// returns: mutual exclusion then rests on fencing tokens alone. The
// default is off: a thief waits for the acknowledgement or the victim's
// validity, whichever comes first.
func WithUnsafeStolenConsistencyFactor(f float64) Option {
	return func(o *options) error {
		o.unsafeSteal = f
		if !(f >= 0 && f <= 1) {
			return driver.InvalidOption("stolen consistency factor must be in [0, 1], got %v", f)
		}
		return nil
	}
}

// WithCallTimeout sets how long a step waits for one master's answer:
// a master that has not answered by then (paused, partitioned, slow)
// counts as failed for that step, which is then decided by the others,
// so that a hung minority delays a step by at most this much. It must be
// at most (TTL − drift)/2, so that a step that waits that long still
// leaves the lease half its validity ([New] checks it), and at least
// 5ms. The default is TTL/10, but at least 200ms (or (TTL − drift)/2 if
// that is less: room for a new connection's dial and TLS handshake) and
// at most 1s: 1s for the default TTL of 10s, 200ms for TTLs from 400ms
// to 2s. A TTL that leaves less than 5ms per call (under about 12ms) is
// refused.
func WithCallTimeout(d time.Duration) Option {
	return func(o *options) error {
		o.callTimeout = d
		return driver.Positive("call timeout", d)
	}
}

// WithImmediateAck makes the Client's leases acknowledge a theft as soon
// as their context ends with [locks.ErrPreempted], rather than when the
// lease's holder lets go of it (calls Release, or [locks.Do] returns) or
// its validity runs out. It is UNSAFE unless every holder stops using a
// lease the moment its context ends: work that is under way and cannot
// be interrupted (a write already sent, a step that does not check its
// context) then overlaps the thief's. Fencing tokens still let a
// resource refuse the stale holder's writes: the thief's token is
// greater. The default is off: the acknowledgement waits for Release.
func WithImmediateAck() Option {
	return func(o *options) error {
		o.immediate = true
		return nil
	}
}

// WithTwoMasters allows [New] to take two masters. Their quorum is both
// (2/2+1 = 2), so two masters tolerate no failure at all, no more than
// one, and cost twice the round trips: [New] refuses them without this
// option. The default is to refuse two masters.
func WithTwoMasters() Option {
	return func(o *options) error {
		o.twoMasters = true
		return nil
	}
}

func isControl(r rune) bool { return r < 0x20 || r == 0x7f }
