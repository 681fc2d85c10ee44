package contracttest

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"
	"go.uber.org/goleak"

	"github.com/latchkey-go/latchkey/locks"
)

// ChaosConfig configures [RunChaos]. Zero fields take the defaults given.
type ChaosConfig struct {
	Duration   time.Duration // how long clients run; required ($LOCKS_CHAOS_DURATION or $CHAOS_DURATION overrides it)
	Clients    int           // clients working at once (6)
	Names      int           // names they contend for (3)
	MaxHold    time.Duration // the longest critical section (20ms)
	FaultEvery time.Duration // the mean time between two faults (1s)
	// Seed seeds the random choices (not the timing); $CHAOS_SEED
	// overrides it; 0 picks one at random.
	Seed uint64
	// Faults, when set, limits the faults injected to these kinds (among
	// those the harness supports); nil means every kind it supports.
	// $CHAOS_FAULTS overrides it.
	Faults []string
	// MaxOutage bounds how long a client's link stays faulted (lost or
	// late replies) and, unless the fault says otherwise, a broker fault
	// (the largest CrashRecovery of the run's clients).
	MaxOutage time.Duration
}

// ChaosDurationEnv names the environment variable that overrides
// ChaosConfig.Duration, so that the same test runs for seconds in `mage
// test` and for minutes in `mage chaos` (which sets it, e.g. to "5m").
// When it is unset, $CHAOS_DURATION (what `mage chaos` reads) is used, so
// that `CHAOS_DURATION=30s go test -run '^TestChaos' ./...` works too.
const ChaosDurationEnv = "LOCKS_CHAOS_DURATION"

// ChaosSeedEnv names the environment variable that sets the seed of every
// [RunChaos] run, overriding ChaosConfig.Seed. Each run prints its seed
// when it starts, in its summary and when it fails; running it again with
// CHAOS_SEED set to that seed makes the same random choices: each client's
// options, each worker's names and holding times, the kinds, victims and
// lengths of the faults. The timing of the brokers and of the scheduler is
// not reproduced, so a seed makes a failure likely again, not certain.
const ChaosSeedEnv = "CHAOS_SEED"

// ChaosFaultsEnv names the environment variable that limits the faults
// of every [RunChaos] run to the kinds it lists, separated by commas
// (e.g. "crash,lost-replies"), overriding ChaosConfig.Faults: to find
// which fault a violation needs.
const ChaosFaultsEnv = "CHAOS_FAULTS"

// chaosDuration is $LOCKS_CHAOS_DURATION or $CHAOS_DURATION when set, else
// short.
func chaosDuration(t testing.TB, short time.Duration) time.Duration {
	env := ChaosDurationEnv
	v := os.Getenv(env)
	if v == "" {
		env = "CHAOS_DURATION"
		v = os.Getenv(env)
	}
	if v == "" {
		return short
	}
	d, err := time.ParseDuration(v)
	if err != nil || d <= 0 {
		t.Fatalf("%s=%q: want a positive duration such as 5m", env, v)
	}
	return d
}

// chaosSeed is $CHAOS_SEED when set, else seed, else a random seed.
func chaosSeed(t testing.TB, seed uint64) uint64 {
	if v := os.Getenv(ChaosSeedEnv); v != "" {
		var s uint64
		if _, err := fmt.Sscan(v, &s); err != nil || s == 0 {
			t.Fatalf("%s=%q: want a positive integer, as a chaos run prints it", ChaosSeedEnv, v)
		}
		return s
	}
	if seed == 0 {
		seed = rand.Uint64()>>1 | 1
	}
	return seed
}

// Fault kinds injected by [RunChaos]. A [BrokerFaulter] adds kinds of its
// own.
const (
	FaultCrash   = "crash"   // Harness.Kill on a client, then a new client in its place
	FaultAbandon = "abandon" // a client's Lock cancelled while it waits
	FaultClose   = "close"   // a client closed (Client.Close), then a new one in its place
	// FaultLostReplies makes a client's [Link] drop what the broker sends
	// back for a while, then heals it: requests still run at the broker,
	// so a step of the protocol has an outcome its client never hears.
	// The client is armed, and its replies start being lost when it next
	// reaches the step drawn: its Lock (the acquire, and a takeover if it
	// waits), its critical section (the renewals), or its Release. The
	// summary counts them by step ("lost-replies@release"). Needs a
	// [ChaosHarness] whose clients have a Link.
	FaultLostReplies = "lost-replies"
	// FaultLateReplies makes a client's [Link] hold what the broker sends
	// back for a while before delivering it, for a while, then heals it:
	// replies arrive after their caller may have given up on them. Needs a
	// Link that is a [ReplyDelayer].
	FaultLateReplies = "late-replies"
)

// ChaosHarness is an optional interface that may be implemented by a
// [Harness] for [RunChaos]: NewChaosClient is NewClient with options of
// the client's own, drawn from rng within the ranges the backend accepts
// (TTLs, renewal intervals, drift, priorities, heartbeats...), so that the
// clients of one run differ as the processes of a real deployment do.
// RunChaos gives each client a rng of its own, seeded from the run's seed
// and the client's number, so that a seed reproduces the mix.
type ChaosHarness interface {
	NewChaosClient(ctx context.Context, rng *rand.Rand) (ChaosClient, error)
}

// ChaosClient is a client made by a [ChaosHarness], with what [RunChaos]
// needs to know of it.
type ChaosClient struct {
	Client

	// Options says which options were drawn, such as "ttl=450ms
	// drift=0.02 priority=1". The run logs it, and a violation lists the
	// options of every client it involves.
	Options string

	// CrashRecovery bounds how long after this client is killed another
	// client holds its names, whatever the options of the clients that
	// wait (the run checks it as the suite does, with a margin). Zero
	// means Capabilities().CrashRecovery.
	CrashRecovery time.Duration

	// Link, if not nil, is the client's network path to every broker it
	// uses, which the run faults ([FaultLostReplies], and
	// [FaultLateReplies] if it is a [ReplyDelayer]). It must stay usable
	// after Kill and Close (Restore on it is then harmless).
	Link Link
}

// ReplyDelayer is an optional interface that may be implemented by a
// [Link]: DelayReplies holds what the broker sends back for d before it
// delivers it, until Restore. *testenv.Proxy and testenv.Proxies
// implement it.
type ReplyDelayer interface {
	DelayReplies(d time.Duration)
}

// BrokerFaulter is an optional interface that may be implemented by a
// [Harness] for [RunChaos]: BrokerFaults returns the faults of the brokers
// themselves that the harness can inject (a minority of Redis masters
// refusing connections, a broker restarted), each of which the run
// injects now and then, one at a time, and heals after a while.
type BrokerFaulter interface {
	BrokerFaults() []BrokerFault
}

