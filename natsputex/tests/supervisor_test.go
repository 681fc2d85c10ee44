package natsputex_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/goleak"

	"github.com/latchkey-go/latchkey/contracttest"
	"github.com/latchkey-go/latchkey/contracttest/testenv/natsenv"
	"github.com/latchkey-go/latchkey/natsputex"
)

// agent is one in-process putex agent with its own connection, recording
// the intervals in which its service runs in a shared History.
type agent struct {
	t       *testing.T
	name    string
	nc      *nats.Conn
	sup     *natsputex.Supervisor
	cancel  context.CancelFunc
	done    chan error
	history *contracttest.History
	failHC  atomic.Bool // the health check fails while set
	// stopDelay makes Stop take this long (a time.Duration) before the
	// service stops.
	stopDelay atomic.Int64
	// stopHonoursCtx makes a slow Stop give up when its context ends,
	// leaving the service running, as a stop command killed at its
	// deadline does.
	stopHonoursCtx atomic.Bool
	// failStop makes Stop fail, leaving the service running, while set.
	failStop            atomic.Bool
	stopCalls, stopsCut atomic.Int32 // Stop calls; those cut short by their context

	// hcDelay makes the health check take this long (a time.Duration).
	hcDelay atomic.Int64
	// failStart makes Start fail while set.
	failStart     atomic.Bool
	startFailures atomic.Int32

	mu      sync.Mutex
	exit    func() // ends the open service interval, nil when stopped
	dead    bool
	started []time.Time
	stopped []time.Time
	tokens  []uint64 // the fencing token each Start was given
	events  []natsputex.Event
}

// sawEvent reports whether the agent was told of an event matching f.
func (a *agent) sawEvent(f func(natsputex.Event) bool) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	return slices.ContainsFunc(a.events, f)
}

