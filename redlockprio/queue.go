package redlockprio

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/latchkey-go/latchkey/locks"
)

// The waiter queue of a Locker's name: each master keeps, beside the
// name's keys, a sorted set of the Locks waiting for it ({name}:q) and
// their entries' expiries by the master's own clock ({name}:qt). A member
// is "<ticket, 16 hex digits>|<the Client's inbox>|<waiter id>", scored
// minus its priority: the head is the highest priority, then the lowest
// ticket, the same order on every master that has both members.
//
// A Lock whose first attempt fails takes a ticket, the largest of the
// name's counter ({name}:qn) incremented on a quorum of masters, and
// joins the queue on every master (raising the counter there to its
// ticket); it has joined once a quorum has it. A later arrival's ticket
// counter meets one of that quorum, so it is larger: among equal
// priorities, the order of completed joins is the order of grants. The
// acquire script of a Locker refuses the name while the queue's head is
// another waiter of a priority at least the caller's. A waiter leaves
// the queue at its lease's release (in the same script) or as its Lock
// returns, never on a grant alone: a grant on a minority of masters must
// not lose its place there, which would order the queue differently on
// different masters. A lease's release wakes only the head (a message
// on its Client's inbox), not every waiter. A waiter
// puts its entry back every TTL/2 (on every master: that also heals a
// master that missed it), which tells it when it is the head of a free
// name (its wake-up lost) and when it is next in line, with how long the
// head's entry has left; an entry not put back expires after the TTL.
// The waiter next in line tries again when the head's entry would have
// expired, so a dead head waiter blocks the queue a TTL after its last
// refresh, plus round trips (at most TTL + TTL/2 when the waiter behind
// it learns it is next only at its own refresh). A waiter that gives up
// (its context ended) leaves the queue on every master before Lock
// returns, waking the next head.

// queued is a Locker call's place in its name's queue.
type queued struct {
	member string // "-" until it has joined
	wake   chan struct{}
	w      *queueWake
}

// queueWake wakes a queued waiter once a quorum of masters has woken it
// and not refused it since: an attempt started on the first master's
// wake-up would mostly find the name still held on the others, whose
// releases are on their way. A master's wake-up counts until an attempt
// finds that master refusing the name (a "held" answer to a call made
// after the wake-up): each master wakes the head once per release, so a
// wake-up that an attempt did not contradict (the master granted, or its
// answer came too late) must not be forgotten, or a release heard by the
// waiter during a failed attempt would leave it waiting for its refresh.
// The Client's mu guards it.
type queueWake struct {
	ch    chan struct{}
	free  []bool // by master: woken, not refused since
	since []bool // by master: woken since the current attempt began
}

// heard records master i's wake-up; guarded by the Client's mu.
func (w *queueWake) heard(i, quorum int) {
	w.free[i], w.since[i] = true, true
	if w.freeAtQuorum(quorum) {
		select {
		case w.ch <- struct{}{}:
		default:
		}
	}
}

// freeAtQuorum reports whether a quorum of masters has woken the waiter
// and not refused it since; guarded by the Client's mu.
func (w *queueWake) freeAtQuorum(quorum int) bool {
	n := 0
	for _, ok := range w.free {
		if ok {
			n++
		}
	}
	return n >= quorum
}

// tried marks the start of an attempt: the wake-ups heard from now on
// are newer than its answers.
func (c *Client) tried(q *queued) {
	if q.w == nil {
		return
	}
	c.mu.Lock()
	clear(q.w.since)
	c.mu.Unlock()
}