// BrokerFault is one kind of fault of the brokers; see [BrokerFaulter].
// Mutual exclusion and fencing must hold through it; the run's liveness
// checks allow for its outage (its length plus a recovery bound).
type BrokerFault struct {
	Kind string // as counted in the summary, e.g. "minority-refuses"

	// Inject starts the fault, choosing with rng whatever it needs (which
	// master), and returns the function that heals it. The run calls both
	// from the test's goroutine, and heals every fault before it ends.
	Inject func(ctx context.Context, rng *rand.Rand) (heal func() error, err error)

	// MinOutage and MaxOutage bound how long the run leaves the fault
	// before it heals it (a master restarted empty must stay down longer
	// than any TTL). Zero MaxOutage means ChaosConfig.MaxOutage.
	MinOutage, MaxOutage time.Duration

	// Goroutines lists prefixes of the functions of the goroutines a
	// broker started anew runs in the test's process (an embedded server,
	// the waiter of a server process: "github.com/nats-io/nats-server/"),
	// which the run's leak check then ignores: a goroutine with such a
	// function anywhere in its stack is the broker's, not the backend's.
	Goroutines []string
}

// ChaosSummary is what one [RunChaos] run observed.
type ChaosSummary struct {
	Seed         uint64
	Acquisitions int            // critical sections entered
	Faults       map[string]int // injected, by kind
	// FencedRejections counts writes a FencedResource refused: a holder
	// that wrote after its successor, stopped by its stale token. They are
	// the fence working, not violations.
	FencedRejections int
	// LeasesEnded counts sections cut short by their lease ending (lost)
	// before their holder left: the holder was told, and stopped.
	LeasesEnded int
	// EndedBeforeEntry counts leases that had ended (taken or expired)
	// by the time their holder entered its section: empty sections,
	// left out of the checks of sections (but not of the Locks' tokens).
	EndedBeforeEntry int
	Recoveries       int           // crashed holders whose names were taken again
	WorstRecovery    time.Duration // the longest of those hand-overs
	// LockErrors counts the Locks that failed, by kind of error: the
	// context's ("deadline", "cancelled"), "closed" (ErrClosed: the client
	// gave up its connection and was replaced), or the error's type.
	LockErrors map[string]int
	// Clients maps each client of the run to the options it was given
	// (empty without a [ChaosHarness]).
	Clients map[string]string
	// Linearizability is porcupine's verdict on the fencing tokens
	// (Ok, Illegal, or Unknown when it timed out); empty without fencing.
	Linearizability porcupine.CheckResult
	Violations      []string
}

func (s ChaosSummary) String() string {
	lin := string(s.Linearizability)
	if lin == "" {
		lin = "n/a (no fencing tokens)"
	}
	return fmt.Sprintf("seed %d (%s=%d reproduces it): %d clients, %d acquisitions; faults: %s; failed Locks: %s; fenced rejections %d; leases ended while held %d, before entry %d; %d crashed holders replaced, worst after %v; tokens linearizable: %s; violations %d",
		s.Seed, ChaosSeedEnv, s.Seed, len(s.Clients), s.Acquisitions, counts(s.Faults), counts(s.LockErrors), s.FencedRejections, s.LeasesEnded, s.EndedBeforeEntry, s.Recoveries,
		s.WorstRecovery.Round(time.Millisecond), lin, len(s.Violations))
}

// counts formats m as "a 1, b 2", sorted.
func counts(m map[string]int) string {
	if len(m) == 0 {
		return "none"
	}
	kinds := make([]string, 0, len(m))
	for k, n := range m {
		kinds = append(kinds, fmt.Sprintf("%s %d", k, n))
	}
	slices.Sort(kinds)
	return strings.Join(kinds, ", ")
}

// RunChaos runs cfg.Clients clients against the backend for cfg.Duration,
// each locking random names among cfg.Names and holding them for up to
// cfg.MaxHold, while faults are injected at random: a client crashed
// (Harness.Kill), a Lock abandoned by cancelling its context, a client
// closed; with a [ChaosHarness], clients with options of their own whose
// replies are lost or late for a while; with a [BrokerFaulter], faults of
// the brokers. Every critical section is recorded on one monotonic clock
// and checked at the end:
//   - no two sections on one name overlap (a crashed client's section ends
//     when it is killed: a dead process does nothing more);
//   - where the backend has fencing tokens, each holder of a name has a
//     greater token than the holder before it, the tokens are
//     linearizable as a strictly increasing counter per name (checked with
//     porcupine, and a Lock that began after another returned never gets
//     a token no greater than its), and every write goes through a
//     [FencedResource];
//   - every name held by a crashed client is held again within the
//     crashed client's CrashRecovery bound (as the conformance suite
//     allows it), plus the outages of faults overlapping the wait;
//   - no name stalls: none goes longer than twice the largest such bound
//     plus a second, plus those outages, without a holder while clients
//     want it;
//   - no goroutine outlives the run.
//
// A violation names the clients involved with their options. The run logs
// its seed when it starts, in its summary and when it fails ([ChaosSeedEnv]
// reproduces it). It fails t for every violation and returns the summary.
//
// Like the rest of the suite, it should not produce false positives, may
// produce false negatives (a run that sees no overlap proves nothing), and
// runs under -race.
func RunChaos(t *testing.T, nh NewHarness, cfg ChaosConfig) ChaosSummary {
	t.Helper()
	if cfg.Duration > 0 {
		cfg.Duration = chaosDuration(t, cfg.Duration)
	}
	r := newChaosRun(t, nh, cfg)
	defer r.close()
	r.run()
	s := r.check()
	for _, v := range s.Violations {
		t.Errorf("violation (seed %d): %s", s.Seed, v)
	}
	t.Logf("chaos summary: %v", s)
	return s
}

type chaosRun struct {
	t      *testing.T
	cfg    ChaosConfig
	h      Harness
	ch     ChaosHarness  // nil without
	brk    []BrokerFault // the harness's broker faults, if any
	caps   Capabilities
	leaks  []goleak.Option
	ctx    context.Context
	cancel context.CancelFunc
	names  []string
	start  time.Time
	broken chan int        // slots whose client closed itself, to refill
	fired  chan firedFault // lost replies a worker started, to heal

	// Used by the test's goroutine only.
	faultRng   *rand.Rand
	pending    []pendingHeal
	refill     map[int]time.Time // empty slots, with when refilling first failed
	brokerDown bool
	forced     string // the kind of the next fault, if set
	// brokerGoroutines are the prefixes of the broker faults injected.
	brokerGoroutines []string

	mu          sync.Mutex
	slots       []*chaosClient // nil while the slot waits for a new client
	all         []*chaosClient
	spans       map[string][]Span
	open        map[string]map[*openSection]bool // sections in progress, by name
	ops         map[string][]porcupine.Operation
	crashes     []crash
	outages     []outage
	faults      map[string]int
	lockErrs    map[string]int
	links       bool // some client has a Link
	rejected    int
	ended       int // sections cut short by their lease ending
	empty       int // sections whose lease had ended when they began
	fences      map[string]*FencedResource
	nextID      int
	maxRecovery time.Duration // the largest crash bound of any client
}

