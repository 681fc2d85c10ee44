package redlockprio

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/latchkey-go/latchkey/locks"
	"github.com/latchkey-go/latchkey/locks/driver"
)

// renew is the Client's [driver.RenewFunc]: it renews the batch, every
// live lease of the Client, in one pipelined round trip per master.
// A round ends at the earliest validity in the batch less the drift
// allowance (see renewLimit). Each lease's answer: extended when a quorum
// extended its keys; ended with [locks.ErrPreempted] or [locks.ErrLost]
// when a quorum says they are taken or gone; ended with ErrLost when the
// round failed and the next could come too late; else left to the next
// round.
func (c *Client) renew(ctx context.Context, batch []*driver.Lease) []driver.Renewal {
	claims := c.claimsOf(batch)
	start := time.Now()
	limit := c.renewLimit(start, batch)
	ctx, cancel := context.WithDeadline(ctx, limit)
	defer cancel()
	ttlMS := c.o.ttl.Milliseconds()
	// Decide as soon as every lease has a quorum of extensions; a dead or
	// hung minority does not hold the round up.
	allRenewed := func(rs []answer) bool {
		for i := range batch {
			n := 0
			for _, r := range rs {
				if r.err == nil && r.val.([]renewal)[i].code == 1 && r.val.([]renewal)[i].err == nil {
					n++
				}
			}
			if n < c.quorum {
				return false
			}
		}
		return true
	}
	// The calls run on a context of their own, until the same limit,
	// which the round's end does not cancel (nor the Client's Close): a
	// master still at work when the others have decided the round (one
	// that answered NOSCRIPT and reloads the script, say) renews its keys
	// all the same.
	calls, callsDone := context.WithDeadline(context.Background(), limit)
	rs := c.callMasters(ctx, c.masters, func(ctx context.Context, m *master) (any, error) {
		if err := c.verify(ctx, m); err != nil {
			return nil, err // its answers do not count until it is
		}
		return renewPipeline(ctx, m, batch, claims, ttlMS)
	}, callPolicy{decides: allRenewed, calls: calls, allDone: callsDone})
	if errors.Is(context.Cause(ctx), locks.ErrClosed) {
		return nil // Close ends the leases with its own cause
	}
	deadline := c.deadlineFor(start)
	answers := make([]driver.Renewal, len(batch))
	for i, l := range batch {
		answers[i] = c.renewal(l, claims[i].name, i, rs, deadline)
	}
	return answers
}

// renewLimit is when a round started at start gives up. A slow round (a
// large batch, a loaded master) may take longer than the interval: allow
// it until the earliest validity in the batch, less the time to end the
// leases before their deadline if it fails, but never past that deadline
// less the drift allowance: a round that hangs must leave its leases time
// to end with ErrLost (see renewal) before their validity runs out,
// rather than reach it.
func (c *Client) renewLimit(start time.Time, batch []*driver.Lease) time.Time {
	var earliest time.Time
	for _, l := range batch {
		if dl := l.Deadline(); earliest.IsZero() || dl.Before(earliest) {
			earliest = dl
		}
	}
	limit := later(start.Add(c.o.renew), earliest.Add(-c.o.renew-c.drift))
	if last := earliest.Add(-c.drift); limit.After(last) {
		limit = last
	}
	return limit
}

func later(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}

// renewal is the answer of the round rs for the i-th lease l of its batch,
// named name: extended to deadline, ended, or left to the next round.
func (c *Client) renewal(l *driver.Lease, name string, i int, rs []answer, deadline time.Time) driver.Renewal {
	ok, pre, gone, closed := 0, 0, 0, 0
	var errs []error
	for _, r := range rs {
		var rn renewal
		if r.err != nil {
			rn.err = r.err
		} else {
			rn = r.val.([]renewal)[i]
			if rn.err != nil {
				rn.err = &masterError{index: r.m.index, addr: r.m.addr, err: rn.err}
			}
		}
		switch {
		case rn.err != nil:
			errs = append(errs, rn.err)
			if isClosed(rn.err) {
				closed++
			}
		case rn.code == 1:
			ok++
		case rn.code == -1:
			pre++
		default:
			gone++
		}
	}
	unknown := len(errs) - closed
	switch {
	case ok >= c.quorum:
		return driver.Renewal{Until: deadline}
	case ok+unknown < c.quorum && pre > 0:
		return driver.Renewal{Err: driver.Preempted(fmt.Errorf("%q taken by a higher priority on %d masters", name, pre))}
	case ok+unknown < c.quorum:
		return driver.Renewal{Err: driver.Lost(fmt.Errorf("%q: keys gone or taken on %d masters: %w", name, gone+pre+closed,
			c.quorumError(name, ok, errs)))}
	case time.Until(l.Deadline()) < c.o.renew+c.drift:
		// The next round could come too late: give up now, before the
		// validity runs out.
		return driver.Renewal{Err: driver.Lost(fmt.Errorf("%q: renewal failed: %w", name, c.quorumError(name, ok, errs)))}
	}
	// Not renewed this round, not lost: the next round tries again.
	return driver.Renewal{Err: c.quorumError(name, ok, errs)}
}

