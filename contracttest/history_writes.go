package contracttest

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/latchkey-go/latchkey/locks"
)

// WriteHistory records critical sections by what their holders did, on
// one monotonic clock: when each holder was granted its lease, when it
// wrote, when the lease's context ended, and when the holder let go with
// which validity deadline. Where a [History] takes a section to run from
// Enter to its exit, a WriteHistory takes it to run from the grant to
// the holder's last write, as the resource the holders write to sees it,
// and [WriteHistory.Check] checks what that resource needs.
//
// Times are durations on the clock of [WriteHistory.Now]. Each is taken
// on the conservative side: a grant's time after the grant returned
// (late), a write's before the holder checked that it may still write
// (early).
//
// While a recorded lease's context is live, a WriteHistory watches the
// scheduler as [Bound.Watch] does, so that [WriteHistory.Check] can tell
// a context that ended late from one whose end was seen late because the
// process stalled.
//
// A WriteHistory and its [Writer]s are safe for concurrent use.
type WriteHistory struct {
	base time.Time

	mu     sync.Mutex
	secs   []*Writer
	live   int           // recorded contexts not yet ended
	stop   chan struct{} // ends the scheduler's watch; nil when none runs
	stalls []stall       // what the watch saw
}

// stall is a 1ms sleep of the scheduler's watch that overshot by more
// than a millisecond, on a WriteHistory's clock.
type stall struct{ from, to time.Duration }

// Writer is one holder's critical section in a [WriteHistory], from
// [WriteHistory.Begin] to its holder's last write. Its methods are safe
// for concurrent use.
type Writer struct {
	h     *WriteHistory
	lease locks.Lease
	rec   Written // guarded by h.mu
}

// Written is what a [WriteHistory] knows of one critical section. Its
// times are on the WriteHistory's clock; -1 is a time that has not come
// (yet).
type Written struct {
	Who   string
	Token uint64
	// Slot is the lease's slot ([locks.SlotLease]), 0 for a lease
	// without one.
	Slot int
	// Granted is when [WriteHistory.Begin] was called, right after the
	// grant returned.
	Granted time.Duration
	// LastWrite is the latest time given to [Writer.Write]; Writes
	// counts the calls.
	LastWrite time.Duration
	Writes    int
	// ContextEnd is when the lease's context was seen to end.
	ContextEnd time.Duration
	// LetGo is when [Writer.LetGo] was first called; Deadline is the
	// lease's validity deadline then, -1 for a lease that does not
	// report one.
	LetGo, Deadline time.Duration
}

// lateEndSlack is how long after its validity deadline a lease's context
// may be seen to end on a machine that runs the process: the delay of
// the lease's timer and of the goroutine that records the end. A stall
// of the process adds to it (see [WriteHistory.Check]).
const lateEndSlack = 2 * time.Millisecond

// maxListed is how many violations the error of [WriteHistory.Check]
// spells out.
const maxListed = 10

// deadliner is a lease that reports its validity deadline, as those of
// redlockprio and natsputex do: zero for none, else the time after which
// its holder may no longer count on it.
type deadliner interface{ Deadline() time.Time }

// NewWriteHistory returns an empty WriteHistory whose clock starts now.
func NewWriteHistory() *WriteHistory {
	return &WriteHistory{base: time.Now()}
}

// Now returns the time elapsed on the WriteHistory's clock.
func (h *WriteHistory) Now() time.Duration {
	return time.Since(h.base)
}

// Begin records the start of who's critical section under lease, which
// was granted just before the call, and returns its Writer. From then on
// the WriteHistory watches the lease's context and records when it ends,
// and watches the scheduler until every recorded context has ended.
func (h *WriteHistory) Begin(who string, lease locks.Lease) *Writer {
	w := &Writer{h: h, lease: lease, rec: Written{
		Who: who, Token: lease.Token(), Granted: h.Now(),
		LastWrite: -1, ContextEnd: -1, LetGo: -1, Deadline: -1,
	}}
	if s, ok := lease.(locks.SlotLease); ok {
		w.rec.Slot = s.Slot()
	}
	h.mu.Lock()
	h.secs = append(h.secs, w)
	if h.live++; h.stop == nil {
		h.stop = make(chan struct{})
		go h.watch(h.stop)
	}
	h.mu.Unlock()
	context.AfterFunc(lease.Context(), func() {
		at := h.Now()
		h.mu.Lock()
		defer h.mu.Unlock()
		w.rec.ContextEnd = at
		if h.live--; h.live == 0 {
			close(h.stop)
			h.stop = nil
		}
	})
	return w
}

