package contracttest

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/latchkey-go/latchkey/locks"
)

// GuardedStore is a store behind a fencing guard (such as the guards of
// module fence), as the fencing checks write to it: a key-value store
// whose every write passes the guard with the writing lease's name and
// token. The suite takes it as an interface, so that it depends on no
// guard and no database driver: each guard's tests adapt it.
type GuardedStore interface {
	// Write sets key to value through the guard, with lease's name and
	// token. It returns an error for which IsStale reports true when the
	// guard refused lease because a larger token of its name has written,
	// and must then have changed nothing. It calls inside, when not nil,
	// once during the write: where the guard's atomic step spans the
	// caller's code (a database transaction) after the guard admitted the
	// lease and before value is written; where the step is one command (a
	// Redis script, a compare-and-set), just before it.
	Write(ctx context.Context, lease locks.Lease, key, value string, inside func()) error

	// Read returns the value of key, "" if none was written.
	Read(ctx context.Context, key string) (string, error)

	// IsStale reports whether err is the guard's refusal of a stale token.
	IsStale(err error) bool

	// Close frees what the store holds; the suite calls it before its
	// goroutine leak check.
	Close() error
}

// NewGuardedStore makes a GuardedStore for one check. It may call t.Skip
// when the store's server is missing.
type NewGuardedStore func(ctx context.Context, t testing.TB) (GuardedStore, error)

// GuardHarness is an optional interface that may be implemented by a
// [Harness] of a backend with fencing tokens: the conformance test
// FencedWrites runs the fencing checks ([RunFencingTests]) against the
// stores NewGuardedStore makes.
type GuardHarness interface {
	NewGuardedStore(ctx context.Context, t testing.TB) (GuardedStore, error)
}

// guardCheck is one fencing check.
type guardCheck struct {
	name string
	run  func(t testing.TB, nh NewHarness, ns NewGuardedStore)
}

var guardChecks = []guardCheck{
	{"StaleHolderRefused", testGuardStaleHolder},
	{"PausedHolderRefused", testGuardPausedHolder},
	{"FirstWritesRace", testGuardFirstWritesRace},
	{"OtherNameUntouched", testGuardOtherName},
	{"NoTokenRefused", testGuardNoToken},
}

// FencingChecks returns the names of the checks [RunFencingTests] runs,
// in order, for [MustCatchStale].
func FencingChecks() []string {
	names := make([]string, len(guardChecks))
	for i, c := range guardChecks {
		names[i] = c.name
	}
	return names
}

// RunFencingTests runs the fencing checks against the backend made by nh
// writing through the guarded stores ns makes: a holder cut off past its
// validity (Kill) writes after its successor and must be refused, with
// the successor's data kept; a holder paused past its validity (its link
// black-holed: it neither renews nor hears of its loss) writes after its
// successor once it runs again and must be refused; two holders' first
// writes race; a lease
// writes twice with one token; one name's fence leaves another's alone;
// a lease without a token is refused. It skips when the backend has no
// fencing tokens.
func RunFencingTests(t *testing.T, nh NewHarness, ns NewGuardedStore) {
	t.Helper()
	for _, c := range guardChecks {
		t.Run(c.name, func(t *testing.T) { c.run(t, nh, ns) })
	}
}

// RunFencingChecks runs the named fencing checks (from [FencingChecks])
// only, as [RunFencingTests] runs them all: for a matrix of backends and
// guards that wants one property of each pair without the cost of every
// check. An unknown name fails t.
func RunFencingChecks(t *testing.T, nh NewHarness, ns NewGuardedStore, checks ...string) {
	t.Helper()
	for _, name := range checks {
		c, ok := guardCheckNamed(name)
		if !ok {
			t.Errorf("no fencing check %q", name)
			continue
		}
		t.Run(c.name, func(t *testing.T) { c.run(t, nh, ns) })
	}
}

// guardCheckNamed returns the fencing check called name.
func guardCheckNamed(name string) (guardCheck, bool) {
	for _, c := range guardChecks {
		if c.name == name {
			return c, true
		}
	}
	return guardCheck{}, false
}

