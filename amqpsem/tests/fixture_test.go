package amqpsem_test

// The fixture every test of this module shares: the broker, names,
// clients, a bare AMQP connection to look at the broker with, the amqpsem
// command, lease histories (contracttest.History) and timing slack. Faults
// come from testenv.Proxy only (through), leaks are found by goleak only.

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	neturl "net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/latchkey-go/latchkey/contracttest"
	"github.com/latchkey-go/latchkey/contracttest/testenv"
	"github.com/latchkey-go/latchkey/locks"

	"github.com/latchkey-go/latchkey/amqpsem"
)

// Short timings for tests: the heartbeat bounds crash recovery.
const (
	testHeartbeat = time.Second
	testVerify    = 250 * time.Millisecond
)

var testBackoff = locks.Backoff{Min: 10 * time.Millisecond, Max: 200 * time.Millisecond}

// testOptions are the options every test client starts from.
func testOptions() []amqpsem.Option {
	return []amqpsem.Option{
		amqpsem.WithHeartbeat(testHeartbeat),
		amqpsem.WithVerifyInterval(testVerify),
		amqpsem.WithBackoff(testBackoff),
		amqpsem.WithSkew(5 * time.Millisecond),
		amqpsem.WithConnectTimeout(5 * time.Second),
	}
}

// fastReconnect makes a client redial at once after a loss.
var fastReconnect = amqpsem.WithReconnect(true, locks.Backoff{Min: 50 * time.Millisecond, Max: 200 * time.Millisecond})

// amqpURL returns the broker's URL and its host:port.
func amqpURL(t testing.TB) (string, string) {
	t.Helper()
	raw := testenv.AMQPURL(t)
	u, err := neturl.Parse(raw)
	if err != nil {
		t.Fatal(err)
	}
	host := u.Host
	if u.Port() == "" {
		host += ":5672"
	}
	return raw, host
}

var unsafeInName = regexp.MustCompile(`[^a-zA-Z0-9]+`)

// freshName returns a semaphore name unique to the test and the run.
func freshName(t *testing.T) string {
	return fmt.Sprintf("amqpsem-%s-%08x", unsafeInName.ReplaceAllString(t.Name(), "-"), rand.Uint32())
}

// newName returns a fresh name (freshName) that is destroyed at cleanup
// (destroyAtCleanup).
func newName(t *testing.T, rawURL string) string {
	t.Helper()
	name := freshName(t)
	destroyAtCleanup(t, rawURL, name)
	return name
}

