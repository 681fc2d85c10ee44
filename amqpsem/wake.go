package amqpsem

import (
	"sync"
	"sync/atomic"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// waker delivers release notifications to the client's waiting calls, in
// two ways.
//
// Waiting [Locker.Lock] calls take turns: the client consumes the name's
// shared wake queue (see [turnQueue]), bound to the wake exchange with
// the name as key, and RabbitMQ hands each release's wake-up to one of
// its consumers, in turn. The client passes it to its oldest waiting call,
// which declares at once; a client with no call to take it gives it back
// (nack, requeue) for the next consumer. So a release wakes one waiter,
// not all of them: those would all declare, and all but one would break
// a channel on RESOURCE_LOCKED.
//
// Semaphore and Admin waiters, and Locks when the shared queue cannot be
// used, are woken by fan-out: one server-named, exclusive, auto-delete
// queue per client, bound to the wake exchange with the key of each name
// being waited for, consumed on its own channel; every waiter wakes and
// checks.
//
// Releases publish their wake-up with the mandatory flag on a channel in
// confirm mode: the broker returns it when no queue is bound to the key,
// so the releasing client learns whether anyone waits (see
// [waker.waitedAtRelease]).
type waker struct {
	c *session

	mu     sync.Mutex
	ch     *amqp.Channel
	queue  string
	broken bool                             // fan-out unavailable: waiters poll
	subs   map[string]map[*wakeSub]struct{} // key -> fan-out waiters
	bound  map[string]bool                  // keys bound at the broker

	turnCh      *amqp.Channel         // consumes the shared wake queues
	turns       map[string][]*wakeSub // key -> waiters taking turns, oldest first
	turnTags    map[string]string     // key -> tag of the consumer of its shared wake queue on turnCh
	lastTag     uint64                // numbers the consumer tags
	noTurns     map[string]bool       // keys whose shared wake queue failed: fan-out
	used        map[string]time.Time  // key -> when this client last consumed from or cancelled on its shared wake queue
	usedSweepAt int                   // see sweep

	pubMu sync.Mutex
	pub   *pubChannel // releases publish here; see send

	relMu           sync.Mutex
	releases        map[string]*release // queue -> its last release, until a Lock asks
	releasesSweepAt int                 // see sweep
}

func newWaker(c *session) *waker {
	return &waker{
		c:        c,
		subs:     map[string]map[*wakeSub]struct{}{},
		bound:    map[string]bool{},
		turns:    map[string][]*wakeSub{},
		turnTags: map[string]string{},
		noTurns:  map[string]bool{},
		used:     map[string]time.Time{},
		releases: map[string]*release{},
	}
}

// sweep deletes the entries of m that are stale, once m has *at entries
// or more, and sets *at to twice what is left (at least 64): it keeps a
// map of recent events small, at a constant amortized cost per entry.
func sweep[V any](m map[string]V, at *int, stale func(V) bool) {
	if len(m) < *at {
		return
	}
	for k, v := range m {
		if stale(v) {
			delete(m, k)
		}
	}
	*at = max(64, 2*len(m))
}

// wakeSub is one waiting call's subscription. c is nil when wake-ups are
// unavailable.
type wakeSub struct {
	c       chan struct{}
	turns   bool        // taking turns: a release wakes one waiter
	pending atomic.Bool // a wake-up arrived that the call has not used
}

// woken reports whether a wake-up arrived since it was last called, and
// uses it up.
func (s *wakeSub) woken() bool { return s.pending.Swap(false) }

func (s *wakeSub) signal() {
	s.pending.Store(true)
	select {
	case s.c <- struct{}{}:
	default:
	}
}
