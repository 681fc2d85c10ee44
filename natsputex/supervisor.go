package natsputex

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/latchkey-go/latchkey/locks"
)

// Phase is where a [Supervisor] stands.
type Phase int

const (
	// PhaseStandby: the agent does not hold the key; its service is
	// stopped.
	PhaseStandby Phase = iota
	// PhaseConfirming: the agent took the key over from another holder
	// and rewrites its token for C intervals before it starts the service.
	PhaseConfirming
	// PhaseActive: the agent holds the key and its service runs.
	PhaseActive
	// PhaseStopped: Run has returned.
	PhaseStopped
)

// String returns the phase's name: "standby", "confirming", "active" or
// "stopped".
func (p Phase) String() string {
	switch p {
	case PhaseStandby:
		return "standby"
	case PhaseConfirming:
		return "confirming"
	case PhaseActive:
		return "active"
	case PhaseStopped:
		return "stopped"
	}
	return fmt.Sprintf("Phase(%d)", int(p))
}

// Event is one thing a [Supervisor] did or saw: a phase change, a new
// holder in the key, or a failure.
type Event struct {
	Time     time.Time
	Phase    Phase  // the phase after the event
	Holder   string // the token in the key, when it was read; "" when free
	Revision uint64 // the key's revision, when known
	Msg      string
	Err      error
}

// String formats the event as one log line.
func (e Event) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "phase=%s msg=%q", e.Phase, e.Msg)
	if e.Holder != "" {
		fmt.Fprintf(&b, " holder=%q", e.Holder)
	}
	if e.Revision != 0 {
		fmt.Fprintf(&b, " revision=%d", e.Revision)
	}
	if e.Err != nil {
		fmt.Fprintf(&b, " err=%q", e.Err.Error())
	}
	return b.String()
}

// Service is what a [Supervisor] drives. Every field may be nil.
type Service struct {
	// Start unfences this node, fences the others and starts the service.
	// It is called when the agent becomes active. Its context ends when
	// the agent's hold would run out. An error counts as a failed health
	// check: the agent runs Stop, then blanks the key and goes back to
	// standby.
	Start func(ctx context.Context) error

	// Stop kills (or fences) the service on this node. It is called once
	// when Run begins, whenever the agent stops being active, and when Run
	// returns. Its context ends after T.
	Stop func(ctx context.Context) error

	// Observe is told every [Event], in order, from the goroutine running
	// the pump or the expiry timer. It must not block.
	Observe func(Event)
}

// Supervisor runs putex's pump on one key: an agent among several, each
// with its own token, of which at most one runs the service at a time.
// Make it with [Client.Supervisor]; it uses the client's R, F, C, safety
// margin and health check.
//
// Each pump stroke lasts at least R (or the shorter renewal period of the
// package doc, when T minus the safety margin is under 2·R). An agent
// whose key is free (missing or blank) or holds its own token runs its
// health check (told [Active]), rewrites the key at the revision it read,
// and starts the service. An agent that finds another token stops its
// service, runs its health check (told [Standby]) and waits until the key
// has gone T = F·R without any write, by its own clock, then writes its
// token at the revision it read (so only one waiter can win) and rewrites
// it for C intervals before its next stroke starts the service. A failed write or health check, or
// another token in the key, stops the service at once; after a failed
// health check or Start, once Stop has returned, the key is blanked (one
// attempt, at the agent's last revision). An active agent that has not
// renewed for T minus the safety margin begins to stop its service by
// itself, before any other agent may take over (the package doc says how
// long Stop may then take).
//
// A Supervisor's methods are safe for concurrent use; Run runs once at a
// time.
type Supervisor struct {
	c     *Client
	key   string
	token string
	svc   Service

	running atomic.Bool

	mu       sync.Mutex
	phase    Phase
	lastRev  uint64    // revision of our last successful write
	deadline time.Time // when our hold runs out without a renewal
	timer    *time.Timer
	done     bool
	holder   string // last holder reported to Observe

	svcMu sync.Mutex // serialises Start and Stop
	up    bool       // the service may be running
}