// destroyAtCleanup destroys the semaphore name at the end of the test, in
// whichever layout it has; the test fails if a default-layout semaphore
// cannot be destroyed.
func destroyAtCleanup(t *testing.T, rawURL, name string) {
	t.Helper()
	t.Cleanup(func() {
		if err := destroyAll(rawURL, map[string]bool{name: true}); err != nil && !errors.Is(err, amqpsem.ErrOtherLayout) {
			t.Errorf("cleanup: %v", err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		c, err := amqpsem.Dial(ctx, rawURL, amqpsem.WithHeartbeat(testHeartbeat))
		if err != nil {
			return
		}
		defer c.Close(context.Background())
		if a, err := c.Admin(amqpsem.WithLayout(amqpsem.PythonLayout)); err == nil {
			_, _ = a.Destroy(ctx, name) // most names are not Python-layout semaphores
		}
	})
}

// through is the option that makes a client dial the broker through the
// fault proxy p.
func through(p *testenv.Proxy) amqpsem.Option {
	return amqpsem.WithDial(func(ctx context.Context, network, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, network, p.Addr())
	})
}

// viaProxy starts a fault proxy to host for the test and returns it with
// the option that dials through it.
func viaProxy(t *testing.T, host string) (*testenv.Proxy, amqpsem.Option) {
	t.Helper()
	p := testenv.NewProxy(t, host)
	return p, through(p)
}

// dial returns a client with testOptions and then opts, closed at cleanup.
func dial(t *testing.T, rawURL string, opts ...amqpsem.Option) *amqpsem.Client {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := amqpsem.Dial(ctx, rawURL, append(testOptions(), opts...)...)
	if err != nil {
		t.Fatalf("Dial: %v", err)
	}
	t.Cleanup(func() { _ = c.Close(context.Background()) })
	return c
}

// adminDial is dial for a client whose Admin scans every slot number
// (Status, WaitReleased): with the tests' 1s heartbeat, a broker busy with
// a scan's 65,535 probes on a loaded machine let the client's connection
// go 3s without a frame, and it was closed (two CI runs: 501 "i/o
// timeout" mid-Status). Its heartbeat is 5s; its leases, the
// administration mutex's, are not what these tests time.
func adminDial(t *testing.T, rawURL string, opts ...amqpsem.Option) *amqpsem.Client {
	t.Helper()
	return dial(t, rawURL, append([]amqpsem.Option{amqpsem.WithHeartbeat(5 * time.Second)}, opts...)...)
}

func admin(t *testing.T, c *amqpsem.Client, opts ...amqpsem.Option) *amqpsem.Admin {
	t.Helper()
	a, err := c.Admin(opts...)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

func semaphore(t *testing.T, c *amqpsem.Client, size int) *amqpsem.Semaphore {
	t.Helper()
	s, err := c.Semaphore(size)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// lockers are the mutex and a one-slot semaphore of c, as Lockers.
func lockers(t *testing.T, c *amqpsem.Client) map[string]locks.Locker {
	m := c.Locker()
	s := semaphore(t, c, 1)
	return map[string]locks.Locker{"Mutex": m, "Semaphore": semLocker{s}}
}

// tctx is a test context of 20s, cancelled at cleanup.
func tctx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// longWait guards against hangs in tests that check every slot number: a
// check takes a few seconds under -race, over 20s on a loaded 2-core
// machine. Their bounds are measured (checkTime).
const longWait = 5 * time.Minute

// longCtx is a test context of longWait.
func longCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), longWait)
	t.Cleanup(cancel)
	return ctx
}

