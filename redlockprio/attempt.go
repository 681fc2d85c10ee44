package redlockprio

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"time"

	"github.com/latchkey-go/latchkey/locks"
	"github.com/latchkey-go/latchkey/locks/driver"
)

// An attempt is one acquisition in flight: its calls to the masters, the
// answers it sorted out, and its token, until it is granted (its claim
// then belongs to a [Lease]) or fails (giveUp cleans up after it).
type attempt struct {
	c     *Client
	cl    *claim
	keys  []string     // the fence key, then the slot keys in slot order
	start time.Time    // taken before the calls: the validity counts from it
	late  *lateAnswers // nil when the call runs inline: nothing comes late
	q     *queued      // a Locker's: its place in the name's queue

	answers []answer
	grants  []grant   // the masters that granted a slot, whichever
	held    []grant   // the masters that answered "held"
	errs    []error   // the masters that failed
	unknown []*master // may have granted (its call failed, not known unsent): clean up there too
	slow    []*master // stragglers: late sees to them until the token is set
	bySlot  []slotGrants
	best    slotGrants // the slot granted by the most masters: the one kept

	token    uint64
	tokenSet bool // late has the token: it no longer sees to failed attempts
}

// acquire makes one attempt at a slot of t. On failure it holds nothing;
// floor carries the largest fence counter seen from one attempt to the
// next. Its errors are causes, for the caller to wrap.
func (c *Client) acquire(ctx context.Context, t target, floor *uint64) (locks.Lease, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if err := c.dupErr(); err != nil {
		return nil, err
	}
	if err := c.subscribeInbox(ctx); err != nil {
		return nil, err
	}
	if err := c.identify(ctx); err != nil {
		return nil, err
	}
	a, err := c.newAttempt(t)
	if err != nil {
		return nil, err
	}
	if a.late != nil {
		defer a.late.decide(0) // a failed attempt, unless decided otherwise
	}
	admitted, err := c.admit(ctx, t.name)
	if err != nil {
		return a.fail(ctx, err)
	}
	a.send(ctx, *floor)
	admitted()
	a.sortAnswers(floor)
	c.refusedBy(a.q, a.held)
	c.grantedBy(a.q, a.grants)
	if err := c.dupErr(); err != nil {
		return a.fail(ctx, err)
	}
	if err := a.checkWon(); err != nil {
		return a.fail(ctx, err)
	}
	extraFree, extraTaken := a.otherSlots()
	if err := a.recordToken(ctx); err != nil {
		return a.fail(ctx, err)
	}
	return a.grant(ctx, extraFree, extraTaken)
}

// newAttempt registers a new claim on t, so that a thief's notice finds
// it from the attempt's first call on.
func (c *Client) newAttempt(t target) (*attempt, error) {
	keys := make([]string, 0, t.size+1)
	keys = append(keys, c.fenceKey(t.name))
	for s := 1; s <= t.size; s++ {
		keys = append(keys, c.key(t.name, s))
	}
	if t.q != nil {
		q, qt, _ := c.queueKeys(t.name)
		keys = append(keys, q, qt)
	}
	cl := &claim{
		c: c, name: t.name, size: t.size, semaphore: t.semaphore,
		id:         c.holderID(),
		fence:      keys[0],
		ackable:    make(chan struct{}),
		holderDone: make(chan struct{}),
	}
	if t.q != nil && t.q.member != "-" {
		cl.waiter = t.q.member
	}
	c.mu.Lock()
	if c.closing {
		c.mu.Unlock()
		return nil, locks.ErrClosed
	}
	c.claims[cl.id] = cl
	c.mu.Unlock()
	a := &attempt{c: c, cl: cl, keys: keys, q: t.q}
	if !c.inline() {
		a.late = &lateAnswers{c: c, cl: cl}
	}
	return a, nil
}