// Supervisor returns a Supervisor of key for an agent whose token is
// token (putex suggests the host name: it is the key's value while the
// agent holds it, documenting who runs the service). Agents on one key
// must have distinct tokens. Invalid key names give an error matching
// [locks.ErrInvalidName]; an empty or unprintable token one matching
// [locks.ErrInvalidOption]. No I/O happens until [Supervisor.Run].
func (c *Client) Supervisor(key, token string, svc Service) (*Supervisor, error) {
	if err := keys.Check(key); err != nil {
		return nil, fmt.Errorf("natsputex: supervisor: %w", err)
	}
	if err := (locks.NameRule{What: "token", MaxLen: 1024}).Check(token); err != nil {
		return nil, fmt.Errorf("natsputex: supervisor: %w", locks.InvalidOption("%v", err))
	}
	return &Supervisor{c: c, key: key, token: token, svc: svc}, nil
}

// Phase returns the supervisor's current phase.
func (s *Supervisor) Phase() Phase {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.phase
}

// Run pumps until ctx ends or the client closes. Then it stops the
// service, blanks the key if it still holds the agent's last write (so
// another agent takes over at once; a write under way when ctx ends is
// finished first) and returns an error matching ctx.Err() (or
// [locks.ErrClosed]), joined with the errors of that last stop and
// release if any. Calling Run while it runs returns an error at once.
func (s *Supervisor) Run(ctx context.Context) error {
	if !s.running.CompareAndSwap(false, true) {
		return fmt.Errorf("natsputex: supervisor %q: already running", s.key)
	}
	defer s.running.Store(false)
	if s.c.ctx.Err() != nil {
		return s.c.closedErr("supervisor " + s.key)
	}
	s.mu.Lock()
	s.phase, s.done, s.holder, s.lastRev = PhaseStandby, false, "", 0
	s.mu.Unlock()

	bctx, stop := s.c.bind(ctx)
	defer stop()
	cl := newClocks(1)
	w, err := s.c.watch(bctx, s.key, []string{s.key}, cl)
	if err != nil {
		s.event(PhaseStandby, "no watch on the key; polling", err)
	} else {
		defer w.stop()
	}
	s.event(PhaseStandby, "starting: stopping the service", s.stopService(bctx, true))
	every := s.c.o.renewEvery()
	for bctx.Err() == nil {
		begin := time.Now()
		s.stroke(bctx, cl, w)
		_ = sleepCtx(bctx, time.Until(begin.Add(every)))
	}
	return s.shutdown(ctx)
}

// stroke is one run of the pump, from Start to End in putex's chart but
// for the final wait.
func (s *Supervisor) stroke(ctx context.Context, cl *clocks, w *watch) {
	rctx, cancel := context.WithTimeout(ctx, s.c.o.renew)
	r, err := s.c.st.read(rctx, s.key)
	cancel()
	holding, lastRev := s.holding()
	switch {
	case ctx.Err() != nil:
		return
	case err != nil && !holding:
		s.event(PhaseStandby, "cannot read the key", err)
		return
	case err != nil:
		// Try to renew what we last wrote: if the broker is gone the
		// write fails too, and the service stops.
		r = record{rev: lastRev, holder: s.token, exists: true}
	default:
		cl.see(0, r.rev)
	}
	if !r.free() && r.holder != s.token {
		s.standby(ctx, r, cl, w)
		return
	}
	s.sunny(ctx, r)
}

// sunny is the path of a key that is free or ours: health check, renew,
// start the service.
func (s *Supervisor) sunny(ctx context.Context, r record) {
	if err := s.c.healthCheck(ctx, Active); err != nil {
		s.abort(ctx, "health check failed", err)
		return
	}
	wctx, cancel := s.writeContext(ctx)
	defer cancel()
	start := time.Now()
	rev, err := s.c.st.claim(wctx, s.key, s.token, r)
	if err != nil {
		if ctx.Err() == nil {
			s.abort(ctx, "write failed", err)
		}
		return
	}
	s.wrote(rev, start)
	if s.Phase() != PhaseActive {
		s.activate(ctx, rev)
	}
}