// waitFor polls cond until it holds, failing the test when it does not
// within d; what says what was waited for.
func waitFor(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %v", what, d)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// waitConnected waits until c is connected, up to d.
func waitConnected(t *testing.T, c *amqpsem.Client, d time.Duration) {
	t.Helper()
	waitFor(t, d, "client reconnected", c.Connected)
}

// raw is a plain AMQP connection for looking at the broker directly, and
// for holding queues as a client written against the specification only
// would (another implementation, a non-linear scanner).
type raw struct {
	t    *testing.T
	conn *amqp.Connection
}

func rawConn(t *testing.T, rawURL string) *raw {
	t.Helper()
	conn, err := amqp.Dial(rawURL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return &raw{t: t, conn: conn}
}

// exists reports whether queue q exists, by a passive declare on a
// channel of its own (which a missing queue closes).
func (r *raw) exists(q string) bool {
	r.t.Helper()
	ch, err := r.conn.Channel()
	if err != nil {
		r.t.Fatal(err)
	}
	defer ch.Close()
	_, err = ch.QueueDeclarePassive(q, false, false, false, false, nil)
	switch code := codeOf(err); {
	case err == nil, code == amqp.ResourceLocked:
		return true
	case code == amqp.NotFound:
		return false
	}
	r.t.Fatalf("passive declare %q: %v", q, err)
	return false
}

// state says whether q is absent ("absent"), exists and is free to this
// connection ("exists"), or is an exclusive queue of another connection
// ("locked"). It is safe from any goroutine.
func (r *raw) state(q string) string {
	ch, err := r.conn.Channel()
	if err != nil {
		return "error: " + err.Error()
	}
	defer ch.Close()
	_, err = ch.QueueDeclarePassive(q, false, false, false, false, nil)
	switch codeOf(err) {
	case 0:
		if err == nil {
			return "exists"
		}
	case amqp.NotFound:
		return "absent"
	case amqp.ResourceLocked:
		return "locked"
	}
	return "error: " + err.Error()
}

// declare declares q with the given properties on a channel of its own and
// returns the broker's answer: nil when q is new or equivalent,
// PRECONDITION_FAILED when its properties differ, RESOURCE_LOCKED when it
// is another connection's exclusive queue.
func (r *raw) declare(q string, durable, exclusive bool, args amqp.Table) error {
	r.t.Helper()
	ch, err := r.conn.Channel()
	if err != nil {
		r.t.Fatal(err)
	}
	defer ch.Close()
	_, err = ch.QueueDeclare(q, durable, false, exclusive, false, args)
	return err
}

// hold declares queue q exclusive on this connection, as a holder does.
// It is safe from any goroutine.
func (r *raw) hold(q string) error {
	ch, err := r.conn.Channel()
	if err != nil {
		return err
	}
	defer ch.Close()
	_, err = ch.QueueDeclare(q, false, false, true, false, maxLen0)
	return err
}

// drop deletes queue q. It is safe from any goroutine.
func (r *raw) drop(q string) error {
	ch, err := r.conn.Channel()
	if err != nil {
		return err
	}
	defer ch.Close()
	_, err = ch.QueueDelete(q, false, false, false)
	return err
}

func (r *raw) delete(q string) {
	r.t.Helper()
	if err := r.drop(q); err != nil {
		r.t.Errorf("delete %q: %v", q, err)
	}
}

// holdQueue declares q exclusive on r's connection, as a client holding
// it does (the Python client and this package alike).
func holdQueue(t *testing.T, r *raw, q string) {
	t.Helper()
	if err := r.declare(q, false, true, maxLen0); err != nil {
		t.Fatalf("holding %q: %v", q, err)
	}
}

func codeOf(err error) int {
	var e *amqp.Error
	if errors.As(err, &e) {
		return e.Code
	}
	return 0
}

var maxLen0 = amqp.Table{"x-max-length": int32(0)}

// checkSlots checks that A[1..n] of name exist, durable with x-max-length
// 0 (a declare with those properties is accepted, one not durable or
// without the argument refused), and that A[n+1] does not.
func checkSlots(t *testing.T, r *raw, name string, n int) {
	t.Helper()
	for i := 1; i <= n; i++ {
		q := amqpsem.DefaultLayout.Slot(name, i)
		if !r.exists(q) {
			t.Fatalf("slot queue %q does not exist", q)
		}
		if err := r.declare(q, true, false, maxLen0); err != nil {
			t.Errorf("%q is not a durable queue with x-max-length 0: %v", q, err)
		}
		if err := r.declare(q, false, false, maxLen0); codeOf(err) != amqp.PreconditionFailed {
			t.Errorf("a non-durable declare of %q gave %v, want PRECONDITION_FAILED", q, err)
		}
	}
	if q := amqpsem.DefaultLayout.Slot(name, n+1); r.exists(q) {
		t.Errorf("slot queue %q exists above the maximum %d", q, n)
	}
}

// holderQueuesLeft polls until no holder queue B[1..n] of name exists
// (or d passes) and returns those that still do.
func holderQueuesLeft(r *raw, name string, n int, d time.Duration) []string {
	end := time.Now().Add(d)
	for {
		var left []string
		for i := 1; i <= n; i++ {
			q := amqpsem.DefaultLayout.Holder(name, i)
			if s := r.state(q); s != "absent" {
				left = append(left, q+"="+s)
			}
		}
		if len(left) == 0 || time.Now().After(end) {
			return left
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// waitMutexFree waits until no connection holds name's administration
// mutex (the queue name itself, in the default layout).
func waitMutexFree(t *testing.T, r *raw, name string, d time.Duration) {
	t.Helper()
	waitFor(t, d, fmt.Sprintf("administration mutex %q free", name), func() bool { return r.state(name) == "absent" })
}

// checkTime measures one check of every slot number of name on a (a
// Status), as WaitReleased makes before it returns nil.
func checkTime(t *testing.T, ctx context.Context, a *amqpsem.Admin, name string) time.Duration {
	t.Helper()
	t0 := time.Now()
	if _, err := a.Status(ctx, name); err != nil {
		t.Fatal(err)
	}
	d := time.Since(t0)
	t.Logf("a check of every slot number took %v", d.Round(time.Millisecond))
	return d
}

// releasedBound is how soon WaitReleased returns once no removed slot is
// held: the check it may be making when the slot is freed, its poll (the
// back-off) and up to two checks of every slot number (documented), one
// more check for the load changing during the test, and slack.
func releasedBound(sl slack, check time.Duration) time.Duration {
	return sl.bound(testBackoff.Max+4*check, 4)
}

// waitReleasedInBackground runs a.WaitReleased(name) with a timeout of d
// and returns a channel of its result.
func waitReleasedInBackground(a *amqpsem.Admin, name string, d time.Duration) <-chan error {
	done := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), d)
		defer cancel()
		done <- a.WaitReleased(ctx, name)
	}()
	return done
}

// events records a client's connection events (WithConnectionNotice).
type events struct {
	mu  sync.Mutex
	got []amqpsem.ConnectionEvent
	c   chan amqpsem.ConnectionEvent
}

func newEvents() *events { return &events{c: make(chan amqpsem.ConnectionEvent, 100)} }

func (e *events) notice(ev amqpsem.ConnectionEvent) {
	e.mu.Lock()
	e.got = append(e.got, ev)
	e.mu.Unlock()
	select {
	case e.c <- ev:
	default:
	}
}

// all returns the events seen so far.
func (e *events) all() []amqpsem.ConnectionEvent {
	e.mu.Lock()
	defer e.mu.Unlock()
	return append([]amqpsem.ConnectionEvent(nil), e.got...)
}

// wait returns the first event for which ok holds, within d.
func (e *events) wait(t *testing.T, d time.Duration, what string, ok func(amqpsem.ConnectionEvent) bool) amqpsem.ConnectionEvent {
	t.Helper()
	timeout := time.After(d)
	for {
		select {
		case ev := <-e.c:
			if ok(ev) {
				return ev
			}
		case <-timeout:
			t.Fatalf("no %s event in %v", what, d)
		}
	}
}

// leaseHistory records leases of one semaphore in contracttest.Histories:
// one over every slot (at most limit at once) and one per slot (at most
// one at once). A lease's section runs from enter to the first of its
// exit and its lease's end.
type leaseHistory struct {
	all *contracttest.History

	mu    sync.Mutex
	slots map[int]*contracttest.History
	exits []func()
}

func newLeaseHistory(limit int) *leaseHistory {
	return &leaseHistory{all: contracttest.NewHistory(limit), slots: map[int]*contracttest.History{}}
}

// enter records l, held by who, from now.
func (h *leaseHistory) enter(who string, l locks.Lease) (exit func()) {
	slot := l.(locks.SlotLease).Slot()
	h.mu.Lock()
	sh := h.slots[slot]
	if sh == nil {
		sh = contracttest.NewHistory(1)
		h.slots[slot] = sh
	}
	h.mu.Unlock()
	who = fmt.Sprintf("%s on slot %d", who, slot)
	e1, e2 := h.all.EnterLease(who, l), sh.EnterLease(who, l)
	exit = func() { e1(); e2() }
	h.mu.Lock()
	h.exits = append(h.exits, exit)
	h.mu.Unlock()
	return exit
}

// slot returns the History of slot s (empty if nobody held it).
func (h *leaseHistory) slot(s int) *contracttest.History {
	h.mu.Lock()
	defer h.mu.Unlock()
	if sh := h.slots[s]; sh != nil {
		return sh
	}
	return contracttest.NewHistory(1)
}

// ended returns when the section of who's lease ended, on the clock of
// h.all (its Now), or false while it is open.
func (h *leaseHistory) ended(who string) (time.Duration, bool) {
	for _, s := range h.all.Spans() {
		if strings.HasPrefix(s.Who, who+" on slot ") {
			return s.Exit, true
		}
	}
	return 0, false
}

// check ends every section still open at now, then fails the test for
// each slot held by two leases at once, and when more than the limit
// were held at once.
func (h *leaseHistory) check(t *testing.T) {
	t.Helper()
	h.mu.Lock()
	exits := h.exits
	slots := make(map[int]*contracttest.History, len(h.slots))
	for s, sh := range h.slots {
		slots[s] = sh
	}
	h.mu.Unlock()
	for _, exit := range exits {
		exit()
	}
	for s, sh := range slots {
		if err := sh.Check(); err != nil {
			t.Errorf("slot %d: %v", s, err)
		}
	}
	if err := h.all.Check(); err != nil {
		t.Error(err)
	}
}

// slack is what a timing bound allows beyond the documented bound on this
// machine, now: the broker's round trip and the scheduler's delay,
// measured at the start of the test, each the largest of a few samples
// and never below a floor (a loaded 2-core machine stalls a process now
// and then for longer than a quiet sample shows).
type slack struct {
	rtt, sched time.Duration
}

// Floors of the measured slack.
const (
	minRoundTrip = 100 * time.Millisecond
	minSchedule  = 500 * time.Millisecond
)

// measureSlack measures the broker's round trip (a channel opened and
// closed on a connection of its own) and the scheduler's delay (how late
// a 1ms sleep wakes).
func measureSlack(t *testing.T, rawURL string) slack {
	t.Helper()
	r := rawConn(t, rawURL)
	var s slack
	for range 5 {
		t0 := time.Now()
		ch, err := r.conn.Channel()
		if err != nil {
			t.Fatal(err)
		}
		_ = ch.Close()
		s.rtt = max(s.rtt, time.Since(t0)/2) // open and close: two round trips
		t0 = time.Now()
		time.Sleep(time.Millisecond)
		s.sched = max(s.sched, time.Since(t0)-time.Millisecond)
	}
	s.rtt, s.sched = max(s.rtt, minRoundTrip), max(s.sched, minSchedule)
	return s
}

// bound returns documented plus trips round trips and the scheduler's
// delay.
func (s slack) bound(documented time.Duration, trips int) time.Duration {
	return documented + time.Duration(trips)*s.rtt + s.sched
}

// String says what the slack is made of, for failure messages.
func (s slack) String() string {
	return fmt.Sprintf("slack: round trip %v, scheduler delay %v", s.rtt, s.sched)
}

// within fails the test when took exceeds documented plus the slack for
// trips round trips; what says what took that long.
func (s slack) within(t *testing.T, what string, took, documented time.Duration, trips int) {
	t.Helper()
	if b := s.bound(documented, trips); took > b {
		t.Errorf("%s took %v: more than the documented %v plus %d round trips and the scheduler's delay (%v; %v)", what, took, documented, trips, b, s)
	}
}

var (
	commandOnce sync.Once
	commandPath string
	commandErr  error
)

// commandBin builds the amqpsem command once.
func commandBin(t *testing.T) string {
	t.Helper()
	commandOnce.Do(func() {
		dir, err := os.MkdirTemp("", "amqpsem-command")
		if err != nil {
			commandErr = err
			return
		}
		commandPath = filepath.Join(dir, "amqpsem")
		out, err := exec.Command("go", "build", "-o", commandPath, "../cmd/amqpsem").CombinedOutput()
		if err != nil {
			commandErr = fmt.Errorf("build: %v: %s", err, out)
		}
	})
	if commandErr != nil {
		t.Fatal(commandErr)
	}
	return commandPath
}

// runCommand runs the amqpsem command with env added, returning its
// combined output and exit code.
func runCommand(t *testing.T, timeout time.Duration, env []string, args ...string) (string, int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, commandBin(t), args...)
	cmd.Env = append(os.Environ(), env...)
	out, err := cmd.CombinedOutput()
	code := 0
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatalf("run %v: %v", args, err)
	}
	return string(out), code
}
