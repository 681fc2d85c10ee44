package natsputex

import (
	"context"
	"fmt"
	"time"

	"github.com/latchkey-go/latchkey/locks/driver"
)

// This file holds what a Supervisor adds to a Locker's attempt and lease
// (attempt.agent, lease.agent): its own writes, its health checks, the
// hold-off after a failed Start, and a hold's renewal and release.

// holdEnd is why an agent's hold ended: why, in the words of its events,
// the error behind it, if any, and the key as a read after a refused
// write found it (nil when not read), for the event to name who took it.
type holdEnd struct {
	why  string
	err  error
	seen *record
}

func (e holdEnd) Error() string {
	if e.err == nil {
		return e.why
	}
	return e.why + ": " + e.err.Error()
}

func (e holdEnd) Unwrap() error { return e.err }

// isOwn reports whether v is a value this agent writes: its token and
// timing, or the longer timing it writes while it confirms.
func (s *Supervisor) isOwn(v string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return v == s.value || s.cur != "" && v == s.cur
}

// ownWrite reports whether r holds a write of the agent's own that it
// may take back at once (and confirm, as after a takeover), and why: its
// own last write, when its hold ran out or Stop or the blank failed and
// no one wrote since, or its own value after a write whose answer was
// lost and that may have landed. Its own value at another revision is
// another agent's (given the same token by mistake), or an earlier run's:
// it is waited for like any holder's. Each attempt forgets a lost answer.
func (s *Supervisor) ownWrite(r record) (string, bool) {
	own := s.isOwn(r.holder)
	s.mu.Lock()
	defer s.mu.Unlock()
	pending := s.pending
	s.pending = false
	switch {
	case own && s.lastRev != 0 && r.rev == s.lastRev:
		return "found its own last write still in the key", true
	case own && pending:
		return "found its own token in the key after a write whose answer was lost", true
	}
	return "", false
}

// heldOff returns how long the agent still leaves a free key (or its own
// last write) to the other agents after its Start failed; it says so
// once.
func (s *Supervisor) heldOff() time.Duration {
	s.mu.Lock()
	wait, said := time.Until(s.holdOff), s.holdOffMsg
	s.holdOffMsg = s.holdOffMsg || wait > 0
	s.mu.Unlock()
	if wait > 0 && !said {
		s.event(PhaseStandby, fmt.Sprintf("Start failed: leaving the key to the other agents for %v", wait.Round(time.Millisecond)), nil)
	}
	return max(wait, 0)
}

// standbyCheck is a stroke of the agent that finds the key held by
// another (or vanished): it reports a new holder, and a holder's longer
// timing, and checks its health (told [Standby]).
func (s *Supervisor) standbyCheck(ctx context.Context, r record) error {
	s.seeHolder(r)
	s.holderTiming(r.holder)
	err := s.c.healthCheck(ctx, Standby)
	if err != nil && ctx.Err() == nil {
		s.event(PhaseStandby, "health check failed", err)
	}
	return err
}

// awaitSilence waits, as putex's standby does within its stroke, until
// key i, last seen written at rev, has gone T without a write by the
// clocks cl (which the agent's watch keeps). It reports false when the
// key was written or freed meanwhile, or ctx ended: the next stroke reads
// it again.
func (s *Supervisor) awaitSilence(ctx context.Context, cl *clocks, i int, rev uint64, T time.Duration) bool {
	every := s.c.o.renewEvery()
	for {
		last, quiet := cl.last(i)
		if last != rev {
			return false // written since it was read: the holder lives
		}
		if quiet >= T {
			return true
		}
		// Look again every interval: a new write ends the stroke, so
		// that the next one reads the key (and the holder's timing)
		// soon after the holder's last write, not up to T later.
		t := time.NewTimer(min(T-quiet, every))
		select {
		case <-ctx.Done():
			t.Stop()
			return false
		case <-s.wake:
			t.Stop()
			return false // freed: the next stroke takes it
		case <-t.C:
		}
	}
}

// activeCheck checks the agent's health (told [Active]) before it takes a
// free key or makes the last write of its confirmations. A failure while
// it confirms is reported when it gives up (see gaveUp).
func (s *Supervisor) activeCheck(ctx context.Context) error {
	err := s.c.healthCheck(ctx, Active)
	if err != nil && ctx.Err() == nil && s.Phase() != PhaseConfirming {
		s.event(PhaseStandby, "health check failed", err)
	}
	return err
}

// wrote records a write of the agent's own that landed at rev.
func (s *Supervisor) wrote(rev uint64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.lastRev = rev
}

