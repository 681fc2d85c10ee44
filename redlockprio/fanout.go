package redlockprio

import (
	"context"
	"errors"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/latchkey-go/latchkey/locks"
)

// The callPolicy-out engine: every step sends one call to each master in
// parallel, on the Client's workers, and returns as soon as its outcome
// is decided; the calls still running go on in the background.

// answer is one master's answer to a step.
type answer struct {
	m   *master
	val any
	err error
}

// workerIdle is how long an idle worker waits for a call before it exits.
const workerIdle = 5 * time.Second

// runOnWorker runs f on one of the Client's workers: an idle one, or a new one
// that Close waits for. Reusing workers spares each call to a master a
// goroutine start and the growth of its stack through the client's call
// path. It reports whether f will run: not once the Client is closed.
func (c *Client) runOnWorker(f func()) bool {
	if c.closedFlag.Load() {
		return false
	}
	select {
	case c.work <- f:
		return true
	default:
	}
	return c.goTracked(func() { c.worker(f) })
}

func (c *Client) worker(f func()) {
	idle := time.NewTimer(workerIdle)
	defer idle.Stop()
	for {
		f()
		f = nil
		idle.Reset(workerIdle)
		select {
		case f = <-c.work:
		case <-idle.C:
			return
		case <-c.done:
			return
		}
	}
}

// callPolicy tunes a callMasters.
type callPolicy struct {
	// decides, if set, says from the answers so far that the outcome is
	// decided: callMasters returns them without waiting for the others.
	decides func([]answer) bool
	// late, if set, gets each answer that arrives after callMasters returned,
	// on the worker that got it.
	late func(answer)
	// allDone, if set, is called once every call has returned (after late).
	allDone func()
	// calls, if set, is the context of the calls; ctx then bounds only
	// the wait for their answers.
	calls context.Context
	// order, if set, orders the calls after this Client's earlier calls
	// at each master that belong to the same lease or waiter (see
	// callOrder).
	order *callOrder
	// grace, if set, bounds the wait for stragglers: once a majority of
	// the masters called have answered without error, the others are
	// waited for at most as long again as that took (graceMin at least),
	// then given errStraggler; their answers go to late. A hung minority
	// then costs a step a round trip or two, not the call timeout.
	grace bool
}

// graceMin is the least wait for stragglers (see callPolicy.grace).
const graceMin = 2 * time.Millisecond

// errStraggler is the error callMasters gives a master that had not answered
// when a majority had and the grace for the others was over; its answer
// goes to callPolicy.late.
var errStraggler = errors.New("no answer within the grace after a majority answered")

// inFlight is what the calls of one callMasters share with its collector.
type inFlight struct {
	mu      sync.Mutex
	ch      chan answer
	stopped bool // the collector returned: answers go to late
	left    atomic.Int32
	late    func(answer)
	allDone func()
}

func (st *inFlight) deliver(r answer) {
	st.mu.Lock()
	if !st.stopped {
		st.ch <- r // buffered for every call: never blocks
		st.mu.Unlock()
	} else {
		st.mu.Unlock()
		if st.late != nil {
			st.late(r)
		}
	}
	st.finish()
}

func (st *inFlight) finish() {
	if st.left.Add(-1) == 0 && st.allDone != nil {
		st.allDone()
	}
}

// callMasters runs step on every master of ms in parallel and collects the
// answers until all are in, ctx ends, or f.decides says the outcome is
// decided. When ctx ends first, masters that have not answered get a
// context error. Calls still running when callMasters returns finish in
// the background (Close waits for them); see callPolicy for what becomes
// of them.
func (c *Client) callMasters(ctx context.Context, ms []*master, step func(ctx context.Context, m *master) (any, error), f callPolicy) []answer {
	calls := f.calls
	if calls == nil {
		calls = ctx
	}
	if c.inline() && len(ms) == 1 && ctx.Err() == nil {
		return c.callInline(ctx, calls, ms[0], step, f)
	}
	st := &inFlight{ch: make(chan answer, len(ms)), late: f.late, allDone: f.allDone}
	st.left.Store(int32(len(ms)))
	started := 0
	for _, m := range ms {
		var prev []<-chan struct{}
		seqDone := func() {}
		if f.order != nil {
			prev, seqDone = c.sequence(m, f.order)
		}
		if c.runOnWorker(func() {
			var v any
			err := unsent(waitFor(calls, prev))
			if err == nil {
				v, err = step(calls, m)
			}
			seqDone()
			st.deliver(answer{m: m, val: v, err: err})
		}) {
			started++
		} else {
			seqDone()
			st.finish()
		}
	}
	got, decided, graceOver := st.collect(ctx, f, len(ms), started)
	if decided || len(got) == len(ms) {
		return got
	}
	for _, m := range ms {
		if !slices.ContainsFunc(got, func(r answer) bool { return r.m == m }) {
			err := ctx.Err()
			if err == nil && f.calls != nil {
				err = f.calls.Err()
			}
			if err == nil && graceOver {
				err = errStraggler
			}
			if started < len(ms) && err == nil {
				err = locks.ErrClosed
			}
			if err == nil {
				err = context.Canceled
			}
			got = append(got, answer{m: m, err: &masterError{index: m.index, addr: m.addr, err: err}})
		}
	}
	return got
}