// sleepCtx waits for d or until ctx ends, and returns ctx's error then.
func sleepCtx(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

func startAgent(t *testing.T, url, bucket, key, name string, h *contracttest.History) *agent {
	t.Helper()
	return startAgentWith(t, url, bucket, key, name, name, h, nil)
}

// startAgentWith starts an agent named name whose token is token, with
// opts after the suite's timing; prepare, if not nil, sets the agent's
// faults before it runs.
func startAgentWith(t *testing.T, url, bucket, key, name, token string, h *contracttest.History, prepare func(*agent), opts ...natsputex.Option) *agent {
	t.Helper()
	nc, js, err := connect(url)
	if err != nil {
		t.Fatal(err)
	}
	a := &agent{t: t, name: name, nc: nc, history: h, done: make(chan error, 1)}
	if prepare != nil {
		prepare(a)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	a.cancel = cancel
	base := []natsputex.Option{
		natsputex.WithRenewInterval(testR), natsputex.WithFailureThreshold(testF), natsputex.WithConfirmations(testC),
		natsputex.WithHealthCheck(func(ctx context.Context, s natsputex.State) error {
			if d := time.Duration(a.hcDelay.Load()); d > 0 {
				if err := sleepCtx(ctx, d); err != nil {
					return err
				}
			}
			if a.failHC.Load() {
				return errors.New("unhealthy (test)")
			}
			return nil
		}),
	}
	c, err := natsputex.New(ctx, js, bucket, append(base, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	a.sup, err = c.Supervisor(key, token, natsputex.Service{
		Start: func(_ context.Context, fence uint64) error {
			if a.failStart.Load() {
				a.startFailures.Add(1)
				return errors.New("cannot start (test)")
			}
			a.mu.Lock()
			defer a.mu.Unlock()
			if a.exit == nil && !a.dead {
				a.exit = h.Enter(name, fence)
				a.started = append(a.started, time.Now())
				a.tokens = append(a.tokens, fence)
			}
			return nil
		},
		Stop: func(ctx context.Context) error {
			a.stopCalls.Add(1)
			if a.failStop.Load() {
				return errors.New("cannot stop (test)")
			}
			d := time.Duration(a.stopDelay.Load())
			if a.stopHonoursCtx.Load() {
				if err := sleepCtx(ctx, d); err != nil {
					a.stopsCut.Add(1)
					return err // killed: the service runs on
				}
			} else {
				time.Sleep(d)
			}
			a.mu.Lock()
			defer a.mu.Unlock()
			a.stopLocked()
			return nil
		},
		Observe: func(e natsputex.Event) {
			t.Logf("%s: %v", name, e)
			a.mu.Lock()
			a.events = append(a.events, e)
			a.mu.Unlock()
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	go func() {
		err := a.sup.Run(ctx)
		_ = c.Close(context.Background())
		a.done <- err
	}()
	t.Cleanup(a.stop)
	return a
}

func (a *agent) stopLocked() {
	if a.exit != nil {
		a.exit()
		a.exit = nil
		a.stopped = append(a.stopped, time.Now())
	}
}

// running reports whether the agent's service runs.
func (a *agent) running() bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.exit != nil
}

func (a *agent) lastStart() time.Time {
	a.mu.Lock()
	defer a.mu.Unlock()
	if len(a.started) == 0 {
		return time.Time{}
	}
	return a.started[len(a.started)-1]
}

// kill crashes the agent: its service dies with it, and it can tell NATS
// nothing more.
func (a *agent) kill() {
	a.mu.Lock()
	a.dead = true
	a.stopLocked()
	a.mu.Unlock()
	a.nc.Close()
	a.cancel()
	<-a.done
	a.done <- nil
}

// stop ends the agent cleanly (a SIGTERM).
func (a *agent) stop() {
	a.cancel()
	err := <-a.done
	a.done <- err
	a.nc.Close()
}

// waitActive waits until exactly one of agents runs its service and
// returns it.
func waitActive(t *testing.T, within time.Duration, agents ...*agent) *agent {
	t.Helper()
	deadline := time.Now().Add(within)
	for time.Now().Before(deadline) {
		var up []*agent
		for _, a := range agents {
			if a.running() {
				up = append(up, a)
			}
		}
		if len(up) > 1 {
			t.Fatalf("%d agents run the service at once", len(up))
		}
		if len(up) == 1 {
			return up[0]
		}
		time.Sleep(5 * time.Millisecond)
	}
	t.Fatalf("no agent became active within %v", within)
	return nil
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
	w := &keyWatch{}
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

func supervisorEnv(t *testing.T) (url, bucket, key string) {
	// Goroutines running now are not the test's; IgnoreCurrent must be
	// taken now, not in the cleanup, where it would ignore every leak.
	ignore := goleak.IgnoreCurrent()
	t.Cleanup(func() { goleak.VerifyNone(t, append(natsenv.ConsumerGoroutines(), ignore)...) })
	url = natsenv.StartServer(t).URL()
	bucket = uniqueBucket("sup")
	prepareBucket(t, url, bucket, natsputex.WithStorage(jetstream.MemoryStorage))
	return url, bucket, "spof-service"
}

// handoverBound is how long after a crash another agent may take up to:
// T from the last write it saw, C confirmation intervals, one stroke of
// alignment and slack for a loaded machine.
const handoverBound = (testF+testC+2)*testR + 500*time.Millisecond

// TestSupervisorHandover: with two then three agents on one key, killing
// the active agent hands the service over no sooner than (F+C)·R after
// its last write and within handoverBound; the services never overlap.
func TestSupervisorHandover(t *testing.T) {
	url, bucket, key := supervisorEnv(t)
	writes := watchWrites(t, url, bucket, key)
	h := contracttest.NewHistory(1)
	agents := []*agent{
		startAgent(t, url, bucket, key, "node-a", h),
		startAgent(t, url, bucket, key, "node-b", h),
	}
	for round := range 3 {
		active := waitActive(t, 2*handoverBound, agents...)
		time.Sleep(3 * testR) // a few renewals
		active.kill()
		killed := time.Now()
		lastWrite := writes.lastWrite()
		var alive []*agent
		for _, a := range agents {
			if a != active {
				alive = append(alive, a)
			}
		}
		next := waitActive(t, handoverBound+time.Second, alive...)
		took := next.lastStart().Sub(killed)
		sinceWrite := next.lastStart().Sub(lastWrite)
		t.Logf("round %d: %s killed, %s active %v later, %v after the last write seen", round, active.name, next.name, took.Round(time.Millisecond), sinceWrite.Round(time.Millisecond))
		// The watch of this test may see the last write a little after the
		// new agent did: allow that much delivery jitter.
		if min := (testF+testC)*testR - 25*time.Millisecond; sinceWrite < min {
			t.Errorf("round %d: handed over %v after the dead agent's last write, want >= (F+C)·R = %v", round, sinceWrite, (testF+testC)*testR)
		}
		if took > handoverBound {
			t.Errorf("round %d: handed over %v after the kill, want <= %v", round, took, handoverBound)
		}
		agents = append(alive, startAgent(t, url, bucket, key, fmt.Sprintf("node-%d", round), h))
	}
	for _, a := range agents {
		a.stop()
	}
	if err := h.Check(); err != nil {
		t.Fatalf("services overlapped: %v", err)
	}
	if h.Len() < 4 {
		t.Fatalf("recorded %d service intervals, want at least 4", h.Len())
	}
}

// TestSupervisorHealthCheckFailover: an active agent whose health check
// fails blanks the key and stops its service within R; another agent takes
// over at once (the key is blank, no T to wait).
func TestSupervisorHealthCheckFailover(t *testing.T) {
	url, bucket, key := supervisorEnv(t)
	h := contracttest.NewHistory(1)
	agents := []*agent{
		startAgent(t, url, bucket, key, "node-a", h),
		startAgent(t, url, bucket, key, "node-b", h),
		startAgent(t, url, bucket, key, "node-c", h),
	}
	active := waitActive(t, 2*handoverBound, agents...)
	time.Sleep(2 * testR)
	failed := time.Now()
	active.failHC.Store(true)
	for active.running() {
		if time.Since(failed) > 2*testR+250*time.Millisecond {
			t.Fatalf("%s still runs its service %v after its health check failed", active.name, time.Since(failed))
		}
		time.Sleep(2 * time.Millisecond)
	}
	stoppedAfter := time.Since(failed)
	var others []*agent
	for _, a := range agents {
		if a != active {
			others = append(others, a)
		}
	}
	// A blank key is taken at once: well before T of silence.
	next := waitActive(t, (testF+testC)*testR+time.Second, others...)
	took := next.lastStart().Sub(failed)
	t.Logf("%s stopped %v after its check failed; %s active after %v", active.name, stoppedAfter.Round(time.Millisecond), next.name, took.Round(time.Millisecond))
	if took >= testF*testR+testR/2 && took > 500*time.Millisecond {
		t.Errorf("takeover of a blanked key took %v: it should not wait for T = %v", took, testF*testR)
	}
	if active.running() {
		t.Errorf("%s restarted its service while its health check fails", active.name)
	}
	for _, a := range agents {
		a.stop()
	}
	if err := h.Check(); err != nil {
		t.Fatalf("services overlapped: %v", err)
	}
}

// TestSupervisorRelease: stopping the active agent (SIGTERM) stops its
// service and blanks the key, so another agent starts at once.
func TestSupervisorRelease(t *testing.T) {
	url, bucket, key := supervisorEnv(t)
	h := contracttest.NewHistory(1)
	a := startAgent(t, url, bucket, key, "node-a", h)
	b := startAgent(t, url, bucket, key, "node-b", h)
	active := waitActive(t, 2*handoverBound, a, b)
	other := b
	if active == b {
		other = a
	}
	stopped := time.Now()
	active.stop()
	waitActive(t, 2*time.Second, other)
	took := other.lastStart().Sub(stopped)
	t.Logf("%s active %v after %s stopped", other.name, took.Round(time.Millisecond), active.name)
	if took >= testF*testR {
		t.Errorf("after a clean stop, the other agent started after %v, want < T = %v (the key should be blank)", took, testF*testR)
	}
	other.stop()
	if err := h.Check(); err != nil {
		t.Fatalf("services overlapped: %v", err)
	}
}

func TestSupervisorBadInput(t *testing.T) {
	url, bucket, _ := supervisorEnv(t)
	nc, js, err := connect(url)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	c, err := natsputex.New(context.Background(), js, bucket)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close(context.Background())
	for _, key := range []string{"", "a b", ".a", "a..b", "a*"} {
		if _, err := c.Supervisor(key, "tok", natsputex.Service{}); !errors.Is(err, locksErrInvalidName) {
			t.Errorf("Supervisor(%q) = %v, want ErrInvalidName", key, err)
		}
	}
	for _, tok := range []string{"", "a\x00b"} {
		if _, err := c.Supervisor("k", tok, natsputex.Service{}); !errors.Is(err, locksErrInvalidOption) {
			t.Errorf("Supervisor token %q = %v, want ErrInvalidOption", tok, err)
		}
	}
	for _, b := range []string{"", "a.b", "a b", "a*"} {
		if _, err := natsputex.New(context.Background(), js, b); !errors.Is(err, locksErrInvalidName) {
			t.Errorf("New(bucket %q) = %v, want ErrInvalidName", b, err)
		}
	}
	s, err := c.Supervisor("k", "tok", natsputex.Service{})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := s.Run(ctx); !errors.Is(err, context.Canceled) {
		t.Errorf("Run with a cancelled context = %v, want context.Canceled", err)
	}
}

// TestSupervisorSlowStop: an active agent whose health check fails runs
// its (slow) Stop before it blanks the key, so the agent that takes the
// blank key over at once starts its service only after the first one's
// has stopped.
func TestSupervisorSlowStop(t *testing.T) {
	url, bucket, key := supervisorEnv(t)
	h := contracttest.NewHistory(1)
	a := startAgent(t, url, bucket, key, "node-a", h)
	b := startAgent(t, url, bucket, key, "node-b", h)
	active := waitActive(t, 2*handoverBound, a, b)
	other := b
	if active == b {
		other = a
	}
	time.Sleep(2 * testR)
	// Shorter than T − R, so that the other agent could not take the key
	// over by silence while Stop runs: only the blank lets it in.
	active.stopDelay.Store(int64(testR + testR/2))
	active.failHC.Store(true)
	waitFor(t, (testF+testC)*testR+time.Second, other.name+" starts its service", other.running)
	a.stop()
	b.stop()
	if err := h.Check(); err != nil {
		t.Fatalf("services overlapped: %v", err)
	}
	if h.Len() < 2 {
		t.Fatalf("recorded %d service intervals, want 2", h.Len())
	}
}

// TestSupervisorShutdownSparesSuccessor: an agent that stops blanks the
// key only at the revision of its own last write. A successor with the
// same token (the agent restarted on the same host) that wrote the key
// since keeps it.
func TestSupervisorShutdownSparesSuccessor(t *testing.T) {
	url, bucket, key := supervisorEnv(t)
	kv := mustBucket(t, url, bucket)
	c := newTestClient(t, url, bucket)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var succRev uint64
	var succErr error
	sup, err := c.Supervisor(key, "node-a", natsputex.Service{Observe: func(e natsputex.Event) {
		if e.Phase != natsputex.PhaseActive || succRev != 0 {
			return
		}
		// Observe runs on the pump's goroutine: the agent makes no write
		// between the successor's and the end of Run.
		succRev, succErr = kv.Update(context.Background(), key, []byte("node-a"), e.Revision)
		cancel()
	}})
	if err != nil {
		t.Fatal(err)
	}
	if err := sup.Run(ctx); !errors.Is(err, context.Canceled) {
		t.Fatalf("Run = %v, want context.Canceled", err)
	}
	if succErr != nil || succRev == 0 {
		t.Fatalf("the successor's write: revision %d, %v", succRev, succErr)
	}
	e, err := kv.Get(context.Background(), key)
	if err != nil {
		t.Fatal(err)
	}
	if string(e.Value()) != "node-a" || e.Revision() != succRev {
		t.Fatalf("after the agent stopped, the key holds %q at revision %d, want the successor's write (revision %d)", e.Value(), e.Revision(), succRev)
	}
}

// serviceCalls is a Service that records, in order, the calls of its
// Start ("start") and Stop ("stop"), and the events it is told of.
type serviceCalls struct {
	mu     sync.Mutex
	calls  []string
	events []natsputex.Event
}

func (r *serviceCalls) service(t *testing.T, name string) natsputex.Service {
	record := func(c string) error {
		r.mu.Lock()
		defer r.mu.Unlock()
		r.calls = append(r.calls, c)
		return nil
	}
	return natsputex.Service{
		Start: func(context.Context, uint64) error { return record("start") },
		Stop:  func(context.Context) error { return record("stop") },
		Observe: func(e natsputex.Event) {
			t.Logf("%s: %v", name, e)
			r.mu.Lock()
			defer r.mu.Unlock()
			r.events = append(r.events, e)
		},
	}
}

func (r *serviceCalls) get() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.calls)
}

// expect waits until the calls recorded number len(want), and fails t
// unless they are want.
func (r *serviceCalls) expect(t *testing.T, within time.Duration, when string, want ...string) {
	t.Helper()
	start := time.Now()
	for len(r.get()) < len(want) && time.Since(start) < within {
		time.Sleep(5 * time.Millisecond)
	}
	if got := r.get(); !slices.Equal(got, want) {
		t.Fatalf("%s: the service calls are %q, want %q", when, got, want)
	}
}

// saw reports whether an event since the n-th matched f.
func (r *serviceCalls) saw(n int, f func(natsputex.Event) bool) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.ContainsFunc(r.events[min(n, len(r.events)):], f)
}

func (r *serviceCalls) eventCount() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.events)
}

// runSupervisor runs sup until the returned function (also called at
// cleanup) cancels it; that function returns Run's error.
func runSupervisor(t *testing.T, sup *natsputex.Supervisor) (stop func() error) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- sup.Run(ctx) }()
	stop = sync.OnceValue(func() error { cancel(); return <-done })
	t.Cleanup(func() { _ = stop() })
	return stop
}

