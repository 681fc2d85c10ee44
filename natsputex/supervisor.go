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
	Holder   string // the holder's token in the key (without the timing a Supervisor writes after it), when it was read; "" when free, or when the event read nothing
	Revision uint64 // the key's revision, when known; 0 when the event read nothing (or the key never existed)
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
	// Run. It must not block.
	Observe func(Event)
}

// Supervisor runs putex's pump on one key: of several agents on the key,
// each with its own token, at most one runs its [Service] at a time. Make
// it with [Client.Supervisor]; it uses the client's R, F, C, safety margin
// and health check, and its hold is one of the client's leases, renewed
// with them and ended by [Client.Close].
//
// An agent that finds the key free (missing or blank) takes it and starts
// the service at once. One that finds another token stops its service and
// waits until the key has gone T = F·R without a write, takes it over, and
// starts the service only after C·R of its own writes have succeeded. A
// failed write or health check, another token in the key, or a hold not
// renewed for T minus the safety margin stops the service at once; the
// key is blanked only once [Service.Stop] has returned, and never by an
// agent that was still confirming a takeover. Agents on one key must have
// distinct tokens; their R, F and C may differ (a rolling change): a
// standby waits and confirms for the longer of its own and the holder's.
// The connection must reconnect for as long as the agent runs: make it
// with [ConnectOptions]. The pump stroke by stroke is in the repository's
// docs/protocols/natsputex.md.
//
// A Supervisor's methods are safe for concurrent use; Run runs once at a
// time.
type Supervisor struct {
	c     *Client
	key   string
	token string
	value string // what the agent writes in the key once it holds it: its token and timing (see valueOf)
	svc   Service

	running atomic.Bool
	wake    <-chan struct{} // the watch's wake-ups while Run runs; nil when it polls

	mu         sync.Mutex
	phase      Phase
	lastRev    uint64 // revision of the agent's last successful write
	pending    bool   // a write's answer was lost: it may have landed
	cur        string // what the agent last wrote while it confirmed: its token and the longer of its timing and its predecessor's (see confirmValue)
	holder     string // last holder reported to Observe
	seenTiming string // the last holder's value whose longer timing was reported
	holdOff    time.Time
	holdOffMsg bool // the hold-off was reported
	startFails int  // failed Starts in a row

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
		return nil, driver.Errorf(backend, "supervisor", "", err) // err names the key
	}
	if err := (driver.NameRule{What: "token", MaxLen: 1024, Char: printable}).Check(token); err != nil {
		// A bad option, not a bad name: "token must not be empty, got """.
		shown := driver.ShownName(token)
		why := strings.TrimPrefix(err.Error(), fmt.Sprintf("%v %s: ", locks.ErrInvalidName, shown))
		return nil, driver.Errorf(backend, "supervisor", key, driver.InvalidOption("%s, got %s", why, shown))
	}
	return &Supervisor{c: c, key: key, token: token, value: valueOf(token, c.o.timing()), svc: svc}, nil
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
	if err := driver.CheckContext(ctx, backend, "supervisor", s.key); err != nil {
		return err
	}
	if !s.running.CompareAndSwap(false, true) {
		return driver.Errorf(backend, "supervisor", s.key, errors.New("already running"))
	}
	defer s.running.Store(false)
	if s.c.reg.Closed() {
		return s.c.reg.ErrClosed("supervisor", s.key)
	}
	s.mu.Lock()
	s.phase, s.lastRev, s.pending, s.cur = PhaseStandby, 0, false, ""
	s.holder, s.seenTiming = "", ""
	s.holdOff, s.holdOffMsg, s.startFails = time.Time{}, false, 0
	s.mu.Unlock()

	bctx, stop := s.c.reg.Bind(ctx)
	defer stop()
	cl := newClocks(1)
	s.wake = nil
	if w, err := s.c.watch(bctx, "supervisor", s.key, []string{s.key}, cl); err != nil {
		s.event(PhaseStandby, "no watch on the key; polling", err)
	} else {
		defer w.stop()
		s.wake = w.wake
	}
	if err := s.stopService(bctx, true); err != nil {
		s.event(PhaseStandby, "starting: stopping the service failed; trying again each stroke", err)
	} else {
		s.event(PhaseStandby, "starting: service stopped", nil)
	}
	var held *lease
	for bctx.Err() == nil {
		begin := time.Now()
		l, wait := s.stroke(bctx, cl)
		if l != nil {
			if held = s.serve(bctx, l); held != nil {
				break // Run is ending while it holds: shutdown releases
			}
			// The stroke that let go of the key lasts R too: the other
			// agents get the blank key first.
			_ = driver.Sleep(bctx, s.c.o.renewEvery())
			continue
		}
		// The stroke lasts at least R, or until the key is freed, or
		// the holder's silence has lasted T.
		t := time.NewTimer(min(wait, time.Until(begin.Add(s.c.o.renewEvery()))))
		select {
		case <-bctx.Done():
		case <-s.wake:
		case <-t.C:
		}
		t.Stop()
	}
	return s.shutdown(ctx, held)
}

// stroke is one stroke of the pump while the agent does not hold the
// key: stop the service if an earlier Stop failed, then one attempt at
// the key. It returns the lease won, or how long to wait before the
// next stroke at most.
func (s *Supervisor) stroke(ctx context.Context, cl *clocks) (*lease, time.Duration) {
	s.retryStop(ctx)
	a := attempt{op: "supervisor", name: s.key, key: s.key, token: s.value, agent: s}
	got, err := s.c.tryKey(ctx, a, cl, &serverClock{st: s.c.st})
	var held *locks.HeldError
	switch {
	case err == nil:
		return got.(*lease), 0
	case ctx.Err() != nil:
	case s.Phase() == PhaseConfirming:
		s.gaveUp(err)
	case errors.As(err, &held):
		if held.RetryAfter > 0 {
			return nil, held.RetryAfter
		}
		return nil, s.c.o.renewEvery()
	default:
		s.event(PhaseStandby, "attempt at the key failed", err)
	}
	if s.Phase() == PhaseConfirming {
		s.setPhase(PhaseStandby)
	}
	return nil, s.c.o.renewEvery()
}

// retryStop calls Stop again if an earlier Stop failed.
func (s *Supervisor) retryStop(ctx context.Context) {
	if !s.serviceUp() {
		return
	}
	if err := s.stopService(ctx, false); err != nil {
		s.event(PhaseStandby, "stopping the service failed again; trying again next stroke", err)
		return
	}
	s.event(PhaseStandby, "service stopped", nil)
}

func (s *Supervisor) setPhase(p Phase) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.phase = p
	if p == PhaseStandby {
		s.holder = ""
	}
}