// MustCatchStale runs each named fencing check (from [FencingChecks])
// against nh writing through ns, which should be a defective guard, and
// fails t unless every one of them fails. A check that skips counts as
// not catching.
func MustCatchStale(t *testing.T, nh NewHarness, ns NewGuardedStore, checks ...string) {
	t.Helper()
	for _, name := range checks {
		t.Run(name, func(t *testing.T) {
			c, ok := guardCheckNamed(name)
			if !ok {
				t.Fatalf("no fencing check %q", name)
			}
			run := c.run
			r := runRecorded(t, func(t testing.TB, nh NewHarness) { run(t, nh, ns) }, nh)
			switch {
			case r.skipped != "":
				t.Errorf("%s skipped instead of failing: %s", name, r.skipped)
			case !r.Failed():
				t.Errorf("%s passed: it did not catch the defective guard", name)
			default:
				t.Logf("%s caught it: %.300s", name, r.failures[0])
			}
		})
	}
}

// testFencedWrites is the conformance suite's entry to the fencing
// checks, for harnesses that are a GuardHarness; it skips for the others
// and for backends without fencing tokens.
func testFencedWrites(t testing.TB, nh NewHarness) {
	for _, c := range guardChecks {
		c.run(t, nh, nil)
	}
}

// guardEnv is a check's env and store.
type guardEnv struct {
	*env
	store GuardedStore
}

// newGuardEnv makes the check's harness and store (from the harness, a
// GuardHarness, when ns is nil); the caller defers close.
func newGuardEnv(t testing.TB, nh NewHarness, ns NewGuardedStore) *guardEnv {
	t.Helper()
	e := newEnv(t, nh)
	if !e.caps.Fencing {
		e.close()
		t.Skip("fencing tokens not supported")
	}
	if ns == nil {
		gh, ok := e.h.(GuardHarness)
		if !ok {
			e.close()
			t.Skip("the harness hands the suite no guarded store (no GuardHarness)")
		}
		ns = gh.NewGuardedStore
	}
	s, err := ns(e.ctx, t)
	if err != nil {
		e.close()
		t.Fatalf("making the guarded store: %v", err)
	}
	return &guardEnv{env: e, store: s}
}

// close closes the store, then the env (whose leak check must see the
// store's goroutines gone).
func (g *guardEnv) close() {
	if err := g.store.Close(); err != nil {
		g.t.Errorf("closing the guarded store: %v", err)
	}
	g.env.close()
}

// write writes through the guard and returns its error.
func (g *guardEnv) write(lease locks.Lease, key, value string, inside func()) error {
	ctx, cancel := g.opCtx()
	defer cancel()
	return g.store.Write(ctx, lease, key, value, inside)
}

// mustWrite writes and fails the check on any error; who names the
// writer.
func (g *guardEnv) mustWrite(lease locks.Lease, key, value, who string) {
	g.t.Helper()
	if err := g.write(lease, key, value, nil); err != nil {
		g.t.Fatalf("%s (token %d) writing %q: %v", who, lease.Token(), value, err)
	}
}

// expectValue checks that key holds want.
func (g *guardEnv) expectValue(key, want, why string) {
	g.t.Helper()
	ctx, cancel := g.opCtx()
	defer cancel()
	got, err := g.store.Read(ctx, key)
	if err != nil {
		g.t.Fatalf("Read(%q): %v", key, err)
	}
	if got != want {
		g.t.Errorf("%q holds %q %s, want %q", key, got, why, want)
	}
}

// cutOffAndSucceed takes name with a new client, kills that client, and
// takes name again with another once the first's lease is over; it
// returns the cut-off holder's lease (its token still readable) and the
// successor's.
func (g *guardEnv) cutOffAndSucceed(name string) (old, next locks.Lease) {
	g.t.Helper()
	holder, hl := g.newClientWithLocker()
	old = g.mustTryLock(hl, name)
	b := g.newClientLocker()
	start := time.Now()
	if err := g.h.Kill(g.ctx, holder); err != nil {
		g.t.Fatalf("Kill: %v", err)
	}
	ctx, cancel := context.WithTimeout(g.ctx, bound(g.caps.CrashRecovery))
	defer cancel()
	next, err := b.Lock(ctx, name)
	if err != nil {
		g.t.Fatalf("after Kill(holder), Lock(%q) failed after %v (stated bound %v): %v", name, time.Since(start).Round(time.Millisecond), g.caps.CrashRecovery, err)
	}
	if next.Token() <= old.Token() {
		g.t.Fatalf("the successor's token %d is not above the cut-off holder's %d", next.Token(), old.Token())
	}
	return old, next
}

