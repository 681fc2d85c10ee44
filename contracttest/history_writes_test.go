package contracttest

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/latchkey-go/latchkey/locks"
	"github.com/latchkey-go/latchkey/locks/memlock"
)

// handLease is a lease made by hand for the WriteHistory tests: the test
// chooses its token and slot, ends its context and sets the deadline it
// reports.
type handLease struct {
	ctx   context.Context
	end   context.CancelFunc
	token uint64
	slot  int

	mu       sync.Mutex
	deadline time.Time
}

func newHandLease(t *testing.T, token uint64, slot int, deadline time.Time) *handLease {
	ctx, end := context.WithCancel(context.Background())
	t.Cleanup(end)
	return &handLease{ctx: ctx, end: end, token: token, slot: slot, deadline: deadline}
}

func (l *handLease) Name() string                  { return "n" }
func (l *handLease) Context() context.Context      { return l.ctx }
func (l *handLease) Token() uint64                 { return l.token }
func (l *handLease) Slot() int                     { return l.slot }
func (l *handLease) Release(context.Context) error { l.end(); return nil }

func (l *handLease) Deadline() time.Time {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.deadline
}

func (l *handLease) setDeadline(d time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.deadline = d
}

// memLease returns a real lease on a fresh name, from memlock, and its
// store. memlock's leases report no deadline.
func memLease(t *testing.T) (locks.Lease, *memlock.Store) {
	store := memlock.New()
	c, err := store.NewClient()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close(context.Background()) })
	lease, err := c.Locker().TryLock(context.Background(), "n")
	if err != nil {
		t.Fatal(err)
	}
	return lease, store
}

// waitFor polls ok every millisecond for up to 5s and fails t if it does
// not come true.
func waitFor(t *testing.T, what string, ok func() bool) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); !ok(); time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within 5s", what)
		}
	}
}

// closed reports whether c is closed.
func closed(c <-chan struct{}) bool {
	select {
	case <-c:
		return true
	default:
		return false
	}
}

// violations counts the lines of Check's error by their kind.
func violations(err error) map[string]int {
	n := map[string]int{}
	if err == nil {
		return n
	}
	for line := range strings.SplitSeq(err.Error(), "\n") {
		kind, _, _ := strings.Cut(line, ":")
		n[kind]++
	}
	return n
}

