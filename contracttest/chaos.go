package contracttest

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
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
	Duration   time.Duration // how long clients run; required ($LOCKS_CHAOS_DURATION overrides it)
	Clients    int           // clients working at once (6)
	Names      int           // names they contend for (3)
	MaxHold    time.Duration // the longest critical section (20ms)
	FaultEvery time.Duration // the mean time between two faults (1s)
	Seed       uint64        // seeds the random choices (not the timing); 0 picks one
}

// ChaosDurationEnv names the environment variable that overrides
// ChaosConfig.Duration, so that the same test runs for seconds in `mage
// test` and for minutes in `mage chaos` (which sets it, e.g. to "5m").
const ChaosDurationEnv = "LOCKS_CHAOS_DURATION"

// chaosDuration is $LOCKS_CHAOS_DURATION when set, else short.
func chaosDuration(t testing.TB, short time.Duration) time.Duration {
	v := os.Getenv(ChaosDurationEnv)
	if v == "" {
		return short
	}
	d, err := time.ParseDuration(v)
	if err != nil || d <= 0 {
		t.Fatalf("%s=%q: want a positive duration such as 5m", ChaosDurationEnv, v)
	}
	return d
}

// Fault kinds injected by [RunChaos].
const (
	FaultCrash   = "crash"   // Harness.Kill on a client, then a new client in its place
	FaultAbandon = "abandon" // a client's Lock cancelled while it waits
	FaultClose   = "close"   // a client closed (Client.Close), then a new one in its place
)

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
	LeasesEnded   int
	Recoveries    int           // crashed holders whose names were taken again
	WorstRecovery time.Duration // the longest of those hand-overs
	// Linearizability is porcupine's verdict on the fencing tokens
	// (Ok, Illegal, or Unknown when it timed out); empty without fencing.
	Linearizability porcupine.CheckResult
	Violations      []string
}

func (s ChaosSummary) String() string {
	kinds := make([]string, 0, len(s.Faults))
	for k, n := range s.Faults {
		kinds = append(kinds, fmt.Sprintf("%s %d", k, n))
	}
	slices.Sort(kinds)
	lin := string(s.Linearizability)
	if lin == "" {
		lin = "n/a (no fencing tokens)"
	}
	return fmt.Sprintf("seed %d: %d acquisitions; faults: %s; fenced rejections %d; leases ended while held %d; %d crashed holders replaced, worst after %v; tokens linearizable: %s; violations %d",
		s.Seed, s.Acquisitions, strings.Join(kinds, ", "), s.FencedRejections, s.LeasesEnded, s.Recoveries,
		s.WorstRecovery.Round(time.Millisecond), lin, len(s.Violations))
}

// RunChaos runs cfg.Clients clients against the backend for cfg.Duration,
// each locking random names among cfg.Names and holding them for up to
// cfg.MaxHold, while faults are injected at random: a client crashed
// (Harness.Kill), a Lock abandoned by cancelling its context, a client
// closed. Every critical section is recorded on one monotonic clock and
// checked at the end:
//   - no two sections on one name overlap (a crashed client's section ends
//     when it is killed: a dead process does nothing more);
//   - where the backend has fencing tokens, they are linearizable as a
//     strictly increasing counter per name (checked with porcupine), and
//     every write goes through a [FencedResource];
//   - every name held by a crashed client is held again within the
//     stated CrashRecovery bound (as the conformance suite allows it);
//   - no name stalls: none goes longer than twice that bound plus a
//     second without a holder while clients want it;
//   - no goroutine outlives the run.
//
// It fails t for every violation and returns the summary.
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
		t.Errorf("violation: %s", v)
	}
	t.Logf("chaos summary: %v", s)
	return s
}

type chaosRun struct {
	t      *testing.T
	cfg    ChaosConfig
	h      Harness
	caps   Capabilities
	leaks  []goleak.Option
	ctx    context.Context
	cancel context.CancelFunc
	names  []string
	start  time.Time

	mu       sync.Mutex
	rng      *rand.Rand
	slots    []*chaosClient
	all      []*chaosClient
	spans    map[string][]Span
	ops      map[string][]porcupine.Operation
	crashes  []crash
	faults   map[string]int
	rejected int
	ended    int // sections cut short by their lease ending
	fences   map[string]*FencedResource
	nextID   int
}

// crash is a client killed while it held name.
type crash struct {
	name string
	at   time.Duration
}