// send runs the acquire script on every master. The calls run on a
// context of their own, which ctx's end does not cut short, until the
// per-master call timeout: calls still running when the outcome is
// decided go on, so that the key (and counter) lands on every master, and
// the answers that come after the attempt returned are seen to (late).
// ctx bounds the wait for them, and so does the call timeout: a master
// that has not answered by then counts as failed. With one master called
// on this goroutine (inline), nothing goes on in the background: the call
// runs on ctx.
func (a *attempt) send(ctx context.Context, floor uint64) {
	c, cl := a.c, a.cl
	first := 0
	if cl.size > 1 {
		first = rand.IntN(cl.size)
	}
	ttlMS := c.o.ttl.Milliseconds()
	a.start = time.Now()
	var member string
	if a.q != nil {
		member = a.q.member
	}
	f := callPolicy{order: acquireOrder(cl, member)}
	if a.late != nil {
		f.calls, f.allDone = context.WithDeadline(context.WithoutCancel(ctx), a.start.Add(c.callTO))
		f.late = a.late.add
		f.grace = true
		if cl.size == 1 {
			f.decides = c.grantDecided
		} // else wait for all (but stragglers): masters may pick different slots
	}
	args := []any{cl.id, ttlMS, c.o.priority, c.inbox, floor, first}
	if a.q != nil {
		args = append(args, a.q.member)
	}
	a.answers = c.callMasters(ctx, c.masters, func(ctx context.Context, m *master) (any, error) {
		if err := c.verify(ctx, m); err != nil {
			return nil, unsent(err) // the acquire script was not sent
		}
		v, err := runScript(ctx, acquireScript, m.c, a.keys, args...)
		return v, m.sendErr(err)
	}, f)
}

// sortAnswers sorts the masters' answers into grants (by slot), "held"
// answers and failures, and picks the slot to keep.
func (a *attempt) sortAnswers(floor *uint64) {
	c := a.c
	for _, r := range a.answers {
		if r.err == nil {
			g, err := parseGrant(r, a.cl.size, c.o.ttl)
			if err != nil {
				r.err = &masterError{index: r.m.index, addr: r.m.addr, err: err}
			} else {
				g.at = time.Now()
				*floor = max(*floor, g.counter)
				c.noteLongest(g.pttl)
				if g.status == 0 {
					a.held = append(a.held, g)
				} else {
					a.grants = append(a.grants, g)
					if i := slices.IndexFunc(a.bySlot, func(sg slotGrants) bool { return sg.slot == g.slot }); i >= 0 {
						a.bySlot[i].gs = append(a.bySlot[i].gs, g)
					} else {
						a.bySlot = append(a.bySlot, slotGrants{g.slot, []grant{g}})
					}
				}
				continue
			}
		}
		a.errs = append(a.errs, r.err)
		switch {
		case a.late != nil && errors.Is(r.err, errStraggler):
			a.slow = append(a.slow, r.m) // its answer goes to late
		case !notSent(r.err):
			// A refused dial, say, took nothing: the attempt knows that
			// master's state, and it does not count as unknown (which
			// would keep the attempt from acknowledging a thief's notice
			// about its other keys: see rememberKept).
			a.unknown = append(a.unknown, r.m)
		}
	}
	for _, sg := range a.bySlot {
		if len(sg.gs) > len(a.best.gs) || len(sg.gs) == len(a.best.gs) && sg.slot < a.best.slot {
			a.best = sg
		}
	}
}

// others are the masters whose state the attempt does not know, to clean
// up as it gives up: those whose call failed (unknown), and those yet to
// answer, which may grant (deleted after the acquire, which sequence
// orders first) — unless the attempt failed before its token was set,
// when their answers go to late (decided 0 as acquire returns), which
// deletes what they grant: a failure decided without them (grantDecided)
// must not wait for a hung master. Masters that answered "held", or whose
// call was never sent (notSent), took nothing. pending are those of
// others whose answer late sees to all the same (see giveUp).
func (a *attempt) others() (ms, pending []*master) {
	ms = slices.Clone(a.unknown)
	for _, m := range a.c.masters {
		if !slices.ContainsFunc(a.answers, func(r answer) bool { return r.m == m }) && (a.late == nil || a.tokenSet) {
			ms = append(ms, m)
			if a.late != nil {
				pending = append(pending, m)
			}
		}
	}
	if a.tokenSet {
		ms = append(ms, a.slow...)
		pending = append(pending, a.slow...)
	}
	return ms, pending
}