// TestWriteHistoryCheck: Check finds a write after a later holder's
// grant (with every later holder, within a slot), a token not above the
// one granted before it (within a slot), and a lease context that ended
// late after its holder let go; and nothing in histories without them.
func TestWriteHistoryCheck(t *testing.T) {
	hour := time.Now().Add(time.Hour)
	for _, tc := range []struct {
		name string
		run  func(t *testing.T, h *WriteHistory)
		want map[string]int
	}{
		{"one after another", func(t *testing.T, h *WriteHistory) {
			a := h.Begin("a", newHandLease(t, 1, 0, hour))
			a.Write(h.Now())
			a.LetGo()
			b := h.Begin("b", newHandLease(t, 2, 0, hour))
			b.Write(h.Now())
		}, nil},
		{"last write at the next grant", func(t *testing.T, h *WriteHistory) {
			a := h.Begin("a", newHandLease(t, 1, 0, hour))
			b := h.Begin("b", newHandLease(t, 2, 0, hour))
			a.Write(b.Record().Granted)
		}, nil},
		{"write after the next grant", func(t *testing.T, h *WriteHistory) {
			a := h.Begin("a", newHandLease(t, 1, 0, hour))
			b := h.Begin("b", newHandLease(t, 2, 0, hour))
			a.Write(b.Record().Granted + time.Microsecond)
		}, map[string]int{"OVERLAP": 1}},
		{"write after two later grants", func(t *testing.T, h *WriteHistory) {
			a := h.Begin("a", newHandLease(t, 1, 0, hour))
			h.Begin("b", newHandLease(t, 2, 0, hour))
			c := h.Begin("c", newHandLease(t, 3, 0, hour))
			a.Write(c.Record().Granted + time.Microsecond)
		}, map[string]int{"OVERLAP": 2}},
		{"tokens down", func(t *testing.T, h *WriteHistory) {
			h.Begin("a", newHandLease(t, 2, 0, hour))
			h.Begin("b", newHandLease(t, 1, 0, hour)).Write(h.Now())
		}, map[string]int{"TOKEN": 1, "OVERLAP": 1}},
		{"equal tokens", func(t *testing.T, h *WriteHistory) {
			h.Begin("a", newHandLease(t, 1, 0, hour))
			h.Begin("b", newHandLease(t, 1, 0, hour)).Write(h.Now())
		}, map[string]int{"TOKEN": 1}},
		{"replaced lease recorded after its replacement", func(t *testing.T, h *WriteHistory) {
			// A thief's Lock returned before its victim's: the victim,
			// whose lease ended before it could write, is recorded last.
			thief := h.Begin("thief", newHandLease(t, 2, 0, hour))
			thief.Write(h.Now())
			h.Begin("victim", newHandLease(t, 1, 0, hour))
			thief.Write(h.Now())
		}, nil},
		{"replaced lease written after its replacement", func(t *testing.T, h *WriteHistory) {
			h.Begin("thief", newHandLease(t, 2, 0, hour))
			h.Begin("victim", newHandLease(t, 1, 0, hour)).Write(h.Now())
		}, map[string]int{"OVERLAP": 1, "TOKEN": 1}},
		{"two slots at once", func(t *testing.T, h *WriteHistory) {
			a := h.Begin("a", newHandLease(t, 2, 1, hour))
			b := h.Begin("b", newHandLease(t, 1, 2, hour))
			a.Write(b.Record().Granted + time.Millisecond)
		}, nil},
		{"one slot twice at once", func(t *testing.T, h *WriteHistory) {
			a := h.Begin("a", newHandLease(t, 1, 1, hour))
			h.Begin("b", newHandLease(t, 3, 2, hour))
			c := h.Begin("c", newHandLease(t, 2, 1, hour))
			a.Write(c.Record().Granted + time.Millisecond)
		}, map[string]int{"OVERLAP": 1}},
		{"context ended after the deadline", func(t *testing.T, h *WriteHistory) {
			l := newHandLease(t, 1, 0, time.Now().Add(-900*time.Millisecond))
			a := h.Begin("a", l)
			l.end()
			waitFor(t, "the context's end recorded", func() bool { return a.Record().ContextEnd >= 0 })
			a.LetGo()
		}, map[string]int{"LATE END": 1}},
		{"context ended after the deadline, holder not gone", func(t *testing.T, h *WriteHistory) {
			l := newHandLease(t, 1, 0, time.Now().Add(-900*time.Millisecond))
			a := h.Begin("a", l)
			l.end()
			waitFor(t, "the context's end recorded", func() bool { return a.Record().ContextEnd >= 0 })
		}, nil},
		{"context ended before the deadline", func(t *testing.T, h *WriteHistory) {
			l := newHandLease(t, 1, 0, hour)
			a := h.Begin("a", l)
			l.end()
			waitFor(t, "the context's end recorded", func() bool { return a.Record().ContextEnd >= 0 })
			a.LetGo()
		}, nil},
		{"more than ten", func(t *testing.T, h *WriteHistory) {
			a := h.Begin("a", newHandLease(t, 1, 0, hour))
			for i := range 12 {
				h.Begin("b", newHandLease(t, uint64(2+i), 0, hour))
			}
			a.Write(h.Now())
		}, map[string]int{"OVERLAP": 10, "and 2 more": 1}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// The clock starts a second early, so that a deadline 900ms
			// ago is on it.
			h := &WriteHistory{base: time.Now().Add(-time.Second)}
			tc.run(t, h)
			err := h.Check()
			got := violations(err)
			if len(got) != len(tc.want) {
				t.Errorf("Check: %v; want violations %v", err, tc.want)
				return
			}
			for kind, n := range tc.want {
				if got[kind] != n {
					t.Errorf("Check found %d %s: %v; want violations %v", got[kind], kind, err, tc.want)
				}
			}
		})
	}
}

// TestWriterWriteWhileLive: WriteWhileLive writes until the lease's
// context ends, each write's time taken before it looked (so before the
// end), or until stop is closed.
func TestWriterWriteWhileLive(t *testing.T) {
	lease, store := memLease(t)
	h := NewWriteHistory()
	w := h.Begin("a", lease)
	done := make(chan struct{})
	go func() { defer close(done); w.WriteWhileLive(nil) }()
	waitFor(t, "a write", func() bool { return w.Record().Writes > 0 })
	if n := store.Revoke("n"); n != 1 {
		t.Fatalf("Revoke = %d, want 1", n)
	}
	waitFor(t, "WriteWhileLive's return after the lease ended", func() bool { return closed(done) })
	waitFor(t, "the context's end recorded", func() bool { return w.Record().ContextEnd >= 0 })
	w.LetGo()
	r := w.Record()
	if r.LastWrite < r.Granted || r.LastWrite >= r.ContextEnd || r.Deadline != -1 {
		t.Errorf("record %v: want writes from the grant to before the context's end, no deadline", r)
	}

	live := newHandLease(t, 2, 0, time.Now().Add(time.Hour))
	w = h.Begin("b", live)
	stop := make(chan struct{})
	done = make(chan struct{})
	go func() { defer close(done); w.WriteWhileLive(stop) }()
	waitFor(t, "a write", func() bool { return w.Record().Writes > 0 })
	close(stop)
	waitFor(t, "WriteWhileLive's return after stop", func() bool { return closed(done) })
	if r := w.Record(); live.Context().Err() != nil || r.ContextEnd != -1 {
		t.Errorf("record %v, lease %v: want it live when stopped", r, live.Context().Err())
	}
}