// watch sleeps 1ms at a time until stop is closed, and records each sleep
// that overshot by more than a millisecond.
func (h *WriteHistory) watch(stop <-chan struct{}) {
	for {
		select {
		case <-stop:
			return
		default:
		}
		from := h.Now()
		time.Sleep(time.Millisecond)
		if to := h.Now(); to-from > 2*time.Millisecond {
			h.mu.Lock()
			h.stalls = append(h.stalls, stall{from, to})
			h.mu.Unlock()
		}
	}
}

// stalled returns by how much the longest of the watch's sleeps that
// overlap from to to overshot, 0 for none.
func (h *WriteHistory) stalled(from, to time.Duration) time.Duration {
	h.mu.Lock()
	defer h.mu.Unlock()
	var longest time.Duration
	for _, s := range h.stalls {
		if s.to > from && s.from < to {
			longest = max(longest, s.to-s.from-time.Millisecond)
		}
	}
	return longest
}

// Write records a write by the holder at at, a time taken from
// [WriteHistory.Now] before the holder checked that it may still write.
func (w *Writer) Write(at time.Duration) {
	w.h.mu.Lock()
	defer w.h.mu.Unlock()
	w.rec.LastWrite = max(w.rec.LastWrite, at)
	w.rec.Writes++
}

// WriteWhileLive writes every millisecond while the lease's context is
// live, until stop is closed (a nil stop never is), as a holder does that
// stops when its context ends. It returns when it stopped writing.
func (w *Writer) WriteWhileLive(stop <-chan struct{}) {
	w.writeWhile(func() bool { return w.lease.Context().Err() == nil }, stop)
}

// Hold is the holder that stops when told: in a goroutine of its own it
// writes while the lease's context is live ([Writer.WriteWhileLive]),
// then lets go ([Writer.LetGo]) and, if release is set, releases the
// lease. The channel it returns is closed when that is done.
func (w *Writer) Hold(release bool) <-chan struct{} {
	done := make(chan struct{})
	go func() {
		defer close(done)
		w.WriteWhileLive(nil)
		w.LetGo()
		if release {
			_ = w.lease.Release(context.Background())
		}
	}()
	return done
}

// WriteUntilDeadline writes every millisecond, whatever the lease's
// context says, while the lease's validity deadline (read again before
// each write) has not passed, until stop is closed (a nil stop never
// is): the holder's code lets go only when it calls Release, or when its
// validity has run out. It returns when it stopped writing. It panics if
// the lease does not report its deadline (a Deadline() time.Time method).
func (w *Writer) WriteUntilDeadline(stop <-chan struct{}) {
	dl, ok := w.lease.(deadliner)
	if !ok {
		panic(fmt.Sprintf("contracttest: WriteUntilDeadline: lease %T reports no deadline", w.lease))
	}
	w.writeWhile(func() bool { return time.Now().Before(dl.Deadline()) }, stop)
}

// writeWhile writes every millisecond while ok holds, until stop is
// closed; each write's time is taken before ok is asked.
func (w *Writer) writeWhile(ok func() bool, stop <-chan struct{}) {
	for {
		at := w.h.Now()
		if !ok() {
			return
		}
		select {
		case <-stop:
			return
		default:
		}
		w.Write(at)
		time.Sleep(time.Millisecond)
	}
}

// LetGo records that the holder let go of the section (call it before
// Release), and the lease's validity deadline at that moment. Only the
// first call counts.
func (w *Writer) LetGo() {
	at := w.h.Now()
	deadline := time.Duration(-1)
	if dl, ok := w.lease.(deadliner); ok && !dl.Deadline().IsZero() {
		deadline = dl.Deadline().Sub(w.h.base)
	}
	w.h.mu.Lock()
	defer w.h.mu.Unlock()
	if w.rec.LetGo < 0 {
		w.rec.LetGo, w.rec.Deadline = at, deadline
	}
}

// Record returns what the WriteHistory knows of the section now.
func (w *Writer) Record() Written {
	w.h.mu.Lock()
	defer w.h.mu.Unlock()
	return w.rec
}

// Records returns what the WriteHistory knows of every section now, in
// the order they began.
func (h *WriteHistory) Records() []Written {
	h.mu.Lock()
	defer h.mu.Unlock()
	recs := make([]Written, len(h.secs))
	for i, w := range h.secs {
		recs[i] = w.rec
	}
	return recs
}

