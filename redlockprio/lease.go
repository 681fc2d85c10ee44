package redlockprio

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/latchkey-go/latchkey/locks"
	"github.com/latchkey-go/latchkey/locks/driver"
)

// A claim is what one holder id stands for at the masters: made by an
// attempt, kept by the lease the attempt became, and remembered (in
// Client.claims) until no thief's notice about the id can need waiting
// for. A thief's notice finds the claim by the id in the key it
// displaced.
type claim struct {
	c         *Client
	name      string
	size      int
	semaphore bool   // a Semaphore's: its lease's Slot is its slot, else 0
	id        string // holder id stored at the masters, unique to the claim
	fence     string
	slot      int    // from 1, once granted
	key       string // the slot's key, once granted
	member    string // a Locker's queue member, if it waited in the queue
	waiter    string // the queue member of the Lock that made the attempt, if any: its deletions do not wake it

	// ackable is closed once a thief's notice about the claim may be
	// acknowledged: the attempt has failed and cleaned up, or has been
	// granted and is no longer waiting for its own victims.
	ackable chan struct{}
	// holderDone is closed when the lease's holder lets go of it: its
	// Release, or the Client's Close.
	holderDone     chan struct{}
	holderDoneOnce sync.Once

	releasing atomic.Bool // the release's calls to the masters have started

	// Guarded by c.mu.
	lease       *driver.Lease // nil while the attempt is in flight
	robbed      error         // set when a thief's notice arrived
	waitOver    bool          // the wait for this thief's victims is over
	givenUp     bool          // the call gave up waiting for the victims: release when over
	victimsLive bool          // holders this thief displaced may still run: keep its keys
	// unsure: the attempt failed without an answer from some master,
	// where it may have kept a key taken from a holder it never told: it
	// cannot speak for its keys, and answers a notice "U" (see notice).
	unsure bool
}

// markAckable closes cl.ackable unless it is closed already.
func (cl *claim) markAckable() {
	select {
	case <-cl.ackable:
	default:
		close(cl.ackable)
	}
}

func (cl *claim) isAckable() bool {
	select {
	case <-cl.ackable:
		return true
	default:
		return false
	}
}

// isHolderDone reports whether the lease's holder has let go of it
// (Release) or its validity has run out.
func (cl *claim) isHolderDone() bool {
	select {
	case <-cl.holderDone:
		return true
	default:
		return !time.Now().Before(cl.lease.Deadline())
	}
}

// Lease is a lock or semaphore slot held on a quorum of the masters. It
// implements [locks.Lease] and [locks.SlotLease]; its methods are safe for
// concurrent use.
//
// Its context ends with [locks.ErrReleased] after Release; with an error
// matching [locks.ErrPreempted] (and [locks.ErrLost]) when a higher
// priority took it; with an error matching [locks.ErrLost] when a quorum
// could not be renewed before its validity ran out (the lease ends before
// that deadline), when an administrator deleted its keys, or when its
// Client was closed.
type Lease struct {
	cl *claim
	l  *driver.Lease
}

var _ locks.SlotLease = (*Lease)(nil)

// Name returns the name the lease was acquired on.
func (e *Lease) Name() string { return e.cl.name }

// Context returns the context that ends with the lease; see [Lease].
func (e *Lease) Context() context.Context { return e.l.Context() }

// Token returns the lease's fencing token: strictly greater for every
// later holder of the name, within the package doc's limits (the argument
// is in the repository's docs/protocols/redlockprio.md).
func (e *Lease) Token() uint64 { return e.l.Token() }

// Slot returns the semaphore slot, from 1, of a [Semaphore]'s lease, and
// 0 for a [Locker]'s.
func (e *Lease) Slot() int { return e.l.Slot() }

// Deadline returns the end of the validity the lease can currently prove
// from the local monotonic clock; renewals move it.
func (e *Lease) Deadline() time.Time { return e.l.Deadline() }

// HolderID returns the id, unique to the lease, under which the masters
// store it: the Client's id ([Client.ID]), ':' and a random part.
func (e *Lease) HolderID() string { return e.cl.id }

// Release ends the lease and deletes its keys on every master where they
// are still its own; see [locks.Lease.Release]. It returns once a quorum
// of masters has answered (the others are answered in the background), or
// a [*QuorumError] when fewer than a quorum answered (the keys left behind
// expire after the TTL).
func (e *Lease) Release(ctx context.Context) error { return e.l.Release(ctx) }

// AfterEnd arranges for f to run in its own goroutine once the lease has
// ended, as [driver.Lease.AfterEnd] does; wrappers such as lockotel use
// it. stop unregisters f and reports whether it did so before f started.
func (e *Lease) AfterEnd(f func()) (stop func() bool) { return e.l.AfterEnd(f) }

// release deletes the lease's keys at the masters; it is the driver
// lease's Release hook.
func (cl *claim) release(ctx context.Context) error {
	cl.holderDoneOnce.Do(func() { close(cl.holderDone) })
	c := cl.c
	c.mu.Lock()
	keep := cl.victimsLive
	token := cl.lease.Token()
	delete(c.byLease, cl.lease)
	if !keep && c.claims[cl.id] == cl {
		delete(c.claims, cl.id)
		c.vouchLocked(cl.id)
	}
	c.mu.Unlock()
	if keep {
		// The Client closed while this thief waited for its victims: its
		// keys, set after theirs, expire after their validity. Deleting
		// them now would free the name while a victim may still run; the
		// claim stays too, so that no notice about them is acknowledged.
		return nil
	}
	cl.releasing.Store(true)
	// The lease has ended: once a quorum has deleted its keys, the name is
	// free. The other masters' calls go on in the background, on a
	// context of their own, so that the keys there go too and their
	// waiters hear of it, whatever becomes of ctx.
	// (With one master called on this goroutine (inline), nothing goes
	// on in the background: the call runs on ctx, if it is still live,
	// bounded by the call timeout like every call.)
	f := callPolicy{decides: c.quorumAnswered, order: releaseOrder(cl)}
	if !c.inline() || ctx.Err() != nil {
		f.calls, f.allDone = context.WithTimeout(context.WithoutCancel(ctx), c.callTO)
	} else {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, c.callTO)
		defer cancel()
	}
	keys := []string{cl.key, cl.fence}
	if cl.slot == 1 {
		q, qt, _ := c.queueKeys(cl.name)
		keys = append(keys, q, qt) // the slot a Locker waits for: wake its queue's head
	}
	channel := c.relChannel(cl.name)
	rs := c.callMasters(ctx, c.masters, func(ctx context.Context, m *master) (any, error) {
		if cl.member != "" {
			return runScript(ctx, releaseScript, m.c, keys, cl.id, token, channel, "", cl.member)
		}
		return runScript(ctx, releaseScript, m.c, keys, cl.id, token, channel)
	}, f)
	answered, errs := tally(rs)
	if answered < c.quorum {
		return c.quorumError(cl.name, answered, errs)
	}
	return nil
}
