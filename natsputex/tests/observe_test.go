package natsputex_test

// What the tests record and check: the writes a key received (keyWatch,
// rawWatch, historyLog), the leases granted (grants, validity, deadlines)
// and the checks run over them.

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/latchkey-go/latchkey/locks"
	"github.com/latchkey-go/latchkey/natsputex"
)

// validity polls leases every millisecond and records any moment one of
// them is still live (its Context not done) after its Deadline, plus a
// 3ms tolerance for the poll: "a holder ... ends its lease by itself at
// the start of its last successful write plus T minus a safety margin".
type validity struct {
	mu     sync.Mutex
	leases []locks.Lease
	names  []string
	bad    []string
	stop   chan struct{}
	done   chan struct{}
}

func watchValidity(t *testing.T) *validity {
	v := &validity{stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(v.done)
		tick := time.NewTicker(time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-v.stop:
				return
			case <-tick.C:
			}
			v.mu.Lock()
			for i, l := range v.leases {
				dl := l.(interface{ Deadline() time.Time }).Deadline()
				if l.Context().Err() == nil && time.Since(dl) > 3*time.Millisecond && len(v.bad) < 20 {
					v.bad = append(v.bad, fmt.Sprintf("%s (token %d) still live %v after its deadline",
						v.names[i], l.Token(), time.Since(dl).Round(time.Millisecond)))
				}
			}
			v.mu.Unlock()
		}
	}()
	t.Cleanup(v.close)
	return v
}

func (v *validity) add(name string, l locks.Lease) {
	v.mu.Lock()
	defer v.mu.Unlock()
	v.leases = append(v.leases, l)
	v.names = append(v.names, name)
}

func (v *validity) close() {
	select {
	case <-v.stop:
	default:
		close(v.stop)
	}
	<-v.done
}

func (v *validity) check(t *testing.T) {
	t.Helper()
	v.close()
	v.mu.Lock()
	defer v.mu.Unlock()
	for _, b := range v.bad {
		t.Error(b)
	}
}

// writesAfter returns the writes the watch saw stored after t.
func (w *keyWatch) writesAfter(t time.Time) []keyWrite {
	w.mu.Lock()
	defer w.mu.Unlock()
	var out []keyWrite
	for _, kw := range w.writes {
		if kw.created.After(t) {
			out = append(out, kw)
		}
	}
	return out
}

func (w *keyWatch) all() []keyWrite {
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([]keyWrite(nil), w.writes...)
}

func (w *keyWatch) logAll(t *testing.T, base time.Time) {
	for _, kw := range w.all() {
		t.Logf("write rev %d %q stored at %+v", kw.rev, kw.value, kw.created.Sub(base).Round(time.Millisecond))
	}
}

// blanksAfter returns the blank writes the watch saw stored after t.
func (w *keyWatch) blanksAfter(t time.Time) []keyWrite {
	var out []keyWrite
	for _, kw := range w.writesAfter(t) {
		if kw.value == "" {
			out = append(out, kw)
		}
	}
	return out
}

// checkTakeovers fails t if a Start of n's began less than C·R after the
// first write of the run of n's writes before it, when that run took the
// key from another token's write (which must then have been T old).
func checkTakeovers(t *testing.T, writes *keyWatch, n *node, T, CR time.Duration) {
	t.Helper()
	writes.catchUp(t)
	all := writes.all()
	for _, st := range n.getStarts() {
		// The start's fencing token is the revision of the write that won
		// the key: find it by revision, not by the server's stamp, which a
		// cluster's follower may set after the holder's Start began.
		first := -1
		for i, w := range all {
			if w.rev == st.token {
				first = i
				break
			}
		}
		if first < 0 || all[first].value != n.name {
			t.Errorf("%s started at %v with fencing token %d, not a revision its token was written at", n.name, st.begin.Format("15:04:05.000"), st.token)
			continue
		}
		for first > 0 && all[first-1].value == n.name {
			first--
		}
		if first == 0 || all[first-1].value == "" {
			continue // a free key, held at once
		}
		p, w := all[first-1], all[first]
		if d := w.created.Sub(p.created); d < T-10*time.Millisecond {
			t.Errorf("%s took the key (rev %d) %v after %q's write (rev %d), before T = %v", n.name, w.rev, d.Round(time.Millisecond), p.value, p.rev, T)
		}
		if d := st.begin.Sub(w.created); d < CR-10*time.Millisecond {
			t.Errorf("%s started %v after its takeover write (rev %d), before C·R = %v", n.name, d.Round(time.Millisecond), w.rev, CR)
		}
	}
}