// testGuardStaleHolder: holder A writes, is cut off past its validity;
// B takes the name and writes; A's late write with its old lease is
// refused as stale and leaves B's data. B writing again with its same
// token is allowed.
func testGuardStaleHolder(t testing.TB, nh NewHarness, ns NewGuardedStore) {
	g := newGuardEnv(t, nh, ns)
	defer g.close()
	name := g.name()
	key := "d-" + name
	old, next := g.cutOffAndSucceed(name)
	g.mustWrite(next, key, "B1", "the successor B")
	err := g.write(old, key, "A-late", nil)
	switch {
	case err == nil:
		t.Errorf("the cut-off holder's write (token %d) was accepted after its successor's (token %d)", old.Token(), next.Token())
	case !g.store.IsStale(err):
		t.Errorf("the cut-off holder's write (token %d) failed with %v, want the guard's stale-token error", old.Token(), err)
	}
	g.expectValue(key, "B1", "after the cut-off holder's late write")
	g.mustWrite(next, key, "B2", "the successor B, again with its token")
	g.expectValue(key, "B2", "after the successor wrote twice with one token")
	err = g.write(old, key, "A-later", nil)
	if err == nil || !g.store.IsStale(err) {
		t.Errorf("the cut-off holder's second late write: got %v, want the guard's stale-token error", err)
	}
	g.expectValue(key, "B2", "after the cut-off holder's second late write")
	g.mustRelease(next)
}

// testGuardPausedHolder: holder A writes, then is paused past its
// validity: its link to the broker is black-holed (a FaultHarness), so it
// neither renews nor hears that its lease lapsed, as a process stopped
// by SIGSTOP or a GC pause. B takes the name and writes; A runs again
// (the link restored) and writes with the lease it still holds: the
// guard refuses it as stale and B's data stays. Where the harness cannot
// black-hole a client (no FaultHarness), A is killed instead (its
// renewals stop alike; only its own side learns of the loss sooner,
// which a guard never asks), and the test says so in its log.
func testGuardPausedHolder(t testing.TB, nh NewHarness, ns NewGuardedStore) {
	g := newGuardEnv(t, nh, ns)
	defer g.close()
	name := g.name()
	key := "d-" + name
	var (
		a    locks.Locker
		link Link
	)
	if fh, ok := g.h.(FaultHarness); ok {
		c, l, err := fh.NewFaultyClient(g.ctx)
		switch {
		case errors.Is(err, errors.ErrUnsupported):
		case err != nil:
			t.Fatalf("NewFaultyClient: %v", err)
		default:
			g.track(c)
			a, link = c.Locker(), l
		}
	}
	var killA func()
	if link == nil {
		g.skippedPart("pausing the holder", "the harness cannot black-hole a client's link (no FaultHarness): the holder is killed instead")
		c, l := g.newClientWithLocker()
		a = l
		killA = func() {
			if err := g.h.Kill(g.ctx, c); err != nil {
				t.Fatalf("Kill: %v", err)
			}
		}
	}
	old := g.mustTryLock(a, name)
	g.mustWrite(old, key, "A1", "the holder A, live")
	if link != nil {
		link.BlackHole()
	} else {
		killA()
	}
	paused := time.Now()
	b := g.newClientLocker()
	ctx, cancel := context.WithTimeout(g.ctx, g.partitionRecovery())
	next, err := b.Lock(ctx, name)
	cancel()
	if err != nil {
		t.Fatalf("with the holder paused, Lock(%q) failed after %v: %v", name, time.Since(paused).Round(time.Millisecond), err)
	}
	t.Logf("the paused holder's name was taken after %v", time.Since(paused).Round(time.Millisecond))
	if next.Token() <= old.Token() {
		t.Fatalf("the successor's token %d is not above the paused holder's %d", next.Token(), old.Token())
	}
	g.mustWrite(next, key, "B1", "the successor B")
	if link != nil {
		link.Restore()
	}
	err = g.write(old, key, "A-resumed", nil)
	switch {
	case err == nil:
		t.Errorf("the resumed holder's write (token %d) was accepted after its successor's (token %d)", old.Token(), next.Token())
	case !g.store.IsStale(err):
		t.Errorf("the resumed holder's write (token %d) failed with %v, want the guard's stale-token error", old.Token(), err)
	}
	g.expectValue(key, "B1", "after the resumed holder's write")
	g.mustRelease(next)
}

// raceWait is how long a racing write waits for the other to finish
// before the paused one goes on. A guard that serialises writes makes
// the other wait all of it; one that does not lets it finish at once. A
// longer stall on a loaded machine only hides a defect (a false
// negative), never fails a correct guard.
const raceWait = time.Second

