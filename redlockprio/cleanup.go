package redlockprio

import (
	"context"
	"slices"
	"sync"
	"time"
)

// giveUp is the one clean-up of an attempt that will not be used (it
// failed, or was robbed before it was granted): it deletes what the
// attempt got on the masters of gs and on others, and forgets the claim.
// Where a grant displaced a holder, the key stays until that holder has
// acknowledged the notice giveUp sends it or its validity has run out, so
// that nobody takes the name while it may still run; meanwhile the claim
// stays, and a notice from a thief that displaced the attempt is
// acknowledged only then (the chain of thieves). If the Client closes
// first, those keys are left to expire: set after the victim's, they
// outlast its validity.
//
// giveUp waits for the deletions also when ctx has ended (a Lock whose
// context ended must hold nothing when it returns), at most the call
// timeout (see deleteKeys). At each master the deletion runs after the
// attempt's acquire there (see sequence), so it also undoes a grant whose
// answer had not come when ctx ended; only masters whose acquire or
// deletion has not answered by then are left to the background (late).
//
// Of others, those in pending are masters whose acquire has not answered
// and whose answer late sees to as a failed attempt's (see
// lateAnswers.abandon): the key there is deleted, kept if taken from
// another holder, but the attempt is remembered as having kept one only
// if late finds it took one — not for a whole TTL on the mere chance, in
// which no thief's notice about it would be acknowledged (the
// mixed-priority stall: an attempt robbed after its grant but before
// its lease, a master's answer still to come).
func (c *Client) giveUp(ctx context.Context, cl *claim, gs []grant, others, pending []*master) {
	ctx = context.WithoutCancel(ctx)
	victims := c.victimsOf(gs)
	var now, taken, unknown []*master
	for _, g := range gs {
		if g.status == 2 && len(victims) > 0 {
			taken = append(taken, g.m)
		} else {
			now = append(now, g.m)
		}
	}
	for _, m := range others {
		if !slices.Contains(taken, m) && !slices.Contains(now, m) {
			now = append(now, m)
			unknown = append(unknown, m)
		}
	}
	// On the masters whose answer the attempt did not get (unknown), a
	// key it took from a holder it does not know of is kept: see
	// releaseScript. Where it got the answer, it knows it took nothing
	// from anyone it has not told, and the key goes.
	leftovers := make([]leftover, len(now))
	for i, m := range now {
		leftovers[i] = leftover{m: m, keepTaken: slices.Contains(unknown, m), lateSees: slices.Contains(pending, m)}
	}
	if len(unknown) > 0 {
		c.mu.Lock()
		cl.unsure = true
		c.mu.Unlock()
	}
	if len(victims) == 0 {
		if slices.ContainsFunc(leftovers, keptIfTaken) {
			c.rememberKept(cl.id) // before a notice can find the claim gone
		}
		c.forgetClaim(cl)
		c.deleteKeys(ctx, cl, leftovers)
		return
	}
	c.deleteKeys(ctx, cl, leftovers)
	acks := c.tell(victims)
	if !c.goTracked(func() {
		over := c.waitVictims(cl.name, 0, victims, acks, time.Time{})
		c.forgetClaim(cl)
		if over {
			leftovers := make([]leftover, len(taken))
			for i, m := range taken {
				leftovers[i] = leftover{m: m}
			}
			c.deleteKeys(context.Background(), cl, leftovers)
		}
	}) {
		c.forgetAcks(acks)
		c.forgetClaim(cl)
	}
}

// forgetClaim drops a failed attempt's claim: a thief's notice about it
// is acknowledged from now on (unless kept says otherwise), as "A" when
// the attempt heard every master (it is vouched for), else as "U".
func (c *Client) forgetClaim(cl *claim) {
	c.mu.Lock()
	if c.claims[cl.id] == cl {
		delete(c.claims, cl.id)
		if !cl.unsure {
			c.vouchLocked(cl.id)
		}
	}
	c.mu.Unlock()
	cl.markAckable()
}

// vouchLocked records id in c.vouched, and forgets the ids whose time
// is over; c.mu is held.
func (c *Client) vouchLocked(id string) {
	now := time.Now()
	for len(c.vouchedQ) > 0 && !now.Before(c.vouched[c.vouchedQ[0]]) {
		delete(c.vouched, c.vouchedQ[0])
		c.vouchedQ = c.vouchedQ[1:]
	}
	if _, ok := c.vouched[id]; !ok {
		c.vouchedQ = append(c.vouchedQ, id)
	}
	c.vouched[id] = now.Add(c.keptFor())
}

