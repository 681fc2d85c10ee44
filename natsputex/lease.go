package natsputex

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/latchkey-go/latchkey/locks"
	"github.com/latchkey-go/latchkey/locks/driver"
)

// lease is a held key: the kit's lease state machine, renewed by the
// client's registry (see [Client.renewLeases]), and what natsputex keeps
// of the key.
type lease struct {
	*driver.Lease
	c     *Client
	key   string
	token string      // what the lease writes: a Locker's token, or a Supervisor's value
	agent *Supervisor // the Supervisor holding the key; nil for a Locker's lease
	// queued: the lease was won by the head of the key's queue, so others
	// may be waiting; its release leaves the key reserved for the next
	// head (see queue.go) rather than blank.
	queued bool
	// knocks tells whether the head of the key's queue said it waits
	// (see [Client.listenForKnocks]); the release then leaves the key
	// reserved too. nil for a lease that listens for none.
	knocks *knocks

	mu        sync.Mutex
	rev       uint64   // revision of the last successful write
	uncertain bool     // the last write failed without a conflict: it may have landed
	stopErr   error    // a Supervisor's Stop failed: its release leaves the key as it is
	failure   *holdEnd // why a Supervisor's last renewal round failed (see endReason)
}

// handle is a lease as users see it: a [locks.SlotLease] with the
// validity deadline, and nothing of the kit's side (Extend, End).
type handle struct{ l *driver.Lease }

var _ locks.SlotLease = handle{}

func (h handle) Name() string                      { return h.l.Name() }
func (h handle) Context() context.Context          { return h.l.Context() }
func (h handle) Token() uint64                     { return h.l.Token() }
func (h handle) Slot() int                         { return h.l.Slot() }
func (h handle) Release(ctx context.Context) error { return h.l.Release(ctx) }

// AfterEnd is [driver.Lease.AfterEnd], for wrappers such as lockotel.
func (h handle) AfterEnd(f func()) (stop func() bool) { return h.l.AfterEnd(f) }

// Deadline returns when the lease ends by itself unless a renewal lands
// first: the start of its last successful write plus T minus the safety
// margin.
func (h handle) Deadline() time.Time { return h.l.Deadline() }

// hold registers the lease the attempt a won at revision won (the
// fencing token) and last wrote at rev by a write that started at start.
// A Supervisor's lease is returned as the *lease itself, a Locker's as
// its handle.
func (c *Client) hold(ctx context.Context, a attempt, won, rev uint64, start time.Time) (locks.Lease, error) {
	l := &lease{c: c, key: a.key, token: a.token, agent: a.agent, rev: rev, queued: a.queued}
	dl, err := c.reg.NewLease(ctx, driver.Spec{
		Name:     a.name,
		Token:    won,
		Slot:     a.slot,
		Deadline: c.o.validUntil(start),
		Release:  l.release,
	})
	if err != nil {
		// Closed meanwhile: blank what was won, unless a takeover
		// confirmed it (then too: the confirmations are done).
		_ = l.release(context.WithoutCancel(ctx))
		return nil, c.reg.ErrClosed(a.op, a.name)
	}
	l.Lease = dl
	if !l.Live() { // the write took longer than the validity
		_ = l.Release(context.WithoutCancel(ctx))
		return nil, &locks.HeldError{Name: a.name, Err: errors.New("the winning write took longer than the lease's validity")}
	}
	if a.knocks != nil {
		l.knocks = a.knocks
		a.knocks.adopt(dl.Context())
	}
	c.mu.Lock()
	c.leases[dl] = l
	c.mu.Unlock()
	context.AfterFunc(dl.Context(), func() {
		c.mu.Lock()
		delete(c.leases, dl)
		c.mu.Unlock()
	})
	if a.agent != nil {
		return l, nil
	}
	return handle{dl}, nil
}