// standby is the path of a key held by another token: stop the service,
// wait for T of silence, take over, confirm.
func (s *Supervisor) standby(ctx context.Context, r record, cl *clocks, w *watch) {
	if holding, _ := s.holding(); holding {
		s.lose(ctx, r, "the key holds another token")
	}
	s.seeHolder(r)
	if err := s.c.healthCheck(ctx, Standby); err != nil {
		s.event(PhaseStandby, "health check failed", err)
		return
	}
	T := s.c.o.ttl()
	var wake <-chan struct{}
	if w != nil {
		wake = w.wake
	}
	for {
		rev, quiet := cl.last(0)
		if rev != r.rev {
			return // written since we read it: the holder lives
		}
		if quiet >= T {
			break
		}
		t := time.NewTimer(T - quiet)
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
		s.event(PhaseStandby, "health check failed before the takeover", err)
		return
	}
	wctx, cancel := s.writeContext(ctx)
	start := time.Now()
	rev, err := s.c.st.claim(wctx, s.key, s.token, r)
	cancel()
	if err != nil {
		if ctx.Err() == nil {
			s.event(PhaseStandby, "takeover failed", err, withHolder(r.holder, r.rev))
		}
		return
	}
	s.setPhase(PhaseConfirming)
	s.wrote(rev, start)
	s.event(PhaseConfirming, fmt.Sprintf("took the key over after %v without a write; confirming for %d interval(s)", T, s.c.o.confirm), nil)
	steps := s.c.o.confirmSteps()
	if steps == 0 {
		s.activate(ctx, rev)
		return
	}
	for i := 1; i <= steps; i++ {
		if sleepCtx(ctx, s.c.o.renewEvery()) != nil {
			return
		}
		if i == steps {
			return // the next stroke renews and starts the service
		}
		wctx, cancel := s.writeContext(ctx)
		start := time.Now()
		nrev, err := s.c.st.renew(wctx, s.key, s.token, rev)
		cancel()
		if err != nil {
			if ctx.Err() == nil {
				s.lose(ctx, record{}, "confirmation write failed: "+err.Error())
			}
			return
		}
		rev = nrev
		s.wrote(rev, start)
	}
}

// activate starts the service and enters PhaseActive, unless Run is
// ending (its shutdown then blanks the key).
func (s *Supervisor) activate(ctx context.Context, rev uint64) {
	if ctx.Err() != nil {
		return
	}
	s.mu.Lock()
	dl := s.deadline
	s.mu.Unlock()
	sctx, cancel := context.WithDeadline(ctx, dl)
	defer cancel()
	s.svcMu.Lock()
	s.up = true
	var err error
	if s.svc.Start != nil {
		err = protect(func() error { return s.svc.Start(sctx) })
	}
	s.svcMu.Unlock()
	if err != nil {
		s.abort(ctx, "starting the service failed", err)
		return
	}
	s.mu.Lock()
	held := s.phase != PhaseStandby || !s.deadline.Before(time.Now())
	if held {
		s.phase = PhaseActive
	}
	s.mu.Unlock()
	if !held { // the hold ran out while the service started
		s.event(PhaseStandby, "the hold ran out while the service started", s.stopService(ctx, false))
		return
	}
	s.mu.Lock()
	s.holder = s.token
	s.mu.Unlock()
	s.event(PhaseActive, "active: service started", nil, withHolder(s.token, rev))
}

// abort stops the service, then makes one attempt to blank the key, and
// goes back to standby. Stop comes first (putex's chart blanks first): a
// blank key is taken at once, so blanking it while Stop still runs would
// let another agent start its service before this one has stopped.
func (s *Supervisor) abort(ctx context.Context, why string, cause error) {
	_, rev := s.holding()
	s.disarm(PhaseStandby)
	what := ": service not running" // stopped already (the hold ran out), or never started
	if s.serviceUp() {
		what = ": service stopped"
	}
	errs := []error{cause, s.stopService(ctx, false)}
	if rev != 0 {
		errs = append(errs, s.blank(ctx, rev, s.c.o.renew))
	}
	s.event(PhaseStandby, why+what, errors.Join(errs...))
}

// serviceUp says whether the service may be running: Start was called
// and Stop has not been since.
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
	err := s.stopService(ctx, false)
	s.event(PhaseStandby, why+": service stopped", err, withHolder(r.holder, r.rev))
}