// claimsOf returns the claims of the leases of batch, in its order, and
// forgets the claims of ended leases that no notice can need waiting for
// any more: their attempt is over, and their holder let go or their
// validity ran out.
func (c *Client) claimsOf(batch []*driver.Lease) []*claim {
	c.mu.Lock()
	defer c.mu.Unlock()
	for id, cl := range c.claims {
		if cl.lease != nil && !cl.lease.Live() && cl.isAckable() && cl.isHolderDone() {
			delete(c.claims, id)
			c.vouchLocked(id)
		}
	}
	// Every lease of a round has its claim: registered under c.mu with it,
	// and released (which drops it) only after the round.
	out := make([]*claim, len(batch))
	for i, l := range batch {
		out[i] = c.byLease[l]
	}
	return out
}

// renewal is one master's answer for one lease: 1 extended, 0 gone,
// -1 taken by a higher priority, or an error.
type renewal struct {
	code int64
	err  error
}

// Where a master stands with the renew script, so that a renewal tick
// is one pipeline of EVALSHA rather than a NOSCRIPT answer, a load and a
// second pipeline.
const (
	scriptUnknown int32 = iota
	scriptLoading
	scriptLoaded
)

// preloadRenew loads the renew script, in the background, on the masters
// not known to have it.
func (c *Client) preloadRenew() {
	for _, m := range c.masters {
		if m.renewScript.CompareAndSwap(scriptUnknown, scriptLoading) {
			if !c.runOnWorker(func() {
				ctx, cancel := context.WithTimeout(context.Background(), c.o.renew)
				defer cancel()
				// Through a pipeline: the client may keep its pipelines'
				// connections apart, and the first tick then finds one.
				pipe := m.c.Pipeline()
				// (Not renewScript.Load: on a pipeline it would read the
				// reply before Exec and set the script's hash to "".)
				load := pipe.ScriptLoad(ctx, renewSource)
				if _, err := pipe.Exec(ctx); err == nil && load.Err() == nil {
					m.renewScript.CompareAndSwap(scriptLoading, scriptLoaded)
				} else {
					m.renewScript.CompareAndSwap(scriptLoading, scriptUnknown)
				}
			}) {
				m.renewScript.Store(scriptUnknown)
			}
		}
	}
}

// renewPipeline sends the renew script for every lease of the batch to
// one master in one pipeline, loading the script and retrying once on
// NOSCRIPT (a master that restarted, say).
func renewPipeline(ctx context.Context, m *master, batch []*driver.Lease, claims []*claim, ttlMS int64) ([]renewal, error) {
	c := m.c
	out := make([]renewal, len(batch))
	for try := 0; ; try++ {
		pipe := c.Pipeline()
		cmds := make([]*redis.Cmd, len(batch))
		for i, l := range batch {
			cl := claims[i]
			cmds[i] = renewScript.EvalSha(ctx, pipe, []string{cl.key, cl.fence}, cl.id, ttlMS, l.Token())
		}
		_, err := pipe.Exec(ctx)
		if err != nil && ctx.Err() != nil {
			return nil, err
		}
		noscript := false
		for i, cmd := range cmds {
			n, err := cmd.Int64()
			if err != nil && redis.HasErrorPrefix(err, "NOSCRIPT") {
				noscript = true
			}
			out[i] = renewal{code: n, err: err}
		}
		if !noscript || try > 0 {
			return out, nil
		}
		m.renewScript.Store(scriptUnknown)
		if err := renewScript.Load(ctx, c).Err(); err != nil {
			return nil, errors.Join(errors.New("loading the renew script"), err)
		}
		m.renewScript.Store(scriptLoaded)
	}
}
