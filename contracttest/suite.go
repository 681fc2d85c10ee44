package contracttest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/latchkey-go/latchkey/locks"
)

// RunConformanceTests runs every test of the suite against the backend made
// by newHarness. Tests of features the backend lacks are skipped, saying so.
//
// Like golang.org/x/net/nettest, the suite should not produce false
// positives (a correct backend fails nothing), may produce false negatives
// (a race may go unseen in one run), and is meant to run under -race.
func RunConformanceTests(t *testing.T, newHarness NewHarness) {
	t.Helper()
	for _, tc := range conformanceTests {
		t.Run(tc.name, func(t *testing.T) { tc.run(t, newHarness) })
	}
}

type conformanceTest struct {
	name string
	run  func(t testing.TB, nh NewHarness)
}

var conformanceTests = []conformanceTest{
	{"MutualExclusion", testMutualExclusion},
	{"Fencing", testFencing},
	{"FencedWrites", testFencedWrites},
	{"TryLockHeld", testTryLockHeld},
	{"LockWaitsForRelease", testLockWaitsForRelease},
	{"DistinctNames", testDistinctNames},
	{"Cancellation", testCancellation},
	{"CancellationRace", testCancellationRace},
	{"Release", testRelease},
	{"ReleaseEndedContext", testReleaseEndedContext},
	{"StaleRelease", testStaleRelease},
	{"CrashLiveness", testCrashLiveness},
	{"TryLockRecoversCrash", testTryLockRecoversCrash},
	{"LossOnKill", testLossOnKill},
	{"PausedHolder", testPausedHolder},
	{"PartitionedHolder", testPartitionedHolder},
	{"AmbiguousAcquire", testAmbiguousAcquire},
	{"LossOnRevoke", testLossOnRevoke},
	{"Preemption", testPreemption},
	{"SemaphoreLimit", testSemaphoreLimit},
	{"SemaphoreSizes", testSemaphoreSizes},
	{"SemaphoreExclusion", testSemaphoreExclusion},
	{"SemaphoreCancellation", testSemaphoreCancellation},
	{"Closed", testClosed},
	{"CloseEndsLeases", testCloseEndsLeases},
	{"CloseHungBroker", testCloseHungBroker},
	{"InvalidNames", testInvalidNames},
	{"RandomNames", testRandomNames},
	{"HugeName", testHugeName},
	{"InvalidOptions", testInvalidOptions},
	{"NilContext", testNilContext},
	{"NoLeaks", testNoLeaks},
}

// closeClient closes c within opTimeout.
func closeClient(c Client) error {
	ctx, cancel := context.WithTimeout(context.Background(), opTimeout)
	defer cancel()
	return c.Close(ctx)
}

// opTimeout bounds every single call the suite makes that should not block:
// far above any healthy broker's latency, so that only a hang trips it.
const opTimeout = 10 * time.Second

// env is one test's harness and the clients it made.
type env struct {
	t       testing.TB
	h       Harness
	caps    Capabilities
	ctx     context.Context
	cancel  context.CancelFunc
	leaks   []goleak.Option
	mu      sync.Mutex
	clients []Client
	closed  bool
}

func newEnv(t testing.TB, nh NewHarness) *env {
	t.Helper()
	leaks := goleak.IgnoreCurrent()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	h, err := nh(ctx, t)
	if err != nil {
		cancel()
		t.Fatalf("making the harness: %v", err)
	}
	return &env{t: t, h: h, caps: h.Capabilities(), ctx: ctx, cancel: cancel, leaks: leakOptions(leaks, h)}
}

// close closes every client and the harness, then checks that no goroutine
// the test started is still running. Tests defer it.
func (e *env) close() {
	e.t.Helper()
	e.mu.Lock()
	if e.closed {
		e.mu.Unlock()
		return
	}
	e.closed = true
	clients := e.clients
	e.mu.Unlock()
	for _, c := range clients {
		if err := closeClient(c); err != nil {
			e.t.Logf("closing a client: %v", err)
		}
	}
	if err := e.h.Close(); err != nil {
		e.t.Errorf("closing the harness: %v", err)
	}
	e.cancel()
	if err := goleak.Find(e.leaks...); err != nil {
		e.t.Errorf("goroutines outlived their leases and clients: %v", err)
	}
}

// newClient makes a new client of the harness (a process of its own, on
// its own connection), closed by env.close.
func (e *env) newClient() Client {
	e.t.Helper()
	c, err := e.h.NewClient(e.ctx)
	if err != nil {
		e.t.Fatalf("NewClient: %v", err)
	}
	e.track(c)
	return c
}

func (e *env) track(c Client) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.clients = append(e.clients, c)
}

// newClientLocker makes a new client and returns its Locker; it skips the
// test when the backend has no Locker.
func (e *env) newClientLocker() locks.Locker {
	e.t.Helper()
	_, l := e.newClientWithLocker()
	return l
}

// newClientWithLocker makes a new client and returns it with its Locker,
// for tests that also close or kill the client; it skips the test when the
// backend has no Locker.
func (e *env) newClientWithLocker() (Client, locks.Locker) {
	e.t.Helper()
	c := e.newClient()
	l := c.Locker()
	if l == nil {
		e.t.Skip("the backend has no Locker")
	}
	return c, l
}

// newClientSemaphore makes a new client and returns its Semaphore of size
// slots; it skips the test when the backend has no Semaphore.
func (e *env) newClientSemaphore(size int) locks.Semaphore {
	e.t.Helper()
	if !e.caps.Semaphore {
		e.t.Skip("the backend has no Semaphore")
	}
	s, err := e.newClient().Semaphore(e.ctx, size)
	if err != nil {
		e.t.Fatalf("Semaphore(%d): %v", size, err)
	}
	return s
}

