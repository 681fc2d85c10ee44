package natsputex

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/latchkey-go/latchkey/locks"
	"github.com/latchkey-go/latchkey/locks/driver"
)

// This file holds what a Supervisor does to its service and its key when
// it starts, stops and gives up: Start, Stop, the blank, shutdown, and
// its events.

// activate starts the service and enters PhaseActive, unless Run is
// ending (its shutdown then blanks the key).
func (s *Supervisor) activate(ctx context.Context) {
	if ctx.Err() != nil {
		return
	}
	s.mu.Lock()
	dl, token := s.holdDeadline(), s.holdRev
	s.mu.Unlock()
	sctx, cancel := context.WithDeadline(ctx, dl)
	defer cancel()
	s.svcMu.Lock()
	s.up = true
	var err error
	if s.svc.Start != nil {
		err = protect(func() error { return s.svc.Start(sctx, token) })
	}
	s.svcMu.Unlock()
	if err != nil && ctx.Err() != nil {
		// Run is ending: its shutdown stops the service and blanks the key.
		s.event(PhaseStandby, "Run is ending: Start was cut short", err)
		return
	}
	if err != nil {
		s.abort(ctx, "starting the service failed", err)
		s.mu.Lock()
		s.startFails++
		s.holdOff = time.Now().Add(s.c.o.ttl() << min(s.startFails-1, 3))
		s.holdOffMsg = false
		s.mu.Unlock()
		return
	}
	s.mu.Lock()
	held := s.phase != PhaseStandby || s.holdLive()
	if held {
		s.phase = PhaseActive
		s.holder = s.token
		s.startFails = 0
	}
	s.mu.Unlock()
	if !held { // the hold ran out while the service started
		if err := s.stopService(ctx, false); err != nil {
			s.event(PhaseStandby, "the hold ran out while the service started: stopping the service failed; trying again next stroke", err)
		} else {
			s.event(PhaseStandby, "the hold ran out while the service started: service stopped", nil)
		}
		return
	}
	s.event(PhaseActive, fmt.Sprintf("active: service started with fencing token %d", token), nil, withHolder(s.token, token))
}

// abort stops the service, then makes one attempt to blank the key, and
// goes back to standby. Stop comes first (putex's chart blanks first): a
// blank key is taken at once, so blanking it while Stop still runs would
// let another agent start its service before this one has stopped. When
// Stop fails the key is not blanked at all.
func (s *Supervisor) abort(ctx context.Context, why string, cause error) {
	_, rev := s.holding()
	s.mu.Lock()
	unconfirmed := s.unconfirmed
	s.mu.Unlock()
	s.disarm(PhaseStandby)
	what := ": service not running" // stopped already (the hold ran out), or never started
	if s.serviceUp() {
		what = ": service stopped"
	}
	if err := s.stopService(ctx, false); err != nil {
		s.event(PhaseStandby, why+": stopping the service failed; the key is not blanked, Stop is tried again next stroke", errors.Join(cause, err))
		return
	}
	errs := []error{cause}
	switch {
	case rev != 0 && unconfirmed:
		// A hold whose confirmations did not finish: its predecessor may
		// still be stopping its service, so the key keeps the last write,
		// and the next agent waits T without a write and confirms.
		what += "; the key is not blanked (the confirmations did not finish)"
	case rev != 0:
		errs = append(errs, s.blank(ctx, rev, s.c.o.renew))
	}
	s.event(PhaseStandby, why+what, errors.Join(errs...))
}

// serviceUp says whether the service may be running: Start was called
// and no Stop has succeeded since.
func (s *Supervisor) serviceUp() bool {
	s.svcMu.Lock()
	defer s.svcMu.Unlock()
	return s.up
}

// blank makes one attempt, bounded by timeout, to blank the key at rev,
// the revision of the agent's own last write: if the key is still at rev,
// it holds that write, whatever the agent's phase. A key written since is
// left as it is: it may be a successor's, even with the same token (an
// agent restarted on the same host).
func (s *Supervisor) blank(ctx context.Context, rev uint64, timeout time.Duration) error {
	bctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), timeout)
	defer cancel()
	nrev, err := s.c.st.renew(bctx, s.key, "", rev)
	switch {
	case isConflict(err):
		return nil
	case err != nil:
		return fmt.Errorf("blanking the key: %w", err)
	}
	s.c.rememberBlank(s.key, nrev)
	return nil
}

