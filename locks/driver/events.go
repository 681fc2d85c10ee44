package driver

import (
	"sync"
	"time"
)

// EventKind says what happened in an [Event].
type EventKind string

// The kinds of events. The kit reports the renewal ones itself; each
// backend reports those of its own protocol.
const (
	// EventRenewRound: a renewal round ended. Leases is the batch's size,
	// Failed how many answers were neither a renewal nor a loss, Duration
	// the round trip.
	EventRenewRound EventKind = "renew_round"
	// EventRenewFailed: one lease's renewal failed in a round without
	// ending it (it is retried until its deadline). Err says why.
	EventRenewFailed EventKind = "renew_failed"

	// EventQuorumError: a step reached fewer than a quorum of masters
	// (redlockprio). Master names one that failed, Err its error.
	EventQuorumError EventKind = "quorum_error"
	// EventTheft: a higher priority took a name from its holder
	// (redlockprio).
	EventTheft EventKind = "theft"
	// EventAckWait: a thief waited for its victim's acknowledgement or
	// for the victim's lease to run out; Duration is the wait
	// (redlockprio).
	EventAckWait EventKind = "ack_wait"

	// EventTakeover: a client took over a key whose holder went silent
	// (natsputex).
	EventTakeover EventKind = "takeover"
	// EventConfirmation: a taker-over confirmed its write; Duration is
	// the time since its takeover (natsputex).
	EventConfirmation EventKind = "confirmation"

	// EventVerifyFailed: a check that a held queue is still the lease's
	// failed (amqpsem).
	EventVerifyFailed EventKind = "verify_failed"
	// EventResourceLocked: the broker answered RESOURCE_LOCKED and the
	// step was retried (amqpsem).
	EventResourceLocked EventKind = "resource_locked"
)

// An Event is something a backend did that an observer may count or
// trace. Fields that do not apply to a kind are zero.
type Event struct {
	Kind     EventKind
	Backend  string        // filled in by the kit
	Name     string        // the lock's name; empty for a client-wide event
	Token    uint64        // the lease's fencing token, if any
	Master   string        // the broker node concerned (a Redis master's address)
	Duration time.Duration // how long the step took, if it is timed
	Leases   int           // EventRenewRound: the batch's size
	Failed   int           // EventRenewRound: answers that failed
	Err      error
}

// Observable is an optional interface that may be implemented by a
// [locks.Locker] or [locks.Semaphore] whose backend reports [Event]s.
// Observe calls fn for every event from now on, from the backend's
// goroutines (fn must be quick and safe for concurrent use), until the
// returned stop function is called.
type Observable interface {
	Observe(fn func(Event)) (stop func())
}

// Events fans a backend's events out to its observers. The zero Events
// has no observers; a Registry has one ([Registry.Observe],
// [Registry.Emit]).
type Events struct {
	backend string
	mu      sync.RWMutex
	next    int
	subs    map[int]func(Event)
}

// Observe implements [Observable].
func (e *Events) Observe(fn func(Event)) (stop func()) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.subs == nil {
		e.subs = make(map[int]func(Event))
	}
	id := e.next
	e.next++
	e.subs[id] = fn
	return func() {
		e.mu.Lock()
		delete(e.subs, id)
		e.mu.Unlock()
	}
}

// Emit sends ev to every observer, outside any lock, so an observer may
// call its stop function. It costs one read lock when there are none.
func (e *Events) Emit(ev Event) {
	e.mu.RLock()
	if len(e.subs) == 0 {
		e.mu.RUnlock()
		return
	}
	fns := make([]func(Event), 0, len(e.subs))
	for _, fn := range e.subs {
		fns = append(fns, fn)
	}
	e.mu.RUnlock()
	if ev.Backend == "" {
		ev.Backend = e.backend
	}
	for _, fn := range fns {
		fn(ev)
	}
}

// Observe implements [Observable] for the registry's events.
func (r *Registry) Observe(fn func(Event)) (stop func()) { return r.events.Observe(fn) }

// Emit reports a backend's event to the registry's observers.
func (r *Registry) Emit(ev Event) { r.events.Emit(ev) }