// TestSupervisorStopOnEveryPhaseChange: Stop runs once when Run begins,
// before any Start; once whenever the agent stops being active (a failed
// health check, another token in the key), before the next Start, and not
// again on every stroke while it stays standby; and when Run returns,
// whether the agent was active or standby.
func TestSupervisorStopOnEveryPhaseChange(t *testing.T) {
	url, bucket, key := supervisorEnv(t)
	kv := mustBucket(t, url, bucket)
	var failHC atomic.Bool
	c := newTestClient(t, url, bucket, natsputex.WithHealthCheck(func(_ context.Context, s natsputex.State) error {
		if s == natsputex.Active && failHC.Load() {
			return errors.New("unhealthy (test)")
		}
		return nil
	}))
	rec := &serviceCalls{}
	sup, err := c.Supervisor(key, "node-a", rec.service(t, "node-a"))
	if err != nil {
		t.Fatal(err)
	}
	stop := runSupervisor(t, sup)
	rec.expect(t, 5*time.Second, "Run began on a free key", "stop", "start")

	// A failed health check: standby, Stop once, however many strokes
	// fail their check (the blank key is free: each stroke tries).
	failHC.Store(true)
	rec.expect(t, 2*testR+time.Second, "the health check failed", "stop", "start", "stop")
	time.Sleep(5 * testR)
	rec.expect(t, 0, "five more strokes with a failing health check", "stop", "start", "stop")
	if p := sup.Phase(); p != natsputex.PhaseStandby {
		t.Fatalf("phase with a failing health check: %v, want standby", p)
	}
	failHC.Store(false)
	rec.expect(t, 2*testR+time.Second, "the health check passed again", "stop", "start", "stop", "start")

	// Another token in the key: Stop at once; after T of silence the
	// agent takes the key over, confirms, and starts again.
	n := rec.eventCount()
	if _, err := kv.Put(context.Background(), key, []byte("intruder")); err != nil {
		t.Fatal(err)
	}
	rec.expect(t, 2*testR+time.Second, "another token in the key", "stop", "start", "stop", "start", "stop")
	rec.expect(t, handoverBound+time.Second, "the key was taken back", "stop", "start", "stop", "start", "stop", "start")
	if !rec.saw(n, func(e natsputex.Event) bool { return e.Phase == natsputex.PhaseConfirming }) {
		t.Error("the agent took the key back without confirming it")
	}

	// Run returns while active.
	if err := stop(); !errors.Is(err, context.Canceled) {
		t.Errorf("Run = %v, want context.Canceled", err)
	}
	rec.expect(t, 0, "Run returned while active", "stop", "start", "stop", "start", "stop", "start", "stop")

	// Run returns while standby: another client holds the key.
	holder, err := newTestClient(t, url, bucket).Locker().TryLock(context.Background(), key)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = holder.Release(context.Background()) }()
	rec2 := &serviceCalls{}
	sup2, err := c.Supervisor(key, "node-a", rec2.service(t, "node-a"))
	if err != nil {
		t.Fatal(err)
	}
	stop2 := runSupervisor(t, sup2)
	waitFor(t, 5*time.Second, "the agent sees the key held by another", func() bool {
		return rec2.saw(0, func(e natsputex.Event) bool { return e.Phase == natsputex.PhaseStandby && e.Holder != "" })
	})
	time.Sleep(2 * testR) // a few strokes as standby; the holder renews
	rec2.expect(t, 0, "standby", "stop")
	if err := stop2(); !errors.Is(err, context.Canceled) {
		t.Errorf("Run = %v, want context.Canceled", err)
	}
	rec2.expect(t, 0, "Run returned while standby", "stop", "stop")
	if holder.Context().Err() != nil {
		t.Errorf("the other client's lease ended while the agent was standby: %v", context.Cause(holder.Context()))
	}
}
