package contracttest

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/anishathalye/porcupine"

	"github.com/latchkey-go/latchkey/locks"
)

// work is one slot's loop: lock a random name, write through its fence,
// hold it, write again, release. A crashed client is replaced in its slot.
func (r *chaosRun) work(slot int, stop <-chan struct{}) {
	rng := rand.New(rand.NewPCG(r.cfg.Seed, 1<<32|uint64(slot)))
	for {
		select {
		case <-stop:
			return
		default:
		}
		cl := r.slot(slot)
		if cl == nil {
			time.Sleep(2 * time.Millisecond) // being refilled
			continue
		}
		name := r.names[rng.IntN(len(r.names))]
		hold := time.Duration(rng.Int64N(int64(r.cfg.MaxHold)) + 1)

		ctx, cancel := context.WithTimeout(cl.ctx, r.waitBound())
		if !cl.setWaiting(cancel) {
			cancel()
			time.Sleep(time.Millisecond) // dead: its slot is being refilled
			continue
		}
		r.reach(cl, stepAcquire, stop)
		call := r.now()
		lease, err := cl.l.Lock(ctx, name)
		ret := r.now()
		cl.setWaiting(nil)
		cancel()
		if err != nil {
			r.lockFailed(slot, cl, err)
			continue
		}
		r.hold(cl, name, lease, call, ret, hold, stop)
	}
}

// lockFailed counts a failed Lock of cl; a live client that says it is
// closed is closed and its slot refilled.
func (r *chaosRun) lockFailed(slot int, cl *chaosClient, err error) {
	if cl.isDead() {
		return
	}
	kind := errKind(err)
	r.mu.Lock()
	r.lockErrs[kind]++
	r.mu.Unlock()
	switch {
	case errors.Is(err, locks.ErrClosed):
		cl.mu.Lock()
		first := !cl.closed
		cl.closed, cl.dead = true, true
		cl.mu.Unlock()
		if first {
			cl.cancel()
			_ = closeClient(cl.c)
			r.setSlot(slot, nil)
			r.broken <- slot // one at a time per slot: never blocks
		}
	case ctxErr(err):
	default:
		time.Sleep(5 * time.Millisecond) // do not spin on a broker that refuses
	}
}

func ctxErr(err error) bool {
	return errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled)
}

// errKind names err for the summary: a context's error, ErrClosed, or the
// first error in its tree of a type of the backend's (such as a quorum
// error); else the sentinel it wraps, or its text.
func errKind(err error) string {
	switch {
	case errors.Is(err, context.DeadlineExceeded):
		return "deadline"
	case errors.Is(err, context.Canceled):
		return "cancelled"
	case errors.Is(err, locks.ErrClosed):
		return "closed"
	}
	plain := func(e error) bool {
		switch fmt.Sprintf("%T", e) {
		case "*fmt.wrapError", "*fmt.wrapErrors", "*errors.errorString", "*errors.joinError":
			return true
		}
		return false
	}
	queue := []error{err}
	for len(queue) > 0 {
		e := queue[0]
		queue = queue[1:]
		if !plain(e) {
			return fmt.Sprintf("%T", e)
		}
		switch u := e.(type) {
		case interface{ Unwrap() error }:
			if w := u.Unwrap(); w != nil {
				queue = append(queue, w)
			}
		case interface{ Unwrap() []error }:
			queue = append(queue, u.Unwrap()...)
		}
	}
	for _, s := range []error{locks.ErrNotAcquired, locks.ErrLost, locks.ErrPreempted, locks.ErrInvalidName, locks.ErrInvalidOption} {
		if errors.Is(err, s) {
			return s.Error()
		}
	}
	msg := err.Error()
	if len(msg) > 60 {
		msg = msg[:60] + "…"
	}
	return msg
}

// hold runs one critical section of cl on name.
func (r *chaosRun) hold(cl *chaosClient, name string, lease locks.Lease, call, ret, hold time.Duration, stop <-chan struct{}) {
	token := lease.Token()
	if r.caps.Fencing {
		r.mu.Lock()
		r.ops[name] = append(r.ops[name], porcupine.Operation{
			ClientId: cl.num, Input: name, Call: int64(call), Output: token, Return: int64(ret),
		})
		r.mu.Unlock()
	}
	exit, ok := r.enter(cl, name, token, lease)
	if ok {
		r.write(cl, name, lease)
		r.reach(cl, stepHold, stop)
		select {
		case <-time.After(hold):
		case <-lease.Context().Done():
		case <-cl.ctx.Done():
		}
		r.write(cl, name, lease)
		exit()
	}
	if cl.isDead() {
		if r.guard != nil && ok {
			r.lateWrite(cl, name, lease, stop)
		}
		return // a crashed process releases nothing
	}
	r.reach(cl, stepRelease, stop)
	rctx, rcancel := context.WithTimeout(context.Background(), opTimeout)
	_ = lease.Release(rctx) // may fail after a fault: the lease is gone anyway
	rcancel()
}

