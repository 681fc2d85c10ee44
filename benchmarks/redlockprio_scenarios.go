package benchmarks

import (
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/latchkey-go/latchkey/locks"
)

// The redlockprio scenarios: how priorities and a hung master change the
// contended scenario's hand-off rate. Compare their ops/s with the
// contended scenario's at the same --workers and hold (equal priorities,
// every master up).
const (
	// MixedPriority is the contended scenario with one client of the
	// Workers at a higher priority than the others: it takes the name from
	// them. Ops is hand-offs per second; samples are every Lock's wait.
	// Metrics: "high_p50_ms", "high_p99_ms" and "high_max_ms" (the higher
	// priority's Lock waits), "high_per_s" and "low_per_s" (acquisitions),
	// "preempted" (leases taken while held: the thief waited for their
	// Release).
	MixedPriority = "mixed-priority"
	// HungMinority is the contended scenario with the first of N ≥ 3
	// masters hung (it accepts requests and never answers, as a paused
	// process) for the whole measured run. Ops is hand-offs per second.
	// Metrics: "longest_gap_ms" (the longest time between one release and
	// the next acquisition), "failed_locks".
	HungMinority = "hung-minority"
)

// PrioritySystem is an optional interface that may be implemented by a
// [System] whose clients can have priorities: a higher priority takes a
// name from a lower one.
type PrioritySystem interface {
	NewPriorityClient(ctx context.Context, priority int) (Client, error)
}

// HangSystem is an optional interface that may be implemented by a
// [System] of N ≥ 3 masters that can hang one master for the clients made
// by NewHangableClient, which reach it through a proxy: Hang(true) stops
// the proxy forwarding (connections stay open, nothing is answered),
// Hang(false) resumes it.
type HangSystem interface {
	NewHangableClient(ctx context.Context) (Client, error)
	Hang(hung bool)
}

func (r *runner) mixedPriority(ctx context.Context) (Result, error) {
	ps, ok := r.sys.(PrioritySystem)
	if !ok {
		return Result{}, notApplicable("no priorities")
	}
	var cs []Client
	defer func() {
		for _, c := range cs {
			_ = c.Close()
		}
	}()
	for i := range r.p.Workers {
		prio := 0
		if i == 0 {
			prio = 1
		}
		c, err := ps.NewPriorityClient(ctx, prio)
		if err != nil {
			return Result{}, fmt.Errorf("new client: %w", err)
		}
		cs = append(cs, c)
	}
	out, err := r.contend(ctx, cs, nil)
	if err != nil {
		return Result{}, err
	}
	res := newResult(out.samples, len(out.samples), out.elapsed)
	var high []time.Duration
	highN := 0
	for i, id := range out.order {
		if id == 0 {
			highN++
			high = append(high, out.waits[i])
		}
	}
	slices.Sort(high)
	res.Metrics = map[string]float64{
		"high_per_s": float64(highN) / out.elapsed.Seconds(),
		"low_per_s":  float64(len(out.order)-highN) / out.elapsed.Seconds(),
		"preempted":  float64(out.preempted.Load()),
	}
	if len(high) > 0 {
		res.Metrics["high_p50_ms"] = ms(pct(high, 50))
		res.Metrics["high_p99_ms"] = ms(pct(high, 99))
		res.Metrics["high_max_ms"] = ms(high[len(high)-1])
	}
	return res, nil
}