// fail gives the attempt up and returns err, or ctx's error once ctx has
// ended.
func (a *attempt) fail(ctx context.Context, err error) (locks.Lease, error) {
	a.giveUp(ctx)
	if cerr := ctx.Err(); cerr != nil {
		return nil, cerr
	}
	return nil, err
}

// giveUp gives the attempt up (see Client.giveUp). When its token was
// set, the masters yet to answer are deleted at as before, keeping a key
// taken from another holder, but they are not unknown: late sees to
// their answers as a failed attempt's (see lateAnswers.abandon), and
// remembers the attempt as having kept a key only where it took one.
func (a *attempt) giveUp(ctx context.Context) {
	ms, pending := a.others()
	if a.tokenSet {
		a.late.abandon()
	} else {
		pending = nil
	}
	a.c.giveUp(ctx, a.cl, a.grants, ms, pending)
}

// checkWon returns nil when a quorum granted one slot; else the name is
// held, unless fewer than a quorum answered at all: a dead or hung
// minority does not turn contention into a QuorumError.
func (a *attempt) checkWon() error {
	c := a.c
	if len(a.best.gs) >= c.quorum {
		return nil
	}
	if answered := len(a.grants) + len(a.held); answered < c.quorum {
		return c.quorumError(a.cl.name, answered, a.errs)
	}
	return heldError(a.cl.name, a.held, c.quorum, a.cl.size, errors.Join(a.errs...))
}

// otherSlots returns the grants of slots other than the one kept, which a
// minority granted: they are not the attempt's to keep. Those taken from
// a victim (taken) are kept until it has stopped; the others (free) go at
// once.
func (a *attempt) otherSlots() (free, taken []grant) {
	for _, sg := range a.bySlot {
		if sg.slot == a.best.slot {
			continue
		}
		for _, g := range sg.gs {
			if g.status == 2 {
				taken = append(taken, g)
			} else {
				free = append(free, g)
			}
		}
	}
	return free, taken
}

// grant turns the won attempt into a lease: it registers it for renewal,
// and, when the grants displaced holders, waits until they have let go.
func (a *attempt) grant(ctx context.Context, extraFree, extraTaken []grant) (locks.Lease, error) {
	c, cl := a.c, a.cl
	deadline := c.deadlineFor(a.start)
	if !time.Now().Before(deadline) {
		return a.fail(ctx, &locks.HeldError{Name: cl.name, Err: fmt.Errorf("acquiring took longer than the validity (TTL %v)", c.o.ttl)})
	}
	cl.slot = a.best.slot
	cl.key = a.keys[a.best.slot]
	if a.q != nil && a.q.member != "-" {
		cl.member = a.q.member // its release takes it out of the queue
	}
	c.deleteKeys(ctx, cl, leftoversOf(extraFree))
	spec := driver.Spec{Name: cl.name, Token: a.token, Deadline: deadline, Release: cl.release}
	if cl.semaphore {
		spec.Slot = cl.slot
	}
	// Victims to tell: those of the slot kept and of the others.
	victims := c.victimsOf(a.grants)
	lease, first, err := a.register(ctx, spec, len(victims) > 0)
	if err != nil {
		a.giveUp(ctx)
		return nil, err
	}
	if first {
		// The renewals start: the first round finds the script loaded.
		c.preloadRenew()
	}
	e := &Lease{cl: cl, l: lease}
	if len(victims) == 0 {
		cl.markAckable()
		return e, nil
	}
	return a.awaitVictims(ctx, e, victims, extraTaken)
}

// register makes the claim a lease the Client renews, unless a thief's
// notice came first (a [locks.HeldError]) or the Client is closing. It
// reports whether the lease is the Client's only one (first).
func (a *attempt) register(ctx context.Context, spec driver.Spec, thief bool) (lease *driver.Lease, first bool, err error) {
	c, cl := a.c, a.cl
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closing {
		return nil, false, locks.ErrClosed
	}
	if cl.robbed != nil {
		return nil, false, &locks.HeldError{Name: cl.name, Err: cl.robbed}
	}
	lease, err = c.reg.NewLease(ctx, spec)
	if err != nil {
		return nil, false, locks.ErrClosed
	}
	cl.lease = lease
	cl.victimsLive = thief
	c.byLease[lease] = cl
	return lease, len(c.byLease) == 1, nil
}
