package natsputex

import (
	"context"
	"fmt"
	"time"

	"github.com/latchkey-go/latchkey/locks"
	"github.com/latchkey-go/latchkey/locks/driver"
)

// This file holds one attempt at one key, which a Locker's Lock, a
// Semaphore's Acquire and a Supervisor's stroke all make: take a free key
// at once, or a silent holder's key over and confirm it, and hand out a
// lease. A Supervisor's attempt (attempt.agent) adds putex's parts: its
// health checks, its own token found in the key, and the hold-off after
// a failed Start (see supervisor_agent.go).

// takeOver writes value over the key as r shows it, and wins only if no
// one wrote since r was read (see [store.claim]): the write that takes a
// silent holder's key over, or (a Supervisor's) a key holding the agent's
// own token that it does not hold. wctx bounds the write; it must not end
// with the caller's context, since a write cut short may land all the
// same. A win is reported as [driver.EventTakeover]; it returns the
// revision of the write, the hold's fencing token, and when it was sent
// (see [resend]).
func (c *Client) takeOver(wctx context.Context, name, key, value string, r record) (uint64, time.Time, error) {
	rev, start, err := c.st.claim(wctx, key, value, r)
	if err != nil {
		return 0, start, err
	}
	c.reg.Emit(driver.Event{Kind: driver.EventTakeover, Name: name, Token: rev})
	return rev, start, nil
}

// confirmation is a hold being confirmed after takeOver won it. Until
// span has passed since the hold's first write was answered (not since it
// began: a write may be sent, or land, well after it began, and the
// holder it displaced learns of it only once it landed), every write
// since having succeeded, the holder writes value: its token with the
// longer T and C·R of its own and of the holder it displaced, so that
// should it give up or die before it is done, the next taker waits and
// confirms as long as the displaced holder counts on, along a chain of
// confirmers too. A confirmation that is given up never blanks the key:
// the displaced holder may still be using its lease (or stopping its
// service); the next taker waits T without a write and confirms.
type confirmation struct {
	name, key string
	won       uint64        // the revision of the takeover write: the hold's fencing token
	began     time.Time     // when the takeover write was sent: the hold's validity counts from it
	since     time.Time     // when its success was answered: the span counts from it
	span      time.Duration // how long it confirms: C·R, or the displaced holder's longer one
	value     string        // what it writes until it is done
}

// confirmationOf returns the confirmation of the hold that the takeover
// write of value at won, begun at start and answered just now, won with
// timing tm (the longer of the taker's own and the displaced holder's).
func confirmationOf(name, key, value string, won uint64, start time.Time, tm timing) *confirmation {
	return &confirmation{name: name, key: key, won: won, began: start, since: time.Now(), span: tm.confirm, value: value}
}

// due reports whether the confirmation has lasted its span at now: the
// next write that succeeds confirms the hold.
func (cf *confirmation) due(now time.Time) bool { return now.Sub(cf.since) >= cf.span }

// confirmWrite makes one write of the hold cf confirms, at rev, the
// revision of the hold's last write: value, which is cf.value until the
// confirmation is due and then the one the caller writes from now on.
// When due, the hold is confirmed by this write's success, which is
// reported as [driver.EventConfirmation]. A failed write ends the
// confirmation; the caller then leaves the key as it is (never blanks
// it).
func (c *Client) confirmWrite(wctx context.Context, cf *confirmation, value string, due bool, rev uint64) (uint64, time.Time, error) {
	nrev, sent, err := c.st.renew(wctx, cf.key, value, rev)
	if err == nil && due {
		c.reg.Emit(driver.Event{Kind: driver.EventConfirmation, Name: cf.name, Token: cf.won, Duration: time.Since(cf.since)})
	}
	return nrev, sent, err
}

// attempt is one try of a Lock, an Acquire or a Supervisor's stroke at
// one key.
type attempt struct {
	op, name, key string
	i             int         // the key's index in the call's keys (and clocks)
	slot          int         // the lease's slot: 0 for a lock, i+1 for a semaphore
	token         string      // what the lease writes once it holds the key: a Locker's token, or a Supervisor's value
	agent         *Supervisor // the Supervisor making the attempt; nil for a Locker's
	// yield: a reserved key (see queue.go) counts as held, so that a Lock
	// that is not the head of the key's queue joins it.
	yield bool
	// queued: the attempt is the head of the key's queue; its lease
	// leaves the key reserved on release.
	queued bool
	// knocks is the call's subscription to knocks on the key, which the
	// lease it wins adopts; nil if none.
	knocks *knocks
}

// confirmValue returns what the attempt writes while it confirms a
// takeover with timing tm: its token with tm, so that the next taker
// waits and confirms as long (see [confirmation]).
func (a attempt) confirmValue(tm timing) string {
	if a.agent != nil {
		return a.agent.confirmValue(tm)
	}
	if tm.confirm > 0 {
		return valueOf(a.token, tm)
	}
	return a.token
}