// crash is a client killed while it held name.
type crash struct {
	name  string
	who   string
	at    time.Duration
	bound time.Duration // the client's CrashRecovery
}

// outage is a fault that was in force from from to to (to is zero while
// it lasts).
type outage struct {
	kind     string
	from, to time.Duration
}

// pendingHeal is a fault to heal at at.
type pendingHeal struct {
	at     time.Time
	kind   string
	cl     *chaosClient // for a link fault; nil for a broker fault
	heal   func() error
	outage int // index in outages
}

// chaosClient is one simulated process.
type chaosClient struct {
	num      int // n of "client-n"
	id       string
	c        Client
	l        locks.Locker
	opts     string
	recovery time.Duration
	link     Link
	ctx      context.Context // ends when the client is crashed or closed
	cancel   context.CancelFunc

	mu       sync.Mutex
	dead     bool
	closed   bool               // it closed itself (ErrClosed): its slot is being refilled
	faulted  bool               // its link is faulted
	armed    string             // the step at which its replies will be lost, if any
	armedFor time.Duration      // for how long
	held     map[string]func()  // open sections by name: their exits
	waiting  context.CancelFunc // cancels the Lock in flight, if any
}

func newChaosRun(t *testing.T, nh NewHarness, cfg ChaosConfig) *chaosRun {
	t.Helper()
	if cfg.Duration <= 0 {
		t.Fatalf("RunChaos: Duration %v must be positive", cfg.Duration)
	}
	cfg.Clients = cmp.Or(cfg.Clients, 6)
	cfg.Names = cmp.Or(cfg.Names, 3)
	cfg.MaxHold = cmp.Or(cfg.MaxHold, 20*time.Millisecond)
	cfg.FaultEvery = cmp.Or(cfg.FaultEvery, time.Second)
	cfg.Seed = chaosSeed(t, cfg.Seed)
	if v := os.Getenv(ChaosFaultsEnv); v != "" {
		cfg.Faults = strings.Split(v, ",")
	}
	seed := cfg.Seed
	t.Logf("chaos: seed %d (%s=%d reproduces its random choices)", seed, ChaosSeedEnv, seed)
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("chaos: FAILED with seed %d; run it again with %s=%d", seed, ChaosSeedEnv, seed)
		}
	})
	leaks := goleak.IgnoreCurrent()
	ctx, cancel := context.WithCancel(context.Background())
	h, err := nh(ctx, t)
	if err != nil {
		cancel()
		t.Fatalf("making the harness: %v", err)
	}
	caps := h.Capabilities()
	if caps.CrashRecovery <= 0 {
		cancel()
		t.Fatalf("RunChaos needs Capabilities().CrashRecovery")
	}
	r := &chaosRun{
		t: t, cfg: cfg, h: h, caps: caps, leaks: leakOptions(leaks, h), ctx: ctx, cancel: cancel,
		faultRng:    rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15)),
		broken:      make(chan int, cfg.Clients),
		fired:       make(chan firedFault, cfg.Clients),
		refill:      map[int]time.Time{},
		spans:       map[string][]Span{},
		open:        map[string]map[*openSection]bool{},
		ops:         map[string][]porcupine.Operation{},
		faults:      map[string]int{},
		lockErrs:    map[string]int{},
		fences:      map[string]*FencedResource{},
		start:       time.Now(),
		maxRecovery: caps.CrashRecovery,
	}
	r.ch, _ = h.(ChaosHarness)
	if bf, ok := h.(BrokerFaulter); ok {
		r.brk = bf.BrokerFaults()
	}
	for i := range cfg.Names {
		name := fmt.Sprintf("chaos-%x-%d", seed&0xffffff, i)
		r.names = append(r.names, name)
		r.fences[name] = &FencedResource{}
	}
	for range cfg.Clients {
		cl, err := r.newClient()
		if err != nil {
			t.Fatalf("NewClient: %v", err)
		}
		if cl.l == nil {
			t.Skip("the backend has no Locker")
		}
		r.slots = append(r.slots, cl)
	}
	r.cfg.MaxOutage = cmp.Or(cfg.MaxOutage, r.maxRecovery)
	t.Logf("chaos: %d clients on %d names for %v, a fault every %v on average (kinds: %s), seed %d",
		cfg.Clients, cfg.Names, cfg.Duration, cfg.FaultEvery, strings.Join(r.kinds(), ", "), seed)
	return r
}

func (r *chaosRun) now() time.Duration { return time.Since(r.start) }

// newClient makes the run's next client; with a ChaosHarness, with options
// drawn from a rng of the client's own. A client without a Locker is
// returned with l nil (and closed).
func (r *chaosRun) newClient() (*chaosClient, error) {
	// The number is taken only when the client is made, so that a
	// client made after failed attempts (a broker down) still gets the
	// options its number draws.
	r.mu.Lock()
	n := r.nextID + 1
	r.mu.Unlock()
	ctx, cancel := context.WithTimeout(r.ctx, opTimeout)
	defer cancel()
	defer r.slow(fmt.Sprintf("making client-%d", n), time.Now())
	var cc ChaosClient
	var err error
	if r.ch != nil {
		rng := rand.New(rand.NewPCG(r.cfg.Seed, uint64(n)))
		cc, err = r.ch.NewChaosClient(ctx, rng)
	} else {
		cc.Client, err = r.h.NewClient(ctx)
	}
	if err != nil {
		return nil, err
	}
	cl := &chaosClient{
		num: n, id: fmt.Sprintf("client-%d", n), c: cc.Client, l: cc.Locker(), opts: cc.Options,
		recovery: cmp.Or(cc.CrashRecovery, r.caps.CrashRecovery), link: cc.Link, held: map[string]func(){},
	}
	if cl.l == nil {
		_ = cc.Close()
		return cl, nil
	}
	cl.ctx, cl.cancel = context.WithCancel(r.ctx)
	if cl.opts != "" {
		r.t.Logf("chaos: %s: %s", cl.id, cl.opts)
	}
	r.mu.Lock()
	r.nextID = n
	r.all = append(r.all, cl)
	r.maxRecovery = max(r.maxRecovery, cl.recovery)
	r.links = r.links || cl.link != nil
	r.mu.Unlock()
	return cl, nil
}

func (r *chaosRun) slot(i int) *chaosClient {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.slots[i]
}