// checkAfterOther fails t if a Start of n's began less than bound after
// the last write of another token before the run of n's writes it
// started on (when there is one: a free key is held at once).
func checkAfterOther(t *testing.T, writes *keyWatch, n *node, bound time.Duration) {
	t.Helper()
	all := writes.all()
	for _, st := range n.getStarts() {
		last := -1
		for i, w := range all {
			if w.created.After(st.begin) {
				break
			}
			last = i
		}
		first := last
		for first > 0 && all[first-1].value == n.name {
			first--
		}
		if first <= 0 || all[first-1].value == "" {
			continue
		}
		p := all[first-1]
		if d := st.begin.Sub(p.created); d < bound {
			t.Errorf("%s started %v after %q's last write (rev %d), before T + C·R = %v", n.name, d.Round(time.Millisecond), p.value, p.rev, bound)
		}
	}
}

// keyHistory returns every write of key kept by its bucket, as a keyWatch.
func keyHistory(t *testing.T, url, bucket, key string) *keyWatch {
	t.Helper()
	kv := mustBucket(t, url, bucket)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	es, err := kv.History(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	w := &keyWatch{}
	for _, e := range es {
		w.writes = append(w.writes, keyWrite{e.Revision(), valueToken(e.Value()), e.Created(), e.Created()})
	}
	return w
}

// historyLog gathers a key's writes from its bucket's history (64 values)
// read now and then, so that a test sees them all across server restarts
// and leader changes that a watch may not survive.
type historyLog struct {
	t                *testing.T
	url, bucket, key string
	byRev            map[uint64]keyWrite
}

func newHistoryLog(t *testing.T, url, bucket, key string) *historyLog {
	return &historyLog{t: t, url: url, bucket: bucket, key: key, byRev: map[uint64]keyWrite{}}
}

func (l *historyLog) collect() {
	for _, w := range keyHistory(l.t, l.url, l.bucket, l.key).all() {
		l.byRev[w.rev] = w
	}
}

// watch returns what was collected as a keyWatch, in revision order.
func (l *historyLog) watch() *keyWatch {
	w := &keyWatch{}
	for _, kw := range l.byRev {
		w.writes = append(w.writes, kw)
	}
	slices.SortFunc(w.writes, func(a, b keyWrite) int { return int(a.rev) - int(b.rev) })
	return w
}

// timingSlack is what the timing checks of observe_test.go add to a bound of
// the docs, for a loaded 2-core machine running with -race.
const timingSlack = 60 * time.Millisecond

// rawWrite is a write to a key with the timing its value carries (a
// Supervisor writes "token\nT=… C·R=…"; zero when the value has none).
type rawWrite struct {
	rev     uint64
	token   string
	T, CR   time.Duration
	created time.Time
}

// rawWatch records every write to a key, timing included.
type rawWatch struct {
	mu     sync.Mutex
	writes []rawWrite
}

func parseRaw(rev uint64, value []byte, created time.Time) rawWrite {
	w := rawWrite{rev: rev, created: created}
	token, timing, _ := strings.Cut(string(value), "\n")
	w.token = token
	for _, f := range strings.Fields(timing) {
		k, v, _ := strings.Cut(f, "=")
		d, _ := time.ParseDuration(v)
		switch k {
		case "T":
			w.T = d
		case "C·R":
			w.CR = d
		}
	}
	return w
}

// watchRaw watches key on url until the test's cleanup.
func watchRaw(t *testing.T, url, bucket, key string) *rawWatch {
	t.Helper()
	w := &rawWatch{}
	kw, err := mustBucket(t, url, bucket).Watch(context.Background(), key)
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for e := range kw.Updates() {
			if e == nil {
				continue
			}
			rw := parseRaw(e.Revision(), e.Value(), e.Created())
			w.mu.Lock()
			w.writes = append(w.writes, rw)
			w.mu.Unlock()
		}
	}()
	t.Cleanup(func() { _ = kw.Stop(); wg.Wait() })
	return w
}

