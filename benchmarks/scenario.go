package benchmarks

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"runtime"
	"slices"
	"sync/atomic"
	"time"
)

// The scenarios, in the order they are reported.
const (
	Uncontended = "uncontended" // one client, one name: Lock+Release latency
	Contended   = "contended"   // Workers clients on one name, Hold inside: hand-offs per second
	Handoff     = "handoff"     // two clients: from just before Release to the waiter's Lock returning
	Semaphore   = "semaphore"   // size-1 slots held by other clients: Acquire latency of the last one
	Many        = "many"        // Leases held by one client: renewal round trips per second, heap per lease
)

// Scenarios returns the scenario names in report order.
func Scenarios() []string {
	return []string{Uncontended, Contended, Waiters, Handoff, Semaphore, Many, MixedPriority, HungMinority}
}

// Params sets how a scenario runs. The zero value of a field means its
// default.
type Params struct {
	// Duration bounds the measured part of the run; Ops bounds the number
	// of measured operations. A run stops at whichever comes first; with
	// neither set it runs for one second. In the many scenario, Duration
	// is the renewal window, rounded down to whole renew intervals and at
	// least three of them, and Ops is ignored.
	Duration time.Duration
	Ops      int

	// Workers is how many clients contend in the contended scenario and
	// how many goroutines acquire in the many scenario. The default is 8.
	Workers int

	// Hold is the critical section of the contended scenario. The default
	// is 100µs.
	Hold time.Duration

	// SemaphoreSize is the semaphore's size in the semaphore scenario;
	// SemaphoreSize-1 slots are held by other clients throughout. The
	// default is 8.
	SemaphoreSize int

	// Leases is how many leases one client holds in the many scenario.
	// The default is 10,000.
	Leases int

	// Timeout bounds each single acquire, so that a broken system fails
	// the run instead of hanging it. The default is 30s.
	Timeout time.Duration

	// Waiters are the client counts of the waiters scenario: [RunAll]
	// runs one scenario per count, named by [WaitersScenario]. The
	// default is [DefaultWaiters].
	Waiters []int

	// AMQPConnections is the most connections a run may open to
	// RabbitMQ, one per client: a waiters count above it is not
	// applicable to the RabbitMQ systems. RabbitMQ refuses connections
	// past its file-descriptor limit (832 sockets on a stock Debian
	// install), and the broker is often shared. The default is
	// [DefaultAMQPConnections].
	AMQPConnections int

	// Spread, when set, lets the waiters scenario run its clients in
	// worker processes (see [Spread]); without it they all run in this
	// process.
	Spread *Spread

	// Rounds is how many times [RunAll] runs everything, in a different
	// order of the systems each round, keeping each pair's median round.
	// The default is 1.
	Rounds int
}

func (p Params) withDefaults() Params {
	if p.Duration <= 0 && p.Ops <= 0 {
		p.Duration = time.Second
	}
	if p.Workers <= 0 {
		p.Workers = 8
	}
	if p.Hold <= 0 {
		p.Hold = 100 * time.Microsecond
	}
	if p.SemaphoreSize <= 1 {
		p.SemaphoreSize = 8
	}
	if p.Leases <= 0 {
		p.Leases = 10000
	}
	if p.Timeout <= 0 {
		p.Timeout = 30 * time.Second
	}
	if p.AMQPConnections <= 0 {
		p.AMQPConnections = DefaultAMQPConnections
	}
	if len(p.Waiters) == 0 {
		p.Waiters = DefaultWaiters
	}
	return p
}