// callInline makes the one call of a step to one master on the caller's
// goroutine: its answer is the outcome, so this spares two goroutine
// switches. The client ends it at the context's deadline (see
// inlineContext). (Once ctx has ended, a call is made on a worker, and not
// waited for.) It waits for this Client's calls it is ordered after that
// still run in the background (see sequence), but need not be waited
// for: the caller makes its next call after this one returns.
func (c *Client) callInline(ctx, calls context.Context, m *master, step func(ctx context.Context, m *master) (any, error), f callPolicy) []answer {
	cctx := inlineContext(ctx, calls)
	var prev []<-chan struct{}
	if f.order != nil {
		prev = c.pending(m, f.order)
	}
	var v any
	err := unsent(waitFor(cctx, prev))
	if err == nil {
		v, err = step(cctx, m)
	}
	if err != nil && cctx == ctx {
		if d, ok := ctx.Deadline(); ok && !time.Now().Before(d) {
			// The client's timeout may come a hair before ctx's own
			// timer: let ctx say so, so that callers see its error.
			<-ctx.Done()
		}
	}
	if err != nil {
		err = &masterError{index: m.index, addr: m.addr, err: err}
	}
	if f.allDone != nil {
		f.allDone()
	}
	return []answer{{m: m, val: v, err: err}}
}

// collect gathers the answers of the started calls of n until all are in,
// ctx or f.calls ends, f.decides says the outcome is decided (decided), or
// the grace for stragglers is over (graceOver); answers that come later go
// to f.late.
func (st *inFlight) collect(ctx context.Context, f callPolicy, n, started int) (got []answer, decided, graceOver bool) {
	got = make([]answer, 0, n)
	add := func(r answer) {
		if r.err != nil {
			r.err = &masterError{index: r.m.index, addr: r.m.addr, err: r.err}
		}
		got = append(got, r)
	}
	var callsDone <-chan struct{} // the calls' deadline: stop waiting then too
	if f.calls != nil {
		callsDone = f.calls.Done()
	}
	var (
		graceC <-chan time.Time
		begun  = time.Now()
	)
	for !decided && len(got) < started {
		select {
		case r := <-st.ch:
			add(r)
			decided = f.decides != nil && f.decides(got)
			if f.grace && graceC == nil && !decided {
				ok := 0
				for _, r := range got {
					if r.err == nil {
						ok++
					}
				}
				if ok >= n/2+1 {
					t := time.NewTimer(max(2*time.Since(begun), graceMin))
					defer t.Stop()
					graceC = t.C
				}
			}
			continue
		case <-ctx.Done():
		case <-callsDone:
		case <-graceC:
			graceOver = true
		}
		break
	}
	st.mu.Lock()
	st.stopped = true
	for drained := false; !drained; {
		select {
		case r := <-st.ch: // answered meanwhile: as good as in time
			add(r)
		default:
			drained = true
		}
	}
	st.mu.Unlock()
	return got, decided, graceOver
}

// inline says whether the Client's calls run on the caller's goroutine:
// with one master, whose client ends each call at its context's deadline.
func (c *Client) inline() bool {
	return len(c.masters) == 1 && c.masters[0].deadlines
}

// inlineContext is the context of a call callMasters runs on the caller's
// goroutine: calls, unless ctx is live and has an earlier deadline, so
// that the call ends no later than the wait for it would have (a client
// that honors deadlines ends it then; a plain cancellation of ctx cannot
// cut it short), and a call the caller wants to outlive ctx (a release)
// is still made when ctx has ended.
func inlineContext(ctx, calls context.Context) context.Context {
	if calls == ctx || ctx.Err() != nil {
		return calls
	}
	cd, ok := calls.Deadline()
	if d, has := ctx.Deadline(); has && (!ok || d.Before(cd)) {
		return ctx
	}
	return calls
}

