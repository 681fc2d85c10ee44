package natsputex

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/latchkey-go/latchkey/locks"
	"github.com/latchkey-go/latchkey/locks/driver"
)

// This file holds what a Supervisor does to its service and its key
// while it holds the key and when it lets go: Start, Stop, the blank,
// shutdown, and its events.

// serve runs the service on the hold l: Start, then wait for the hold to
// end, then stop the service and blank the key. It returns l when Run
// ends while the agent holds the key (its shutdown releases it), nil once
// the hold is over.
func (s *Supervisor) serve(ctx context.Context, l *lease) *lease {
	if !s.activate(ctx, l) {
		if ctx.Err() != nil {
			return l
		}
		return nil
	}
	select {
	case <-ctx.Done():
		return l
	case <-l.Context().Done():
	}
	s.endHold(ctx, l, holdEnd{})
	return nil
}

// endReason says why the hold l ended, in the words of the events, and
// the error behind it: a failed renewal or check, the client closing, or
// its deadline passing, with the failure of the renewal round that was
// under way then, if any (a health check that hangs).
func endReason(l *lease) holdEnd {
	var end holdEnd
	switch err := context.Cause(l.Context()); {
	case errors.As(err, &end):
		return end
	case errors.Is(err, locks.ErrClosed):
		return holdEnd{why: "the client closed"}
	}
	const expired = "no successful write for T minus the safety margin"
	if f := l.lastFailure(); f != nil {
		return holdEnd{why: f.why + " (" + expired + ")", err: f.err, seen: f.seen}
	}
	return holdEnd{why: expired}
}

// activate starts the service on the hold l and enters PhaseActive. It
// reports whether the service runs: not when Run is ending (its shutdown
// then releases the hold), nor when Start failed or the hold ran out
// meanwhile (the hold is then over).
func (s *Supervisor) activate(ctx context.Context, l *lease) bool {
	if ctx.Err() != nil {
		return false
	}
	// Start's context ends with Run's, with the hold, and at the hold's
	// deadline as it stands: renewals go on while Start runs, but Start
	// must not count on them.
	sctx, cancel := context.WithDeadline(ctx, l.Deadline())
	defer cancel()
	defer context.AfterFunc(l.Context(), cancel)()
	s.svcMu.Lock()
	s.up = true
	var err error
	if s.svc.Start != nil {
		err = protect(func() error { return s.svc.Start(sctx, l.Token()) })
	}
	s.svcMu.Unlock()
	switch {
	case err != nil && ctx.Err() != nil:
		// Run is ending: its shutdown stops the service and blanks the key.
		s.event(PhaseStandby, "Run is ending: Start was cut short", err)
		return false
	case err != nil:
		s.endHold(ctx, l, holdEnd{why: "starting the service failed", err: err})
		s.mu.Lock()
		s.startFails++
		s.holdOff = time.Now().Add(s.c.o.ttl() << min(s.startFails-1, 3))
		s.holdOffMsg = false
		s.mu.Unlock()
		return false
	case !l.Live():
		s.endHold(ctx, l, holdEnd{why: "the hold ran out while the service started"})
		return false
	}
	s.mu.Lock()
	s.phase = PhaseActive
	s.holder = s.token
	s.startFails = 0
	s.mu.Unlock()
	s.event(PhaseActive, fmt.Sprintf("active: service started with fencing token %d", l.Token()), nil, withHolder(s.token, l.Token()))
	return true
}

// endHold lets go of the hold l, which ended (or failed to start) for
// end (zero to say why it ended: see endReason): stop the service, then
// blank the key (the lease's release, see [lease.releaseAgent]), and go
// back to standby. When Stop fails the key is not blanked, and Stop is
// tried again each stroke.
func (s *Supervisor) endHold(ctx context.Context, l *lease, end holdEnd) {
	s.setPhase(PhaseStandby)
	what := ": service not running" // stopped already, or never started
	if s.serviceUp() {
		what = ": service stopped"
	}
	stopErr, err := s.letGo(ctx, l)
	if end.why == "" { // after the release, which waits for the round under way
		end = endReason(l)
	}
	why, cause := end.why, end.err
	var opts []eventOpt
	if end.seen != nil {
		opts = append(opts, withHolder(end.seen.holder, end.seen.rev))
	}
	rev, uncertain := l.lastWrite()
	s.mu.Lock()
	s.lastRev = rev
	s.pending = s.pending || uncertain
	s.mu.Unlock()
	if stopErr != nil {
		s.event(PhaseStandby, why+": stopping the service failed; the key is not blanked, Stop is tried again next stroke", errors.Join(cause, stopErr), opts...)
		return
	}
	if cause == nil {
		cause = err
	}
	s.event(PhaseStandby, why+what, cause, opts...)
}

// letGo stops the service, then releases the hold l: its key is blanked
// unless Stop failed. Stop comes first, at once: the release waits for a
// renewal under way, which may hang until T has passed. It returns Stop's
// error and the release's.
func (s *Supervisor) letGo(ctx context.Context, l *lease) (stopErr, err error) {
	if stopErr = s.stopService(ctx, false); stopErr != nil {
		l.keepKey(stopErr)
	}
	return stopErr, l.Release(context.WithoutCancel(ctx))
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
	nrev, _, err := s.c.st.renew(bctx, s.key, "", rev)
	switch {
	case isConflict(err):
		return nil
	case err != nil:
		return fmt.Errorf("blanking the key: %w", err)
	}
	s.c.rememberBlank(s.key, nrev)
	return nil
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

// shutdown ends Run: stop the service and blank the key if the agent
// holds it (held's release: the key keeps the agent's last write when
// Stop failed, or when the agent was confirming a takeover, which holds
// nothing yet), or just stop it (Stop runs when Run returns, also from
// standby: see [Service.Stop]).
func (s *Supervisor) shutdown(ctx context.Context, held *lease) error {
	confirming := s.Phase() == PhaseConfirming
	errs := []error{ctx.Err()}
	if errs[0] == nil {
		errs[0] = locks.ErrClosed
	}
	msg := "stopped"
	var err error
	if held != nil {
		var rerr error
		err, rerr = s.letGo(ctx, held)
		if err == nil && !errors.Is(rerr, locks.ErrLost) {
			err = rerr // not ended already (the client closed): the blank's error
		}
	} else {
		err = s.stopService(ctx, true)
	}
	switch {
	case errors.Is(err, ErrStopFailed):
		msg = "stopped; stopping the service failed: it may still run, and the key was not blanked"
	case confirming:
		// Its predecessor may still be stopping its service: the next
		// agent must wait T without a write and confirm, not find the
		// key free.
		msg = "stopped while confirming a takeover: the key was not blanked"
	}
	errs = append(errs, err)
	s.mu.Lock()
	s.phase = PhaseStopped
	s.mu.Unlock()
	s.event(PhaseStopped, msg, nil)
	return driver.Errorf(backend, "supervisor", s.key, errors.Join(errs...))
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