func (r *chaosRun) setSlot(i int, cl *chaosClient) {
	r.mu.Lock()
	r.slots[i] = cl
	r.mu.Unlock()
}

// waitBound is how long a worker's Lock waits before it gives up.
func (r *chaosRun) waitBound() time.Duration {
	r.mu.Lock()
	defer r.mu.Unlock()
	return 2*bound(r.maxRecovery) + time.Second
}

// run drives the clients and the faults until the duration is over, then
// heals every fault still in force.
func (r *chaosRun) run() {
	var wg sync.WaitGroup
	stop := make(chan struct{})
	for i := range r.slots {
		wg.Go(func() { r.work(i, stop) })
	}
	end := time.Now().Add(r.cfg.Duration)
	next := time.Now().Add(r.gap())
	for time.Now().Before(end) {
		wake := earliest(next, end)
		for _, p := range r.pending {
			wake = earliest(wake, p.at)
		}
		if len(r.refill) > 0 {
			wake = earliest(wake, time.Now().Add(20*time.Millisecond))
		}
		timer := time.NewTimer(time.Until(wake))
		select {
		case slot := <-r.broken:
			r.refill[slot] = time.Time{}
		case f := <-r.fired:
			r.firedFault(f)
		case <-timer.C:
		}
		timer.Stop()
		r.healDue(time.Now())
		r.refillSlots()
		if !time.Now().Before(next) && time.Now().Before(end) {
			next = time.Now().Add(r.inject())
		}
	}
	r.healDue(time.Time{})
	close(stop)
	over := time.Now()
	wg.Wait()
	r.slow("the workers' last sections and Locks", over)
	for {
		select {
		case f := <-r.fired: // fired as the run ended
			f.long = 0
			r.firedFault(f)
			r.healDue(time.Time{})
		default:
			return
		}
	}
}

// slow logs what took long since start, when it took over 5s: where a
// run spends its time after its duration.
func (r *chaosRun) slow(what string, start time.Time) {
	if d := time.Since(start); d > 5*time.Second {
		r.t.Logf("chaos: %s took %v", what, d.Round(time.Millisecond))
	}
}

func earliest(a, b time.Time) time.Time {
	if b.Before(a) {
		return b
	}
	return a
}

// gap draws the time to the next fault.
func (r *chaosRun) gap() time.Duration {
	return time.Duration(r.faultRng.Int64N(int64(2*r.cfg.FaultEvery)) + 1)
}

// between draws a duration in [lo, hi].
func (r *chaosRun) between(lo, hi time.Duration) time.Duration {
	if hi <= lo {
		return lo
	}
	return lo + time.Duration(r.faultRng.Int64N(int64(hi-lo)+1))
}

// healDue heals the faults due by now (all of them if now is zero).
func (r *chaosRun) healDue(now time.Time) {
	keep := r.pending[:0]
	var due []pendingHeal
	for _, p := range r.pending {
		if now.IsZero() || !p.at.After(now) {
			due = append(due, p)
		} else {
			keep = append(keep, p)
		}
	}
	r.pending = keep
	for _, p := range due {
		r.healOne(p)
	}
}

func (r *chaosRun) healOne(p pendingHeal) {
	if err := p.heal(); err != nil {
		r.t.Errorf("chaos: healing %s: %v", p.kind, err)
	}
	r.mu.Lock()
	r.outages[p.outage].to = r.now()
	r.mu.Unlock()
	if p.cl != nil {
		p.cl.mu.Lock()
		p.cl.faulted = false
		p.cl.mu.Unlock()
	} else {
		r.brokerDown = false
	}
}

// dropHeal forgets cl's pending link fault, if any, for a client killed
// with its link faulted: a dead process stays dead.
func (r *chaosRun) dropHeal(cl *chaosClient) {
	for i, p := range r.pending {
		if p.cl == cl {
			r.mu.Lock()
			r.outages[p.outage].to = r.now()
			r.mu.Unlock()
			r.pending = slices.Delete(r.pending, i, i+1)
			return
		}
	}
}

// refillSlots gives empty slots new clients. A slot that cannot get one
// for opTimeout fails the test (the broker is gone for good).
func (r *chaosRun) refillSlots() {
	for slot, since := range r.refill {
		cl, err := r.newClient()
		if err == nil && cl.l != nil {
			r.setSlot(slot, cl)
			delete(r.refill, slot)
			continue
		}
		if since.IsZero() {
			r.refill[slot] = time.Now()
		} else if time.Since(since) > opTimeout {
			r.t.Errorf("chaos: no new client for %v: %v", opTimeout, err)
			delete(r.refill, slot)
		}
	}
}

// work is one slot's loop: lock a random name, write through its fence,
// hold it, write again, release. A crashed client is replaced in its slot.
func (r *chaosRun) work(slot int, stop <-chan struct{}) {
	rng := rand.New(rand.NewPCG(r.cfg.Seed, 1<<32|uint64(slot)))
	for {
		select {
		case <-stop:
			return
		default:
		}
		cl := r.slot(slot)
		if cl == nil {
			time.Sleep(2 * time.Millisecond) // being refilled
			continue
		}
		name := r.names[rng.IntN(len(r.names))]
		hold := time.Duration(rng.Int64N(int64(r.cfg.MaxHold)) + 1)

		ctx, cancel := context.WithTimeout(cl.ctx, r.waitBound())
		if !cl.setWaiting(cancel) {
			cancel()
			time.Sleep(time.Millisecond) // dead: its slot is being refilled
			continue
		}
		r.reach(cl, stepAcquire, stop)
		call := r.now()
		lease, err := cl.l.Lock(ctx, name)
		ret := r.now()
		cl.setWaiting(nil)
		cancel()
		if err != nil {
			r.lockFailed(slot, cl, err)
			continue
		}
		r.hold(cl, name, lease, call, ret, hold, stop)
	}
}

// lockFailed counts a failed Lock of cl; a live client that says it is
// closed is closed and its slot refilled.
func (r *chaosRun) lockFailed(slot int, cl *chaosClient, err error) {
	if cl.isDead() {
		return
	}
	kind := errKind(err)
	r.mu.Lock()
	r.lockErrs[kind]++
	r.mu.Unlock()
	switch {
	case errors.Is(err, locks.ErrClosed):
		cl.mu.Lock()
		first := !cl.closed
		cl.closed, cl.dead = true, true
		cl.mu.Unlock()
		if first {
			cl.cancel()
			_ = cl.c.Close()
			r.setSlot(slot, nil)
			r.broken <- slot // one at a time per slot: never blocks
		}
	case ctxErr(err):
	default:
		time.Sleep(5 * time.Millisecond) // do not spin on a broker that refuses
	}
}

func ctxErr(err error) bool {
	return errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled)
}

