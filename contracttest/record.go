package contracttest

import (
	"fmt"
	"slices"
	"sync"
	"time"
)

// History records critical sections on one monotonic clock and checks that
// at most Limit of them overlap. It is safe for concurrent use.
type History struct {
	Limit int // how many may overlap; 1 for a lock

	mu    sync.Mutex
	base  time.Time
	spans []Span
	open  int
	peak  int
}

// Span is one critical section: who held the name, with which token, from
// Enter to Exit on the History's clock.
type Span struct {
	Who         string
	Token       uint64
	Enter, Exit time.Duration
	// Ended, when set, says why the section ended at Exit: its lease
	// ended (the cause), before its holder got round to leaving.
	Ended string
}

// NewHistory returns an empty History allowing limit overlapping sections.
func NewHistory(limit int) *History {
	return &History{Limit: limit, base: time.Now()}
}

// Enter marks the start of a critical section and returns the function
// that marks its end.
func (h *History) Enter(who string, token uint64) (exit func()) {
	h.mu.Lock()
	s := Span{Who: who, Token: token, Enter: time.Since(h.base)}
	h.open++
	h.peak = max(h.peak, h.open)
	h.mu.Unlock()
	return func() {
		h.mu.Lock()
		defer h.mu.Unlock()
		s.Exit = time.Since(h.base)
		h.open--
		h.spans = append(h.spans, s)
	}
}

// Peak returns the largest number of sections seen open at once.
func (h *History) Peak() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.peak
}

// Len returns the number of finished sections.
func (h *History) Len() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.spans)
}

// Check returns an error describing the first moment more than Limit
// finished sections overlapped, or nil.
func (h *History) Check() error {
	h.mu.Lock()
	spans := slices.Clone(h.spans)
	h.mu.Unlock()
	type edge struct {
		at    time.Duration
		delta int
		span  Span
	}
	var edges []edge
	for _, s := range spans {
		edges = append(edges, edge{s.Enter, +1, s}, edge{s.Exit, -1, s})
	}
	// At equal times, exits go first: touching sections do not overlap.
	slices.SortFunc(edges, func(a, b edge) int {
		if a.at != b.at {
			return int(a.at - b.at)
		}
		return a.delta - b.delta
	})
	open := map[Span]bool{}
	for _, e := range edges {
		if e.delta < 0 {
			delete(open, e.span)
			continue
		}
		open[e.span] = true
		if len(open) > h.Limit {
			var who []string
			for s := range open {
				span := fmt.Sprintf("%s(token %d, %v-%v", s.Who, s.Token, s.Enter, s.Exit)
				if s.Ended != "" {
					span += ", lease ended: " + s.Ended
				}
				who = append(who, span+")")
			}
			slices.Sort(who)
			return fmt.Errorf("%d critical sections overlap at %v, limit %d: %v", len(open), e.at, h.Limit, who)
		}
	}
	return nil
}

// FencedResource is a resource guarded by fencing tokens, as a storage
// service would guard itself: it accepts a write only with a token at
// least as large as every token it has seen, and rejects the rest. A lock
// whose tokens do not strictly increase between holders makes it reject.
// It is safe for concurrent use.
type FencedResource struct {
	mu       sync.Mutex
	last     uint64
	lastWho  string
	accepted int
}

// Write records a write by who with token, or returns an error if a later
// holder's token has been seen.
func (r *FencedResource) Write(who string, token uint64) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if token == 0 {
		return fmt.Errorf("fenced write by %s with token 0", who)
	}
	if token < r.last || token == r.last && who != r.lastWho {
		return fmt.Errorf("stale fencing token %d from %s: %s already wrote with %d", token, who, r.lastWho, r.last)
	}
	r.last, r.lastWho = token, who
	r.accepted++
	return nil
}

// Accepted returns how many writes were accepted.
func (r *FencedResource) Accepted() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.accepted
}