// refusedBy forgets the wake-ups of the masters that answered q's
// attempt "held", unless they woke it again since the attempt began (a
// release after the refusal).
func (c *Client) refusedBy(q *queued, held []grant) {
	if q == nil || q.w == nil {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, g := range held {
		if !q.w.since[g.m.index] {
			q.w.free[g.m.index] = false
		}
	}
}

// grantedBy counts the masters that granted q's attempt a free slot as
// having woken it: the slot there is free for it once the attempt's key
// is deleted, should the attempt fail, and that deletion does not wake
// its own waiter (see Client.deleteAt).
func (c *Client) grantedBy(q *queued, gs []grant) {
	if q == nil || q.w == nil {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, g := range gs {
		if g.status == 1 {
			q.w.free[g.m.index] = true
		}
	}
}

// stillFree reports whether, after a failed attempt, a quorum of masters
// has still woken q and not refused it: the attempt failed on something
// else (a master's answer too late, say), and no further wake-up will
// come from them for this release.
func (c *Client) stillFree(q *queued) bool {
	if q.w == nil {
		return false
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return q.w.freeAtQuorum(c.quorum)
}

// queueRefresh is how often a waiter puts its entry back, as a fraction
// of the TTL (the entry's lifetime): every TTL/2 leaves half the TTL for
// a refresh to land before the entry expires, and keeps the refreshes of
// many waiters cheap. (At TTL/4, 256 waiters on 3 masters spent the
// machine on refreshes: lockbench contended made 101–126 hand-offs/s,
// against 271 at TTL/2.) The dead head's successor does not wait for its
// refresh: it tries when the head's entry expires (see waitQueued).
const queueRefresh = 2

// waitQueued is a Locker's wait once its first attempt failed (the name
// held): it joins the name's queue, then tries again when
// woken as the head (a release), after the back-off when a failed
// attempt left a quorum of wake-ups standing (see queueWake), when a
// refresh finds it the head of a free name (a wake-up lost), when the
// holder's keys would have expired
// (a holder dead without a release), or, next in line, when the head's
// entry expires (a head waiter dead); it leaves the queue as it returns.
func (c *Client) waitQueued(ctx context.Context, t target, floor *uint64) (locks.Lease, error) {
	q := t.q
	// A join that fails (fewer than a quorum answered: masters down, or
	// too slow under load) is contention, not failure: the waiter tries
	// again as it would have without a queue, and joins at its next
	// refresh.
	st, _ := c.join(ctx, t.name, q)
	var lease locks.Lease
	defer func() { c.leave(ctx, t.name, q, lease != nil) }()
	if cerr := ctx.Err(); cerr != nil {
		return nil, cerr
	}
	refresh := max(c.o.ttl/queueRefresh, time.Millisecond)
	refreshAt := time.Now().Add(refresh)
	var retryAt time.Time // zero: no retry but on a wake-up or a refresh
	later := func(d time.Duration) {
		if at := time.Now().Add(d); retryAt.IsZero() || at.Before(retryAt) {
			retryAt = at
		}
	}
	if st.second {
		later(st.headLeft)
	}
	polls := 0   // attempts while not joined: polling as without a queue
	rewakes := 0 // attempts since the last wake-up that left it standing
	if q.wake == nil {
		later(c.o.backoff.Delay(polls))
	}
	timer := time.NewTimer(refresh)
	defer timer.Stop()
	try := st.head
	for {
		if try {
			var err error
			c.tried(q)
			lease, err = c.acquire(ctx, t, floor)
			if cerr := ctx.Err(); err != nil && cerr != nil {
				if errors.Is(err, cerr) {
					return nil, err
				}
				return nil, fmt.Errorf("%w (the attempt: %v)", cerr, err)
			}
			if err == nil || !errors.Is(err, locks.ErrNotAcquired) {
				return lease, err
			}
			lease = nil
			retryAt = time.Time{}
			var he *locks.HeldError
			if errors.As(err, &he) && he.RetryAfter > 0 && (!isMember(he.Holder) || st.second) {
				// Held by a holder: try again when its keys would have
				// expired, should it die without a release. Refused for
				// the head waiter, next in line: when the head's entry
				// would have expired, should it be dead.
				later(he.RetryAfter)
			}
			if q.wake == nil {
				// Not in the queue (its join failed): no wake-up will
				// come; poll with the back-off, as a Semaphore waits.
				polls++
				later(c.o.backoff.Delay(polls))
			} else if c.stillFree(q) {
				// A quorum woke it and none of them refused it: the
				// attempt failed on something else (an answer too late).
				// Those masters will not wake it again for this release:
				// try again after the back-off.
				rewakes++
				later(c.o.backoff.Delay(rewakes))
			}
		}
		try = false
		next := refreshAt
		if !retryAt.IsZero() && retryAt.Before(next) {
			next = retryAt
		}
		if !timer.Stop() {
			select {
			case <-timer.C:
			default:
			}
		}
		timer.Reset(time.Until(next))
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-q.wake:
			try = true
			rewakes = 0
		case <-timer.C:
			now := time.Now()
			if !retryAt.IsZero() && !now.Before(retryAt) {
				try = true
				retryAt = time.Time{}
			}
			if !now.Before(refreshAt) {
				if q.wake == nil {
					st, _ = c.join(ctx, t.name, q)
				} else {
					st = c.refresh(ctx, t.name, q.member)
				}
				if st.second {
					later(st.headLeft)
				}
				try = st.head || try || q.wake == nil
				refreshAt = time.Now().Add(refresh)
			}
		}
	}
}

// isMember reports whether a holder named in a "held" answer is a queue
// member (the name refused for the queue's head), not a lease's holder.
func isMember(holder string) bool { return len(holder) > 17 && holder[16] == '|' }

// join takes a ticket and joins the name's queue on every master; it
// returns what the masters said of the waiter's place.
func (c *Client) join(ctx context.Context, name string, q *queued) (standing, error) {
	_, _, qn := c.queueKeys(name)
	admitted, err := c.admit(ctx, name)
	if err != nil {
		return standing{}, err
	}
	calls, cancel := context.WithTimeout(context.WithoutCancel(ctx), c.callTO)
	rs := c.callMasters(ctx, c.masters, func(ctx context.Context, m *master) (any, error) {
		return runScript(ctx, ticketScript, m.c, []string{qn})
	}, callPolicy{calls: calls, allDone: cancel, grace: true})
	admitted()
	var ticket int64
	answered, errs := 0, []error(nil)
	for _, r := range rs {
		v, ok := r.val.(int64)
		if r.err != nil || !ok {
			errs = append(errs, cmp.Or(r.err, fmt.Errorf("unexpected ticket reply %v", r.val)))
			continue
		}
		answered++
		ticket = max(ticket, v)
	}
	if answered < c.quorum {
		return standing{}, c.quorumError(name, answered, errs)
	}
	member := fmt.Sprintf("%016x|%s|%s", ticket, c.inbox, c.holderID())
	w := &queueWake{ch: make(chan struct{}, 1), free: make([]bool, len(c.masters)), since: make([]bool, len(c.masters))}
	wake := w.ch
	c.mu.Lock()
	c.qwake[member] = w
	if c.refreshes == nil {
		c.refreshes = map[string]*nameRefresh{}
	}
	g := c.refreshes[name]
	if g == nil {
		g = &nameRefresh{entries: map[string]*entryRefresh{}, idle: make(chan struct{})}
		c.refreshes[name] = g
	}
	g.entries[member] = &entryRefresh{}
	c.mu.Unlock()
	st, answered, errs := c.enqueue(ctx, name, member)
	if answered < c.quorum {
		c.mu.Lock()
		delete(c.qwake, member)
		c.mu.Unlock()
		c.leave(ctx, name, &queued{member: member, wake: wake}, false)
		return standing{}, c.quorumError(name, answered, errs)
	}
	q.member, q.wake, q.w = member, wake, w
	return st, nil
}

// standing is what a join or refresh learned of a waiter's place.
type standing struct {
	head     bool          // a master found it the head of a free name
	second   bool          // a master found it next after the head
	headLeft time.Duration // there, how long the head's entry has left
}

// enqueue puts member's entry on every master, for a TTL; it returns
// what the masters said of its place, and how many answered.
func (c *Client) enqueue(ctx context.Context, name, member string) (st standing, answered int, errs []error) {
	qk, qt, qn := c.queueKeys(name)
	keys := []string{qk, qt, qn, c.key(name, 1)}
	var ticket uint64
	_, _ = fmt.Sscanf(member[:16], "%x", &ticket)
	admitted, err := c.admit(ctx, name)
	if err != nil {
		return st, 0, []error{err}
	}
	calls, cancel := context.WithTimeout(context.WithoutCancel(ctx), c.callTO)
	rs := c.callMasters(ctx, c.masters, func(ctx context.Context, m *master) (any, error) {
		return runScript(ctx, enqueueScript, m.c, keys, member, c.o.priority, c.o.ttl.Milliseconds(), ticket)
	}, callPolicy{calls: calls, allDone: cancel, grace: true, order: memberOrder(member)})
	admitted()
	for _, r := range rs {
		if r.err != nil || !st.add(r.val) {
			errs = append(errs, cmp.Or(r.err, fmt.Errorf("unexpected enqueue reply %v", r.val)))
			continue
		}
		answered++
	}
	return st, answered, errs
}

// add takes one master's enqueue reply into st, and reports whether it
// was one.
func (st *standing) add(reply any) bool {
	vs, ok := reply.([]any)
	if !ok || len(vs) < 3 {
		return false
	}
	flag, _ := vs[0].(int64)
	rank, _ := vs[1].(int64)
	left, _ := vs[2].(int64)
	switch {
	case flag == 1:
		st.head = true
	case rank == 1:
		if d := millis(max(left, 1)); !st.second || d < st.headLeft {
			st.headLeft = d
		}
		st.second = true
	}
	return true
}

// leave forgets q's wake-up channel and, unless the Lock got the lease
// (got), takes q out of the name's queue on every master, waiting for the
// answers up to the call timeout even when ctx has ended, so that a Lock
// that gives up leaves nothing behind. A lease's member leaves the queue
// in its release script, on every master the release reaches (a master
// it does not reach lets the entry expire after the TTL).
func (c *Client) leave(ctx context.Context, name string, q *queued, got bool) {
	if q.wake == nil {
		return
	}
	c.mu.Lock()
	delete(c.qwake, q.member)
	if g := c.refreshes[name]; g != nil {
		delete(g.entries, q.member)
		if len(g.entries) == 0 && !g.busy {
			delete(c.refreshes, name)
		}
	}
	c.mu.Unlock()
	if got {
		return
	}
	qk, qt, _ := c.queueKeys(name)
	keys := []string{qk, qt, c.key(name, 1)}
	ctx = context.WithoutCancel(ctx)
	calls, cancel := context.WithTimeout(ctx, c.callTO)
	c.callMasters(ctx, c.masters, func(ctx context.Context, m *master) (any, error) {
		return runScript(ctx, dequeueScript, m.c, keys, q.member)
	}, callPolicy{calls: calls, allDone: cancel, grace: true, order: memberOrder(q.member)})
}

// nameRefresh is the queue entries of one name that this Client's Locks
// keep at the masters, refreshed together: a refresh is one pipeline of
// enqueue scripts per master for every entry due, one such step at a
// time per name, outside the admission of arrival steps (see admit).
// Refreshed one entry at a time, each admitted behind the name's other
// steps through the Client, the entries of many waiters, or of waiters
// of far masters, expired before their refreshes came, and each attempt
// found its own entry gone and another waiter at the head: none got the
// name. Guarded by the Client's mu.
type nameRefresh struct {
	entries map[string]*entryRefresh // by member
	busy    bool                     // a refresh step is under way
	idle    chan struct{}            // closed when it ends
}

// entryRefresh is one entry's refresh: asked for (due), then made, with
// what the masters said of its place (st, done).
type entryRefresh struct {
	due, done bool
	st        standing
}

// refresh puts member's entry back on every master (see enqueue), with
// the other entries of the name through this Client that are due, and
// returns what the masters said of its place. One waiter makes the
// step for all the entries then due; the others wait for it, on ctx.
func (c *Client) refresh(ctx context.Context, name, member string) standing {
	c.mu.Lock()
	g := c.refreshes[name]
	var e *entryRefresh
	if g != nil {
		e = g.entries[member]
	}
	if e == nil { // not joined (cannot happen: refresh follows a join)
		c.mu.Unlock()
		st, _, _ := c.enqueue(ctx, name, member)
		return st
	}
	e.due, e.done = true, false
	for {
		if e.done {
			st := e.st
			c.mu.Unlock()
			return st
		}
		if !g.busy {
			var members []string
			var batch []*entryRefresh
			for m, o := range g.entries {
				if o.due {
					o.due = false
					members = append(members, m)
					batch = append(batch, o)
				}
			}
			g.busy = true
			c.mu.Unlock()
			sts := c.enqueueAll(ctx, name, members)
			c.mu.Lock()
			for i, o := range batch {
				o.st, o.done = sts[i], true
			}
			g.busy = false
			close(g.idle)
			g.idle = make(chan struct{})
			if len(g.entries) == 0 {
				delete(c.refreshes, name)
			}
			continue
		}
		idle := g.idle
		c.mu.Unlock()
		select {
		case <-idle:
		case <-ctx.Done():
			return standing{}
		}
		c.mu.Lock()
	}
}

// enqueueAll puts the entries of members back on every master, in one
// pipeline per master (see enqueue), and returns what the masters said
// of each one's place.
func (c *Client) enqueueAll(ctx context.Context, name string, members []string) []standing {
	qk, qt, qn := c.queueKeys(name)
	keys := []string{qk, qt, qn, c.key(name, 1)}
	tickets := make([]uint64, len(members))
	order := &callOrder{}
	for i, member := range members {
		_, _ = fmt.Sscanf(member[:16], "%x", &tickets[i])
		order.joins = append(order.joins, memberChain(member))
	}
	calls, cancel := context.WithTimeout(context.WithoutCancel(ctx), c.callTO)
	rs := c.callMasters(ctx, c.masters, func(ctx context.Context, m *master) (any, error) {
		return enqueuePipeline(ctx, m, keys, members, tickets, c.o.priority, c.o.ttl.Milliseconds())
	}, callPolicy{calls: calls, allDone: cancel, grace: true, order: order})
	sts := make([]standing, len(members))
	for _, r := range rs {
		replies, ok := r.val.([]any)
		if r.err != nil || !ok {
			continue
		}
		for i, v := range replies {
			sts[i].add(v)
		}
	}
	return sts
}

// enqueuePipeline sends the enqueue script for every member to one
// master in one pipeline, loading the script and sending again once on
// NOSCRIPT (a master that restarted, say). It returns each member's
// reply (nil where it failed).
func enqueuePipeline(ctx context.Context, m *master, keys, members []string, tickets []uint64, prio int, lifeMS int64) ([]any, error) {
	for try := 0; ; try++ {
		pipe := m.c.Pipeline()
		cmds := make([]*redis.Cmd, len(members))
		for i, member := range members {
			cmds[i] = enqueueScript.EvalSha(ctx, pipe, keys, member, prio, lifeMS, tickets[i])
		}
		_, err := pipe.Exec(ctx)
		out := make([]any, len(members))
		noscript, answered := false, false
		for i, cmd := range cmds {
			v, err := cmd.Result()
			if err != nil && redis.HasErrorPrefix(err, "NOSCRIPT") {
				noscript = true
			}
			if err == nil {
				out[i], answered = v, true
			}
		}
		if err != nil && !answered && !noscript {
			return nil, m.sendErr(err)
		}
		if !noscript || try > 0 {
			return out, nil
		}
		if err := enqueueScript.Load(ctx, m.c).Err(); err != nil {
			return nil, err
		}
	}
}