func (w *rawWatch) all() []rawWrite {
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([]rawWrite(nil), w.writes...)
}

// endEvent returns n's first event at or after since that puts it in
// standby: the one that says why its hold ended.
func endEvent(n *node, since time.Time) (natsputex.Event, bool) {
	n.mu.Lock()
	defer n.mu.Unlock()
	for _, e := range n.events {
		if !e.Time.Before(since) && e.Phase == natsputex.PhaseStandby {
			return e, true
		}
	}
	return natsputex.Event{}, false
}

// eventsAfter returns n's events at or after since.
func eventsAfter(n *node, since time.Time) []natsputex.Event {
	n.mu.Lock()
	defer n.mu.Unlock()
	var out []natsputex.Event
	for _, e := range n.events {
		if !e.Time.Before(since) {
			out = append(out, e)
		}
	}
	return out
}

// nodeWrites returns the writes of token the watch saw stored after t.
func nodeWrites(w *keyWatch, token string, t time.Time) []keyWrite {
	var out []keyWrite
	for _, kw := range w.writesAfter(t) {
		if kw.value == token {
			out = append(out, kw)
		}
	}
	return out
}

// writeBefore returns the last write of token stored before rev.
func writeBefore(w *keyWatch, token string, rev uint64) (keyWrite, bool) {
	var out keyWrite
	for _, kw := range w.all() {
		if kw.rev < rev && kw.value == token {
			out = kw
		}
	}
	return out, out.rev != 0
}

// checkRestart fails t unless n's first Start after after began C·R or
// more after n's first write since its Stop before that Start: what the
// doc asks of an agent that finds its own token after a write whose
// answer was lost ("it starts the service only after C·R of its own
// writes that it saw succeed, on every path"). It returns false if n did
// not start again.
func checkRestart(t *testing.T, writes *keyWatch, n *node, after time.Time, CR time.Duration) bool {
	t.Helper()
	var st serviceCall
	for _, s := range n.getStarts() {
		if s.begin.After(after) {
			st = s
			break
		}
	}
	if st.begin.IsZero() {
		return false
	}
	var stopped time.Time
	for _, s := range n.getStops() {
		if s.begin.Before(st.begin) {
			stopped = s.begin
		}
	}
	ws := nodeWrites(writes, n.name, stopped)
	if len(ws) == 0 {
		t.Errorf("%s started again at %v with no write of its own since it stopped", n.name, st.begin.Format("15:04:05.000"))
		return true
	}
	t.Logf("%s started again %v after its first write (rev %d) since it stopped (C·R = %v)", n.name, st.begin.Sub(ws[0].created).Round(time.Millisecond), ws[0].rev, CR)
	if d := st.begin.Sub(ws[0].created); d < CR-10*time.Millisecond {
		t.Errorf("%s started again %v after its first write since it stopped (rev %d), before C·R = %v", n.name, d.Round(time.Millisecond), ws[0].rev, CR)
	}
	return true
}