// held returns the answer of an attempt that found the key held by
// holder: a [locks.HeldError] saying when to try again.
func (a attempt) held(holder string, retry time.Duration, err error) *locks.HeldError {
	return &locks.HeldError{Name: a.name, Holder: holder, RetryAfter: retry, Err: err}
}

// errorf wraps err in the call's error shape, saying what step failed.
func (a attempt) errorf(step string, err error) error {
	return driver.Errorf(backend, a.op, a.name, fmt.Errorf("%s %q: %w", step, a.key, err))
}

// tryKey makes one attempt at a key: over a blank it knows of, else by a
// read, then taking a free key at once, or a silent one over.
func (c *Client) tryKey(ctx context.Context, a attempt, cl *clocks, clock *serverClock) (locks.Lease, error) {
	if a.agent == nil {
		// A Supervisor reads first: it checks its health before it writes.
		if lease, err, done := c.tryOverBlank(ctx, a, cl); done {
			return lease, err
		}
	}
	octx, cancel := c.opContext(ctx)
	r, err := c.st.read(octx, a.key)
	cancel()
	if err != nil {
		return nil, a.errorf("read", err)
	}
	quiet := cl.see(a.i, r.rev, r.at)
	// The holder's timing counts when it is longer than this client's: a
	// holder renews for its own T, and a taker-over that waited less
	// could take a live holder's key between two of its renewals. A
	// Locker's token carries its T, a Supervisor's value its T and C·R.
	_, ht, _ := parseValue(r.holder)
	cl.noteTiming(a.i, ht)
	if a.agent != nil {
		if why, own := a.agent.ownWrite(r); own {
			// Its own last write, or one whose answer was lost: taken
			// at once, and confirmed as after a takeover.
			if wait := a.agent.heldOff(); wait > 0 {
				return nil, a.held(r.holder, wait, nil)
			}
			return c.takeSilent(ctx, a, r, ht, why, false)
		}
	}
	// A free key is taken at once, unless this call saw it vanish or its
	// revision go back (the bucket made again) less than T ago: a holder
	// of the key's past may still hold it, so it is taken as a held key,
	// after T of silence.
	if r.reserved && a.yield {
		return nil, a.held(queueHolder, 0, nil)
	}
	if r.reserved {
		a.queued = true // others may wait: leave it reserved again
	}
	if r.free() && !cl.rebornHold(a.i, c.o.ttl()) {
		return c.takeFree(ctx, a, r)
	}
	if r.free() {
		ht = cl.longest(a.i) // a holder of the key's past: the longest seen
	}
	if a.agent != nil {
		// putex's standby checks its health every stroke.
		if err := a.agent.standbyCheck(ctx, r); err != nil {
			return nil, a.held(r.holder, c.o.renewEvery(), err)
		}
	}
	T := max(c.o.ttl(), ht.ttl)
	if quiet < T && !r.at.IsZero() && !a.yield && !cl.measured(a.i, r.rev) {
		// The first sight of this write by this call (every TryLock's):
		// ask the server how long ago it was stored, by its own clock,
		// so that a key silent for T already is taken over now, not
		// after this call has watched it for T. If the server cannot
		// tell, this call's own clock counts alone. A Lock's first
		// attempt does not ask: a held key sends it to the key's
		// queue, whose head asks when it first reads the write (this
		// call itself, if it finds no queue ahead of it).
		octx, cancel := c.opContext(ctx)
		now, err := clock.now(octx)
		cancel()
		if err == nil {
			quiet = cl.backdate(a.i, r.rev, now.Sub(r.at))
		}
	}
	checked := a.agent != nil
	if quiet < T && a.agent != nil && a.agent.awaitSilence(ctx, cl, a.i, r.rev, T) {
		// putex's standby waits out T in its stroke, then checks its
		// health again and writes at the revision it read.
		quiet, checked = T, false
	}
	if quiet < T {
		return nil, a.held(r.holder, T-quiet, nil)
	}
	// The key has gone T without a write, by the server's clock or this
	// call's own: the holder is presumed dead.
	return c.takeSilent(ctx, a, r, ht, fmt.Sprintf("took the key over after %v without a write", T), checked)
}

// tryOverBlank writes over a blank this client left, or this call's
// watch saw, without reading the key first: one round trip. done is false
// when there is no such blank, or someone wrote since.
func (c *Client) tryOverBlank(ctx context.Context, a attempt, cl *clocks) (lease locks.Lease, err error, done bool) {
	blank, ok := c.knownBlank(a.key)
	if !ok {
		blank, ok = cl.takeBlank(a.i, c.o.ttl())
	}
	if !ok {
		return nil, nil, false
	}
	octx, cancel := c.writeContext(ctx)
	nrev, start, err := c.st.renew(octx, a.key, a.token, blank)
	cancel()
	switch {
	case err == nil:
		lease, err = c.hold(ctx, a, nrev, nrev, start)
		return lease, err, true
	case isConflict(err):
		return nil, nil, false
	}
	return nil, driver.Errorf(backend, a.op, a.name, err), true
}

