package natsputex

import (
	"context"
	"fmt"
	"time"

	"github.com/latchkey-go/latchkey/locks/driver"
)

// This file holds the Supervisor's paths through a pump cycle: renewing
// the key it holds, taking a free key, its own token, or a silent
// holder's key over, and confirming.

// renew is the path of a key the agent holds: health check (once the
// confirmations are done), rewrite the token at the agent's own last
// revision, and start the service when the confirmations are done.
func (s *Supervisor) renew(ctx context.Context) {
	s.mu.Lock()
	phase, rev, cf, value := s.phase, s.lastRev, s.conf, s.value
	s.mu.Unlock()
	confirming := phase == PhaseConfirming && cf != nil
	if confirming {
		// The timing of the hold it confirms for, until it is done (its
		// last confirmation too).
		value = cf.value
	}
	due := !confirming || cf.due(time.Now())
	if due {
		if err := s.c.healthCheck(ctx, Active); err != nil {
			if ctx.Err() == nil {
				s.abort(ctx, "health check failed", err)
			}
			return
		}
	}
	wctx, cancel := s.writeContext(ctx)
	defer cancel()
	start := time.Now()
	var nrev uint64
	var err error
	if confirming {
		nrev, err = s.c.confirmWrite(wctx, cf, value, due, rev)
	} else {
		nrev, err = s.c.st.renew(wctx, s.key, value, rev)
	}
	if err != nil {
		if ctx.Err() == nil {
			s.writeFailed(err)
			s.abort(ctx, "write failed", err)
		}
		return
	}
	s.wrote(nrev, start)
	if confirming && due {
		s.mu.Lock()
		s.unconfirmed = false // C·R of its own writes: the key may be blanked again
		s.mu.Unlock()
		s.activate(ctx)
	}
}

// isOwn reports whether v is a value this agent writes: its token and
// timing, or the longer timing it writes while it confirms.
func (s *Supervisor) isOwn(v string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return v == s.value || s.cur != "" && v == s.cur
}

// holderTiming returns how long a standby waits for silence before it
// takes the key from the holder whose value it read, and how long it then
// confirms: the longer of its own timing and the one the value carries
// (its own if it carries none: a value written by hand; a Locker's token
// carries its T only).
func (s *Supervisor) holderTiming(value string) timing {
	t := s.c.o.timing()
	holder, ht, ok := parseValue(value)
	if !ok {
		return t
	}
	if ht.ttl > t.ttl || ht.confirm > t.confirm {
		s.mu.Lock()
		said := s.seenTiming == value
		s.seenTiming = value
		s.mu.Unlock()
		if !said {
			s.event(PhaseStandby, fmt.Sprintf("the holder's timing (%v) is longer than this agent's (%v): waiting as long as the holder counts on; all agents on a key should share R, F and C", ht, t), nil, withHolder(holder, 0))
		}
	}
	return t.longer(ht)
}

// takeFree is the path of a free key: health check, write, start the
// service at once.
func (s *Supervisor) takeFree(ctx context.Context, r record) {
	if s.heldOff() {
		return
	}
	if err := s.c.healthCheck(ctx, Active); err != nil {
		if ctx.Err() == nil {
			s.abort(ctx, "health check failed", err)
		}
		return
	}
	wctx, cancel := s.writeContext(ctx)
	defer cancel()
	start := time.Now()
	rev, err := s.c.st.claim(wctx, s.key, s.value, r)
	switch {
	case err != nil && ctx.Err() != nil:
		return
	case isConflict(err):
		s.event(PhaseStandby, "another agent took the free key first", nil)
		return
	case err != nil:
		s.writeFailed(err)
		s.abort(ctx, "write failed", err)
		return
	}
	s.mu.Lock()
	s.holdRev, s.conf, s.unconfirmed = rev, nil, false
	s.mu.Unlock()
	s.wrote(rev, start)
	s.activate(ctx)
}

// heldOff reports whether the agent leaves the key to the others for now,
// after its Start failed; it says so once.
func (s *Supervisor) heldOff() bool {
	s.mu.Lock()
	wait, said := time.Until(s.holdOff), s.holdOffMsg
	s.holdOffMsg = s.holdOffMsg || wait > 0
	s.mu.Unlock()
	if wait > 0 && !said {
		s.event(PhaseStandby, fmt.Sprintf("Start failed: leaving the key to the other agents for %v", wait.Round(time.Millisecond)), nil)
	}
	return wait > 0
}