// errKind names err for the summary: a context's error, ErrClosed, or the
// first error in its tree of a type of the backend's (such as a quorum
// error); else the sentinel it wraps, or its text.
func errKind(err error) string {
	switch {
	case errors.Is(err, context.DeadlineExceeded):
		return "deadline"
	case errors.Is(err, context.Canceled):
		return "cancelled"
	case errors.Is(err, locks.ErrClosed):
		return "closed"
	}
	plain := func(e error) bool {
		switch fmt.Sprintf("%T", e) {
		case "*fmt.wrapError", "*fmt.wrapErrors", "*errors.errorString", "*errors.joinError":
			return true
		}
		return false
	}
	queue := []error{err}
	for len(queue) > 0 {
		e := queue[0]
		queue = queue[1:]
		if !plain(e) {
			return fmt.Sprintf("%T", e)
		}
		switch u := e.(type) {
		case interface{ Unwrap() error }:
			if w := u.Unwrap(); w != nil {
				queue = append(queue, w)
			}
		case interface{ Unwrap() []error }:
			queue = append(queue, u.Unwrap()...)
		}
	}
	for _, s := range []error{locks.ErrNotAcquired, locks.ErrLost, locks.ErrPreempted, locks.ErrInvalidName, locks.ErrInvalidOption} {
		if errors.Is(err, s) {
			return s.Error()
		}
	}
	msg := err.Error()
	if len(msg) > 60 {
		msg = msg[:60] + "…"
	}
	return msg
}

// hold runs one critical section of cl on name.
func (r *chaosRun) hold(cl *chaosClient, name string, lease locks.Lease, call, ret, hold time.Duration, stop <-chan struct{}) {
	token := lease.Token()
	if r.caps.Fencing {
		r.mu.Lock()
		r.ops[name] = append(r.ops[name], porcupine.Operation{
			ClientId: cl.num, Input: name, Call: int64(call), Output: token, Return: int64(ret),
		})
		r.mu.Unlock()
	}
	exit, ok := r.enter(cl, name, token, lease)
	if ok {
		r.write(cl, name, lease)
		r.reach(cl, stepHold, stop)
		select {
		case <-time.After(hold):
		case <-lease.Context().Done():
		case <-cl.ctx.Done():
		}
		r.write(cl, name, lease)
		exit()
	}
	if cl.isDead() {
		return // a crashed process releases nothing
	}
	r.reach(cl, stepRelease, stop)
	rctx, rcancel := context.WithTimeout(context.Background(), opTimeout)
	_ = lease.Release(rctx) // may fail after a fault: the lease is gone anyway
	rcancel()
}

// enter opens a section unless cl is dead (a dead process does nothing).
// The section ends when exit is called or, if the lease has ended by
// then, when it ended, if that is earlier: a holder stops when told (its
// context's Err reports the end at once, also at a validity deadline),
// and the goroutine leaving the section may run a little later. The end
// is taken as the earlier of a callback of the context (no earlier than
// the lease really ended) and the lease's validity deadline, if it has
// one and it has passed.
func (r *chaosRun) enter(cl *chaosClient, name string, token uint64, lease locks.Lease) (exit func(), ok bool) {
	cl.mu.Lock()
	defer cl.mu.Unlock()
	if cl.dead {
		return nil, false
	}
	// The other sections open on name whose leases have ended, ended
	// before now: before this one begins. (The callback below says so
	// too, but from a goroutine of its own, which may run after this
	// section began: a theft that ends the victim's lease just before the
	// thief's Lock returns would seem to overlap.)
	o := &openSection{lease: lease}
	r.mu.Lock()
	now := r.now()
	for other := range r.open[name] {
		if other.lease.Context().Err() != nil {
			other.endBy(now)
		}
	}
	if lease.Context().Err() != nil {
		o.endBy(now) // before it began: the section will be empty
	}
	if r.open[name] == nil {
		r.open[name] = map[*openSection]bool{}
	}
	r.open[name][o] = true
	r.mu.Unlock()
	s := Span{Who: cl.id, Token: token, Enter: r.now()}
	stop := context.AfterFunc(lease.Context(), func() { o.endBy(r.now()) })
	end := sync.OnceFunc(func() {
		stop()
		s.Exit = r.now()
		if lease.Context().Err() != nil {
			s.Ended = fmt.Sprint(context.Cause(lease.Context()))
			if e := time.Duration(o.ended.Load() - 1); e >= 0 && e < s.Exit {
				s.Exit = max(e, s.Enter)
			}
			if d, ok := lease.(interface{ Deadline() time.Time }); ok && !d.Deadline().IsZero() {
				if e := d.Deadline().Sub(r.start); e < s.Exit {
					s.Exit = max(e, s.Enter)
				}
			}
		}
		r.mu.Lock()
		delete(r.open[name], o)
		switch {
		case s.Exit <= s.Enter:
			// The lease ended (taken, or its validity passed) before
			// its holder entered: a holder that stops when told did
			// nothing, and holds nothing to check.
			r.empty++
		case s.Ended != "":
			r.ended++
			fallthrough
		default:
			r.spans[name] = append(r.spans[name], s)
		}
		r.mu.Unlock()
		delete(cl.held, name) // callers hold cl.mu
	})
	cl.held[name] = end
	return func() {
		cl.mu.Lock()
		defer cl.mu.Unlock()
		end()
	}, true
}

// openSection is a section in progress: its lease, and the earliest time
// its lease was seen ended, +1 (0 while it was not).
type openSection struct {
	lease locks.Lease
	ended atomic.Int64
}

// endBy records that the section's lease had ended by at.
func (o *openSection) endBy(at time.Duration) {
	for {
		old := o.ended.Load()
		if old != 0 && old <= int64(at)+1 || o.ended.CompareAndSwap(old, int64(at)+1) {
			return
		}
	}
}

// write writes through name's fence while cl is alive and its lease live.
func (r *chaosRun) write(cl *chaosClient, name string, lease locks.Lease) {
	if !r.caps.Fencing {
		return
	}
	cl.mu.Lock()
	defer cl.mu.Unlock()
	if cl.dead || lease.Context().Err() != nil {
		return
	}
	if err := r.fences[name].Write(cl.id, lease.Token()); err != nil {
		r.mu.Lock()
		r.rejected++
		r.mu.Unlock()
	}
}

// setWaiting records the cancel func of cl's Lock in flight; it reports
// false when cl is dead.
func (c *chaosClient) setWaiting(cancel context.CancelFunc) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.waiting = cancel
	return !c.dead
}

func (c *chaosClient) isDead() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.dead
}

// kill marks c dead and ends its open sections now, returning the names
// it held. It reports false if c was dead already.
func (c *chaosClient) kill() (names []string, ok bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.dead {
		return nil, false
	}
	c.dead = true
	for name, exit := range c.held {
		names = append(names, name)
		exit()
	}
	return names, true
}