// TestWriterWriteUntilDeadline: WriteUntilDeadline writes on after the
// lease's context ended, until the deadline it reports (read again
// before each write) passes, each write's time taken before it looked;
// it panics for a lease that reports no deadline.
func TestWriterWriteUntilDeadline(t *testing.T) {
	h := NewWriteHistory()
	l := newHandLease(t, 1, 0, time.Now().Add(time.Hour))
	w := h.Begin("a", l)
	done := make(chan struct{})
	go func() { defer close(done); w.WriteUntilDeadline(nil) }()
	l.end()
	waitFor(t, "a write after the context ended", func() bool {
		r := w.Record()
		return r.ContextEnd >= 0 && r.LastWrite > r.ContextEnd
	})
	deadline := time.Now()
	l.setDeadline(deadline)
	waitFor(t, "WriteUntilDeadline's return after the deadline", func() bool { return closed(done) })
	w.LetGo()
	r := w.Record()
	if at := deadline.Sub(h.base); r.LastWrite >= at || r.Deadline != at {
		t.Errorf("record %v: want the last write before the deadline %s, the deadline recorded", r, ms(at))
	}

	lease, _ := memLease(t)
	func() {
		defer func() {
			if recover() == nil {
				t.Error("WriteUntilDeadline with a lease without a deadline did not panic")
			}
		}()
		h.Begin("b", lease).WriteUntilDeadline(nil)
	}()
}

// TestWriterLetGo: LetGo records the time and the lease's deadline then;
// later calls change nothing.
func TestWriterLetGo(t *testing.T) {
	h := NewWriteHistory()
	deadline := time.Now().Add(time.Minute)
	l := newHandLease(t, 1, 3, deadline)
	w := h.Begin("a", l)
	if r := w.Record(); r.LetGo != -1 || r.Deadline != -1 || r.Slot != 3 || r.Token != 1 || r.Who != "a" {
		t.Fatalf("record before LetGo: %v", r)
	}
	before := h.Now()
	w.LetGo()
	first := w.Record()
	if first.LetGo < before || first.LetGo > h.Now() || first.Deadline != deadline.Sub(h.base) {
		t.Errorf("record after LetGo %v: want let go after %s, deadline %s", first, ms(before), ms(deadline.Sub(h.base)))
	}
	l.setDeadline(deadline.Add(time.Minute))
	w.LetGo()
	if again := w.Record(); again != first {
		t.Errorf("a second LetGo changed the record from %v to %v", first, again)
	}
	if s := h.String(); !strings.Contains(s, "a (slot 3)") || strings.Count(s, "\n") != 1 {
		t.Errorf("String = %q, want one line naming a on slot 3", s)
	}
}

// TestWriteHistoryPeak: Peak counts the sections live at once, each from
// its grant to its last write, over every slot, at the earliest time the
// most were; sections that touch do not overlap.
func TestWriteHistoryPeak(t *testing.T) {
	hour := time.Now().Add(time.Hour)

	h := NewWriteHistory()
	if n, at := h.Peak(); n != 0 || at != 0 {
		t.Errorf("empty: Peak = %d at %s", n, ms(at))
	}
	a := h.Begin("a", newHandLease(t, 1, 1, hour))
	b := h.Begin("b", newHandLease(t, 2, 2, hour))
	c := h.Begin("c", newHandLease(t, 3, 1, hour))
	gc := c.Record().Granted
	a.Write(gc + time.Millisecond)
	b.Write(gc + time.Millisecond)
	c.Write(gc + 2*time.Millisecond)
	waitFor(t, "c's last write past", func() bool { return h.Now() > gc+2*time.Millisecond })
	h.Begin("d", newHandLease(t, 4, 1, hour)).Write(h.Now() + time.Hour) // alone by then
	if n, at := h.Peak(); n != 3 || at != gc {
		t.Errorf("Peak = %d at %s, want 3 at c's grant %s:\n%v", n, ms(at), ms(gc), h)
	}

	h = NewWriteHistory()
	a = h.Begin("a", newHandLease(t, 1, 0, hour))
	b = h.Begin("b", newHandLease(t, 2, 0, hour))
	gb := b.Record().Granted
	a.Write(gb)
	b.Write(gb + time.Millisecond)
	if n, at := h.Peak(); n != 1 || at != a.Record().Granted {
		t.Errorf("touching: Peak = %d at %s, want 1 at a's grant:\n%v", n, ms(at), h)
	}
}

