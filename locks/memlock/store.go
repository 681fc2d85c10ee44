package memlock

import (
	"fmt"
	"sync"
	"time"

	"github.com/latchkey-go/latchkey/locks"
	"github.com/latchkey-go/latchkey/locks/driver"
)

// backend names memlock in errors and events.
const backend = "memlock"

// MaxSemaphoreSize is the largest size [Client.Semaphore] accepts.
const MaxSemaphoreSize = 65535

// names is the rule memlock applies to names, so that tests of user code
// catch empty or garbled names as a real backend would.
var names = driver.NameRule{What: "memlock name", MaxLen: 1024}

// Store is the in-memory broker: all clients made from one Store contend
// for the same names. The zero Store is not usable; call [New].
//
// A Store is safe for concurrent use.
type Store struct {
	mu      sync.Mutex
	entries map[string]*entry
	nextID  uint64
}

type entry struct {
	holds   []*hold // by slot index; nil or expired means free
	counter uint64  // last fencing token handed out
	waiters map[chan struct{}]struct{}
}

// hold is a lease as the Store sees it: a slot of a name.
type hold struct {
	client   *Client
	name     string
	slot     int // index in entry.holds
	lease    *driver.Lease
	expires  time.Time
	priority int
}

// New returns an empty Store.
func New() *Store {
	return &Store{entries: make(map[string]*entry)}
}

func (s *Store) heldErrorLocked(name string, e *entry, size int, now time.Time) error {
	first := e.holds[0]
	soonest := first.expires
	for _, h := range e.holds[:size] {
		if h.expires.Before(soonest) {
			first, soonest = h, h.expires
		}
	}
	return &locks.HeldError{Name: name, Holder: first.client.id, RetryAfter: soonest.Sub(now)}
}

func (s *Store) entryLocked(name string, size int) *entry {
	e := s.entries[name]
	if e == nil {
		e = &entry{waiters: make(map[chan struct{}]struct{})}
		s.entries[name] = e
	}
	for len(e.holds) < size {
		e.holds = append(e.holds, nil)
	}
	return e
}

// release frees h at the Store, unless its client was killed: a dead
// process cannot tell the broker anything.
func (s *Store) release(h *hold) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if h.client.state == killed {
		return
	}
	s.dropLocked(h)
}

func (s *Store) holdsLocked(h *hold) bool {
	e := s.entries[h.name]
	return e != nil && h.slot < len(e.holds) && e.holds[h.slot] == h
}

// dropLocked removes h from its slot if it is still there and wakes the
// name's waiters.
func (s *Store) dropLocked(h *hold) {
	if h.lease != nil {
		delete(h.client.holds, h.lease)
	}
	if !s.holdsLocked(h) {
		return
	}
	e := s.entries[h.name]
	e.holds[h.slot] = nil
	s.wakeLocked(e)
}

func (s *Store) wakeLocked(e *entry) {
	for w := range e.waiters {
		select {
		case w <- struct{}{}:
		default:
		}
	}
}

// Revoke takes every lease on name away at once, as an administrator
// deleting the lock at the broker would: their contexts end with
// [locks.ErrLost] and waiters are woken. It reports how many leases ended.
func (s *Store) Revoke(name string) int {
	s.mu.Lock()
	e := s.entries[name]
	var gone []*hold
	if e != nil {
		for _, h := range e.holds {
			if h != nil {
				gone = append(gone, h)
				s.dropLocked(h)
			}
		}
	}
	s.mu.Unlock()
	for _, h := range gone {
		h.lease.End(driver.Lost(fmt.Errorf("memlock: %q revoked", name)))
	}
	return len(gone)
}

// Expire makes every lease on name expire now at the Store, as if its
// holders had stopped renewing for a whole TTL. The holders are not told:
// each finds out on its next renewal, and its lease then ends with
// [locks.ErrLost]. Meanwhile others may take the name, so Expire is the
// way to test that code stops when its lease's context ends.
func (s *Store) Expire(name string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	e := s.entries[name]
	if e == nil {
		return
	}
	now := time.Now()
	for _, h := range e.holds {
		if h != nil {
			h.expires = now
		}
	}
	s.wakeLocked(e)
}
