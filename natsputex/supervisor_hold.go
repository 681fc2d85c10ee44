package natsputex

import (
	"context"
	"errors"
	"time"

	"github.com/latchkey-go/latchkey/locks/driver"
)

// This file holds the deadline of a Supervisor's hold: a [driver.Lease],
// the deadline machine of the Locker's leases too, extended by each write
// that succeeds to its start plus the validity ([options.validUntil]);
// when the deadline passes, the service stops.

// errHoldLeft ends a hold's deadline when the agent leaves its holding
// phases itself: not an expiry.
var errHoldLeft = errors.New("natsputex: the agent left the hold")

// wrote records a successful write that started at start and moves the
// hold's deadline: the service stops by itself unless another write
// succeeds before it. A hold whose deadline has passed, or that was left,
// gets a new one.
func (s *Supervisor) wrote(rev uint64, start time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.lastRev = rev
	until := s.c.o.validUntil(start)
	if s.hold != nil && s.hold.Extend(until) {
		return
	}
	h := driver.NewLease(context.Background(), driver.Spec{Name: s.key, Token: s.holdRev, Deadline: until})
	s.hold = h
	context.AfterFunc(h.Context(), func() { s.expire(h) })
}

// expire runs when the hold h has ended: when its deadline passed while
// the agent held the key, the service stops.
func (s *Supervisor) expire(h *driver.Lease) {
	s.mu.Lock()
	if s.hold != h || s.done || s.phase == PhaseStandby {
		s.mu.Unlock()
		return
	}
	s.phase = PhaseStandby
	s.holder = ""
	s.mu.Unlock()
	const why = "no successful write for T minus the safety margin"
	what := ": service not running"
	if s.serviceUp() {
		what = ": service stopped"
	}
	if err := s.stopService(context.Background(), false); err != nil {
		s.event(PhaseStandby, why+": stopping the service failed; trying again next stroke", err)
		return
	}
	s.event(PhaseStandby, why+what, nil)
}

// leaveHold ends the hold's deadline, if any, without an expiry. Call
// with s.mu held.
func (s *Supervisor) leaveHold() {
	if h := s.hold; h != nil {
		s.hold = nil
		h.End(errHoldLeft)
	}
}

// holdLive reports whether the hold's deadline has not passed. Call with
// s.mu held.
func (s *Supervisor) holdLive() bool { return s.hold != nil && s.hold.Live() }

// holdDeadline returns the hold's deadline, zero if there is none. Call
// with s.mu held.
func (s *Supervisor) holdDeadline() time.Time {
	if s.hold == nil {
		return time.Time{}
	}
	return s.hold.Deadline()
}

// lastWriteStart returns when the agent's last successful write began.
func (s *Supervisor) lastWriteStart() time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.holdDeadline().Add(-s.c.o.validity())
}

// disarm leaves the holding phases. The next holder seen in standby is
// reported, even if it carries the agent's own token.
func (s *Supervisor) disarm(p Phase) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.phase = p
	s.holder = ""
	s.leaveHold()
}

// holding reports whether the agent believes it holds the key, and the
// revision of its last write.
func (s *Supervisor) holding() (bool, uint64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.phase == PhaseActive || s.phase == PhaseConfirming, s.lastRev
}

// writeContext bounds a write: by the hold's deadline when the agent
// holds the key, else by R. The end of ctx does not cut a write short:
// the agent must learn whether a write sent as Run ends took effect, to
// blank the key at its revision.
func (s *Supervisor) writeContext(ctx context.Context) (context.Context, context.CancelFunc) {
	ctx = context.WithoutCancel(ctx)
	s.mu.Lock()
	dl, holding := s.holdDeadline(), s.phase == PhaseActive || s.phase == PhaseConfirming
	s.mu.Unlock()
	if holding && time.Until(dl) > 0 {
		return context.WithDeadline(ctx, dl)
	}
	return context.WithTimeout(ctx, s.c.o.renew)
}