// chaosClient is one simulated process.
type chaosClient struct {
	id     string
	c      Client
	l      locks.Locker
	ctx    context.Context // ends when the client is crashed or closed
	cancel context.CancelFunc

	mu      sync.Mutex
	dead    bool
	held    map[string]func()  // open sections by name: their exits
	waiting context.CancelFunc // cancels the Lock in flight, if any
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
	if cfg.Seed == 0 {
		cfg.Seed = rand.Uint64()
	}
	leaks := goleak.IgnoreCurrent()
	ctx, cancel := context.WithCancel(context.Background())
	h, err := nh(ctx, t)
	if err != nil {
		cancel()
		t.Fatalf("making the harness: %v", err)
	}
	if h.Capabilities().CrashRecovery <= 0 {
		cancel()
		t.Fatalf("RunChaos needs Capabilities().CrashRecovery")
	}
	r := &chaosRun{
		t: t, cfg: cfg, h: h, caps: h.Capabilities(), leaks: leakOptions(leaks, h), ctx: ctx, cancel: cancel,
		rng:    rand.New(rand.NewPCG(cfg.Seed, cfg.Seed^0x9e3779b97f4a7c15)),
		spans:  map[string][]Span{},
		ops:    map[string][]porcupine.Operation{},
		faults: map[string]int{},
		fences: map[string]*FencedResource{},
		start:  time.Now(),
	}
	for i := range cfg.Names {
		name := fmt.Sprintf("chaos-%x-%d", cfg.Seed&0xffffff, i)
		r.names = append(r.names, name)
		r.fences[name] = &FencedResource{}
	}
	for range cfg.Clients {
		r.slots = append(r.slots, r.newClient())
	}
	t.Logf("chaos: %d clients on %d names for %v, a fault every %v on average, seed %d",
		cfg.Clients, cfg.Names, cfg.Duration, cfg.FaultEvery, cfg.Seed)
	return r
}

func (r *chaosRun) now() time.Duration { return time.Since(r.start) }

func (r *chaosRun) newClient() *chaosClient {
	r.t.Helper()
	c, err := r.h.NewClient(r.ctx)
	if err != nil {
		r.t.Fatalf("NewClient: %v", err)
	}
	l := c.Locker()
	if l == nil {
		_ = c.Close()
		r.t.Skip("the backend has no Locker")
	}
	ctx, cancel := context.WithCancel(r.ctx)
	r.mu.Lock()
	defer r.mu.Unlock()
	r.nextID++
	cc := &chaosClient{id: fmt.Sprintf("client-%d", r.nextID), c: c, l: l, ctx: ctx, cancel: cancel, held: map[string]func(){}}
	r.all = append(r.all, cc)
	return cc
}

func (r *chaosRun) intn(n int) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.rng.IntN(n)
}

// run drives the clients and the faults until the duration is over.
func (r *chaosRun) run() {
	var wg sync.WaitGroup
	stop := make(chan struct{})
	for i := range r.slots {
		wg.Go(func() { r.work(i, stop) })
	}
	deadline := time.After(r.cfg.Duration)
	for done := false; !done; {
		gap := time.Duration(r.intn(int(2*r.cfg.FaultEvery)) + 1)
		select {
		case <-deadline:
			done = true
		case <-time.After(gap):
			r.inject()
		}
	}
	close(stop)
	wg.Wait()
}

// work is one slot's loop: lock a random name, write through its fence,
// hold it, write again, release. A crashed client is replaced in its slot.
func (r *chaosRun) work(slot int, stop <-chan struct{}) {
	wait := 2*bound(r.caps.CrashRecovery) + time.Second
	for {
		select {
		case <-stop:
			return
		default:
		}
		r.mu.Lock()
		cl := r.slots[slot]
		r.mu.Unlock()
		name := r.names[r.intn(len(r.names))]
		hold := time.Duration(r.intn(int(r.cfg.MaxHold)) + 1)

		ctx, cancel := context.WithTimeout(cl.ctx, wait)
		if !cl.setWaiting(cancel) {
			cancel()
			time.Sleep(time.Millisecond) // dead: its slot is being refilled
			continue
		}
		call := r.now()
		lease, err := cl.l.Lock(ctx, name)
		ret := r.now()
		cl.setWaiting(nil)
		if err != nil {
			cancel()
			continue
		}
		r.hold(cl, name, lease, call, ret, hold)
		cancel()
	}
}