// Result is what one scenario measured on one system. Samples are
// latencies: Lock+Release (uncontended), the wait in Lock (contended),
// release-to-holding (handoff), Acquire (semaphore), Lock of each lease
// (many). Ops is operations per second: Lock+Release cycles (uncontended,
// semaphore), hand-offs (contended: every acquisition, the lock passing to
// the next holder, which may be the same client again; handoff: one per
// cycle, including the settling wait), and for many the renewal round
// trips per second to all masters together.
type Result struct {
	System   string  `json:"system"`
	Scenario string  `json:"scenario"`
	Samples  int     `json:"samples"`
	P50      int64   `json:"p50_ns"`
	P90      int64   `json:"p90_ns"`
	P99      int64   `json:"p99_ns"`
	Ops      float64 `json:"ops_per_s"`

	// Metrics holds scenario-specific figures. contended and waiters:
	// [MetricSwitches] (acquisitions by another client than the previous
	// holder), [MetricTopShare] (the busiest client's fraction of the
	// acquisitions: 1/clients is fair, 1 is one client starving the
	// others), [MetricMaxWait], [MetricNeverHeld], [MetricClients],
	// [MetricProcesses], and where the brokers can be counted
	// [MetricOpsPerHandoff] and [MetricOutPerHandoff]. many: "bytes_per_lease" (heap growth of the whole process,
	// embedded brokers included), "round_trips_per_master_per_tick",
	// "renew_errors", and for systems the scenario renews itself (peers)
	// "renewed_per_lease_per_tick" (below 1: the renewal loop cannot keep
	// up with the interval). With several rounds, "round_spread" (see
	// [RunAll]). It is not part of the results schema; reports list
	// it separately.
	Metrics map[string]float64 `json:"-"`

	// note, when not empty, is something the run saw that its figures
	// do not say (calls that failed, and the first error); [RunAll]
	// keeps it in [Report.Notes].
	note string
}

// Duration helpers for the percentiles.
func (r Result) P50Duration() time.Duration { return time.Duration(r.P50) }
func (r Result) P90Duration() time.Duration { return time.Duration(r.P90) }
func (r Result) P99Duration() time.Duration { return time.Duration(r.P99) }

func newResult(samples []time.Duration, ops int, elapsed time.Duration) Result {
	r := Result{Samples: len(samples)}
	if len(samples) > 0 {
		slices.Sort(samples)
		r.P50, r.P90, r.P99 = int64(pct(samples, 50)), int64(pct(samples, 90)), int64(pct(samples, 99))
	}
	if elapsed > 0 {
		r.Ops = float64(ops) / elapsed.Seconds()
	}
	return r
}

// pct returns the p-th percentile of sorted samples, by nearest rank.
func pct(sorted []time.Duration, p int) time.Duration {
	i := (p*len(sorted) + 99) / 100
	return sorted[max(i, 1)-1]
}

// Run runs scenario on sys, recording the result under name. Each run uses
// fresh lock names and its own clients, and leaves nothing held. It returns
// an error matching [ErrNotApplicable] when the scenario does not apply to
// the system, and ctx's error if ctx ends first.
func Run(ctx context.Context, sys System, name, scenario string, p Params) (Result, error) {
	p = p.withDefaults()
	base, waiters := splitScenario(scenario)
	r := &runner{sys: sys, name: name, p: p, prefix: lockPrefix(base)}
	var (
		res Result
		err error
	)
	switch base {
	case Uncontended:
		res, err = r.uncontended(ctx)
	case Contended:
		res, err = r.contended(ctx)
	case Waiters:
		res, err = r.crowded(ctx, cmp.Or(waiters, p.Workers), true)
	case Handoff:
		res, err = r.handoff(ctx)
	case Semaphore:
		res, err = r.semaphore(ctx)
	case Many:
		res, err = r.many(ctx)
	case MixedPriority:
		res, err = r.mixedPriority(ctx)
	case HungMinority:
		res, err = r.hungMinority(ctx)
	default:
		return Result{}, fmt.Errorf("benchmarks: unknown scenario %q (scenarios: %v)", scenario, Scenarios())
	}
	if errors.Is(err, ErrNotApplicable) {
		return Result{}, err
	}
	if err != nil {
		return Result{}, fmt.Errorf("%s × %s: %w", name, scenario, err)
	}
	res.System, res.Scenario = name, scenario
	return res, nil
}