// A leftover is a key a claim may hold on a master: of its slot, or of
// every slot of the name when slot is 0 (the attempt does not know which
// one that master granted). keepTaken keeps the key if the claim took it
// from another holder (see releaseScript): a master whose answer the
// attempt did not get, so that it cannot have told that holder.
type leftover struct {
	m         *master
	slot      int
	keepTaken bool
	lateSees  bool // keepTaken, and late remembers a key taken (see giveUp)
}

// keptIfTaken reports whether lo is kept if taken from another holder,
// with nothing but the clean-up to tell whether it was (see giveUp).
func keptIfTaken(lo leftover) bool { return lo.keepTaken && !lo.lateSees }

// leftoversOf returns the keys of the slots gs granted.
func leftoversOf(gs []grant) []leftover {
	out := make([]leftover, len(gs))
	for i, g := range gs {
		out[i] = leftover{m: g.m, slot: g.slot}
	}
	return out
}

// deleteKeys deletes the claim's leftovers, one master each, where they
// are still the claim's; when some are kept if taken, it remembers that
// the claim may have kept such keys (see notice). It waits for the
// answers until ctx ends, the call timeout, or the grace for stragglers
// once a majority has answered (see callPolicy.grace); the calls go on
// regardless until the call timeout. giveUp passes a context that does
// not end, so that a failed attempt holds nothing when it returns.
func (c *Client) deleteKeys(ctx context.Context, cl *claim, leftovers []leftover) {
	if len(leftovers) == 0 {
		return
	}
	calls, cancel := context.WithTimeout(context.WithoutCancel(ctx), c.callTO)
	ms := make([]*master, len(leftovers))
	for i, lo := range leftovers {
		ms[i] = lo.m
	}
	if slices.ContainsFunc(leftovers, keptIfTaken) {
		c.rememberKept(cl.id)
	}
	c.callMasters(ctx, ms, func(ctx context.Context, m *master) (any, error) {
		lo := leftovers[slices.IndexFunc(leftovers, func(lo leftover) bool { return lo.m == m })]
		return nil, c.deleteAt(ctx, cl, lo)
	}, callPolicy{order: freeOrder(cl), calls: calls, allDone: cancel, grace: true})
}

// deleteAt deletes one leftover of cl, slot by slot, and stops at the
// first error. Where it frees the first slot (the one a Locker's queue
// waits for), the master wakes the queue's head, as a release does: a
// waiter whose attempt that key refused there heard no wake-up it could
// count, and would otherwise wait for its refresh (TTL/2) — two waiters
// that each found themselves the head (one's entry not yet on every
// master) split the masters, and both failed. It does not wake the
// attempt's own waiter (cl.waiter), which counts the masters that
// granted it as free already (see Client.grantedBy): woken by its own
// deletions, a head with a wake-up standing from a master that no
// longer answers in time tried again at once, in a loop, while the name
// was held.
func (c *Client) deleteAt(ctx context.Context, cl *claim, lo leftover) error {
	first, last := lo.slot, lo.slot
	if lo.slot == 0 {
		first, last = 1, cl.size
	}
	for s := first; s <= last; s++ {
		keep := "0"
		if lo.keepTaken {
			keep = "1"
		}
		args := []any{cl.id, 0, "", keep}
		keys := []string{c.key(cl.name, s), cl.fence}
		if s == 1 {
			q, qt, _ := c.queueKeys(cl.name)
			keys = append(keys, q, qt)
			args = append(args, "", cl.waiter)
		}
		if _, err := runScript(ctx, releaseScript, lo.m.c, keys, args...); err != nil {
			return err
		}
	}
	return nil
}

// lateAnswers handles the acquire answers that arrive after the outcome
// was decided. Once the token is known, a master whose answer does not
// show a counter at least the token (or that failed) is raised to it in
// the background, so that the token spreads beyond the quorum that
// recorded it. After a failed attempt (token 0), a free slot granted late
// is deleted, as giveUp deletes those granted in time; a slot taken from
// a victim is left to expire, set after the victim's key (as when the
// Client closes during a theft), since deleting it could free the name
// while the victim, never told, still runs.
type lateAnswers struct {
	c  *Client
	cl *claim

	mu      sync.Mutex
	decided bool
	token   uint64
	pending []answer
	seen    []answer // checked with the token: abandon checks them again
}

