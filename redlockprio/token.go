package redlockprio

import (
	"context"
	"errors"
	"slices"

	"github.com/latchkey-go/latchkey/locks"
)

// recordToken sets the attempt's token, the largest counter of the
// granting masters, which must then be on a quorum of masters before
// anyone may use it. A master that answered with a counter at least the
// token has it already (its counter never decreases); the others are
// raised to it. The answers still to come are checked as they arrive
// (late).
func (a *attempt) recordToken(ctx context.Context) error {
	c, won := a.c, a.best.gs
	for _, g := range won {
		a.token = max(a.token, g.counter)
	}
	if a.late != nil {
		a.late.decide(a.token)
		a.tokenSet = true
	}
	atToken := 0
	var lower, pending []*master
	for _, m := range c.masters {
		switch {
		case !slices.ContainsFunc(a.answers, func(r answer) bool { return r.m == m }):
			pending = append(pending, m)
		case slices.ContainsFunc(won, func(g grant) bool { return g.m == m && g.counter >= a.token }):
			// Only a counter set with our key in place records the token:
			// a thief's grant there comes after it. A master that answered
			// "held" (or granted another slot) with a high counter does
			// not: a thief may hold it since before and have stolen our
			// keys elsewhere, where the counters were lower.
			atToken++
		default:
			lower = append(lower, m)
		}
	}
	if atToken >= c.quorum {
		// Not needed for this grant, but it keeps the token on more than a
		// bare quorum, so that a master restarting empty later does not
		// take the last copy with it.
		for _, m := range lower {
			c.raiseLater(a.cl.fence, m, a.token)
		}
		return nil
	}
	return a.writeBack(ctx, atToken, append(lower, pending...))
}

// writeBack raises the counters of ms, the masters not known to have the
// token, when fewer than a quorum (atToken) have it: the masters' counters
// differ (failed attempts and split votes raise some only; one restarted,
// say). It waits for enough that still hold the attempt's key as they
// record it (raiseScript checks, atomically): a higher priority may have
// taken the key between the grant and this write-back, its token read
// from the counter before it was raised, and its notice may come only
// after the attempt returned.
func (a *attempt) writeBack(ctx context.Context, atToken int, ms []*master) error {
	c, cl, token := a.c, a.cl, a.token
	need := c.quorum - atToken
	slotKey := a.keys[a.best.slot]
	recorded := func(r answer) bool {
		v, ok := r.val.(int64)
		return r.err == nil && ok && v >= 0 && uint64(v) >= token
	}
	calls, cancel := context.WithTimeout(context.WithoutCancel(ctx), c.callTO)
	rs := c.callMasters(ctx, ms, func(ctx context.Context, m *master) (any, error) {
		return runScript(ctx, raiseScript, m.c, []string{cl.fence, slotKey}, token, cl.id)
	}, callPolicy{decides: func(rs []answer) bool {
		n := 0
		for _, r := range rs {
			if recorded(r) {
				n++
			}
		}
		return n >= need
	}, allDone: cancel, calls: calls})
	taken := false // a master that granted no longer holds our key
	for _, r := range rs {
		switch v, _ := r.val.(int64); {
		case recorded(r):
			atToken++
		case r.err != nil:
			a.errs = append(a.errs, r.err)
		case v < 0 && slices.ContainsFunc(a.best.gs, func(g grant) bool { return g.m == r.m }):
			taken = true
		}
	}
	if atToken < c.quorum {
		if taken {
			return &locks.HeldError{Name: cl.name, Err: errors.New("taken by another holder before the token was recorded")}
		}
		return c.quorumError(cl.name, atToken, a.errs)
	}
	return nil
}
