package benchmarks

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Waiters is the contended workload at several waiter counts. [RunAll]
// runs it as one scenario per count of [Params.Waiters], named by
// [WaitersScenario] ("waiters/64"); [Run] also takes the bare name, at
// [Params.Workers] clients.
const Waiters = "waiters"

// DefaultWaiters are the waiter counts of the waiters scenario unless
// [Params.Waiters] says otherwise.
var DefaultWaiters = []int{8, 64, 256, 1000}

// DefaultPerProcess is how many clients one worker process of the waiters
// scenario runs unless [Spread.PerProcess] says otherwise.
const DefaultPerProcess = 250

// DefaultAMQPConnections is [Params.AMQPConnections]' default.
const DefaultAMQPConnections = 300

// amqpSystem is implemented by systems with one RabbitMQ connection per
// client.
type amqpSystem interface{ amqpConnections() }

// WaitersScenario returns the name of the waiters scenario at n clients.
func WaitersScenario(n int) string { return Waiters + "/" + strconv.Itoa(n) }

// splitScenario returns a scenario name's base ("waiters") and its waiter
// count (0 when it has none).
func splitScenario(s string) (string, int) {
	base, count, ok := strings.Cut(s, "/")
	if !ok || base != Waiters {
		return s, 0
	}
	n, err := strconv.Atoi(count)
	if err != nil || n < 1 {
		return s, 0
	}
	return base, n
}

// ParseWaiters parses a comma-separated list of waiter counts, each at
// least 2 (one holder and one waiter), as lockbench's --waiters takes it.
func ParseWaiters(list string) ([]int, error) {
	var out []int
	for f := range strings.SplitSeq(list, ",") {
		if f = strings.TrimSpace(f); f == "" {
			continue
		}
		n, err := strconv.Atoi(f)
		if err != nil || n < 2 {
			return nil, fmt.Errorf("benchmarks: waiter count %q: want an integer >= 2", f)
		}
		if !slices.Contains(out, n) {
			out = append(out, n)
		}
	}
	if len(out) == 0 {
		return nil, errors.New("benchmarks: no waiter counts")
	}
	slices.Sort(out)
	return out, nil
}

// Spread says how the waiters scenario spreads its clients over worker
// processes, so that at a thousand waiters no one process's scheduler is
// what limits the rate. Without a Spread (or with an Ops-bounded run, or a
// system that lives in one process, memlock) every client runs in this
// process.
type Spread struct {
	// Command returns a command that runs [ServeWorker] on its standard
	// input and output: lockbench runs itself with a hidden flag.
	Command func(ctx context.Context) *exec.Cmd
	// PerProcess is the most clients one worker runs: n clients run in
	// ⌈n / PerProcess⌉ workers. The default is [DefaultPerProcess].
	PerProcess int
	// Env is where the workers find the brokers. [RunAll] sets it to
	// its env when it is empty.
	Env Env
}

// inProcessOnly is implemented by systems whose clients cannot live in
// other processes (memlock).
type inProcessOnly interface{ inProcessOnly() }

// joinable is implemented by systems that made something (a bucket) their
// clients in other processes must share: joinKey is what a worker's
// [Env.Join] must hold to build the same system.
type joinable interface{ joinKey() string }

// brokerCounter is implemented by systems that can count the operations
// their brokers serve. wide counters are the brokers' own (every process's
// clients), read once by the parent; the others count this process's
// clients only, and each worker reads its own.
type brokerCounter interface {
	brokerOps(ctx context.Context) (brokerOps, error)
	wideOps() bool
}

// brokerOps are counters of operations served by a system's brokers.
type brokerOps struct {
	Ops uint64 `json:"ops"` // requests the brokers executed (Redis commands) or received (NATS messages)
	Out uint64 `json:"out"` // messages the brokers delivered to the clients (NATS only)
	// HasOut says Out is counted.
	HasOut bool `json:"has_out"`
}

func (a brokerOps) sub(b brokerOps) brokerOps {
	return brokerOps{Ops: a.Ops - b.Ops, Out: a.Out - b.Out, HasOut: a.HasOut}
}

