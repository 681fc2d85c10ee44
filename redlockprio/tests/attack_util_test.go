package redlockprio_test

import (
	"fmt"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/latchkey-go/latchkey/locks"
	"github.com/latchkey-go/latchkey/redlockprio"
)

// atkClock records critical sections on one monotonic clock.
type atkClock struct {
	base time.Time
	mu   sync.Mutex
	secs []*atkSection
}

func newAtkClock() *atkClock { return &atkClock{base: time.Now()} }

func (c *atkClock) now() time.Duration { return time.Since(c.base) }

func (c *atkClock) at(t time.Time) time.Duration { return t.Sub(c.base) }

// atkSection is one holder's critical section: granted is taken right after
// Lock returned (late, so conservative), each write's time is taken before
// the holder checked that it may still write (early, so conservative).
type atkSection struct {
	who       string
	token     uint64
	granted   time.Duration
	lastWrite time.Duration // -1 if none
	writes    int
	deadline  time.Duration // lease deadline when the section ended
	ended     time.Duration // when the holder let go (called Release)
	ctxEnd    time.Duration // when the lease's context ended (-1 while live)
}

func (c *atkClock) begin(who string, l locks.Lease) *atkSection {
	s := &atkSection{who: who, token: l.Token(), granted: c.now(), lastWrite: -1, ctxEnd: -1}
	c.mu.Lock()
	c.secs = append(c.secs, s)
	c.mu.Unlock()
	go func() {
		<-l.Context().Done()
		t := c.now()
		c.mu.Lock()
		s.ctxEnd = t
		c.mu.Unlock()
	}()
	return s
}

// write records a write at t if ok.
func (c *atkClock) write(s *atkSection, t time.Duration) {
	c.mu.Lock()
	s.lastWrite = max(s.lastWrite, t)
	s.writes++
	c.mu.Unlock()
}

// workWhileLive writes every millisecond while the lease's context is live,
// until stop is closed. It returns when it stopped writing.
func (c *atkClock) workWhileLive(s *atkSection, l locks.Lease, stop <-chan struct{}) {
	for {
		t := c.now()
		if l.Context().Err() != nil {
			return
		}
		select {
		case <-stop:
			return
		default:
		}
		c.write(s, t)
		time.Sleep(time.Millisecond)
	}
}

// workIgnoringContext writes every millisecond, whatever the lease's context
// says, while the lease's validity (Deadline) has not run out, until stop is
// closed: the holder's code has not let go until it calls Release, which the
// docs say the thief waits for (or the validity).
func (c *atkClock) workIgnoringContext(s *atkSection, l locks.Lease, stop <-chan struct{}) {
	dl := l.(*redlockprio.Lease)
	for {
		t := c.now()
		if !time.Now().Before(dl.Deadline()) {
			return
		}
		select {
		case <-stop:
			return
		default:
		}
		c.write(s, t)
		time.Sleep(time.Millisecond)
	}
}

func (c *atkClock) end(s *atkSection, l locks.Lease) {
	c.mu.Lock()
	s.ended = c.now()
	s.deadline = c.at(l.(*redlockprio.Lease).Deadline())
	c.mu.Unlock()
}

// check fails t when a holder wrote after a later holder was granted, or
// when tokens do not strictly increase in grant order. It returns the
// number of violations.
func (c *atkClock) check(t testing.TB) int {
	t.Helper()
	c.mu.Lock()
	secs := make([]atkSection, len(c.secs)) // copies: begin's goroutines write ctxEnd under c.mu
	for i, s := range c.secs {
		secs[i] = *s
	}
	c.mu.Unlock()
	sort.Slice(secs, func(i, j int) bool { return secs[i].granted < secs[j].granted })
	bad := 0
	for i, a := range secs {
		for _, b := range secs[i+1:] {
			if a.lastWrite > b.granted {
				bad++
				if bad <= 10 {
					t.Errorf("OVERLAP: %s (token %d, granted %v) wrote %v after %s (token %d) was granted at %v",
						a.who, a.token, ms(a.granted), ms(a.lastWrite-b.granted), b.who, b.token, ms(b.granted))
				}
			}
		}
		if a.ended > 0 && a.ctxEnd > a.deadline+2*time.Millisecond {
			bad++
			t.Errorf("LATE END: %s's context ended %v, %v after its validity deadline %v",
				a.who, ms(a.ctxEnd), ms(a.ctxEnd-a.deadline), ms(a.deadline))
		}
		if i > 0 && secs[i-1].token >= a.token {
			bad++
			if bad <= 10 {
				t.Errorf("TOKEN: %s granted at %v got token %d, not above %s's %d granted at %v",
					a.who, ms(a.granted), a.token, secs[i-1].who, secs[i-1].token, ms(secs[i-1].granted))
			}
		}
	}
	return bad
}

func (c *atkClock) dump(t testing.TB) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, s := range c.secs {
		t.Logf("  %-10s token %-4d granted %-8v lastWrite %-8v writes %-5d ctxEnd %-8v letGo %-8v deadline %v",
			s.who, s.token, ms(s.granted), ms(s.lastWrite), s.writes, ms(s.ctxEnd), ms(s.ended), ms(s.deadline))
	}
}

func ms(d time.Duration) string { return fmt.Sprintf("%.1fms", float64(d)/float64(time.Millisecond)) }

// maxConcurrent returns the largest number of sections that were live at
// once (from grant to last write), and when.
func (c *atkClock) maxConcurrent() (int, time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	type ev struct {
		at time.Duration
		d  int
	}
	var evs []ev
	for _, s := range c.secs {
		end := max(s.lastWrite, s.granted)
		evs = append(evs, ev{s.granted, +1}, ev{end, -1})
	}
	sort.Slice(evs, func(i, j int) bool {
		if evs[i].at != evs[j].at {
			return evs[i].at < evs[j].at
		}
		return evs[i].d < evs[j].d // ends before starts at the same instant
	})
	n, best := 0, 0
	var when time.Duration
	for _, e := range evs {
		n += e.d
		if n > best {
			best, when = n, e.at
		}
	}
	return best, when
}