// TestWriterWriteKeepsTheLatest: a write whose time was taken before an
// earlier-recorded one's does not move LastWrite back; every write
// counts.
func TestWriterWriteKeepsTheLatest(t *testing.T) {
	h := NewWriteHistory()
	w := h.Begin("a", newHandLease(t, 1, 0, time.Now().Add(time.Hour)))
	w.Write(5 * time.Millisecond)
	w.Write(3 * time.Millisecond)
	if r := w.Record(); r.LastWrite != 5*time.Millisecond || r.Writes != 2 {
		t.Errorf("record %v: want the last write at 5ms, 2 writes", r)
	}
}

// TestWriteHistoryLateEndAllowsStalls: a context seen to end late is
// excused by a stall of the scheduler between the deadline and its end
// that could have held up the lease's timer and the recorder, twice; not
// by a shorter stall, nor by one outside that time.
func TestWriteHistoryLateEndAllowsStalls(t *testing.T) {
	for _, tc := range []struct {
		name     string
		stall    func(deadline, end time.Duration) stall
		wantLate bool
	}{
		{"none", nil, true},
		{"over half the lateness, between", func(dl, end time.Duration) stall {
			return stall{dl, dl + (end-dl)/2 + 10*time.Millisecond}
		}, false},
		{"under half the lateness, between", func(dl, end time.Duration) stall {
			return stall{dl, dl + (end-dl)/3}
		}, true},
		{"as long, before the deadline", func(dl, end time.Duration) stall {
			return stall{dl - (end - dl), dl}
		}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := &WriteHistory{base: time.Now().Add(-time.Second)}
			l := newHandLease(t, 1, 0, time.Now().Add(-900*time.Millisecond))
			w := h.Begin("a", l)
			l.end()
			waitFor(t, "the context's end recorded", func() bool { return w.Record().ContextEnd >= 0 })
			w.LetGo()
			r := w.Record()
			if tc.stall != nil {
				h.mu.Lock()
				h.stalls = append(h.stalls, tc.stall(r.Deadline, r.ContextEnd))
				h.mu.Unlock()
			}
			err := h.Check()
			if late := violations(err)["LATE END"] == 1; late != tc.wantLate {
				t.Errorf("Check = %v for %v; want a late end: %v", err, r, tc.wantLate)
			}
		})
	}
}

// TestWriteHistoryWatchesWhileContextsLive: the scheduler's watch runs
// from the first Begin until every recorded context has ended, and again
// from the next Begin.
func TestWriteHistoryWatchesWhileContextsLive(t *testing.T) {
	h := NewWriteHistory()
	watching := func() bool {
		h.mu.Lock()
		defer h.mu.Unlock()
		return h.stop != nil
	}
	if watching() {
		t.Fatal("watching before any Begin")
	}
	hour := time.Now().Add(time.Hour)
	a, b := newHandLease(t, 1, 0, hour), newHandLease(t, 2, 0, hour)
	wa := h.Begin("a", a)
	h.Begin("b", b)
	a.end()
	waitFor(t, "a's end recorded", func() bool { return wa.Record().ContextEnd >= 0 })
	if !watching() {
		t.Fatal("not watching while b's context is live")
	}
	b.end()
	waitFor(t, "the watch's end after every context ended", func() bool { return !watching() })
	c := newHandLease(t, 3, 0, hour)
	h.Begin("c", c)
	if !watching() {
		t.Fatal("not watching while c's context is live")
	}
}

// TestWriterHold: Hold writes while the lease's context is live, then
// lets go, and closes its channel.
func TestWriterHold(t *testing.T) {
	h := NewWriteHistory()
	l := newHandLease(t, 1, 0, time.Now().Add(time.Hour))
	w := h.Begin("a", l)
	done := w.Hold(false)
	waitFor(t, "a write", func() bool { return w.Record().Writes > 0 })
	if closed(done) {
		t.Fatal("Hold returned while the lease was live")
	}
	l.end()
	waitFor(t, "Hold's end", func() bool { return closed(done) })
	if r := w.Record(); r.LetGo < 0 || r.LastWrite > r.LetGo {
		t.Errorf("after Hold: %v; want writes, then the let-go", r)
	}

}