// testGuardFirstWritesRace: the cut-off holder A and its successor B make
// their first writes at once, each in turn paused inside its guarded
// write while the other writes: whichever way they interleave, B's write
// succeeds and B's data is what stays; A's either came first or was
// refused as stale.
func testGuardFirstWritesRace(t testing.TB, nh NewHarness, ns NewGuardedStore) {
	g := newGuardEnv(t, nh, ns)
	defer g.close()
	for _, paused := range []string{"A", "B"} {
		name := g.name()
		key := "d-" + name
		old, next := g.cutOffAndSucceed(name)
		first, second := old, next
		if paused == "B" {
			first, second = next, old
		}
		inside := make(chan struct{})
		resume := make(chan struct{})
		firstErr := make(chan error, 1)
		go func() {
			firstErr <- g.write(first, key, valueOf(first, old), func() {
				close(inside)
				<-resume
			})
		}()
		select {
		case <-inside:
		case err := <-firstErr:
			close(resume)
			t.Fatalf("%s's write returned before pausing inside the guard: %v", paused, err)
		}
		secondErr := make(chan error, 1)
		go func() { secondErr <- g.write(second, key, valueOf(second, old), nil) }()
		var errSecond error
		secondDone := false
		select {
		case errSecond = <-secondErr:
			secondDone = true
		case <-time.After(raceWait):
		}
		close(resume)
		errFirst := <-firstErr
		if !secondDone {
			errSecond = <-secondErr
		}
		errA, errB := errFirst, errSecond
		if paused == "B" {
			errA, errB = errSecond, errFirst
		}
		if errB != nil {
			t.Fatalf("with %s paused inside its write, the successor B's write (token %d) failed: %v", paused, next.Token(), errB)
		}
		if errA != nil && !g.store.IsStale(errA) {
			t.Fatalf("with %s paused inside its write, the cut-off A's write failed with %v, want success or the stale-token error", paused, errA)
		}
		g.expectValue(key, "B", fmt.Sprintf("after racing first writes with %s paused inside the guard (A: %v)", paused, errA))
		g.mustRelease(next)
	}
}

// valueOf names the writer of a racing write: "B" for the successor.
func valueOf(lease, old locks.Lease) string {
	if lease == old {
		return "A"
	}
	return "B"
}

// testGuardOtherName: a name's fence leaves every other name's alone: a
// lease on another name, with a smaller token, still writes after the
// first name was raised, and the first name's holder still writes after
// it.
func testGuardOtherName(t testing.TB, nh NewHarness, ns NewGuardedStore) {
	g := newGuardEnv(t, nh, ns)
	defer g.close()
	other := g.name()
	x := g.mustTryLock(g.newClientLocker(), other)
	name := g.name()
	first := g.mustTryLock(g.newClientLocker(), name)
	g.mustRelease(first)
	b := g.mustTryLock(g.newClientLocker(), name)
	if x.Token() >= b.Token() {
		g.skippedPart("a smaller token on another name", fmt.Sprintf("the backend gave the other name token %d, not below %d", x.Token(), b.Token()))
	}
	g.mustWrite(b, "d-"+name, "B", "the holder of the first name")
	if err := g.write(x, "d-"+other, "X", nil); err != nil {
		t.Fatalf("the holder of another name (token %d) writing after the first name was raised to %d: %v", x.Token(), b.Token(), err)
	}
	g.mustWrite(b, "d-"+name, "B2", "the holder of the first name, after the other name's write")
	g.expectValue("d-"+name, "B2", "after both names wrote")
	g.expectValue("d-"+other, "X", "after both names wrote")
	g.mustRelease(x)
	g.mustRelease(b)
}

// testGuardNoToken: a lease whose Token is 0 (a backend without fencing)
// is refused, and changes nothing.
func testGuardNoToken(t testing.TB, nh NewHarness, ns NewGuardedStore) {
	g := newGuardEnv(t, nh, ns)
	defer g.close()
	name := g.name()
	key := "d-" + name
	lease := g.mustTryLock(g.newClientLocker(), name)
	g.mustWrite(lease, key, "real", "the holder")
	zero := &leaseOverride{Lease: lease, token: func() uint64 { return 0 }}
	if err := g.write(zero, key, "zero", nil); err == nil {
		t.Errorf("a write with token 0 was accepted")
	} else if errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("a write with token 0 hung until its deadline: %v", err)
	}
	g.expectValue(key, "real", "after a write with token 0")
	g.mustRelease(lease)
}