// Which clients [chaosRun.pick] prefers.
const (
	anySlot  = iota
	holding  // in a critical section: crashing a holder tests recovery
	stepping // holding or waiting: faulting its link hits a step of the protocol
)

// pick returns a random slot whose client is alive and for which ok
// returns true, or -1; one that is doing what prefer says if any is.
func (r *chaosRun) pick(prefer int, ok func(*chaosClient) bool) int {
	r.mu.Lock()
	slots := slices.Clone(r.slots)
	r.mu.Unlock()
	var all, active []int
	for i, cl := range slots {
		if cl == nil || !ok(cl) {
			continue
		}
		cl.mu.Lock()
		if !cl.dead {
			all = append(all, i)
			if len(cl.held) > 0 || prefer == stepping && cl.waiting != nil {
				active = append(active, i)
			}
		}
		cl.mu.Unlock()
	}
	if prefer != anySlot && len(active) > 0 {
		return active[r.faultRng.IntN(len(active))]
	}
	if len(all) == 0 {
		return -1
	}
	return all[r.faultRng.IntN(len(all))]
}

func anyClient(*chaosClient) bool { return true }

func hasLink(cl *chaosClient) bool {
	cl.mu.Lock()
	defer cl.mu.Unlock()
	return cl.link != nil && !cl.faulted && cl.armed == ""
}

func hasDelayer(cl *chaosClient) bool {
	_, ok := cl.link.(ReplyDelayer)
	return ok && hasLink(cl)
}

// kinds returns the fault kinds the run may inject.
func (r *chaosRun) kinds() []string {
	kinds := []string{FaultCrash, FaultAbandon, FaultClose}
	if r.links {
		kinds = append(kinds, FaultLostReplies, FaultLateReplies)
	}
	for _, b := range r.brk {
		kinds = append(kinds, b.Kind)
	}
	if r.cfg.Faults != nil {
		kinds = slices.DeleteFunc(kinds, func(k string) bool { return !slices.Contains(r.cfg.Faults, k) })
	}
	return kinds
}

// inject picks one fault and applies it, and returns the time to the
// next one. After a holder's crash, half the time the next fault is a
// broker fault (if the harness has any) within the time the crashed
// holder's names take to come back: a broker restarted during a takeover.
func (r *chaosRun) inject() (gap time.Duration) {
	gap = r.gap()
	kinds := r.kinds()
	if r.forced != "" {
		kinds, r.forced = []string{r.forced}, ""
	}
	if len(kinds) == 0 {
		return gap
	}
	kind := kinds[r.faultRng.IntN(len(kinds))]
	switch kind {
	case FaultAbandon:
		slot := r.pick(anySlot, anyClient)
		if slot < 0 {
			return gap
		}
		cl := r.slot(slot)
		r.count(kind)
		cl.mu.Lock()
		if cl.waiting != nil {
			cl.waiting()
		}
		cl.mu.Unlock()
	case FaultCrash, FaultClose:
		prefer := anySlot
		if kind == FaultCrash {
			prefer = holding
		}
		slot := r.pick(prefer, anyClient)
		if slot < 0 {
			return gap
		}
		r.count(kind)
		cl := r.slot(slot)
		held := r.stop(cl, kind == FaultCrash)
		r.setSlot(slot, nil)
		if held && len(r.brk) > 0 && !r.brokerDown && r.faultRng.IntN(2) == 0 {
			var brk []string
			for _, b := range r.brk {
				if slices.Contains(r.kinds(), b.Kind) {
					brk = append(brk, b.Kind)
				}
			}
			if len(brk) > 0 {
				r.forced = brk[r.faultRng.IntN(len(brk))]
				gap = r.between(0, cl.recovery)
			}
		}
		r.refill[slot] = time.Time{}
		r.refillSlots()
	case FaultLostReplies, FaultLateReplies:
		r.faultLink(kind)
	default:
		r.faultBroker(kind)
	}
	return gap
}

func (r *chaosRun) count(kind string) {
	r.mu.Lock()
	r.faults[kind]++
	r.mu.Unlock()
}

// stop crashes (Harness.Kill) or closes cl; it reports whether cl was
// holding a name when it crashed.
func (r *chaosRun) stop(cl *chaosClient, crashed bool) (held bool) {
	if !crashed {
		// A clean close: the client's sections end before it releases;
		// its link is healed first, so that it can say goodbye.
		for _, p := range r.pending {
			if p.cl == cl {
				r.dropHeal(cl)
				r.healOneNow(p)
				break
			}
		}
		cl.kill()
		cl.cancel()
		if err := cl.c.Close(); err != nil {
			r.t.Logf("closing %s: %v", cl.id, err)
		}
		return false
	}
	at := r.now()
	names, _ := cl.kill()
	r.mu.Lock()
	for _, name := range names {
		r.crashes = append(r.crashes, crash{name: name, who: cl.id, at: at, bound: cl.recovery})
	}
	r.mu.Unlock()
	r.dropHeal(cl)
	cl.cancel()
	if err := r.h.Kill(r.ctx, cl.c); err != nil {
		r.t.Errorf("Kill(%s): %v", cl.id, err)
	}
	return len(names) > 0
}

// healOneNow heals p's fault now (its outage already closed).
func (r *chaosRun) healOneNow(p pendingHeal) {
	if err := p.heal(); err != nil {
		r.t.Errorf("chaos: healing %s: %v", p.kind, err)
	}
	p.cl.mu.Lock()
	p.cl.faulted = false
	p.cl.mu.Unlock()
}

// faultLink loses or delays the replies to a client for a while.
func (r *chaosRun) faultLink(kind string) {
	ok := hasLink
	if kind == FaultLateReplies {
		ok = hasDelayer
	}
	prefer := stepping
	if r.faultRng.IntN(4) == 0 {
		prefer = anySlot
	}
	slot := r.pick(prefer, ok)
	if slot < 0 {
		return
	}
	cl := r.slot(slot)
	long := r.between(10*time.Millisecond, r.cfg.MaxOutage)
	if kind == FaultLostReplies {
		steps := []string{stepAcquire, stepHold, stepRelease}
		cl.mu.Lock()
		cl.armed, cl.armedFor = steps[r.faultRng.IntN(len(steps))], long
		cl.mu.Unlock()
		return // its worker starts it at the step, and counts it
	}
	d := r.between(5*time.Millisecond, r.cfg.MaxOutage/2)
	what := fmt.Sprintf("%s for %v (by %v)", kind, long.Round(time.Millisecond), d.Round(time.Millisecond))
	cl.link.(ReplyDelayer).DelayReplies(d)
	cl.mu.Lock()
	cl.faulted = true
	cl.mu.Unlock()
	r.count(kind)
	r.t.Logf("chaos: at %v, %s: %s", r.now().Round(time.Millisecond), cl.id, what)
	r.addPending(kind+" "+cl.id, cl, long, func() error { cl.link.Restore(); return nil })
}