// lose stops the service after the key was taken away.
func (s *Supervisor) lose(ctx context.Context, r record, why string) {
	s.disarm(PhaseStandby)
	what := ": service not running"
	if s.serviceUp() {
		what = ": service stopped"
	}
	if err := s.stopService(ctx, false); err != nil {
		s.event(PhaseStandby, why+": stopping the service failed; trying again next stroke", err, withHolder(r.holder, r.rev))
		return
	}
	s.event(PhaseStandby, why+what, nil, withHolder(r.holder, r.rev))
}

// stopBudget returns T + C·R, how long Stop may run: a standby starts no
// sooner than T + C·R after the agent's last write, which was at the
// latest when Stop began.
func (s *Supervisor) stopBudget() time.Duration {
	return s.c.o.ttl() + s.c.o.timing().confirm
}

// stopService runs Stop if the service may be up, or always when force.
// Until a Stop succeeds the service counts as up.
func (s *Supervisor) stopService(ctx context.Context, force bool) error {
	s.svcMu.Lock()
	defer s.svcMu.Unlock()
	if !s.up && !force {
		return nil
	}
	if s.svc.Stop == nil {
		s.up = false
		return nil
	}
	budget := s.stopBudget()
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), budget)
	defer cancel()
	err := protect(func() error { return s.svc.Stop(ctx) })
	if err == nil && ctx.Err() != nil {
		err = ctx.Err() // it returned, but too late
	}
	if err != nil {
		s.up = true
		if ctx.Err() != nil {
			return fmt.Errorf("%w: not done within T + C·R = %v: %w", ErrStopFailed, budget, err)
		}
		return fmt.Errorf("%w: %w", ErrStopFailed, err)
	}
	s.up = false
	return nil
}

// seeHolder reports a new holder seen in standby.
func (s *Supervisor) seeHolder(r record) {
	s.mu.Lock()
	changed := s.holder != holderToken(r.holder)
	s.holder = holderToken(r.holder)
	s.mu.Unlock()
	switch {
	case !changed:
	case r.free():
		s.event(PhaseStandby, "standby: the key vanished or its revision went back (the bucket deleted and made again, or its messages lost): its holder before that may still run its service; waiting for T without a write", nil, withHolder("", r.rev))
	case s.holder == s.token:
		s.event(PhaseStandby, "standby: the key holds this agent's own token, which it did not write: another agent has the same token (tokens must be unique), or an earlier run of this agent died holding the key; waiting for T without a write", nil, withHolder(r.holder, r.rev))
	default:
		s.event(PhaseStandby, "standby: the key is held by another agent", nil, withHolder(r.holder, r.rev))
	}
}

// shutdown ends Run: stop the service, blank the key if it still holds
// the agent's last write (at that revision only: unlike a lease's
// release, it does not re-read the key, since a successor may carry the
// same token), unless Stop failed.
func (s *Supervisor) shutdown(ctx context.Context) error {
	_, rev := s.holding()
	s.mu.Lock()
	unconfirmed := s.unconfirmed
	s.done = true
	s.phase = PhaseStopped
	s.leaveHold()
	s.mu.Unlock()
	errs := []error{ctx.Err()}
	if errs[0] == nil {
		errs[0] = locks.ErrClosed
	}
	// Stop runs when Run returns, also from standby (see [Service.Stop]).
	msg := "stopped"
	switch err := s.stopService(ctx, true); {
	case err != nil:
		msg = "stopped; stopping the service failed: it may still run, and the key was not blanked"
		errs = append(errs, err)
	case rev != 0 && unconfirmed:
		// Its predecessor may still be stopping its service: the next
		// agent must wait T without a write and confirm, not find the
		// key free.
		msg = "stopped while confirming a takeover: the key was not blanked"
	case rev != 0:
		errs = append(errs, s.blank(ctx, rev, s.c.o.ttl()))
	}
	err := errors.Join(errs...)
	s.event(PhaseStopped, msg, nil)
	return driver.Errorf(backend, "supervisor", s.key, err)
}

type eventOpt func(*Event)

// withHolder reports the holder whose value (or token) is h, by its
// token, and the revision rev.
func withHolder(h string, rev uint64) eventOpt {
	return func(e *Event) { e.Holder, e.Revision = holderToken(h), rev }
}

func (s *Supervisor) event(p Phase, msg string, err error, opts ...eventOpt) {
	if s.svc.Observe == nil {
		return
	}
	e := Event{Time: time.Now(), Phase: p, Msg: msg, Err: err}
	for _, o := range opts {
		o(&e)
	}
	s.svc.Observe(e)
}

// protect runs a user hook, turning a panic into an error.
func protect(f func() error) (err error) {
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("panic: %v", p)
		}
	}()
	return f()
}
