package contracttest

import (
	"cmp"
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"
	"go.uber.org/goleak"

	"github.com/latchkey-go/latchkey/locks"
)

// chaosRun is one [RunChaos] run: its harness, its clients, the faults it
// injected and what it recorded.
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
	guard       GuardedStore // ChaosConfig.Guard's store, nil without
	guardSeq    int
	guardOps    map[string][]guardWrite
	guardNewest map[string]uint64 // the greatest token the guard took, by name
	guardFinal  map[string]string // each name's data at the end
	guardStats  struct{ accepted, refused, errs, late int }
	lateWG      sync.WaitGroup // crashed holders' writes in flight
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
	if cfg.Guard != nil {
		if !caps.Fencing {
			_ = h.Close()
			cancel()
			t.Fatalf("RunChaos: a Guard needs a backend with fencing tokens")
		}
		g, err := cfg.Guard(ctx, t)
		if err != nil {
			_ = h.Close()
			cancel()
			t.Fatalf("making the guarded store: %v", err)
		}
		r.guard = g
		r.guardOps, r.guardNewest, r.guardFinal = map[string][]guardWrite{}, map[string]uint64{}, map[string]string{}
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
		_ = closeClient(cc)
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
	r.lateWG.Wait()
	r.slow("the workers' last sections and Locks", over)
	if r.guard != nil {
		r.readGuarded()
	}
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