// faultBroker injects the broker fault kind, unless one is in force.
func (r *chaosRun) faultBroker(kind string) {
	if r.brokerDown {
		return
	}
	i := slices.IndexFunc(r.brk, func(b BrokerFault) bool { return b.Kind == kind })
	b := r.brk[i]
	long := r.between(cmp.Or(b.MinOutage, 10*time.Millisecond), cmp.Or(b.MaxOutage, r.cfg.MaxOutage))
	heal, err := b.Inject(r.ctx, r.faultRng)
	if err != nil {
		r.t.Errorf("chaos: injecting %s: %v", kind, err)
		return
	}
	r.brokerDown = true
	r.brokerGoroutines = append(r.brokerGoroutines, b.Goroutines...)
	r.count(kind)
	r.t.Logf("chaos: at %v, %s for %v", r.now().Round(time.Millisecond), kind, long.Round(time.Millisecond))
	r.addPending(kind, nil, long, heal)
}

// addPending records an outage that started now, to heal after long.
func (r *chaosRun) addPending(kind string, cl *chaosClient, long time.Duration, heal func() error) {
	r.addPendingFrom(kind, cl, r.now(), long, heal)
}

// addPendingFrom records an outage that started at from, to heal long
// after it.
func (r *chaosRun) addPendingFrom(kind string, cl *chaosClient, from, long time.Duration, heal func() error) {
	r.mu.Lock()
	r.outages = append(r.outages, outage{kind: kind, from: from})
	i := len(r.outages) - 1
	r.mu.Unlock()
	r.pending = append(r.pending, pendingHeal{at: r.start.Add(from + long), kind: kind, cl: cl, heal: heal, outage: i})
}

// firedFault records f, to heal in time; a client crashed meanwhile keeps
// its link as it is (a dead process stays dead).
func (r *chaosRun) firedFault(f firedFault) {
	r.addPendingFrom(f.kind, f.cl, f.from, f.long, f.heal)
	if f.cl.isDead() {
		r.dropHeal(f.cl)
	}
}

// firedFault is a client's lost replies, started by its worker at a step.
type firedFault struct {
	kind       string
	cl         *chaosClient
	from, long time.Duration
	heal       func() error
}

// Steps at which a client's replies are lost.
const (
	stepAcquire = "acquire" // its Lock
	stepHold    = "hold"    // its critical section: renewals
	stepRelease = "release" // its Release
)

// reach is called by cl's worker at step: if cl is armed for it, its
// replies are lost from now on, until the run heals it.
func (r *chaosRun) reach(cl *chaosClient, step string, stop <-chan struct{}) {
	cl.mu.Lock()
	if cl.armed != step || cl.dead {
		cl.mu.Unlock()
		return
	}
	long := cl.armedFor
	cl.armed, cl.faulted = "", true
	cl.mu.Unlock()
	cl.link.DropReplies()
	from := r.now()
	kind := FaultLostReplies + "@" + step
	r.count(kind)
	r.t.Logf("chaos: at %v, %s: %s for %v", from.Round(time.Millisecond), cl.id, kind, long.Round(time.Millisecond))
	f := firedFault{kind: kind + " " + cl.id, cl: cl, from: from, long: long, heal: func() error { cl.link.Restore(); return nil }}
	select {
	case r.fired <- f:
	case <-stop: // the run is over
		cl.link.Restore()
	}
}

// allowance is how long a wait of base that starts at from may take,
// given the outages that overlap it: each adds its length and recovery
// (to notice it healed, and to let what it left behind expire).
func (r *chaosRun) allowance(from, base, recovery time.Duration) time.Duration {
	allowed := base
	for _, o := range r.outages { // by start
		if o.from < from+allowed && o.to > from {
			allowed += o.to - max(o.from, from) + recovery
		}
	}
	return allowed
}

// check turns the recorded history into a summary with its violations.
func (r *chaosRun) check() ChaosSummary {
	r.mu.Lock()
	defer r.mu.Unlock()
	s := ChaosSummary{
		Seed: r.cfg.Seed, Faults: r.faults, FencedRejections: r.rejected, LeasesEnded: r.ended, EndedBeforeEntry: r.empty,
		LockErrors: r.lockErrs, Clients: map[string]string{},
	}
	for _, cl := range r.all {
		s.Clients[cl.id] = cl.opts
	}
	end := r.now()
	for i := range r.outages {
		if r.outages[i].to == 0 {
			r.outages[i].to = end
		}
	}
	recovery := bound(r.maxRecovery)
	violation := func(format string, args ...any) {
		s.Violations = append(s.Violations, r.withOptions(fmt.Sprintf(format, args...)))
	}
	for _, name := range r.names {
		spans := r.spans[name]
		s.Acquisitions += len(spans)
		h := &History{Limit: 1, spans: spans}
		if err := h.Check(); err != nil {
			violation("%s: %v", name, err)
		}
		slices.SortFunc(spans, func(a, b Span) int { return int(a.Enter - b.Enter) })
		stall := 2*recovery + time.Second
		last := time.Duration(0)
		for _, sp := range spans {
			if gap := sp.Enter - last; gap > r.allowance(last, stall, recovery) {
				violation("%s: nobody held it from %v to %v (%v; allowed %v, more during faults)", name, last, sp.Enter, gap.Round(time.Millisecond), stall)
			}
			last = max(last, sp.Exit)
		}
		if r.caps.Fencing {
			// Every later holder has a greater token: sections that
			// do not overlap (those that do are a violation already)
			// carry tokens increasing in the order they were held.
			inverted, first := 0, ""
			for i := 1; i < len(spans); i++ {
				a, b := spans[i-1], spans[i]
				if a.Exit <= b.Enter && b.Token <= a.Token {
					inverted++
					if first == "" {
						first = fmt.Sprintf("%s held it %v-%v with token %d after %s held it %v-%v with token %d",
							b.Who, b.Enter, b.Exit, b.Token, a.Who, a.Enter, a.Exit, a.Token)
					}
				}
			}
			if inverted > 0 {
				violation("%s: %d holders had a token no greater than the holder before them; first: %s", name, inverted, first)
			}
		}
	}
	for _, c := range r.crashes {
		limit := r.allowance(c.at, bound(c.bound), recovery)
		i := slices.IndexFunc(r.spans[c.name], func(sp Span) bool { return sp.Enter > c.at })
		if i < 0 {
			if end-c.at > limit {
				violation("%s: never held again after its holder %s crashed at %v", c.name, c.who, c.at)
			}
			continue
		}
		took := r.spans[c.name][i].Enter - c.at
		s.Recoveries++
		s.WorstRecovery = max(s.WorstRecovery, took)
		if took > limit {
			violation("%s: held again %v after its holder %s crashed at %v (allowed %v with the faults then)", c.name, took.Round(time.Millisecond), c.who, c.at, limit.Round(time.Millisecond))
		}
	}
	if r.caps.Fencing {
		var history []porcupine.Operation
		for _, name := range r.names {
			history = append(history, r.ops[name]...)
		}
		s.Linearizability = porcupine.CheckOperationsTimeout(tokenModel, history, time.Minute)
		if s.Linearizability == porcupine.Illegal {
			s.Violations = append(s.Violations, "fencing tokens are not linearizable as a strictly increasing counter per name")
		}
		for _, name := range r.names {
			if v := tokenRegressions(name, r.ops[name]); v != "" {
				violation("%s", v)
			}
		}
	}
	return s
}