// wrote records a successful write that started at start and arms the
// expiry: the service stops by itself unless another write succeeds
// within the validity.
func (s *Supervisor) wrote(rev uint64, start time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.lastRev = rev
	s.deadline = start.Add(s.c.o.validity())
	if s.timer == nil {
		s.timer = time.AfterFunc(time.Until(s.deadline), s.expire)
	} else {
		s.timer.Reset(time.Until(s.deadline))
	}
}

// expire runs when the hold's validity may have run out.
func (s *Supervisor) expire() {
	s.mu.Lock()
	if s.done || s.phase == PhaseStandby {
		s.mu.Unlock()
		return
	}
	if d := time.Until(s.deadline); d > 0 {
		s.timer.Reset(d)
		s.mu.Unlock()
		return
	}
	s.phase = PhaseStandby
	s.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), s.c.o.ttl())
	defer cancel()
	err := s.stopService(ctx, false)
	s.event(PhaseStandby, "no successful write for T minus the safety margin: service stopped", err)
}

// disarm leaves the holding phases.
func (s *Supervisor) disarm(p Phase) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.phase = p
	if s.timer != nil {
		s.timer.Stop()
	}
}

func (s *Supervisor) setPhase(p Phase) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.phase = p
}

// holding reports whether the agent believes it holds the key, and the
// revision of its last write.
func (s *Supervisor) holding() (bool, uint64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.phase == PhaseActive || s.phase == PhaseConfirming, s.lastRev
}

// writeContext bounds a write: by the hold's validity when the agent
// holds the key, else by R. The end of ctx does not cut a write short:
// the agent must learn whether a write sent as Run ends took effect, to
// blank the key at its revision.
func (s *Supervisor) writeContext(ctx context.Context) (context.Context, context.CancelFunc) {
	ctx = context.WithoutCancel(ctx)
	s.mu.Lock()
	dl, holding := s.deadline, s.phase == PhaseActive || s.phase == PhaseConfirming
	s.mu.Unlock()
	if holding && time.Until(dl) > 0 {
		return context.WithDeadline(ctx, dl)
	}
	return context.WithTimeout(ctx, s.c.o.renew)
}

// stopService runs Stop if the service may be up, or always when force.
func (s *Supervisor) stopService(ctx context.Context, force bool) error {
	s.svcMu.Lock()
	defer s.svcMu.Unlock()
	if !s.up && !force {
		return nil
	}
	s.up = false
	if s.svc.Stop == nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.c.o.ttl())
	defer cancel()
	if err := protect(func() error { return s.svc.Stop(ctx) }); err != nil {
		return fmt.Errorf("stopping the service: %w", err)
	}
	return nil
}

// seeHolder reports a new holder seen in standby.
func (s *Supervisor) seeHolder(r record) {
	s.mu.Lock()
	changed := s.holder != r.holder
	s.holder = r.holder
	s.mu.Unlock()
	if changed {
		s.event(PhaseStandby, "standby: the key is held by another agent", nil, withHolder(r.holder, r.rev))
	}
}

// shutdown ends Run: stop the service, blank the key if it still holds
// the agent's last write (at that revision only: unlike a lease's
// release, it does not re-read the key, since a successor may carry the
// same token).
func (s *Supervisor) shutdown(ctx context.Context) error {
	_, rev := s.holding()
	s.mu.Lock()
	s.done = true
	s.phase = PhaseStopped
	if s.timer != nil {
		s.timer.Stop()
	}
	s.mu.Unlock()
	errs := []error{ctx.Err()}
	if errs[0] == nil {
		errs[0] = s.c.closedErr("supervisor " + s.key)
	}
	// Stop runs when Run returns, also from standby (see [Service.Stop]).
	errs = append(errs, s.stopService(ctx, true))
	if rev != 0 {
		errs = append(errs, s.blank(ctx, rev, s.c.o.ttl()))
	}
	err := errors.Join(errs...)
	s.event(PhaseStopped, "stopped", nil)
	return fmt.Errorf("natsputex: supervisor %q: %w", s.key, err)
}

type eventOpt func(*Event)

func withHolder(h string, rev uint64) eventOpt {
	return func(e *Event) { e.Holder, e.Revision = h, rev }
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