// takeFree takes the free key r describes: held at once. A Supervisor
// first checks its health (told [Active]), and leaves the key alone
// while it holds off after a failed Start.
func (c *Client) takeFree(ctx context.Context, a attempt, r record) (locks.Lease, error) {
	if a.agent != nil {
		if wait := a.agent.heldOff(); wait > 0 {
			return nil, a.held(r.holder, wait, nil)
		}
		if err := a.agent.activeCheck(ctx); err != nil {
			return nil, a.held(r.holder, c.o.renewEvery(), err)
		}
	}
	octx, cancel := c.writeContext(ctx)
	rev, start, err := c.st.claim(octx, a.key, a.token, r)
	cancel()
	switch {
	case isConflict(err):
		return nil, a.held(r.holder, 0, err)
	case err != nil:
		a.writeFailed(err)
		return nil, a.errorf("write", err)
	}
	a.wrote(rev)
	return c.hold(ctx, a, rev, rev, start)
}

// takeSilent takes over the key r describes, silent for T, whose holder's
// value carried ht, and confirms the takeover (see [confirmation]) before
// the lease is handed out; why says so in a Supervisor's events. The
// last confirmation writes the lease's own token. A Supervisor also takes
// its own write this way (see [Supervisor.ownWrite]). The health check
// (told [Standby]) comes first, unless checked says the attempt ran it.
func (c *Client) takeSilent(ctx context.Context, a attempt, r record, ht timing, why string, checked bool) (locks.Lease, error) {
	if !checked {
		if err := c.healthCheck(ctx, Standby); err != nil {
			a.report("health check failed", err)
			return nil, a.held(r.holder, c.o.renew, err)
		}
	}
	tm := c.o.timing().longer(ht)
	value := a.confirmValue(tm)
	octx, cancel := c.writeContext(ctx)
	won, start, err := c.takeOver(octx, a.name, a.key, value, r)
	cancel()
	switch {
	case isConflict(err):
		return nil, a.held(r.holder, 0, err)
	case err != nil:
		a.writeFailed(err)
		return nil, a.errorf("take over", err)
	}
	a.wrote(won)
	cf := confirmationOf(a.name, a.key, value, won, start, tm)
	if a.agent != nil {
		a.agent.confirming(cf, why)
	}
	rev, start, err := c.confirm(ctx, a, cf)
	switch {
	case err == nil:
		return c.hold(ctx, a, won, rev, start)
	case isConflict(err):
		return nil, a.held(r.holder, 0, fmt.Errorf("lost the key while confirming the takeover: %w", err))
	}
	// Not blanked (see confirmation).
	return nil, a.errorf("confirm takeover of", err)
}

// confirm makes the writes of the confirmation cf, one every renewal
// interval, until its span has passed; the last one writes the lease's
// own token. A Supervisor checks its health (told [Active]) before that
// last write. It returns the revision of the last write and when it was
// sent.
func (c *Client) confirm(ctx context.Context, a attempt, cf *confirmation) (uint64, time.Time, error) {
	rev, start := cf.won, cf.began
	for done := cf.span == 0; !done; {
		if err := driver.Sleep(ctx, c.o.renewEvery()); err != nil {
			return 0, start, err
		}
		due, next := cf.due(time.Now()), cf.value
		if due {
			next = a.token
			if a.agent != nil {
				if err := a.agent.activeCheck(ctx); err != nil {
					return 0, start, err
				}
			}
		}
		octx, cancel := c.opContext(ctx)
		nrev, sent, err := c.confirmWrite(octx, cf, next, due, rev)
		cancel()
		if err != nil {
			a.writeFailed(err)
			return 0, sent, err
		}
		rev, start = nrev, sent
		a.wrote(rev)
		done = due
	}
	return rev, start, nil
}

// wrote tells a Supervisor making the attempt that a write of its own
// landed at rev.
func (a attempt) wrote(rev uint64) {
	if a.agent != nil {
		a.agent.wrote(rev)
	}
}

// writeFailed tells a Supervisor making the attempt that a write failed:
// unless the error is a conflict, it may have landed all the same.
func (a attempt) writeFailed(err error) {
	if a.agent != nil {
		a.agent.writeFailed(err)
	}
}

// report tells a Supervisor's observer of a step that failed.
func (a attempt) report(msg string, err error) {
	if a.agent != nil {
		a.agent.event(PhaseStandby, msg, err)
	}
}