func (a brokerOps) add(b brokerOps) brokerOps {
	return brokerOps{Ops: a.Ops + b.Ops, Out: a.Out + b.Out, HasOut: a.HasOut || b.HasOut}
}

// acquisition is one Lock that returned: when (Unix ns, the wall clock all
// processes of the machine share), and by which client.
type acquisition struct {
	At int64 `json:"t"`
	ID int   `json:"c"`
}

// crowdResult is what the clients of one process measured.
type crowdResult struct {
	Acquired []acquisition   `json:"acquired"`
	Waits    []time.Duration `json:"waits"`
	// Pending is the longest wait still unanswered when the run ended.
	Pending  time.Duration `json:"pending"`
	Finished int64         `json:"finished"` // Unix ns when the last client stopped
	Ops      *brokerOps    `json:"ops,omitempty"`
	Errors   []string      `json:"errors,omitempty"`
	// Failed counts Lock and Release calls that failed before the end
	// (the client went on); First is the first one's error.
	Failed int    `json:"failed,omitempty"`
	First  string `json:"first,omitempty"`
}

// crowd is the clients of one process contending on one name: ids
// firstID, firstID+1... in the whole run.
type crowd struct {
	sys     System
	cs      []Client
	firstID int
	name    string
	hold    time.Duration
	timeout time.Duration
}

// run runs the contended loop from start until end (or until stop says
// so) and returns what it measured. A failed Lock or Release before the
// end stops every client of the process and is reported in Errors.
func (c *crowd) run(ctx context.Context, start, end time.Time, stop *stopper) crowdResult {
	if d := time.Until(start); d > 0 {
		select {
		case <-ctx.Done():
		case <-time.After(d):
		}
	}
	counter, _ := c.sys.(brokerCounter)
	var ops0 brokerOps
	local := counter != nil && !counter.wideOps()
	if local {
		o, err := counter.brokerOps(ctx)
		local = err == nil
		ops0 = o
	}
	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	if !end.IsZero() {
		// Waiters still blocked at the end are let go.
		var cancelEnd context.CancelFunc
		runCtx, cancelEnd = context.WithDeadline(runCtx, end)
		defer cancelEnd()
	}
	over := func() bool {
		return runCtx.Err() != nil || (!end.IsZero() && !time.Now().Before(end))
	}
	var (
		mu  sync.Mutex
		out crowdResult
		wg  sync.WaitGroup
	)
	fail := func(err error) {
		mu.Lock()
		out.Errors = append(out.Errors, err.Error())
		mu.Unlock()
		cancel()
	}
	failed := func(err error) {
		mu.Lock()
		if out.Failed++; out.First == "" {
			out.First = err.Error()
		}
		mu.Unlock()
	}
	r := &runner{p: Params{Timeout: c.timeout}}
	for i, cl := range c.cs {
		id := c.firstID + i
		wg.Go(func() {
			var (
				waits []time.Duration
				acq   []acquisition
			)
			defer func() {
				mu.Lock()
				out.Waits = append(out.Waits, waits...)
				out.Acquired = append(out.Acquired, acq...)
				mu.Unlock()
			}()
			for stop.next() {
				t0 := time.Now()
				h, err := r.lock(runCtx, cl, c.name)
				for err != nil && !over() && ctx.Err() == nil {
					// A failed Lock is counted, and the client waits on,
					// after a pause so that a broker refusing at once is
					// not hammered.
					failed(err)
					select {
					case <-runCtx.Done():
					case <-time.After(5 * time.Millisecond):
					}
					h, err = r.lock(runCtx, cl, c.name)
				}
				if err != nil {
					// At the deadline a client may fail with its own
					// i/o timeout a moment before ctx reports it.
					if ctx.Err() != nil {
						fail(err)
						return
					}
					waited := time.Since(t0)
					if !end.IsZero() {
						waited = end.Sub(t0)
					}
					mu.Lock()
					out.Pending = max(out.Pending, waited)
					mu.Unlock()
					return
				}
				got := time.Now()
				waits = append(waits, got.Sub(t0))
				acq = append(acq, acquisition{At: got.UnixNano(), ID: id})
				spin(c.hold)
				if err := r.release(ctx, h); err != nil {
					failed(err)
				}
			}
		})
	}
	wg.Wait()
	out.Finished = time.Now().UnixNano()
	if local {
		if o, err := counter.brokerOps(ctx); err == nil {
			d := o.sub(ops0)
			out.Ops = &d
		}
	}
	return out
}

