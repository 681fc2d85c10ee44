package natsputex

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/latchkey-go/latchkey/locks/driver"
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
	Holder   string // the holder's token in the key (without the timing a Supervisor writes after it), when it was read; "" when free
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

// ErrStopFailed is the error, checked with [errors.Is], of a
// [Service.Stop] that failed or did not return within T + C·R: the
// service may still run.
var ErrStopFailed = errors.New("natsputex: stopping the service failed")

// Service is what a [Supervisor] drives. Every field may be nil.
type Service struct {
	// Start unfences this node, fences the others and starts the service.
	// It is called when the agent becomes active, with the hold's fencing
	// token: the revision of the write that won the key, greater than the
	// token of every earlier holder of the key and smaller than that of
	// every later one (for the life of the bucket's stream: see the
	// package doc). Pass it to the resources the service writes to, and
	// have them refuse a token lower than the highest they have seen: a
	// node that lost the key without knowing it yet (paused, cut off) is
	// then refused. Start's context ends when the agent's hold would run
	// out. An error counts as a failed health check: the agent runs Stop,
	// then blanks the key, goes back to standby and leaves a free key to
	// the other agents for T (twice as long after each further failure
	// in a row, up to 8·T) before it takes it again.
	Start func(ctx context.Context, token uint64) error

	// Stop kills (or fences) the service on this node. It is called once
	// when Run begins, whenever the agent stops being active, and when Run
	// returns. Its context ends after T + C·R, the most time it can have
	// before a standby may start (it has at least margin + C·R: see the
	// package doc). A Stop that returns an error, or that is still
	// running when its context ends, has failed: the agent counts the
	// service as running, says so, does not blank the key (a standby then
	// waits for T without a write) and calls Stop again on each stroke
	// until it succeeds.
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
// that holds the key rewrites its token at the revision of its own last
// write, every stroke, after its health check passes (told [Active]).
// An agent that finds the key free (missing or blank) runs its health
// check (told [Active]), writes its token at the revision it read, and
// starts the service at once. An agent that finds another token stops its
// service, runs its health check (told [Standby]) and waits until the
// key has gone T = F·R without any write, by its own clock, then writes
// its token at the revision it read (so only one waiter can win). After
// such a takeover the agent confirms: it starts the service only once C
// intervals (C·R) have passed since the start of its first write of the
// hold that it saw succeed, every write since having succeeded too. An
// agent that does not hold the key may find its own token in it: its own
// last write (its hold ran out, or Stop or the blank failed, and no one
// wrote since), or a write whose answer was lost (the write landed, or
// nats.go sent it again after a reconnect). It then writes at the
// revision it read and confirms for C intervals as after a takeover.
// Otherwise its own token at a revision it did not write is another
// agent's, given the same token by mistake, or an earlier run's: it waits
// for T without a write, as for any other token, and says so; an agent
// holding the key that finds its token written by someone else stops its
// service and says so.
//
// A failed write or health check, or another write in the key, stops the
// service at once; after a failed health check or Start, once Stop has
// returned, the key is blanked (one attempt, at the agent's last
// revision), unless the agent's confirmations were not done: a confirmer
// that gives up, for any reason, never blanks the key. An active agent
// that has not renewed for T minus the safety margin begins to stop its
// service by itself, before any other agent may take over (the package doc
// says how long Stop may then take).
//
// The connection the client uses must reconnect for as long as the agent
// runs: nats.go gives up after 60 attempts by default, and waits 2s
// between attempts, during which an active agent cannot renew. Connect
// with [ConnectOptions] (natslock does), and keep the reconnect wait well
// under R.
//
// Agents on a key should use the same R, F and C (natslock's -r, -f and
// -c), but a rolling change of them is safe: an agent writes its T and
// C·R in the key's value, after its token and a newline, and a standby
// waits for the longer of its own T and the holder's, and confirms for
// the longer C·R, saying so when the holder's is longer. A [Locker]'s
// token carries its T. A value that carries no timing (written by hand,
// or by an older version, which advertised its timing in a key of its
// own) counts as the standby's own timing, and a holder that finds its
// key taken sooner than its own T after its last write says so.
//
// A key that vanishes, or whose revision goes back (the bucket deleted
// and made again), while the agent runs is taken only after T of
// silence and C·R of confirmation, as a dead holder's: the package doc
// says what remains.
//
// A Supervisor's methods are safe for concurrent use; Run runs once at a
// time.
type Supervisor struct {
	c     *Client
	key   string
	token string
	value string // what the agent writes in the key: its token and timing (see valueOf)
	svc   Service

	running atomic.Bool

	mu          sync.Mutex
	phase       Phase
	lastRev     uint64    // revision of our last successful write
	holdRev     uint64    // revision of the write that won the current hold: its fencing token
	heldSince   time.Time // when that write began: the confirmation clock
	deadline    time.Time // when our hold runs out without a renewal
	timer       *time.Timer
	done        bool
	holder      string        // last holder reported to Observe
	pending     bool          // a write's answer was lost: it may have landed
	holdOff     time.Time     // no free key is taken before then (Start failed)
	holdOffMsg  bool          // the hold-off was reported
	startFails  int           // failed Starts in a row
	confirmFor  time.Duration // how long the current hold confirms: C·R, or a predecessor's longer one
	cur         string        // what the agent writes while it confirms: its token and the longer of its timing and its predecessor's (see confirm)
	unconfirmed bool          // the agent's last write is a hold's whose confirmations did not finish: it is never blanked
	seenTiming  string        // the last holder's value whose longer timing was reported

	svcMu sync.Mutex // serialises Start and Stop
	up    bool       // the service may be running
}

// Supervisor returns a Supervisor of key for an agent whose token is token
// (putex suggests the host name: it is the key's value while the agent
// holds it, followed by a newline and the agent's T and C·R, documenting
// who runs the service). Agents on one key must have distinct tokens.
// Invalid key names give an error matching [locks.ErrInvalidName]; an
// empty or unprintable token (a character [unicode.IsPrint] refuses) one
// matching [locks.ErrInvalidOption]. No I/O happens until
// [Supervisor.Run].
func (c *Client) Supervisor(key, token string, svc Service) (*Supervisor, error) {
	if err := keys.Check(key); err != nil {
		return nil, fmt.Errorf("natsputex: supervisor: %w", err)
	}
	if err := (driver.NameRule{What: "token", MaxLen: 1024, Char: printable}).Check(token); err != nil {
		return nil, fmt.Errorf("natsputex: supervisor: %w", driver.InvalidOption("%v", err))
	}
	own := timing{c.o.ttl(), time.Duration(c.o.confirm) * c.o.renew}
	return &Supervisor{c: c, key: key, token: token, value: valueOf(token, own), svc: svc}, nil
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
// finished first) unless the agent was confirming a takeover (its
// predecessor may still be stopping: the key keeps the last write, and the
// next agent waits T without a write and confirms) and returns an error
// matching ctx.Err() (or [locks.ErrClosed]), joined with the errors of
// that last stop and release if any. When that last Stop fails the key is
// not blanked, and the error also matches [ErrStopFailed]: the service may
// still run. Calling Run while it runs returns an error at once.
func (s *Supervisor) Run(ctx context.Context) error {
	if !s.running.CompareAndSwap(false, true) {
		return fmt.Errorf("natsputex: supervisor %q: already running", s.key)
	}
	defer s.running.Store(false)
	if s.c.ctx.Err() != nil {
		return s.c.closedErr("supervisor " + s.key)
	}
	s.mu.Lock()
	s.phase, s.done, s.holder, s.lastRev, s.holdRev = PhaseStandby, false, "", 0, 0
	s.cur, s.unconfirmed = "", false
	s.pending, s.holdOff, s.holdOffMsg, s.startFails = false, time.Time{}, false, 0
	s.confirmFor, s.seenTiming = s.ownConfirm(), ""
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
	if err := s.stopService(bctx, true); err != nil {
		s.event(PhaseStandby, "starting: stopping the service failed; trying again each stroke", err)
	} else {
		s.event(PhaseStandby, "starting: service stopped", nil)
	}
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
	s.retryStop(ctx)
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
		r = record{rev: lastRev, holder: s.value, exists: true}
	default:
		cl.see(0, r.rev, r.at)
		if _, t, ok := parseValue(r.holder); ok {
			cl.noteTiming(0, t)
		}
	}
	if holding {
		switch {
		case r.rev == lastRev && !s.isOwn(r.holder):
			// Not our write at our revision: the bucket was made again
			// and its revisions reached ours.
			s.lose(ctx, r, fmt.Sprintf("the key holds another value at this agent's last revision %d: the bucket was made again", lastRev))
		case r.rev <= lastRev: // our last write (an older one: a stale read, or a bucket made again, where the renewal fails)
			s.renew(ctx)
		case holderToken(r.holder) == s.token:
			s.lose(ctx, r, fmt.Sprintf("the key holds this agent's token written by another agent (revision %d, this agent's last is %d): two agents have the same token", r.rev, lastRev))
		case r.free():
			s.lose(ctx, r, "the key was blanked or deleted by someone else")
		default:
			why := "the key holds another token"
			s.mu.Lock()
			since := time.Since(s.deadline.Add(-s.c.o.validity())) // our last write's start
			s.mu.Unlock()
			if T := s.c.o.ttl(); since < T {
				// No agent with our T could have taken it over yet.
				why += fmt.Sprintf(", written within %v of this agent's last write, before T = %v: a client that did not go by the timing in this agent's value took it (an older version, or a write by hand)", since.Round(time.Millisecond), T)
			}
			s.lose(ctx, r, why)
		}
		return
	}
	pending := s.takePending()
	switch {
	case r.free() && cl.rebornHold(0, s.c.o.ttl()):
		// The key vanished, or its revision went back (the bucket was
		// made again), less than T ago: its holder before that may
		// still believe it holds it. Wait for T without a write, as for
		// a held key.
		s.standby(ctx, r, cl, w)
	case r.free():
		s.takeFree(ctx, r)
	case s.isOwn(r.holder) && r.rev == lastRev:
		// The agent's own last write: it stopped holding (its hold ran
		// out, or Stop or the blank failed) and no one wrote since.
		s.takeOwn(ctx, r, "found its own last write still in the key")
	case s.isOwn(r.holder) && pending:
		s.takeOwn(ctx, r, "found its own token in the key after a write whose answer was lost")
	default:
		s.standby(ctx, r, cl, w)
	}
}

// retryStop calls Stop again if an earlier Stop failed and the agent does
// not hold the key.
func (s *Supervisor) retryStop(ctx context.Context) {
	if holding, _ := s.holding(); holding || !s.serviceUp() {
		return
	}
	if err := s.stopService(ctx, false); err != nil {
		s.event(PhaseStandby, "stopping the service failed again; trying again next stroke", err)
		return
	}
	s.event(PhaseStandby, "service stopped", nil)
}

// renew is the path of a key the agent holds: health check (once the
// confirmations are done), rewrite the token at the agent's own last
// revision, and start the service when the confirmations are done.
func (s *Supervisor) renew(ctx context.Context) {
	s.mu.Lock()
	phase, rev, since, confirmFor := s.phase, s.lastRev, s.heldSince, s.confirmFor
	value := s.value
	if phase == PhaseConfirming && s.cur != "" {
		value = s.cur // the timing of the hold it confirms for, until it is done
	}
	s.mu.Unlock()
	due := phase == PhaseActive || time.Since(since) >= confirmFor
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
	nrev, err := s.c.st.renew(wctx, s.key, value, rev)
	if err != nil {
		if ctx.Err() == nil {
			s.writeFailed(err)
			s.abort(ctx, "write failed", err)
		}
		return
	}
	s.wrote(nrev, start)
	if phase == PhaseConfirming && due {
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

// ownTiming returns the agent's own T and C·R.
func (s *Supervisor) ownTiming() timing {
	return timing{s.c.o.ttl(), s.ownConfirm()}
}

// ownConfirm returns C·R, how long a new holder confirms its hold by the
// agent's own timing.
func (s *Supervisor) ownConfirm() time.Duration {
	return time.Duration(s.c.o.confirm) * s.c.o.renew
}

// timing is what an agent advertises of its own timing, so that a
// standby with shorter settings still waits as long as the holder counts
// on: T, after which a standby may take the key, and C·R, the time a
// successor confirms (the holder's Stop counts on it).
type timing struct{ ttl, confirm time.Duration }

func (t timing) String() string { return fmt.Sprintf("T=%v C·R=%v", t.ttl, t.confirm) }

// parseTiming reads what timing.String wrote.
func parseTiming(v string) (timing, bool) {
	var ts, cs string
	if _, err := fmt.Sscanf(v, "T=%s C·R=%s", &ts, &cs); err != nil {
		return timing{}, false
	}
	t, err1 := time.ParseDuration(ts)
	c, err2 := time.ParseDuration(cs)
	if err1 != nil || err2 != nil || t <= 0 || c < 0 {
		return timing{}, false
	}
	return timing{t, c}, true
}

// valueOf returns what an agent with token and timing t writes in the
// key: its token, a newline (no token holds one: control characters are
// refused) and its timing, so that the timing a standby goes by is read
// with the holder, in the same write, and cannot be lost or overwritten
// apart from it.
func valueOf(token string, t timing) string { return token + "\n" + t.String() }

// parseValue splits a key's value into the holder's token and the timing
// it carries: a Supervisor's value (see valueOf) carries T and C·R, a
// Locker's token its T only (see tokenTTL; confirm is then 0). ok is
// false when the value carries no timing: the token is then the whole
// value.
func parseValue(v string) (token string, t timing, ok bool) {
	if i := strings.IndexByte(v, '\n'); i >= 0 {
		if t, ok := parseTiming(v[i+1:]); ok {
			return v[:i], t, true
		}
		return v, timing{}, false
	}
	if d := tokenTTL(v); d > 0 {
		return v, timing{ttl: d}, true
	}
	return v, timing{}, false
}

// holderToken returns the token in a key's value (see parseValue).
func holderToken(v string) string {
	token, _, _ := parseValue(v)
	return token
}

// holderTiming returns how long a standby waits for silence before it
// takes the key from the holder whose value it read, and how long it then
// confirms: the longer of its own timing and the one the value carries
// (its own if it carries none: a value written by hand; a Locker's token
// carries its T only).
func (s *Supervisor) holderTiming(value string) timing {
	t := timing{s.c.o.ttl(), s.ownConfirm()}
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
	return timing{max(t.ttl, ht.ttl), max(t.confirm, ht.confirm)}
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
	s.holdRev, s.heldSince, s.confirmFor, s.unconfirmed = rev, start, s.ownConfirm(), false
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
	tm := s.ownTiming()
	if _, ht, ok := parseValue(r.holder); ok {
		tm = timing{max(tm.ttl, ht.ttl), max(tm.confirm, ht.confirm)}
	}
	value := s.confirmValue(tm)
	wctx, cancel := s.writeContext(ctx)
	start := time.Now()
	rev, err := s.c.st.claim(wctx, s.key, value, r)
	cancel()
	if err != nil {
		if ctx.Err() == nil {
			s.writeFailed(err)
			s.event(PhaseStandby, "write failed", err, withHolder(r.holder, r.rev))
		}
		return
	}
	s.confirm(ctx, rev, start, tm.confirm, why)
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

// confirm enters PhaseConfirming after the write at rev, begun at start,
// won the key; it confirms for confirmFor, and starts the service at once
// if that is 0. Until the confirmations are done the key is never
// blanked (see shutdown): the agent's predecessor may still be stopping
// its service.
func (s *Supervisor) confirm(ctx context.Context, rev uint64, start time.Time, confirmFor time.Duration, why string) {
	s.mu.Lock()
	s.phase, s.holdRev, s.heldSince, s.confirmFor = PhaseConfirming, rev, start, confirmFor
	s.unconfirmed = confirmFor > 0
	s.mu.Unlock()
	s.wrote(rev, start)
	s.event(PhaseConfirming, fmt.Sprintf("%s; confirming for %v", why, confirmFor), nil, withHolder(s.token, rev))
	if confirmFor == 0 {
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
		tm = timing{max(tm.ttl, past.ttl), max(tm.confirm, past.confirm)}
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
	start := time.Now()
	rev, err := s.c.st.claim(wctx, s.key, value, r)
	cancel()
	if err != nil {
		if ctx.Err() == nil {
			s.writeFailed(err)
			s.event(PhaseStandby, "takeover failed", err, withHolder(r.holder, r.rev))
		}
		return
	}
	s.confirm(ctx, rev, start, tm.confirm, fmt.Sprintf("took the key over after %v without a write", T))
	if tm.confirm > 0 {
		// The next stroke renews: one interval after this write.
		_ = sleepCtx(ctx, s.c.o.renewEvery())
	}
}

// activate starts the service and enters PhaseActive, unless Run is
// ending (its shutdown then blanks the key).
func (s *Supervisor) activate(ctx context.Context) {
	if ctx.Err() != nil {
		return
	}
	s.mu.Lock()
	dl, token := s.deadline, s.holdRev
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
	held := s.phase != PhaseStandby || !s.deadline.Before(time.Now())
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

// disarm leaves the holding phases. The next holder seen in standby is
// reported, even if it carries the agent's own token.
func (s *Supervisor) disarm(p Phase) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.phase = p
	s.holder = ""
	if s.timer != nil {
		s.timer.Stop()
	}
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

// stopBudget returns T + C·R, how long Stop may run: a standby starts no
// sooner than T + C·R after the agent's last write, which was at the
// latest when Stop began.
func (s *Supervisor) stopBudget() time.Duration {
	return s.c.o.ttl() + s.ownConfirm()
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
	if s.timer != nil {
		s.timer.Stop()
	}
	s.mu.Unlock()
	errs := []error{ctx.Err()}
	if errs[0] == nil {
		errs[0] = s.c.closedErr("supervisor " + s.key)
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
	return fmt.Errorf("natsputex: supervisor %q: %w", s.key, err)
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