// writeFailed notes a failed write whose answer may have been lost (any
// error but a conflict): it may have landed.
func (s *Supervisor) writeFailed(err error) {
	if isConflict(err) {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.pending = true
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
	defer s.mu.Unlock()
	s.cur = v
	return v
}

// confirming enters PhaseConfirming after a takeover write won the key;
// the confirmations cf lead to the hold. Until they are done the key is
// never blanked: the agent's predecessor may still be stopping its
// service.
func (s *Supervisor) confirming(cf *confirmation, why string) {
	s.setPhase(PhaseConfirming)
	s.event(PhaseConfirming, fmt.Sprintf("%s; confirming for %v", why, cf.span), nil, withHolder(s.token, cf.won))
}

// gaveUp goes back to standby after the confirmations failed (a write,
// the health check): the key keeps the agent's last write.
func (s *Supervisor) gaveUp(err error) {
	s.setPhase(PhaseStandby)
	s.event(PhaseStandby, "gave up confirming: the key is not blanked (the confirmations did not finish)", err)
}

// holderTiming reports, once per value, a holder whose timing is longer
// than the agent's: the agent waits and confirms as long as the holder
// counts on (see [Client.tryKey]).
func (s *Supervisor) holderTiming(value string) {
	t := s.c.o.timing()
	holder, ht, ok := parseValue(value)
	if !ok || ht.ttl <= t.ttl && ht.confirm <= t.confirm {
		return
	}
	s.mu.Lock()
	said := s.seenTiming == value
	s.seenTiming = value
	s.mu.Unlock()
	if !said {
		s.event(PhaseStandby, fmt.Sprintf("the holder's timing (%v) is longer than this agent's (%v): waiting as long as the holder counts on; all agents on a key should share R, F and C", ht, t), nil, withHolder(holder, 0))
	}
}

// takenBy says who took the key from the agent, as r shows it, read
// after a write at rev, the revision of the hold's last write (begun at
// start), found the key written since.
func (s *Supervisor) takenBy(r record, rev uint64, start time.Time) string {
	switch {
	case r.free():
		return "the key was blanked or deleted by someone else"
	case r.rev <= rev: // a stale read, or a bucket made again
		return fmt.Sprintf("the key was written by someone else (it reads revision %d, this agent's last is %d)", r.rev, rev)
	case holderToken(r.holder) == s.token:
		return fmt.Sprintf("the key holds this agent's token written by another agent (revision %d, this agent's last is %d): two agents have the same token", r.rev, rev)
	}
	why := "the key holds another token"
	if since, T := time.Since(start), s.c.o.ttl(); since < T {
		// No agent with our T could have taken it over from this agent's
		// write; one read cannot tell whether a blank came between.
		why += fmt.Sprintf(", written within %v of this agent's last write, before T = %v: someone blanked or deleted the key and another agent took it as free, or a client that did not go by the timing in this agent's value wrote it (an older version, or a write by hand)", since.Round(time.Millisecond), T)
	}
	return why
}

// renewAgent is a Supervisor's renewal (see [lease.renew], with l.mu
// held): rewrite the agent's value at its own last revision; when someone
// else wrote since, read the key once to say who. Unlike a Locker's, it
// never takes a conflict for its own late answer: its token is not unique
// to the hold (an agent restarted, or given another's token by mistake).
func (l *lease) renewAgent(ctx context.Context) driver.Renewal {
	c := l.c
	rev, start, err := c.st.renew(ctx, l.key, l.token, l.rev)
	switch {
	case isConflict(err):
		end := holdEnd{why: "the key was written by someone else", err: err}
		rctx, cancel := context.WithTimeout(ctx, c.o.renew)
		r, rerr := c.st.read(rctx, l.key)
		cancel()
		if rerr == nil {
			end.why, end.seen = l.agent.takenBy(r, l.rev, l.Deadline().Add(-c.o.validity())), &r
		}
		return l.lostLocked(end)
	case err != nil:
		l.uncertain = true
		return l.lostLocked(holdEnd{why: "write failed", err: err})
	}
	l.rev = rev
	return driver.Renewal{Until: c.o.validUntil(start)}
}

// releaseAgent is a Supervisor's release: Stop first, then one attempt,
// bounded by T, to blank the key at the revision of the hold's last
// write (putex's chart blanks first; but a blank key is taken at once,
// so blanking while Stop runs would let another agent start its service
// before this one has stopped). When Stop fails the key is not blanked.
// It is also the release of [Client.Close].
func (l *lease) releaseAgent(ctx context.Context) error {
	l.mu.Lock()
	stopErr := l.stopErr
	l.mu.Unlock()
	if stopErr != nil {
		return stopErr
	}
	if err := l.agent.stopService(ctx, false); err != nil {
		return err
	}
	return l.agent.blank(ctx, l.lastRev(), l.c.o.ttl())
}

// keepKey makes the hold's release leave the key as it is, and return
// err: the agent's Stop failed, and the service may still run.
func (l *lease) keepKey(err error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.stopErr = err
}

// lostLocked is the answer of a failed renewal of the hold, remembered
// (see endReason). Call with l.mu held.
func (l *lease) lostLocked(end holdEnd) driver.Renewal {
	l.failure = &end
	return driver.Renewal{Err: driver.Lost(end)}
}

// failed remembers why a renewal round of the hold failed.
func (l *lease) failed(end holdEnd) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.failure = &end
}

// lastFailure returns why the hold's last renewal round failed, nil if
// none did.
func (l *lease) lastFailure() *holdEnd {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.failure
}

// lastWrite returns the revision of the hold's last successful write,
// and whether a later write failed without a conflict (it may have
// landed).
func (l *lease) lastWrite() (rev uint64, uncertain bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.rev, l.uncertain
}