func (r *runner) hungMinority(ctx context.Context) (Result, error) {
	hs, ok := r.sys.(HangSystem)
	if !ok {
		return Result{}, notApplicable("cannot hang a master")
	}
	var cs []Client
	defer func() {
		for _, c := range cs {
			_ = c.Close()
		}
	}()
	for range r.p.Workers {
		c, err := hs.NewHangableClient(ctx)
		if err != nil {
			return Result{}, fmt.Errorf("new client: %w", err)
		}
		cs = append(cs, c)
		// Each client has met every master (subscriptions, identity)
		// before one hangs.
		if err := r.cycle(ctx, c, r.prefix+"-warm"); err != nil {
			return Result{}, err
		}
	}
	hs.Hang(true)
	defer hs.Hang(false)
	var failed atomic.Int64
	out, err := r.contend(ctx, cs, &failed)
	if err != nil {
		return Result{}, err
	}
	res := newResult(out.samples, len(out.samples), out.elapsed)
	res.Metrics = map[string]float64{
		"longest_gap_ms": ms(out.longestGap),
		"failed_locks":   float64(failed.Load()),
	}
	return res, nil
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// contention is what contend measured.
type contention struct {
	samples    []time.Duration // every Lock's wait
	order      []int           // which client held, in acquisition order
	waits      []time.Duration // the wait of each acquisition, in that order
	longestGap time.Duration   // longest time from a release to the next acquisition
	elapsed    time.Duration
	preempted  atomic.Int64 // leases taken by a higher priority while held
}

// contend runs the contended scenario's loop on cs: each client locks the
// run's name, holds it for Hold, and releases it, until the run ends. A
// failed Lock fails the run, unless failed is given: it is then counted
// there and the client tries again. A lease taken by a higher priority
// while held is counted in preempted, not a failure.
func (r *runner) contend(ctx context.Context, cs []Client, failed *atomic.Int64) (*contention, error) {
	name := r.prefix
	if err := r.cycle(ctx, cs[0], name); err != nil {
		return nil, err
	}
	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	if r.p.Duration > 0 {
		runCtx, cancel = context.WithTimeout(runCtx, r.p.Duration)
		defer cancel()
	}
	var (
		mu       sync.Mutex
		out      = &contention{}
		errs     []error
		released time.Time
		wg       sync.WaitGroup
	)
	over := func() bool {
		dl, ok := runCtx.Deadline()
		return runCtx.Err() != nil || (ok && !time.Now().Before(dl))
	}
	start := time.Now()
	stop := r.stopper(start)
	for id, c := range cs {
		wg.Go(func() {
			for stop.next() {
				t0 := time.Now()
				h, err := r.lock(runCtx, c, name)
				for err != nil && failed != nil && !over() {
					failed.Add(1)
					h, err = r.lock(runCtx, c, name)
				}
				if err != nil {
					if !over() || ctx.Err() != nil {
						mu.Lock()
						errs = append(errs, err)
						mu.Unlock()
						cancel()
					}
					return
				}
				got := time.Now()
				mu.Lock()
				out.samples = append(out.samples, got.Sub(t0))
				out.order = append(out.order, id)
				out.waits = append(out.waits, got.Sub(t0))
				if !released.IsZero() {
					out.longestGap = max(out.longestGap, got.Sub(released))
				}
				mu.Unlock()
				spin(r.p.Hold)
				mu.Lock()
				released = time.Now()
				mu.Unlock()
				if err := r.release(ctx, h); errors.Is(err, locks.ErrPreempted) {
					// Taken by a higher priority while held: its Release
					// says so, and let the thief in.
					out.preempted.Add(1)
				} else if err != nil {
					mu.Lock()
					errs = append(errs, err)
					mu.Unlock()
					cancel()
					return
				}
			}
		})
	}
	wg.Wait()
	out.elapsed = time.Since(start)
	return out, errors.Join(errs...)
}

// hangProxy forwards TCP connections to upstream until it is hung: then
// it keeps them open and forwards nothing, in either direction, until it
// is resumed (as a paused server would, its requests queue up).
type hangProxy struct {
	ln       net.Listener
	upstream string

	mu     sync.Mutex
	hung   bool
	closed bool
	wake   chan struct{} // closed when hung or closed changes
	conns  []net.Conn
	wg     sync.WaitGroup
}

func newHangProxy(upstream string) (*hangProxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	p := &hangProxy{ln: ln, upstream: upstream, wake: make(chan struct{})}
	p.wg.Go(p.accept)
	return p, nil
}

func (p *hangProxy) Addr() string { return p.ln.Addr().String() }

func (p *hangProxy) Hang(hung bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.hung != hung {
		p.hung = hung
		close(p.wake)
		p.wake = make(chan struct{})
	}
}

// gate waits while the proxy is hung; it reports false once the proxy is
// closed.
func (p *hangProxy) gate() bool {
	for {
		p.mu.Lock()
		hung, wake, closed := p.hung, p.wake, p.closed
		p.mu.Unlock()
		if closed {
			return false
		}
		if !hung {
			return true
		}
		<-wake
	}
}

func (p *hangProxy) accept() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		u, err := net.Dial("tcp", p.upstream)
		if err != nil {
			_ = c.Close()
			continue
		}
		p.mu.Lock()
		if p.closed {
			p.mu.Unlock()
			_ = c.Close()
			_ = u.Close()
			return
		}
		p.conns = append(p.conns, c, u)
		p.mu.Unlock()
		p.wg.Go(func() { p.pipe(u, c) })
		p.wg.Go(func() { p.pipe(c, u) })
	}
}

func (p *hangProxy) pipe(dst, src net.Conn) {
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			if !p.gate() {
				return
			}
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			_ = dst.Close()
			return
		}
	}
}

// Close closes the listener and every connection, and waits for the
// proxy's goroutines.
func (p *hangProxy) Close() error {
	err := p.ln.Close()
	p.mu.Lock()
	conns := p.conns
	p.conns = nil
	p.closed = true
	close(p.wake) // wakes gates: they see the proxy closed
	p.wake = make(chan struct{})
	p.mu.Unlock()
	for _, c := range conns {
		_ = c.Close()
	}
	p.wg.Wait()
	return err
}