// names reports whether e names what an agent read in the key: the token,
// in Event.Holder ("the holder's token in the key ..., when it was read")
// or in its message; for a free key, a message that says it was blanked,
// deleted or purged.
func names(e natsputex.Event, token, own string) bool {
	if token != "" && token == own {
		return e.Holder == token || strings.Contains(e.Msg, "same token")
	}
	if token != "" {
		return e.Holder == token || strings.Contains(e.Msg, `"`+token+`"`) || strings.Contains(e.Msg, " "+token)
	}
	msg := strings.ToLower(e.Msg)
	for _, w := range []string{"blank", "delet", "purg", "missing", "free", "vanish"} {
		if strings.Contains(msg, w) {
			return e.Holder == ""
		}
	}
	return false
}

// stoppedEvent returns n's first event at or after since that ends its
// hold (phase standby, "…: service stopped").
func stoppedEvent(n *node, since time.Time) (natsputex.Event, bool) {
	for _, e := range eventsAfter(n, since) {
		if e.Phase == natsputex.PhaseStandby && strings.HasSuffix(e.Msg, "service stopped") {
			return e, true
		}
	}
	return natsputex.Event{}, false
}

// blanks returns the writes that free the key stored after t: blanks,
// deletes, and the reserved value a release leaves for the head of the
// key's queue (natsputex/queue.go) when a Lock waits.
func blanks(w *keyWatch, t time.Time) []keyWrite {
	var out []keyWrite
	for _, kw := range w.writesAfter(t) {
		if kw.value == "" || kw.value == "\x00queue" {
			out = append(out, kw)
		}
	}
	return out
}

// writeAt waits for the watch to see revision rev and returns it.
func writeAt(t *testing.T, w *keyWatch, rev uint64) keyWrite {
	t.Helper()
	var out keyWrite
	waitFor(t, 2*time.Second, fmt.Sprintf("the watch sees rev %d", rev), func() bool {
		for _, kw := range w.all() {
			if kw.rev == rev {
				out = kw
				return true
			}
		}
		return false
	})
	return out
}

// prefixed returns the writes whose token begins with prefix, stored
// after t.
func prefixed(w *keyWatch, prefix string, t time.Time) []keyWrite {
	var out []keyWrite
	for _, kw := range w.writesAfter(t) {
		if strings.HasPrefix(kw.value, prefix) {
			out = append(out, kw)
		}
	}
	return out
}

func ms(d time.Duration) time.Duration { return d.Round(time.Millisecond) }

// deadlines samples a lease's Deadline every millisecond while it is
// live, to check each against the holder's writes the server stored.
type deadlines struct {
	mu      sync.Mutex
	samples []deadlineSample
	stop    chan struct{}
	done    chan struct{}
}

type deadlineSample struct{ at, deadline time.Time }

func sampleDeadlines(t *testing.T, l locks.Lease) *deadlines {
	d := &deadlines{stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(d.done)
		tick := time.NewTicker(time.Millisecond)
		defer tick.Stop()
		last := time.Time{}
		for {
			select {
			case <-d.stop:
				return
			case <-l.Context().Done():
				return
			case <-tick.C:
			}
			dl := l.(interface{ Deadline() time.Time }).Deadline()
			if !dl.Equal(last) {
				last = dl
				d.mu.Lock()
				d.samples = append(d.samples, deadlineSample{time.Now(), dl})
				d.mu.Unlock()
			}
		}
	}()
	t.Cleanup(d.close)
	return d
}

func (d *deadlines) close() {
	select {
	case <-d.stop:
	default:
		close(d.stop)
	}
	<-d.done
}

// check fails t if a deadline the lease showed lies more than T − margin
// (+2ms) after the server's stamp of the latest write of token stored
// when it was seen: the validity of a write counted from its sending
// cannot outrun T of silence after the stored write, which is when a
// waiter may take over. It returns the largest excess over that stamp.
func (d *deadlines) check(t *testing.T, writes *keyWatch, token string, validity time.Duration) time.Duration {
	t.Helper()
	d.close()
	d.mu.Lock()
	defer d.mu.Unlock()
	var most time.Duration
	for _, s := range d.samples {
		w, ok := writes.lastBy(token, s.at)
		if !ok {
			t.Errorf("the lease showed deadline %v at %v, before any write of its token was stored", s.deadline.Format("15:04:05.000"), s.at.Format("15:04:05.000"))
			continue
		}
		ex := s.deadline.Sub(w.created)
		most = max(most, ex)
		if ex > validity+2*time.Millisecond {
			t.Errorf("the lease's deadline (seen at %v) is %v after its last stored write (rev %d): more than T − margin = %v, so it outlives T of silence by the server's stamp",
				s.at.Format("15:04:05.000"), ms(ex), w.rev, validity)
		}
	}
	return most
}