// hold runs one critical section of cl on name.
func (r *chaosRun) hold(cl *chaosClient, name string, lease locks.Lease, call, ret, hold time.Duration) {
	token := lease.Token()
	if r.caps.Fencing {
		r.mu.Lock()
		r.ops[name] = append(r.ops[name], porcupine.Operation{
			Input: name, Call: int64(call), Output: token, Return: int64(ret),
		})
		r.mu.Unlock()
	}
	exit, ok := r.enter(cl, name, token, lease)
	if ok {
		r.write(cl, name, lease)
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
	s := Span{Who: cl.id, Token: token, Enter: r.now()}
	var ended atomic.Int64 // when the lease's context ended, +1; 0 while live
	stop := context.AfterFunc(lease.Context(), func() { ended.Store(int64(r.now()) + 1) })
	end := sync.OnceFunc(func() {
		stop()
		s.Exit = r.now()
		if lease.Context().Err() != nil {
			s.Ended = fmt.Sprint(context.Cause(lease.Context()))
			if e := time.Duration(ended.Load() - 1); e >= 0 && e < s.Exit {
				s.Exit = max(e, s.Enter)
			}
			if d, ok := lease.(interface{ Deadline() time.Time }); ok && !d.Deadline().IsZero() {
				if e := d.Deadline().Sub(r.start); e < s.Exit {
					s.Exit = max(e, s.Enter)
				}
			}
		}
		r.mu.Lock()
		r.spans[name] = append(r.spans[name], s)
		if s.Ended != "" {
			r.ended++
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
// it held.
func (c *chaosClient) kill() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.dead = true
	var names []string
	for name, exit := range c.held {
		names = append(names, name)
		exit()
	}
	return names
}

// pick returns a random slot; with holding, one whose client is in a
// critical section if any is, since crashing a holder is what tests recovery.
func (r *chaosRun) pick(holding bool) int {
	r.mu.Lock()
	slots := slices.Clone(r.slots)
	r.mu.Unlock()
	var busy []int
	for i, cl := range slots {
		cl.mu.Lock()
		if holding && len(cl.held) > 0 && !cl.dead {
			busy = append(busy, i)
		}
		cl.mu.Unlock()
	}
	if len(busy) > 0 {
		return busy[r.intn(len(busy))]
	}
	return r.intn(len(slots))
}

// inject picks one fault and one client and applies it.
func (r *chaosRun) inject() {
	kinds := []string{FaultCrash, FaultAbandon, FaultClose}
	kind := kinds[r.intn(len(kinds))]
	slot := r.pick(kind == FaultCrash)
	r.mu.Lock()
	cl := r.slots[slot]
	r.faults[kind]++
	r.mu.Unlock()
	switch kind {
	case FaultAbandon:
		cl.mu.Lock()
		if cl.waiting != nil {
			cl.waiting()
		}
		cl.mu.Unlock()
		return
	case FaultCrash:
		at := r.now()
		for _, name := range cl.kill() {
			r.mu.Lock()
			r.crashes = append(r.crashes, crash{name: name, at: at})
			r.mu.Unlock()
		}
		cl.cancel()
		if err := r.h.Kill(r.ctx, cl.c); err != nil {
			r.t.Errorf("Kill(%s): %v", cl.id, err)
		}
	case FaultClose:
		// A clean close: the client's sections end before it releases.
		cl.kill()
		cl.cancel()
		if err := cl.c.Close(); err != nil {
			r.t.Logf("closing %s: %v", cl.id, err)
		}
	}
	next := r.newClient()
	r.mu.Lock()
	r.slots[slot] = next
	r.mu.Unlock()
}

// check turns the recorded history into a summary with its violations.
func (r *chaosRun) check() ChaosSummary {
	r.mu.Lock()
	defer r.mu.Unlock()
	s := ChaosSummary{Seed: r.cfg.Seed, Faults: r.faults, FencedRejections: r.rejected, LeasesEnded: r.ended}
	recovery := bound(r.caps.CrashRecovery)
	end := r.now()
	for _, name := range r.names {
		spans := r.spans[name]
		s.Acquisitions += len(spans)
		h := &History{Limit: 1, spans: spans}
		if err := h.Check(); err != nil {
			s.Violations = append(s.Violations, fmt.Sprintf("%s: %v", name, err))
		}
		slices.SortFunc(spans, func(a, b Span) int { return int(a.Enter - b.Enter) })
		stall := 2*recovery + time.Second
		last := time.Duration(0)
		for _, sp := range spans {
			if gap := sp.Enter - last; gap > stall {
				s.Violations = append(s.Violations, fmt.Sprintf("%s: nobody held it from %v to %v (%v; allowed %v)", name, last, sp.Enter, gap.Round(time.Millisecond), stall))
			}
			last = max(last, sp.Exit)
		}
	}
	for _, c := range r.crashes {
		i := slices.IndexFunc(r.spans[c.name], func(sp Span) bool { return sp.Enter > c.at })
		if i < 0 {
			if end-c.at > recovery {
				s.Violations = append(s.Violations, fmt.Sprintf("%s: never held again after its holder crashed at %v", c.name, c.at))
			}
			continue
		}
		took := r.spans[c.name][i].Enter - c.at
		s.Recoveries++
		s.WorstRecovery = max(s.WorstRecovery, took)
		if took > recovery {
			s.Violations = append(s.Violations, fmt.Sprintf("%s: held again %v after its holder crashed at %v (allowed %v)", c.name, took.Round(time.Millisecond), c.at, recovery))
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
	}
	return s
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
	r.cancel()
	for _, c := range r.all {
		if err := c.c.Close(); err != nil && !errors.Is(err, context.Canceled) {
			r.t.Logf("closing %s: %v", c.id, err)
		}
	}
	if err := r.h.Close(); err != nil {
		r.t.Errorf("closing the harness: %v", err)
	}
	if err := goleak.Find(r.leaks...); err != nil {
		r.t.Errorf("goroutines outlived the run: %v", err)
	}
}