// skippedPart says, in the test's log, that part of the test did not run
// and why: a check that skips part of itself for a capability the backend
// lacks says so, as a whole test that skips does.
func (e *env) skippedPart(what, why string) {
	e.t.Helper()
	e.t.Logf("skipped part of the test: %s: %s", what, why)
}

var unsafeChars = regexp.MustCompile(`[^a-zA-Z0-9]+`)

// name returns a name unique to this test and run, legal on every broker:
// letters, digits and dashes, under 64 bytes.
func (e *env) name() string {
	base := unsafeChars.ReplaceAllString(e.t.Name(), "-")
	if len(base) > 40 {
		base = base[len(base)-40:]
	}
	var b [6]byte
	_, _ = rand.Read(b[:])
	return strings.Trim(base, "-") + "-" + hex.EncodeToString(b[:])
}

// opCtx returns a context for one call that should not block.
func (e *env) opCtx() (context.Context, context.CancelFunc) {
	return context.WithTimeout(e.ctx, opTimeout)
}

// revokeTimeout bounds a Revoker's Revoke: an administrator's step, which
// may take as long as the backend's own administration does (amqpsem's
// waits until a check of every slot number finds no holder: seconds under
// the race detector on a loaded machine). A liveness bound, not a
// performance claim.
const revokeTimeout = 60 * time.Second

func (e *env) revokeCtx() (context.Context, context.CancelFunc) {
	return context.WithTimeout(e.ctx, revokeTimeout)
}

func (e *env) mustLock(l locks.Locker, name string) locks.Lease {
	e.t.Helper()
	ctx, cancel := e.opCtx()
	defer cancel()
	lease, err := l.Lock(ctx, name)
	if err != nil {
		e.t.Fatalf("Lock(%q): %v", name, err)
	}
	return lease
}

func (e *env) mustTryLock(l locks.Locker, name string) locks.Lease {
	e.t.Helper()
	ctx, cancel := e.opCtx()
	defer cancel()
	lease, err := l.TryLock(ctx, name)
	if err != nil {
		e.t.Fatalf("TryLock(%q) on a free name: %v", name, err)
	}
	return lease
}

// mustTryAcquire takes a slot of s that should be free; what says which
// one in the failure.
func (e *env) mustTryAcquire(s locks.Semaphore, name, what string) locks.Lease {
	e.t.Helper()
	ctx, cancel := e.opCtx()
	defer cancel()
	lease, err := s.TryAcquire(ctx, name)
	if err != nil {
		e.t.Fatalf("TryAcquire %s: %v", what, err)
	}
	return lease
}

// fillSemaphore takes every slot of the semaphore of semSize on name, each
// with a client of its own, and returns the leases.
func (e *env) fillSemaphore(name string) []locks.Lease {
	e.t.Helper()
	var held []locks.Lease
	for i := range semSize {
		held = append(held, e.mustTryAcquire(e.newClientSemaphore(semSize), name, fmt.Sprintf("#%d of %d slots", i+1, semSize)))
	}
	return held
}

func (e *env) mustRelease(lease locks.Lease) {
	e.t.Helper()
	ctx, cancel := e.opCtx()
	defer cancel()
	if err := lease.Release(ctx); err != nil {
		e.t.Fatalf("Release(%q): %v", lease.Name(), err)
	}
}

// expectHeld checks that TryLock of name by l fails with ErrNotAcquired.
func (e *env) expectHeld(l locks.Locker, name, why string) {
	e.t.Helper()
	ctx, cancel := e.opCtx()
	defer cancel()
	lease, err := l.TryLock(ctx, name)
	if err == nil {
		_ = lease.Release(ctx)
		e.t.Fatalf("TryLock(%q) succeeded %s", name, why)
	}
	if !errors.Is(err, locks.ErrNotAcquired) {
		e.t.Fatalf("TryLock(%q) %s: got %v, want an error matching locks.ErrNotAcquired", name, why, err)
	}
}

// expectTokenAbove checks that next, a later holder of the name prev held,
// has the larger fencing token, when the backend has fencing tokens (and
// says it skipped the check otherwise). nextWho and prevWho name the two in
// the failure.
func (e *env) expectTokenAbove(next, prev locks.Lease, nextWho, prevWho string) {
	e.t.Helper()
	if !e.caps.Fencing {
		e.skippedPart(fmt.Sprintf("%s's token above %s's", nextWho, prevWho), "the backend has no fencing tokens")
		return
	}
	if next.Token() <= prev.Token() {
		e.t.Errorf("%s's token %d is not above %s's %d", nextWho, next.Token(), prevWho, prev.Token())
	}
}

// bound is the time the suite allows for a stated bound: the bound, a
// quarter more, and 250ms for scheduling.
func bound(d time.Duration) time.Duration { return d + d/4 + 250*time.Millisecond }

// waitEnded waits until lease's context ends, up to limit, and returns how
// long that took or an error.
func waitEnded(lease locks.Lease, limit time.Duration) (time.Duration, error) {
	start := time.Now()
	select {
	case <-lease.Context().Done():
		return time.Since(start), nil
	case <-time.After(limit):
		return 0, fmt.Errorf("lease %q still live after %v", lease.Name(), limit)
	}
}

// sameContext reports whether a and b are one context (as [locks.Lease]'s
// Context promises on every call), without panicking on a context type
// that cannot be compared.
func sameContext(a, b context.Context) (same bool) {
	defer func() {
		if recover() != nil {
			same = false
		}
	}()
	return a == b
}