// grants records the leases granted on one name, in grant order, and
// checks at each grant that no earlier lease is still live (its Context
// not done) and that the token is above every earlier one.
type grants struct {
	mu     sync.Mutex
	start  time.Time
	leases []grantRecord
	bad    []string
	// overlaps and outOfOrder count the grants made while an earlier
	// lease was live, and those whose token was not above every earlier.
	overlaps, outOfOrder int
}

type grantRecord struct {
	who   string
	lease locks.Lease
	at    time.Duration
}

func newGrants() *grants { return &grants{start: time.Now()} }

func (g *grants) grant(who string, l locks.Lease) {
	g.mu.Lock()
	defer g.mu.Unlock()
	at := time.Since(g.start)
	overlap, late := false, false
	for _, o := range g.leases {
		if o.lease.Context().Err() == nil {
			overlap = true
			g.bad = append(g.bad, fmt.Sprintf("%s got token %d at %v while %s's lease (token %d, granted at %v) was live",
				who, l.Token(), at.Round(time.Millisecond), o.who, o.lease.Token(), o.at.Round(time.Millisecond)))
		}
		if o.lease.Token() >= l.Token() {
			late = true
			g.bad = append(g.bad, fmt.Sprintf("%s got token %d at %v, not above %s's %d granted earlier",
				who, l.Token(), at.Round(time.Millisecond), o.who, o.lease.Token()))
		}
	}
	if overlap {
		g.overlaps++
	}
	if late {
		g.outOfOrder++
	}
	g.leases = append(g.leases, grantRecord{who, l, at})
}

// firstOf returns when who was first granted a lease, and whether it was.
func (g *grants) firstOf(who string) (time.Time, bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	for _, o := range g.leases {
		if o.who == who {
			return g.start.Add(o.at), true
		}
	}
	return time.Time{}, false
}

// first returns the first lease granted.
func (g *grants) first() locks.Lease {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.leases[0].lease
}

func (g *grants) check(t *testing.T) {
	t.Helper()
	g.mu.Lock()
	defer g.mu.Unlock()
	for i, o := range g.leases {
		if i > 4 && i < len(g.leases)-2 {
			continue
		}
		t.Logf("grant: %s token %d at %v", o.who, o.lease.Token(), o.at.Round(time.Millisecond))
	}
	for _, b := range g.bad {
		t.Error(b)
	}
}

// takeover returns the last write by prefix and the first write by
// another after it, the one that took the key over (a delete does not
// count); ok is false if there is none yet.
func (w *keyWatch) takeover(prefix string) (last, next keyWrite, ok bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, kw := range w.writes {
		if strings.HasPrefix(kw.value, prefix) {
			last = kw
			continue
		}
		if last.rev != 0 && kw.value != "" {
			return last, kw, true
		}
	}
	return last, keyWrite{}, false
}

// silence checks that the first write to the key by another than prefix,
// after prefix's writes, came T or more after prefix's last write, by
// the server's stamps (the server runs on this machine).
func silence(t *testing.T, w *keyWatch, prefix string, T time.Duration) {
	t.Helper()
	last, next, ok := w.takeover(prefix)
	if !ok {
		return
	}
	gap := next.created.Sub(last.created)
	t.Logf("%s's last write rev %d; the next write, rev %d by %q, %v later (T = %v)", prefix, last.rev, next.rev, next.value, gap.Round(time.Millisecond), T)
	if gap < T {
		t.Errorf("a dead holder's key was taken over %v after its last write, before T = %v", gap.Round(time.Millisecond), T)
	}
}