// enter opens a section unless cl is dead (a dead process does nothing).
// The section ends when exit is called or, if the lease has ended by
// then, when it ended, if that is earlier: a holder stops when told (its
// context's Err reports the end at once, also at a validity deadline),
// and the goroutine leaving the section may run a little later. The end
// is taken as the earlier of a callback of the context (no earlier than
// the lease really ended) and the lease's validity deadline, if it has
// one and it has passed.
func (r *chaosRun) enter(cl *chaosClient, name string, token uint64, lease locks.Lease) (exit func(), ok bool) {
	cl.mu.Lock()
	defer cl.mu.Unlock()
	if cl.dead {
		return nil, false
	}
	// The other sections open on name whose leases have ended, ended
	// before now: before this one begins. (The callback below says so
	// too, but from a goroutine of its own, which may run after this
	// section began: a theft that ends the victim's lease just before the
	// thief's Lock returns would seem to overlap.)
	o := &openSection{lease: lease}
	r.mu.Lock()
	now := r.now()
	for other := range r.open[name] {
		if other.lease.Context().Err() != nil {
			other.endBy(now)
		}
	}
	if lease.Context().Err() != nil {
		o.endBy(now) // before it began: the section will be empty
	}
	if r.open[name] == nil {
		r.open[name] = map[*openSection]bool{}
	}
	r.open[name][o] = true
	r.mu.Unlock()
	s := Span{Who: cl.id, Token: token, Enter: r.now()}
	stop := context.AfterFunc(lease.Context(), func() { o.endBy(r.now()) })
	end := sync.OnceFunc(func() {
		stop()
		s.Exit = r.now()
		if lease.Context().Err() != nil {
			s.Ended = fmt.Sprint(context.Cause(lease.Context()))
			if e := time.Duration(o.ended.Load() - 1); e >= 0 && e < s.Exit {
				s.Exit = max(e, s.Enter)
			}
			if d, ok := lease.(interface{ Deadline() time.Time }); ok && !d.Deadline().IsZero() {
				if e := d.Deadline().Sub(r.start); e < s.Exit {
					s.Exit = max(e, s.Enter)
				}
			}
		}
		r.mu.Lock()
		delete(r.open[name], o)
		switch {
		case s.Exit <= s.Enter:
			// The lease ended (taken, or its validity passed) before
			// its holder entered: a holder that stops when told did
			// nothing, and holds nothing to check.
			r.empty++
		case s.Ended != "":
			r.ended++
			fallthrough
		default:
			r.spans[name] = append(r.spans[name], s)
		}
		r.mu.Unlock()
		delete(cl.held, name) // callers hold cl.mu
	})
	cl.held[name] = end
	return func() {
		cl.mu.Lock()
		defer cl.mu.Unlock()
		end()
	}, true
}

// openSection is a section in progress: its lease, and the earliest time
// its lease was seen ended, +1 (0 while it was not).
type openSection struct {
	lease locks.Lease
	ended atomic.Int64
}

// endBy records that the section's lease had ended by at.
func (o *openSection) endBy(at time.Duration) {
	for {
		old := o.ended.Load()
		if old != 0 && old <= int64(at)+1 || o.ended.CompareAndSwap(old, int64(at)+1) {
			return
		}
	}
}

// write writes through name's fence while cl is alive and its lease
// live, and through the run's guard, if any, while cl is alive.
func (r *chaosRun) write(cl *chaosClient, name string, lease locks.Lease) {
	if !r.caps.Fencing {
		return
	}
	cl.mu.Lock()
	dead, live := cl.dead, lease.Context().Err() == nil
	if !dead && live {
		if err := r.fences[name].Write(cl.id, lease.Token()); err != nil {
			r.mu.Lock()
			r.rejected++
			r.mu.Unlock()
		}
	}
	cl.mu.Unlock()
	if r.guard != nil && !dead {
		// Through the guard, also after the lease ended: a holder that
		// did not look in time writes all the same.
		r.guardWriteThrough(cl, name, lease, !live)
	}
}

// setWaiting records the cancel func of cl's Lock in flight; it reports
// false when cl is dead.
func (c *chaosClient) setWaiting(cancel context.CancelFunc) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.waiting = cancel
	return !c.dead
}

func (c *chaosClient) isDead() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.dead
}

// kill marks c dead and ends its open sections now, returning the names
// it held. It reports false if c was dead already.
func (c *chaosClient) kill() (names []string, ok bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.dead {
		return nil, false
	}
	c.dead = true
	for name, exit := range c.held {
		names = append(names, name)
		exit()
	}
	return names, true
}