// Check returns an error listing the violations among the sections
// recorded so far, or nil. Sections are compared with those of their own
// slot (a semaphore's slots are so many locks). It is a violation
//   - when a holder wrote after a later holder was granted (OVERLAP);
//     of two leases with tokens, the later is the one with the higher
//     token, else the one granted later, since a grant is recorded when
//     Lock returned: a victim of a theft, or a lease that ran out before
//     its Lock returned, can be recorded after the lease that replaced
//     it,
//   - when a holder that wrote got a token not above that of the lease
//     granted before it (TOKEN),
//   - when a section whose holder let go saw its lease's context end
//     after the deadline the lease reported then, by more than 2ms (the
//     timer's and the scheduler's delay) and twice the longest stall
//     the scheduler's watch saw between the two (the lease's timer and
//     the goroutine that records the end may each have been held up by
//     it) (LATE END).
//
// The error spells out the first ten.
func (h *WriteHistory) Check() error {
	recs := h.Records()
	slices.SortStableFunc(recs, byGrant)
	var bad []string
	before := map[int]Written{} // the slot's previous grant
	for i, a := range recs {
		for _, b := range recs[i+1:] {
			if b.Slot != a.Slot {
				continue
			}
			earlier, later := a, b
			if a.Token != 0 && b.Token != 0 && a.Token > b.Token {
				earlier, later = b, a
			}
			if earlier.LastWrite > later.Granted {
				bad = append(bad, fmt.Sprintf("OVERLAP: %s (token %d, granted %s) wrote %s after %s (token %d) was granted at %s",
					earlier.name(), earlier.Token, ms(earlier.Granted), ms(earlier.LastWrite-later.Granted), later.name(), later.Token, ms(later.Granted)))
			}
		}
		if a.Deadline >= 0 && a.ContextEnd > a.Deadline+lateEndSlack {
			if stalled := h.stalled(a.Deadline, a.ContextEnd); a.ContextEnd > a.Deadline+lateEndSlack+2*stalled {
				bad = append(bad, fmt.Sprintf("LATE END: %s's context ended %s, %s after its validity deadline %s (allowed: %s + 2 × a stall of %s the scheduler showed then)",
					a.name(), ms(a.ContextEnd), ms(a.ContextEnd-a.Deadline), ms(a.Deadline), ms(lateEndSlack), ms(stalled)))
			}
		}
		if p, ok := before[a.Slot]; ok && p.Token >= a.Token && a.Writes > 0 {
			bad = append(bad, fmt.Sprintf("TOKEN: %s granted at %s got token %d, not above %s's %d granted at %s",
				a.name(), ms(a.Granted), a.Token, p.name(), p.Token, ms(p.Granted)))
		}
		before[a.Slot] = a
	}
	if len(bad) == 0 {
		return nil
	}
	if len(bad) > maxListed {
		bad = append(bad[:maxListed], fmt.Sprintf("and %d more", len(bad)-maxListed))
	}
	return errors.New(strings.Join(bad, "\n"))
}

// Peak returns the largest number of sections that were live at once,
// each from its grant to its last write, and the earliest time it was
// reached; sections that touch do not overlap. It counts every slot.
func (h *WriteHistory) Peak() (n int, at time.Duration) {
	recs := h.Records()
	slices.SortStableFunc(recs, byGrant)
	// The count is largest at some section's grant.
	for _, s := range recs {
		live := 0
		for _, r := range recs {
			if r.Granted <= s.Granted && s.Granted < r.LastWrite {
				live++
			}
		}
		if live > n {
			n, at = live, s.Granted
		}
	}
	return n, at
}

// byGrant orders sections by their grants.
func byGrant(a, b Written) int { return cmp.Compare(a.Granted, b.Granted) }

// String returns the sections, one a line, in the order they began.
func (h *WriteHistory) String() string {
	var b strings.Builder
	for _, r := range h.Records() {
		fmt.Fprintf(&b, "%v\n", r)
	}
	return b.String()
}

// String returns the section on one line.
func (r Written) String() string {
	return fmt.Sprintf("%-14s token %-4d granted %-8s lastWrite %-8s writes %-5d ctxEnd %-8s letGo %-8s deadline %s",
		r.name(), r.Token, ms(r.Granted), ms(r.LastWrite), r.Writes, ms(r.ContextEnd), ms(r.LetGo), ms(r.Deadline))
}

// name is who, with the slot if the lease has one.
func (r Written) name() string {
	if r.Slot != 0 {
		return fmt.Sprintf("%s (slot %d)", r.Who, r.Slot)
	}
	return r.Who
}

// ms formats a time on a WriteHistory's clock in milliseconds, "-" for
// one that has not come.
func ms(d time.Duration) string {
	if d < 0 {
		return "-"
	}
	return fmt.Sprintf("%.1fms", float64(d)/float64(time.Millisecond))
}