// withOptions appends to v the options of every client it names, and the
// faults in force around the moment it names.
func (r *chaosRun) withOptions(v string) string {
	if at, ok := momentOf(v); ok {
		var near []string
		for _, o := range r.outages {
			if o.from <= at && o.to >= at-bound(r.maxRecovery) {
				near = append(near, fmt.Sprintf("%s %v-%v", o.kind, o.from.Round(time.Millisecond), o.to.Round(time.Millisecond)))
			}
		}
		if len(near) > 0 {
			v += "; faults then: " + strings.Join(near, ", ")
		}
	}
	var mix []string
	for _, cl := range r.all {
		if cl.opts != "" && (strings.Contains(v, cl.id+"(") || strings.Contains(v, cl.id+" ") || strings.Contains(v, cl.id+"'")) {
			mix = append(mix, fmt.Sprintf("%s{%s}", cl.id, cl.opts))
		}
	}
	if len(mix) > 0 {
		v += "; options: " + strings.Join(mix, ", ")
	}
	return v
}

// momentOf finds the moment a violation names: after "overlap at ",
// "crashed at " or " held it ".
func momentOf(v string) (time.Duration, bool) {
	for _, key := range []string{"overlap at ", "crashed at ", " held it "} {
		if _, rest, ok := strings.Cut(v, key); ok {
			end := strings.IndexAny(rest, ",- ")
			if end < 0 {
				end = len(rest)
			}
			if d, err := time.ParseDuration(rest[:end]); err == nil {
				return d, true
			}
		}
	}
	return 0, false
}

// tokenRegressions describes the Locks on name that returned a token no
// greater than one returned by a Lock that had returned before they were
// called (each is enough to make the history illegal for tokenModel), or
// returns "" if there is none.
func tokenRegressions(name string, ops []porcupine.Operation) string {
	byCall := slices.Clone(ops)
	slices.SortFunc(byCall, func(a, b porcupine.Operation) int { return cmp.Compare(a.Call, b.Call) })
	byReturn := slices.Clone(ops)
	slices.SortFunc(byReturn, func(a, b porcupine.Operation) int { return cmp.Compare(a.Return, b.Return) })
	var (
		top   porcupine.Operation // the largest token returned so far
		next  int
		n     int
		first string
	)
	for _, b := range byCall {
		for ; next < len(byReturn) && byReturn[next].Return < b.Call; next++ {
			if a := byReturn[next]; a.Output.(uint64) > tokenOf(top) || top.Output == nil {
				top = a
			}
		}
		if top.Output == nil || b.Output.(uint64) > tokenOf(top) {
			continue
		}
		n++
		if first == "" {
			first = fmt.Sprintf("client-%d's Lock (called at %v, returned at %v) got token %d, though client-%d's Lock had returned token %d at %v",
				b.ClientId, time.Duration(b.Call), time.Duration(b.Return), b.Output, top.ClientId, top.Output, time.Duration(top.Return))
		}
	}
	if n == 0 {
		return ""
	}
	return fmt.Sprintf("%s: %d Locks got a token no greater than an earlier Lock's; first: %s", name, n, first)
}

func tokenOf(op porcupine.Operation) uint64 {
	if op.Output == nil {
		return 0
	}
	return op.Output.(uint64)
}

// tokenModel is a counter per name that only moves up: each successful
// Lock returns a token above every token returned by a Lock that finished
// before it began.
var tokenModel = porcupine.Model{
	Partition: func(history []porcupine.Operation) [][]porcupine.Operation {
		byName := map[any][]porcupine.Operation{}
		var order []any
		for _, op := range history {
			if _, ok := byName[op.Input]; !ok {
				order = append(order, op.Input)
			}
			byName[op.Input] = append(byName[op.Input], op)
		}
		var parts [][]porcupine.Operation
		for _, k := range order {
			parts = append(parts, byName[k])
		}
		return parts
	},
	Init: func() any { return uint64(0) },
	Step: func(state, _, output any) (bool, any) {
		token := output.(uint64)
		return token > state.(uint64), token
	},
}

// close closes every client and the harness, and checks for leaks.
func (r *chaosRun) close() {
	r.healDue(time.Time{})
	r.cancel()
	start := time.Now()
	for _, c := range r.all {
		if err := c.c.Close(); err != nil && !errors.Is(err, context.Canceled) {
			r.t.Logf("closing %s: %v", c.id, err)
		}
	}
	r.slow("closing the clients", start)
	start = time.Now()
	if err := r.h.Close(); err != nil {
		r.t.Errorf("closing the harness: %v", err)
	}
	r.slow("closing the harness", start)
	leaks := r.leaks
	if len(r.brokerGoroutines) > 0 {
		leaks = append(slices.Clip(leaks), brokerLeaks(r.brokerGoroutines)...)
	}
	if err := goleak.Find(leaks...); err != nil {
		r.t.Errorf("goroutines outlived the run: %v", err)
	}
}

// brokerLeaks returns goleak options ignoring every goroutine now running
// a function whose name starts with one of prefixes.
func brokerLeaks(prefixes []string) []goleak.Option {
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			buf = buf[:n]
			break
		}
		buf = make([]byte, 2*len(buf))
	}
	seen := map[string]bool{}
	var opts []goleak.Option
	for _, line := range strings.Split(string(buf), "\n") {
		if !slices.ContainsFunc(prefixes, func(p string) bool { return strings.HasPrefix(line, p) }) {
			continue
		}
		fn := line
		if i := strings.LastIndex(fn, "("); i > 0 && strings.HasSuffix(fn, ")") {
			fn = fn[:i]
		}
		if !seen[fn] {
			seen[fn] = true
			opts = append(opts, goleak.IgnoreAnyFunction(fn))
		}
	}
	return opts
}