func (a *lateAnswers) add(r answer) {
	a.mu.Lock()
	if !a.decided {
		a.pending = append(a.pending, r)
		a.mu.Unlock()
		return
	}
	token := a.token
	if token != 0 {
		a.seen = append(a.seen, r)
	}
	a.mu.Unlock()
	a.check(r, token)
}

// abandon turns an attempt decided with a token into a failed one (it
// was robbed before it was granted, or could not record its token): the
// answers still to come are then seen to as a failed attempt's — a free
// slot granted late is deleted, a slot taken from a victim is left to
// expire and remembered as kept — and so are those that came since the
// token was set, checked again (on this goroutine, before giveUp forgets
// the claim). So giveUp need not count the masters yet to answer as
// unknown — acknowledging no thief's notice about the attempt for a TTL
// on the mere chance that it took a key there — which stalled a higher
// priority that took the name from the robbed attempt's keys: the
// mixed-priority stall of about a TTL.
func (a *lateAnswers) abandon() {
	a.mu.Lock()
	if !a.decided || a.token == 0 {
		a.mu.Unlock()
		return
	}
	a.token = 0
	seen := a.seen
	a.seen = nil
	a.mu.Unlock()
	for _, r := range seen {
		a.check(r, 0) // before giveUp forgets the claim: see notice
	}
}

// decide sets the token (0 for a failed attempt) and sees to the answers
// that came before it; only its first call counts.
func (a *lateAnswers) decide(token uint64) {
	a.mu.Lock()
	if a.decided {
		a.mu.Unlock()
		return
	}
	a.decided, a.token = true, token
	pending := a.pending
	a.pending = nil
	a.mu.Unlock()
	for _, r := range pending {
		a.c.runOnWorker(func() { a.check(r, token) })
	}
}

// check sees to one answer; it runs in the background.
func (a *lateAnswers) check(r answer, token uint64) {
	c, cl := a.c, a.cl
	var g grant
	err := r.err
	if err == nil {
		g, err = parseGrant(r, cl.size, c.o.ttl)
	}
	ctx, cancel := context.WithTimeout(context.Background(), c.callTO)
	defer cancel()
	switch {
	case token == 0 && err == nil && g.status == 2:
		// A theft answered too late: the key is left to expire, after
		// its victim's validity (it keeps the longer PTTL), and for as
		// long no later thief's notice about it is acknowledged, since
		// that victim was never told.
		c.rememberKeptFor(cl.id, g.pttl+c.o.driftOver(g.pttl))
	case token == 0 && err == nil && g.status == 1:
		c.deleteLate(ctx, cl, leftover{m: r.m, slot: g.slot})
	case token == 0 && err != nil && !notSent(err):
		// The call may have granted all the same: delete there, as the
		// failed attempt does where a call failed in time (keeping a key
		// taken from a holder it cannot tell).
		c.rememberKept(cl.id)
		for s := 1; s <= cl.size; s++ {
			c.deleteLate(ctx, cl, leftover{m: r.m, slot: s, keepTaken: true})
		}
	case token == 0, err == nil && g.counter >= token:
	case cl.releasing.Load():
		// The lease's release, under way, raises every master it reaches
		// to the token: this master's counter too.
	default:
		_, _ = runScript(ctx, raiseScript, r.m.c, []string{cl.fence}, token)
	}
}

// deleteLate deletes what a failed attempt's late answer got at one
// master, ordered as a release is (see freeOrder): this Client's next
// acquire of the name there waits for it, so that the deletion cannot
// land after that acquire was refused by the key it deletes, which would
// leave the new lease a bare quorum. An acquire sent before the late
// answer arrived is not ordered after its deletion (a documented limit).
func (c *Client) deleteLate(ctx context.Context, cl *claim, lo leftover) {
	prev, done := c.sequence(lo.m, freeOrder(cl))
	defer done()
	if waitFor(ctx, prev) == nil {
		_ = c.deleteAt(ctx, cl, lo)
	}
}

// raiseLater raises m's fence counter to token in the background.
func (c *Client) raiseLater(fence string, m *master, token uint64) {
	c.runOnWorker(func() {
		ctx, cancel := context.WithTimeout(context.Background(), c.callTO)
		defer cancel()
		_, _ = runScript(ctx, raiseScript, m.c, []string{fence}, token)
	})
}