// renewLeases is the client's [driver.RenewFunc]: one round for all its
// live leases. It runs the health check once (told [Active]); a failure
// ends every lease of the round, then blanks each key (one attempt), so
// that a waiter takes over at once: the key is free only once its lease
// is over. (A Supervisor's key is blanked by its own release, once its
// service has stopped: see [lease.release].) Otherwise it rewrites each key at its lease's last revision;
// NATS KV has no multi-key compare-and-set, so the writes go out at
// once, each in a goroutine of this round, and the round waits for all
// of them. A write that fails ends its lease.
func (c *Client) renewLeases(ctx context.Context, batch []*driver.Lease) []driver.Renewal {
	out := make([]driver.Renewal, len(batch))
	leases := c.leasesOf(batch)
	if err := c.healthCheck(ctx, Active); err != nil {
		for i, l := range leases {
			if l == nil {
				continue
			}
			out[i] = driver.Renewal{Err: driver.Lost(fmt.Errorf("%q: %w", l.Name(), err))}
			if l.agent != nil {
				end := holdEnd{why: "health check failed", err: err}
				l.failed(end)
				out[i].Err = driver.Lost(end)
			} else {
				out[i].Then = func() { c.abandon(l.key, l.token, l.lastRev()) }
			}
		}
		return out
	}
	var wg sync.WaitGroup
	for i, l := range leases {
		if l == nil {
			continue
		}
		wg.Go(func() {
			out[i] = l.renew(ctx)
			if out[i].Err == nil {
				// Extended as soon as its own write is answered, not when
				// the round's slowest write is: the deadline counts from
				// this write's start, and a straggler must not end a lease
				// whose renewal landed in time. The kit applies the same
				// answer again at the end of the round.
				l.Extend(out[i].Until)
			}
		})
	}
	wg.Wait()
	return out
}

// leasesOf returns the client's leases behind batch, nil for one that
// ended before the round (its answer is then empty).
func (c *Client) leasesOf(batch []*driver.Lease) []*lease {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make([]*lease, len(batch))
	for i, dl := range batch {
		out[i] = c.leases[dl]
	}
	return out
}

func (l *lease) lastRev() uint64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.rev
}

// renew rewrites the token at the last revision, bounded by T. Any
// failure ends the lease.
func (l *lease) renew(ctx context.Context) driver.Renewal {
	c := l.c
	ctx, cancel := context.WithTimeout(ctx, c.o.ttl())
	defer cancel()
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.agent != nil {
		return l.renewAgent(ctx)
	}
	rev, start, err := c.st.renew(ctx, l.key, l.token, l.rev)
	if isConflict(err) {
		// A conflict may answer this very write, applied all the same: a
		// stream leader that lost its leadership answers it late, after
		// the new leader stored it. The key still holding this lease's
		// token (unique to it) at a later revision says so.
		if r, rerr := c.st.read(ctx, l.key); rerr == nil && r.holder == l.token && r.rev > l.rev {
			rev, err = r.rev, nil
		}
	}
	if err != nil {
		why := "renewal failed"
		if isConflict(err) {
			why = "the key was written by someone else"
		}
		at := fmt.Sprintf("revision %d", l.rev)
		if l.key != l.Name() { // a semaphore's slot
			at = fmt.Sprintf("key %q, %s", l.key, at)
		}
		return driver.Renewal{Err: driver.Lost(fmt.Errorf("%q: %s (%s): %w", l.Name(), why, at, err))}
	}
	l.rev = rev
	return driver.Renewal{Until: c.o.validUntil(start)}
}

// release blanks the key if it is still this lease's; a lease won by the
// head of the key's queue leaves it reserved for the next head instead
// (see queue.go). A Supervisor's lease stops the service first (see
// [lease.releaseAgent]).
func (l *lease) release(ctx context.Context) error {
	if l.agent != nil {
		return l.releaseAgent(ctx)
	}
	ctx, cancel := l.c.opContext(ctx)
	defer cancel()
	var blank []byte
	queued := l.queued || l.knocks != nil && l.knocks.knocked.Load()
	if queued {
		blank = []byte(reservedValue)
	}
	nrev, over, err := l.c.st.clear(ctx, l.key, l.token, l.lastRev(), blank)
	if err != nil {
		return fmt.Errorf("blank %q: %w", l.key, err)
	}
	if nrev > 0 {
		l.c.tellFreed(l.key, over, nrev)
	}
	if nrev > 0 && !queued {
		l.c.rememberBlank(l.key, nrev)
	}
	return nil
}

// abandon blanks key if it still holds token, with a context of its own:
// the lease that wrote it has ended, maybe because its check failed.
func (c *Client) abandon(key, token string, rev uint64) {
	ctx, cancel := context.WithTimeout(context.Background(), c.o.ttl())
	defer cancel()
	if nrev, over, err := c.st.clear(ctx, key, token, rev, nil); err == nil && nrev > 0 {
		c.tellFreed(key, over, nrev)
		c.rememberBlank(key, nrev)
	}
}
