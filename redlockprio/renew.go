package redlockprio

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/latchkey-go/latchkey/locks/driver"
)

// startRenewerLocked starts the Locker's one renewal goroutine unless it
// runs already. l.mu must be held.
func (l *Locker) startRenewerLocked() {
	if l.renewing || l.closed {
		return
	}
	l.renewing = true
	l.wg.Go(l.renewLoop)
}

// renewLoop renews every held lease once per renewal interval, in one
// pipelined round trip per master, and exits when no lease is held or the
// Locker closes.
func (l *Locker) renewLoop() {
	l.preloadRenew()
	t := time.NewTicker(l.o.renew)
	defer t.Stop()
	for {
		select {
		case <-l.done:
			l.mu.Lock()
			l.renewing = false
			l.mu.Unlock()
			return
		case <-t.C:
		}
		l.mu.Lock()
		var batch []*Lease
		for id, e := range l.entries {
			if e.base == nil {
				continue // an attempt in flight
			}
			if !e.base.Live() {
				// Forgotten once no notice about it can need waiting
				// for: settled, and let go or past its validity.
				if e.isSettled() && e.isLetGo() {
					delete(l.entries, id)
				}
				continue
			}
			batch = append(batch, e)
		}
		if len(batch) == 0 {
			l.renewing = false
			l.mu.Unlock()
			return
		}
		tokens := make([]uint64, len(batch))
		for i, e := range batch {
			tokens[i] = e.token
		}
		l.mu.Unlock()
		l.renewBatch(batch, tokens)
	}
}

// renewal is one master's answer for one lease: 1 extended, 0 gone,
// -1 taken by a higher priority, or an error.
type renewal struct {
	code int64
	err  error
}

func (l *Locker) renewBatch(batch []*Lease, tokens []uint64) {
	start := time.Now()
	// A slow round (a large batch, a loaded master) may take longer than
	// the interval: allow it until the earliest validity in the batch,
	// less the time to end the leases before their deadline if it fails,
	// but never past that deadline less the drift allowance: a round that
	// hangs must leave its leases time to end with ErrLost (below) before
	// their validity runs out, rather than reach it.
	var earliest time.Time
	for _, e := range batch {
		if dl := e.base.Deadline(); earliest.IsZero() || dl.Before(earliest) {
			earliest = dl
		}
	}
	limit := later(start.Add(l.o.renew), earliest.Add(-l.o.renew-l.drift))
	if last := earliest.Add(-l.drift); limit.After(last) {
		limit = last
	}
	ctx, cancel := context.WithDeadline(context.Background(), limit)
	defer cancel()
	ttlMS := l.o.ttl.Milliseconds()
	// Decide as soon as every lease has a quorum of extensions; a dead or
	// hung minority does not hold the tick up.
	allRenewed := func(rs []result) bool {
		for i := range batch {
			n := 0
			for _, r := range rs {
				if r.err == nil && r.val.([]renewal)[i].code == 1 && r.val.([]renewal)[i].err == nil {
					n++
				}
			}
			if n < l.quorum {
				return false
			}
		}
		return true
	}
	// The calls run on a context of their own, until the same limit,
	// which the round's end does not cancel: a master still at work when
	// the others have decided the round (one that answered NOSCRIPT and
	// reloads the script, say) renews its keys all the same.
	calls, callsDone := context.WithDeadline(context.Background(), limit)
	rs := l.fanout(ctx, l.masters, func(ctx context.Context, m *master) (any, error) {
		if err := l.verify(ctx, m); err != nil {
			return nil, err // its answers do not count until it is
		}
		return renewPipeline(ctx, m, batch, tokens, ttlMS)
	}, fan{enough: allRenewed, calls: calls, done: callsDone})
	deadline := l.deadlineFor(start)
	for i, e := range batch {
		ok, pre, gone := 0, 0, 0
		closed := 0
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
		case ok >= l.quorum:
			e.base.Extend(deadline)
		case ok+unknown < l.quorum && pre > 0:
			e.base.End(driver.Preempted(fmt.Errorf("redlockprio: %q taken by a higher priority on %d masters", e.name, pre)))
		case ok+unknown < l.quorum:
			e.base.End(driver.Lost(fmt.Errorf("redlockprio: %q: keys gone or taken on %d masters: %w", e.name, gone+pre+closed,
				&QuorumError{Got: ok, Need: l.quorum, Errs: errs})))
		case time.Until(e.base.Deadline()) < l.o.renew+l.drift:
			// The next tick could come too late: give up now, before the
			// validity runs out.
			e.base.End(driver.Lost(fmt.Errorf("redlockprio: %q: renewal failed: %w", e.name,
				&QuorumError{Got: ok, Need: l.quorum, Errs: errs})))
		}
	}
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
func (l *Locker) preloadRenew() {
	for _, m := range l.masters {
		if m.renewScript.CompareAndSwap(scriptUnknown, scriptLoading) {
			if !l.spawn(func() {
				ctx, cancel := context.WithTimeout(context.Background(), l.o.renew)
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
func renewPipeline(ctx context.Context, m *master, batch []*Lease, tokens []uint64, ttlMS int64) ([]renewal, error) {
	c := m.c
	out := make([]renewal, len(batch))
	for try := 0; ; try++ {
		pipe := c.Pipeline()
		cmds := make([]*redis.Cmd, len(batch))
		for i, e := range batch {
			cmds[i] = renewScript.EvalSha(ctx, pipe, []string{e.key, e.fence}, e.id, ttlMS, tokens[i])
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

func (e *Lease) isSettled() bool {
	select {
	case <-e.settled:
		return true
	default:
		return false
	}
}

// isLetGo reports whether the lease's holder has let go of it (Release)
// or its validity has run out.
func (e *Lease) isLetGo() bool {
	select {
	case <-e.letGo:
		return true
	default:
		return !time.Now().Before(e.base.Deadline())
	}
}
