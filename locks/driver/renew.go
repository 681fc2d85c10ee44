package driver

import (
	"context"
	"errors"
	"time"

	"github.com/latchkey-go/latchkey/locks"
)

// renewLoop renews the registry's live leases every r.every, in one
// batch per round, and exits when none is left live or the registry
// closes; NewLease starts it again.
func (r *Registry) renewLoop() {
	r.loops.Add(1)
	defer r.loops.Add(-1)
	t := time.NewTicker(r.every)
	defer t.Stop()
	for {
		select {
		case <-r.ctx.Done():
			r.stopRenewing()
			return
		case <-t.C:
		}
		batch := r.renewBatch()
		if batch == nil {
			return
		}
		r.renewRound(batch)
	}
}

func (r *Registry) stopRenewing() {
	r.mu.Lock()
	r.renewing = false
	r.mu.Unlock()
}

// renewBatch returns the live leases, each counted into the round, or nil
// (and marks the loop stopped) when there are none.
func (r *Registry) renewBatch() []*Lease {
	r.mu.Lock()
	defer r.mu.Unlock()
	var batch []*Lease
	for l := range r.leases {
		if l.joinRound() {
			batch = append(batch, l)
		}
	}
	if len(batch) == 0 {
		r.renewing = false
		return nil
	}
	return batch
}

// renewRound runs one RenewFunc call on batch and applies its answers:
// it extends the renewed leases, ends every lost one at once, then runs
// the lost leases' clean-ups concurrently, each in a goroutine Close
// waits for, so that a slow clean-up holds up neither the other leases'
// ends nor the next round. A lease's Release waits for its clean-up.
func (r *Registry) renewRound(batch []*Lease) {
	ctx, cancel := r.roundContext(batch)
	start := time.Now()
	answers := r.renew(ctx, batch)
	cancel()
	round := Event{Kind: EventRenewRound, Leases: len(batch), Duration: time.Since(start)}
	var cleanups []func()
	for i, l := range batch {
		var a Renewal
		if i < len(answers) {
			a = answers[i]
		}
		switch {
		case a.Err == nil:
			if !a.Until.IsZero() {
				l.Extend(a.Until)
			}
		case errors.Is(a.Err, locks.ErrLost):
			l.End(a.Err)
			if a.Then != nil {
				cleanups = append(cleanups, func() {
					defer l.roundDone()
					a.Then()
				})
				continue // its Done comes after the clean-up
			}
		default:
			round.Failed++
			r.events.Emit(Event{Kind: EventRenewFailed, Name: l.Name(), Token: l.Token(), Err: a.Err})
		}
		l.roundDone()
	}
	r.events.Emit(round)
	for _, f := range cleanups {
		r.wg.Go(f) // the loop itself counts in wg, so Close has not finished waiting
	}
}

// roundContext ends at the earliest validity deadline in batch, or when
// the registry closes.
func (r *Registry) roundContext(batch []*Lease) (context.Context, context.CancelFunc) {
	var earliest time.Time
	for _, l := range batch {
		if dl := l.Deadline(); !dl.IsZero() && (earliest.IsZero() || dl.Before(earliest)) {
			earliest = dl
		}
	}
	if earliest.IsZero() {
		return context.WithCancel(r.ctx)
	}
	return context.WithDeadline(r.ctx, earliest)
}