// firstBy returns the first write seen of value token, and whether there
// is one.
func (w *keyWatch) firstBy(token string) (keyWrite, bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, kw := range w.writes {
		if kw.value == token {
			return kw, true
		}
	}
	return keyWrite{}, false
}

// keyWrite is a write to a key seen by a test's watch.
type keyWrite struct {
	rev     uint64
	value   string
	created time.Time // the broker's time of the write (same machine)
	seen    time.Time // when the watch delivered it
}

// keyWatch records the writes to a key that a watch of the test's sees.
type keyWatch struct {
	mu     sync.Mutex
	writes []keyWrite

	urls, bucket, key string // for catchUp
}

// watchWrites watches key until the test's cleanup.
func watchWrites(t *testing.T, url, bucket, key string) *keyWatch {
	t.Helper()
	kv := mustBucket(t, url, bucket)
	// A replicated stream just made may still be electing its leader: its
	// consumer's creation then times out (a CI run, on a new 3-node
	// cluster), and is asked again.
	var kw jetstream.KeyWatcher
	var err error
	for until := time.Now().Add(30 * time.Second); ; {
		kw, err = kv.Watch(context.Background(), key)
		if err == nil || !errors.Is(err, context.DeadlineExceeded) || time.Now().After(until) {
			break
		}
	}
	if err != nil {
		t.Fatal(err)
	}
	w := &keyWatch{urls: url, bucket: bucket, key: key}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for e := range kw.Updates() {
			if e != nil {
				w.mu.Lock()
				w.writes = append(w.writes, keyWrite{e.Revision(), valueToken(e.Value()), e.Created(), time.Now()})
				w.mu.Unlock()
			}
		}
	}()
	t.Cleanup(func() { _ = kw.Stop(); <-done }) // before mustBucket's close
	return w
}

// catchUp waits, up to 10s, until the watch has seen the key's last
// write (a delete included): a watch restarted across a stream leader's
// restart delivered a takeover write after the test had read its writes
// (a CI run: a Start's token "not a revision its token was written at").
func (w *keyWatch) catchUp(t *testing.T) {
	t.Helper()
	nc, js, err := connect(w.urls)
	if err != nil {
		t.Logf("catching the watch up: %v", err)
		return
	}
	defer nc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	stream, err := js.Stream(ctx, "KV_"+w.bucket)
	if err != nil {
		t.Logf("catching the watch up: %v", err)
		return
	}
	last, err := stream.GetLastMsgForSubject(ctx, "$KV."+w.bucket+"."+w.key)
	if err != nil {
		t.Logf("catching the watch up: %v", err)
		return
	}
	for {
		w.mu.Lock()
		seen := len(w.writes) > 0 && w.writes[len(w.writes)-1].rev >= last.Sequence
		w.mu.Unlock()
		if seen {
			return
		}
		select {
		case <-ctx.Done():
			t.Logf("the watch has not seen the key's last write (rev %d) after 10s", last.Sequence)
			return
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// valueToken returns the token in a key's value: a Supervisor writes its
// token, a newline and its timing.
func valueToken(v []byte) string {
	token, _, _ := strings.Cut(string(v), "\n")
	return token
}

// lastWrite returns when the watch saw the last write (zero: none yet).
func (w *keyWatch) lastWrite() time.Time {
	w.mu.Lock()
	defer w.mu.Unlock()
	if len(w.writes) == 0 {
		return time.Time{}
	}
	return w.writes[len(w.writes)-1].seen
}

// lastBy returns the last write seen of value token that the broker
// stored no later than before, and whether there is one.
func (w *keyWatch) lastBy(token string, before time.Time) (keyWrite, bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for i := len(w.writes) - 1; i >= 0; i-- {
		if kw := w.writes[i]; kw.value == token && !kw.created.After(before) {
			return kw, true
		}
	}
	return keyWrite{}, false
}