// takeOwn is the path of a key holding the agent's own token while it
// does not hold the key: its own last write, or a write whose answer was
// lost and that may have landed. The agent writes at the revision it read
// and confirms, as after a takeover: its first write it saw succeed
// starts the confirmation clock.
func (s *Supervisor) takeOwn(ctx context.Context, r record, why string) {
	if s.heldOff() {
		return
	}
	if err := s.c.healthCheck(ctx, Standby); err != nil {
		if ctx.Err() == nil {
			s.event(PhaseStandby, "health check failed", err)
		}
		return
	}
	// Its own write may carry a longer timing, that of a hold it was
	// confirming for: it keeps it.
	tm := s.c.o.timing()
	if _, ht, ok := parseValue(r.holder); ok {
		tm = tm.longer(ht)
	}
	value := s.confirmValue(tm)
	wctx, cancel := s.writeContext(ctx)
	rev, start, err := s.c.takeOver(wctx, s.key, s.key, value, r)
	cancel()
	if err != nil {
		if ctx.Err() == nil {
			s.writeFailed(err)
			s.event(PhaseStandby, "write failed", err, withHolder(r.holder, r.rev))
		}
		return
	}
	s.confirm(ctx, confirmationOf(s.key, s.key, value, rev, start, tm), why)
}

// confirmValue returns what the agent writes while it confirms a hold
// taken with timing tm (the longer of its own and its predecessor's), and
// remembers it: its token and tm, so that should it give up (or die)
// before its confirmations are done, the next agent waits and confirms as
// long as the hold it was confirming for counts on, along a chain of
// confirmers too.
func (s *Supervisor) confirmValue(tm timing) string {
	v := valueOf(s.token, tm)
	s.mu.Lock()
	s.cur = v
	s.mu.Unlock()
	return v
}

// confirm enters PhaseConfirming after a takeover write won the key; it
// confirms for cf.span, and starts the service at once if that is 0.
// Until the confirmations are done the key is never blanked (see
// shutdown): the agent's predecessor may still be stopping its service.
func (s *Supervisor) confirm(ctx context.Context, cf *confirmation, why string) {
	s.mu.Lock()
	s.phase, s.holdRev, s.conf = PhaseConfirming, cf.won, cf
	s.unconfirmed = cf.span > 0
	s.mu.Unlock()
	s.wrote(cf.won, cf.since)
	s.event(PhaseConfirming, fmt.Sprintf("%s; confirming for %v", why, cf.span), nil, withHolder(s.token, cf.won))
	if cf.span == 0 {
		s.activate(ctx)
	}
}

// writeFailed notes a failed write whose answer may have been lost (any
// error but a conflict): it may have landed.
func (s *Supervisor) writeFailed(err error) {
	if isConflict(err) {
		return
	}
	s.mu.Lock()
	s.pending = true
	s.mu.Unlock()
}

// takePending reports, and forgets, whether a write's answer was lost.
func (s *Supervisor) takePending() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	p := s.pending
	s.pending = false
	return p
}

// standby is the path of a key held by another token: stop the service,
// wait for T of silence, take over, confirm.
func (s *Supervisor) standby(ctx context.Context, r record, cl *clocks, w *watch) {
	s.seeHolder(r)
	if err := s.c.healthCheck(ctx, Standby); err != nil {
		if ctx.Err() == nil {
			s.event(PhaseStandby, "health check failed", err)
		}
		return
	}
	tm := s.holderTiming(r.holder)
	if r.free() {
		// A key seen to vanish (see stroke): its past holder's timing,
		// the longest seen, counts.
		past := cl.longest(0)
		tm = tm.longer(past)
	}
	T := tm.ttl
	var wake <-chan struct{}
	if w != nil {
		wake = w.wake
	}
	every := s.c.o.renewEvery()
	for {
		rev, quiet := cl.last(0)
		if rev != r.rev {
			return // written since we read it: the holder lives
		}
		if quiet >= T {
			break
		}
		// Look again every stroke: a new write ends this stroke, so that
		// the next one reads the key (and the holder's timing) soon after
		// the holder's last write, not up to T later.
		t := time.NewTimer(min(T-quiet, every))
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-wake:
			t.Stop()
			return // freed: the next stroke takes it
		case <-t.C:
		}
	}
	if err := s.c.healthCheck(ctx, Standby); err != nil {
		if ctx.Err() == nil {
			s.event(PhaseStandby, "health check failed before the takeover", err)
		}
		return
	}
	value := s.confirmValue(tm)
	wctx, cancel := s.writeContext(ctx)
	rev, start, err := s.c.takeOver(wctx, s.key, s.key, value, r)
	cancel()
	if err != nil {
		if ctx.Err() == nil {
			s.writeFailed(err)
			s.event(PhaseStandby, "takeover failed", err, withHolder(r.holder, r.rev))
		}
		return
	}
	s.confirm(ctx, confirmationOf(s.key, s.key, value, rev, start, tm), fmt.Sprintf("took the key over after %v without a write", T))
	if tm.confirm > 0 {
		// The next stroke renews: one interval after this write.
		_ = driver.Sleep(ctx, s.c.o.renewEvery())
	}
}