// lockPrefix returns a fresh prefix for the lock names of one run; it is
// legal as a NATS KV key, a Redis key and an AMQP queue name.
func lockPrefix(scenario string) string {
	var b [4]byte
	_, _ = rand.Read(b[:])
	return "lb-" + hex.EncodeToString(b[:]) + "-" + scenario
}

type runner struct {
	sys    System
	name   string // the system's, in the registry
	p      Params
	prefix string
}

// done tells a loop when to stop: after Ops operations or Duration.
type stopper struct {
	left     atomic.Int64
	deadline time.Time
}

func (r *runner) stopper(start time.Time) *stopper {
	s := &stopper{}
	if r.p.Ops > 0 {
		s.left.Store(int64(r.p.Ops))
	} else {
		s.left.Store(1 << 62)
	}
	if r.p.Duration > 0 {
		s.deadline = start.Add(r.p.Duration)
	}
	return s
}

// next reports whether one more operation may start.
func (s *stopper) next() bool {
	if !s.deadline.IsZero() && !time.Now().Before(s.deadline) {
		return false
	}
	return s.left.Add(-1) >= 0
}

func (r *runner) clients(ctx context.Context, n int) ([]Client, func(), error) {
	var cs []Client
	closeAll := func() {
		for _, c := range cs {
			_ = c.Close()
		}
	}
	for range n {
		c, err := r.sys.NewClient(ctx)
		if err != nil {
			closeAll()
			return nil, nil, fmt.Errorf("new client: %w", err)
		}
		cs = append(cs, c)
	}
	return cs, closeAll, nil
}

// lock acquires name within the per-acquire timeout.
func (r *runner) lock(ctx context.Context, l Locker, name string) (Held, error) {
	ctx, cancel := context.WithTimeout(ctx, r.p.Timeout)
	defer cancel()
	h, err := l.Lock(ctx, name)
	if err != nil {
		return nil, fmt.Errorf("lock %q: %w", name, err)
	}
	return h, nil
}

// release releases h; it is never cut short by the run's context, so that
// nothing is left held.
func (r *runner) release(ctx context.Context, h Held) error {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), r.p.Timeout)
	defer cancel()
	if err := h.Release(ctx); err != nil {
		return fmt.Errorf("release: %w", err)
	}
	return nil
}

func (r *runner) uncontended(ctx context.Context) (Result, error) {
	cs, closeAll, err := r.clients(ctx, 1)
	if err != nil {
		return Result{}, err
	}
	defer closeAll()
	c, name := cs[0], r.prefix
	// Warm up: connections, scripts and buckets are ready, and the
	// broker and this process have run the path before it is timed.
	warm := time.Now().Add(min(r.p.Duration/10, 250*time.Millisecond))
	for first := true; first || time.Now().Before(warm); first = false {
		if err := r.cycle(ctx, c, name); err != nil {
			return Result{}, err
		}
	}
	var samples []time.Duration
	start := time.Now()
	stop := r.stopper(start)
	for stop.next() {
		t0 := time.Now()
		if err := r.cycle(ctx, c, name); err != nil {
			return Result{}, err
		}
		samples = append(samples, time.Since(t0))
		if err := ctx.Err(); err != nil {
			return Result{}, err
		}
	}
	return newResult(samples, len(samples), time.Since(start)), nil
}

func (r *runner) cycle(ctx context.Context, l Locker, name string) error {
	h, err := r.lock(ctx, l, name)
	if err != nil {
		return err
	}
	return r.release(ctx, h)
}

func (r *runner) contended(ctx context.Context) (Result, error) {
	return r.crowded(ctx, r.p.Workers, false)
}

// spin holds the CPU-free critical section for d. time.Sleep would round
// 100µs up to the timer slack; the critical section is work, not waiting,
// so it is measured on the monotonic clock while yielding.
func spin(d time.Duration) {
	end := time.Now().Add(d)
	for time.Now().Before(end) {
		runtime.Gosched()
	}
}