// seqKey is one chain of calls at one master (see callOrder).
type seqKey struct {
	master int
	chain  string
}

// callOrder says which of this Client's earlier calls at a master a call
// waits for there: the last call of each chain it joins (and then is
// itself the last of), and the last of each chain it only comes after.
// A chain is a lease's calls (its claim: the acquire, the deletion of
// what a failed attempt got, the release), a waiter's queue entry (its
// enqueues, its leave, its lease's release), or the calls that free a
// name's keys (deletions and releases), which a new attempt of the name
// comes after. Calls of different leases and waiters are not ordered:
// many Locks of one name through one Client do not wait behind each
// other's calls.
type callOrder struct {
	joins []string
	after []string
}

// The chains of callOrder: a claim's, a queue member's, and the calls
// freeing a name's keys.
func claimChain(cl *claim) string      { return "claim\x00" + cl.id }
func memberChain(member string) string { return "member\x00" + member }
func freeChain(name string) string     { return "free\x00" + name }

// acquireOrder orders an attempt's acquire: in its claim's chain (its
// deletions and release come after it), after this Client's calls
// freeing the name (a release returned at a quorum, its other calls still
// running: the next attempt must not find that lease's key there, which
// would leave it a bare quorum), and after the enqueues of its queue
// member, if it has one (a master its join or refresh has yet to reach
// would see another waiter at the head, and refuse it).
func acquireOrder(cl *claim, member string) *callOrder {
	o := &callOrder{joins: []string{claimChain(cl)}, after: []string{freeChain(cl.name)}}
	if member != "" && member != "-" {
		o.after = append(o.after, memberChain(member))
	}
	return o
}

// freeOrder orders a deletion of cl's keys: after its acquire (else a
// straggling acquire would set the key again, left until the TTL), and
// before the next attempt of the name.
func freeOrder(cl *claim) *callOrder {
	return &callOrder{joins: []string{claimChain(cl), freeChain(cl.name)}}
}

// releaseOrder orders a lease's release: as freeOrder, and after its
// queue member's enqueues, if it waited (else a straggling refresh would
// put the entry back after the release took it out, and it would block
// the queue until it expired).
func releaseOrder(cl *claim) *callOrder {
	o := freeOrder(cl)
	if cl.member != "" {
		o.joins = append(o.joins, memberChain(cl.member))
	}
	return o
}

// memberOrder orders the calls about a waiter's queue entry: its
// enqueues (join and refreshes) and its leave, so that a straggling
// enqueue does not put it back after it left.
func memberOrder(member string) *callOrder {
	return &callOrder{joins: []string{memberChain(member)}}
}

// sequence orders this Client's calls at m by o: it returns channels
// closed once the calls this one waits for (see callOrder) have returned,
// and the function to call when this one has returned. Calls are
// sequenced in the order callMasters issues them, so that at each master
// they run in that order, though callMasters returns once a quorum has
// answered and the other calls go on in the background. A call waits
// only for calls issued before it: chains never wait in a circle.
func (c *Client) sequence(m *master, o *callOrder) ([]<-chan struct{}, func()) {
	mine := make(chan struct{})
	prev := make([]<-chan struct{}, 0, len(o.joins)+len(o.after))
	c.seqMu.Lock()
	for _, chain := range o.after {
		if p := c.seq[seqKey{m.index, chain}]; p != nil {
			prev = append(prev, p)
		}
	}
	for _, chain := range o.joins {
		k := seqKey{m.index, chain}
		if p := c.seq[k]; p != nil {
			prev = append(prev, p)
		}
		c.seq[k] = mine
	}
	c.seqMu.Unlock()
	return prev, func() {
		close(mine)
		c.seqMu.Lock()
		for _, chain := range o.joins {
			k := seqKey{m.index, chain}
			if c.seq[k] == mine {
				delete(c.seq, k)
			}
		}
		c.seqMu.Unlock()
	}
}

// pending returns channels closed once this Client's calls at m that a
// call ordered by o waits for have returned (none if none is running).
func (c *Client) pending(m *master, o *callOrder) []<-chan struct{} {
	c.seqMu.Lock()
	defer c.seqMu.Unlock()
	var prev []<-chan struct{}
	for _, chain := range slices.Concat(o.joins, o.after) {
		if p := c.seq[seqKey{m.index, chain}]; p != nil {
			prev = append(prev, p)
		}
	}
	return prev
}

// waitFor waits until every channel of prev is closed or ctx ends.
func waitFor(ctx context.Context, prev []<-chan struct{}) error {
	for _, p := range prev {
		select {
		case <-p:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return nil
}