// newClients makes n clients, a few at a time.
func newClients(ctx context.Context, sys System, n int) ([]Client, func(), error) {
	cs := make([]Client, n)
	closeAll := func() {
		for _, c := range cs {
			if c != nil {
				_ = c.Close()
			}
		}
	}
	var (
		next atomic.Int64
		mu   sync.Mutex
		errs []error
		wg   sync.WaitGroup
	)
	for range min(n, 8) {
		wg.Go(func() {
			for {
				i := int(next.Add(1) - 1)
				if i >= n || ctx.Err() != nil {
					return
				}
				c, err := sys.NewClient(ctx)
				if err != nil {
					mu.Lock()
					errs = append(errs, err)
					mu.Unlock()
					return
				}
				cs[i] = c
			}
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		closeAll()
		return nil, nil, fmt.Errorf("new client: %w", err)
	}
	if err := ctx.Err(); err != nil {
		closeAll()
		return nil, nil, err
	}
	return cs, closeAll, nil
}

// crowded runs n clients on one name: the contended scenario (n =
// Workers, every client in this process) and the waiters scenario
// (spread over worker processes when p.Spread allows it).
func (r *runner) crowded(ctx context.Context, n int, spread bool) (Result, error) {
	if _, ok := r.sys.(amqpSystem); ok && n+1 > r.p.AMQPConnections {
		return Result{}, notApplicable("%d clients take %d RabbitMQ connections, over the %d allowed (--amqp-connections)", n, n+1, r.p.AMQPConnections)
	}
	procs := 1
	_, only := r.sys.(inProcessOnly)
	remote := spread && r.p.Spread != nil && r.p.Spread.Command != nil && r.p.Duration > 0 && !only
	if remote {
		per := r.p.Spread.PerProcess
		if per <= 0 {
			per = DefaultPerProcess
		}
		procs = (n + per - 1) / per
	}
	// The first client takes and frees the name once before the run, and
	// is held open throughout, so that what it made (a bucket) is there.
	first, closeFirst, err := newClients(ctx, r.sys, 1)
	if err != nil {
		return Result{}, err
	}
	defer closeFirst()
	if err := r.cycle(ctx, first[0], r.prefix); err != nil {
		return Result{}, err
	}
	counter, _ := r.sys.(brokerCounter)
	wide := counter != nil && counter.wideOps()
	var (
		results    []crowdResult
		ops0, ops1 brokerOps
		start      time.Time
		wideErr    error
	)
	readWide := func() brokerOps {
		if !wide || wideErr != nil {
			return brokerOps{}
		}
		o, err := counter.brokerOps(ctx)
		if err != nil {
			wideErr = err
		}
		return o
	}
	if !remote {
		rest, closeRest, err := newClients(ctx, r.sys, n-1)
		if err != nil {
			return Result{}, err
		}
		defer closeRest()
		c := &crowd{sys: r.sys, cs: append(first, rest...), name: r.prefix, hold: r.p.Hold, timeout: r.p.Timeout}
		ops0 = readWide()
		start = time.Now()
		var end time.Time
		if r.p.Duration > 0 {
			end = start.Add(r.p.Duration)
		}
		results = []crowdResult{c.run(ctx, start, end, r.stopper(start))}
		ops1 = readWide()
	} else {
		ws, err := r.startWorkers(ctx, n, procs)
		defer func() {
			for _, w := range ws {
				w.stop()
			}
		}()
		if err != nil {
			return Result{}, err
		}
		ops0 = readWide()
		// Every worker is waiting for the word: start all of them at one
		// moment on the wall clock they share.
		start = time.Now().Add(50 * time.Millisecond)
		g := workerGo{Start: start.UnixNano(), End: start.Add(r.p.Duration).UnixNano()}
		results = make([]crowdResult, len(ws))
		errs := make([]error, len(ws))
		var wg sync.WaitGroup
		for i, w := range ws {
			wg.Go(func() { results[i], errs[i] = w.run(g) })
		}
		wg.Wait()
		if err := errors.Join(errs...); err != nil {
			return Result{}, err
		}
		ops1 = readWide()
	}
	if err := ctx.Err(); err != nil {
		return Result{}, err
	}
	var ops *brokerOps
	if wide && wideErr == nil {
		d := ops1.sub(ops0)
		ops = &d
	}
	return mergeCrowds(results, n, procs, start, r.p.Hold, ops)
}

// mergeCrowds makes one result of the processes' results.
func mergeCrowds(rs []crowdResult, clients, procs int, start time.Time, hold time.Duration, ops *brokerOps) (Result, error) {
	var (
		acq     []acquisition
		waits   []time.Duration
		pending time.Duration
		errs    []string
		failed  int
		first   string
		fin     int64
		local   brokerOps
		counted = len(rs) > 0
	)
	for _, r := range rs {
		acq = append(acq, r.Acquired...)
		waits = append(waits, r.Waits...)
		pending = max(pending, r.Pending)
		errs = append(errs, r.Errors...)
		if failed += r.Failed; first == "" {
			first = r.First
		}
		fin = max(fin, r.Finished)
		if r.Ops == nil {
			counted = false
		} else {
			local = local.add(*r.Ops)
		}
	}
	if len(errs) > 0 {
		return Result{}, errors.New(strings.Join(errs, "; "))
	}
	if ops == nil && counted {
		ops = &local
	}
	elapsed := time.Duration(fin - start.UnixNano())
	res := newResult(waits, len(acq), elapsed)
	slices.SortFunc(acq, func(a, b acquisition) int { return int(a.At - b.At) })
	switches, overlaps, counts := 0, 0, make([]int, clients)
	for i, a := range acq {
		if a.ID >= 0 && a.ID < clients {
			counts[a.ID]++
		}
		if i > 0 && a.ID != acq[i-1].ID {
			switches++
		}
		if i > 0 && time.Duration(a.At-acq[i-1].At) < hold {
			overlaps++
		}
	}
	never := 0
	for _, c := range counts {
		if c == 0 {
			never++
		}
	}
	longest := pending
	if len(waits) > 0 {
		longest = max(longest, waits[len(waits)-1]) // newResult sorted them
	}
	secs := max(elapsed.Seconds(), 1e-9)
	res.Metrics = map[string]float64{
		MetricSwitches:  float64(switches) / secs,
		MetricTopShare:  float64(slices.Max(counts)) / float64(max(len(acq), 1)),
		MetricMaxWait:   float64(longest),
		MetricNeverHeld: float64(never),
		MetricClients:   float64(clients),
		MetricProcesses: float64(procs),
		MetricOverlaps:  float64(overlaps),
		MetricFailed:    float64(failed),
	}
	if failed > 0 {
		res.note = fmt.Sprintf("%d Lock or Release calls failed before the end (the clients went on); the first: %s", failed, first)
	}
	if ops != nil {
		res.Metrics[MetricOpsPerSecond] = float64(ops.Ops) / secs
	}
	if ops != nil && len(acq) > 0 {
		res.Metrics[MetricOpsPerHandoff] = float64(ops.Ops) / float64(len(acq))
		if ops.HasOut {
			res.Metrics[MetricOutPerHandoff] = float64(ops.Out) / float64(len(acq))
		}
	}
	return res, nil
}

// The metrics of the contended and waiters scenarios.
const (
	// MetricSwitches is acquisitions per second by another client than
	// the previous holder.
	MetricSwitches = "switches_per_s"
	// MetricTopShare is the busiest client's fraction of the
	// acquisitions: 1/clients is fair, 1 is one client starving the
	// others.
	MetricTopShare = "top_client_share"
	// MetricMaxWait is the longest single wait in Lock, in nanoseconds,
	// counting the waits still unanswered when the run ended.
	MetricMaxWait = "max_wait_ns"
	// MetricNeverHeld is how many clients never got the lock in the run.
	MetricNeverHeld = "clients_never_held"
	// MetricClients is how many clients contended.
	MetricClients = "clients"
	// MetricProcesses is how many processes the clients ran in.
	MetricProcesses = "processes"
	// MetricOverlaps counts acquisitions less than the hold after the
	// one before: two holders at once, which a lock never allows (a
	// check of the run: the processes did contend on one lock).
	MetricOverlaps = "overlapping_holds"
	// MetricFailed counts Lock and Release calls that failed before the
	// end of the run; the clients went on waiting.
	MetricFailed = "failed_calls"
	// MetricOpsPerHandoff is broker operations per acquisition: Redis
	// commands executed on every master the system uses (INFO
	// commandstats' calls, commands run by scripts included, INFO
	// itself excluded); NATS messages the clients published. Absent
	// where the broker cannot be counted (RabbitMQ).
	MetricOpsPerHandoff = "broker_ops_per_handoff"
	// MetricOpsPerSecond is the same broker operations per second of the
	// run, which says what the waiters cost when no hand-off happened.
	MetricOpsPerSecond = "broker_ops_per_s"
	// MetricOutPerHandoff is messages the broker delivered to the clients
	// per acquisition (NATS: replies, watch and subscription updates).
	MetricOutPerHandoff = "broker_msgs_out_per_handoff"
)

// --- worker processes ---

// workerJob is what a worker is asked to run.
type workerJob struct {
	System  string        `json:"system"`
	Env     Env           `json:"env"`
	Name    string        `json:"name"`
	FirstID int           `json:"first_id"`
	Clients int           `json:"clients"`
	Hold    time.Duration `json:"hold"`
	Timeout time.Duration `json:"timeout"`
}

// workerReady answers a job once its clients are connected.
type workerReady struct {
	Error string `json:"error,omitempty"`
}

// workerGo starts the run, both times in Unix ns.
type workerGo struct {
	Start int64 `json:"start"`
	End   int64 `json:"end"`
}

// ServeWorker runs one worker process of the waiters scenario: it reads a
// job as JSON from in (the system, by its registry name, its brokers, the
// lock name, how many clients), builds the system and its clients and
// says so on out, waits for the start and end times, runs the clients
// between them and writes what they measured to out; then it waits for in
// to close, and closes the clients. Nothing else may write to out.
func ServeWorker(ctx context.Context, in io.Reader, out io.Writer) error {
	dec, enc := json.NewDecoder(in), json.NewEncoder(out)
	var job workerJob
	if err := dec.Decode(&job); err != nil {
		return fmt.Errorf("benchmarks: worker: reading the job: %w", err)
	}
	c, cleanup, err := job.build(ctx)
	if err != nil {
		_ = enc.Encode(workerReady{Error: err.Error()})
		return err
	}
	defer cleanup()
	if err := enc.Encode(workerReady{}); err != nil {
		return err
	}
	var g workerGo
	if err := dec.Decode(&g); err != nil {
		return fmt.Errorf("benchmarks: worker: waiting for the start: %w", err)
	}
	start, end := time.Unix(0, g.Start), time.Unix(0, g.End)
	r := &runner{p: Params{Duration: end.Sub(start)}}
	res := c.run(ctx, start, end, r.stopper(start))
	if err := enc.Encode(res); err != nil {
		return err
	}
	_, _ = io.Copy(io.Discard, in) // until the parent is done with every worker
	return nil
}

func (job workerJob) build(ctx context.Context) (*crowd, func(), error) {
	e, ok := Lookup(job.System)
	if !ok {
		return nil, nil, fmt.Errorf("benchmarks: worker: no system %q", job.System)
	}
	if job.Clients < 1 || job.Name == "" {
		return nil, nil, fmt.Errorf("benchmarks: worker: bad job: %d clients on %q", job.Clients, job.Name)
	}
	sys, err := e.New(ctx, job.Env)
	if err != nil {
		return nil, nil, err
	}
	cs, closeAll, err := newClients(ctx, sys, job.Clients)
	if err != nil {
		_ = sys.Close()
		return nil, nil, err
	}
	cleanup := func() {
		closeAll()
		_ = sys.Close()
	}
	return &crowd{sys: sys, cs: cs, firstID: job.FirstID, name: job.Name, hold: job.Hold, timeout: job.Timeout}, cleanup, nil
}

// worker is a running worker process, seen from the parent.
type worker struct {
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	dec    *json.Decoder
	enc    *json.Encoder
	stderr *bytes.Buffer
	exited chan struct{} // closed by stop
	once   sync.Once
}

// startWorkers starts procs workers running n clients between them, and
// returns once every one has its clients connected.
func (r *runner) startWorkers(ctx context.Context, n, procs int) ([]*worker, error) {
	env := r.p.Spread.Env
	if j, ok := r.sys.(joinable); ok {
		env.Join = j.joinKey()
	}
	ws := make([]*worker, 0, procs)
	for i := range procs {
		lo, hi := i*n/procs, (i+1)*n/procs
		w, err := startWorker(ctx, r.p.Spread.Command(ctx))
		if err != nil {
			return ws, err
		}
		ws = append(ws, w)
		job := workerJob{System: r.name, Env: env, Name: r.prefix, FirstID: lo, Clients: hi - lo, Hold: r.p.Hold, Timeout: r.p.Timeout}
		if err := w.enc.Encode(job); err != nil {
			return ws, w.fail("sending the job", err)
		}
	}
	errs := make([]error, len(ws))
	var wg sync.WaitGroup
	for i, w := range ws {
		wg.Go(func() {
			var ready workerReady
			if err := w.dec.Decode(&ready); err != nil {
				errs[i] = w.fail("connecting its clients", err)
			} else if ready.Error != "" {
				errs[i] = fmt.Errorf("worker %d: %s", i, ready.Error)
			}
		})
	}
	wg.Wait()
	return ws, errors.Join(errs...)
}

func startWorker(ctx context.Context, cmd *exec.Cmd) (*worker, error) {
	w := &worker{cmd: cmd, stderr: new(bytes.Buffer), exited: make(chan struct{})}
	cmd.Stderr = w.stderr
	var err error
	if w.stdin, err = cmd.StdinPipe(); err != nil {
		return nil, err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("benchmarks: starting a worker: %w", err)
	}
	w.dec, w.enc = json.NewDecoder(stdout), json.NewEncoder(w.stdin)
	go func() {
		select {
		case <-ctx.Done():
			_ = w.stdin.Close() // a worker waiting for the word gives up
		case <-w.exited:
		}
	}()
	return w, nil
}

// run starts the worker's clients at g's times and returns what they
// measured.
func (w *worker) run(g workerGo) (crowdResult, error) {
	var res crowdResult
	if err := w.enc.Encode(g); err != nil {
		return res, w.fail("sending the start", err)
	}
	if err := w.dec.Decode(&res); err != nil {
		return res, w.fail("reading its results", err)
	}
	return res, nil
}

// fail returns err with what the worker said on stderr.
func (w *worker) fail(doing string, err error) error {
	w.stop()
	msg := strings.TrimSpace(w.stderr.String())
	if len(msg) > 2000 {
		msg = msg[len(msg)-2000:]
	}
	return fmt.Errorf("worker %d: %s: %w (stderr: %q)", w.cmd.Process.Pid, doing, err, msg)
}

// stop closes the worker's input, which ends it, and waits for it to
// exit, killing it after a minute.
func (w *worker) stop() {
	w.once.Do(func() {
		_ = w.stdin.Close()
		done := make(chan struct{})
		go func() {
			_ = w.cmd.Wait()
			close(done)
		}()
		select {
		case <-done:
		case <-time.After(time.Minute):
			_ = w.cmd.Process.Kill()
			<-done
		}
		close(w.exited)
	})
}
