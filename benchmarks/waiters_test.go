package benchmarks

import (
	"bytes"
	"context"
	"encoding/xml"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"
)

// workerEnv, set in a test binary's environment, makes it a worker
// process of the waiters scenario instead of running tests.
const workerEnv = "LATCHKEY_BENCHMARKS_WORKER"

func TestMain(m *testing.M) {
	if os.Getenv(workerEnv) == "1" {
		if err := ServeWorker(context.Background(), os.Stdin, os.Stdout); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// testWorker runs this test binary as a worker process.
func testWorker(ctx context.Context) *exec.Cmd {
	cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), workerEnv+"=1")
	return cmd
}

// TestWaitersReport runs the waiters scenario at 2 and 4 clients, two
// clients per worker process, on an in-process system, a Redis one
// (counted at the masters) and a NATS one (counted by each worker's
// connections, on the bucket the parent made), and checks that every
// figure the report promises is there and sane.
func TestWaitersReport(t *testing.T) {
	bk := newBrokers(t)
	var (
		entries []Entry
		env     Env
	)
	for _, name := range []string{"memlock", "redlockprio/N1", "natsputex"} {
		e, _ := Lookup(name)
		entries = append(entries, e)
		env = bk.env(t, e)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	counts := []int{2, 4}
	p := Params{Duration: 300 * time.Millisecond, Waiters: counts, Spread: &Spread{Command: testWorker, PerProcess: 2}}
	rep, err := RunAll(ctx, env, entries, []string{Waiters}, p, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range rep.Skipped {
		t.Errorf("%s × %s left out: %s", s.System, s.Scenario, s.Reason)
	}
	for _, e := range entries {
		for _, n := range counts {
			sc := WaitersScenario(n)
			r, ok := rep.Find(e.Name, sc)
			if !ok {
				t.Errorf("%s × %s: no result", e.Name, sc)
				continue
			}
			m := func(name string) float64 {
				t.Helper()
				v, ok := rep.Metric(e.Name, sc, name)
				if !ok {
					t.Errorf("%s × %s: no %s", e.Name, sc, name)
				}
				return v
			}
			procs := 1
			if e.Needs != 0 {
				procs = (n + 1) / 2
			}
			checkCrowd(t, r, m, n, procs)
			ops, hasOps := rep.Metric(e.Name, sc, MetricOpsPerHandoff)
			_, hasOut := rep.Metric(e.Name, sc, MetricOutPerHandoff)
			switch {
			case e.Needs == 0:
				if hasOps {
					t.Errorf("%s × %s: broker ops %v for an in-process system", e.Name, sc, ops)
				}
			case !hasOps || ops < 2:
				// Every hand-off takes and frees the name at the broker.
				t.Errorf("%s × %s: broker ops per hand-off = %v (counted: %v), want >= 2", e.Name, sc, ops, hasOps)
			case hasOut != (e.Needs == NATS):
				t.Errorf("%s × %s: messages out counted: %v, want them for NATS only", e.Name, sc, hasOut)
			}
			t.Logf("%s × %s: %d samples, %s hand-offs/s, p50 %v, p99 %v, metrics %v", e.Name, sc, r.Samples, FormatRate(r.Ops), r.P50Duration(), r.P99Duration(), r.Metrics)
		}
	}
	var tab, svg bytes.Buffer
	if err := rep.WriteTable(&tab); err != nil {
		t.Fatal(err)
	}
	if err := rep.WriteSVG(&svg); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(tab.String(), "waiters/4") || !strings.Contains(svg.String(), "<polyline") {
		t.Errorf("table or chart lacks the waiters results:\n%s", tab.String())
	}
}

// checkCrowd checks the figures of a contended or waiters result of n
// clients in procs processes.
func checkCrowd(t *testing.T, r Result, m func(string) float64, n, procs int) {
	t.Helper()
	if r.Samples < 1 || r.Ops <= 0 || r.P50 <= 0 || r.P50 > r.P99 {
		t.Errorf("%s × %s: %d samples, %v ops/s, p50 %d, p99 %d", r.System, r.Scenario, r.Samples, r.Ops, r.P50, r.P99)
	}
	if got := m(MetricClients); got != float64(n) {
		t.Errorf("%s × %s: %v clients, want %d", r.System, r.Scenario, got, n)
	}
	if got := m(MetricProcesses); got != float64(procs) {
		t.Errorf("%s × %s: %v processes, want %d", r.System, r.Scenario, got, procs)
	}
	if sw := m(MetricSwitches); sw < 0 || sw > r.Ops*1.0001 {
		t.Errorf("%s × %s: %v hand-offs to another client/s of %v hand-offs/s", r.System, r.Scenario, sw, r.Ops)
	}
	if share := m(MetricTopShare); share < 1/float64(n)-1e-9 || share > 1 {
		t.Errorf("%s × %s: busiest client's share %v, want within [1/%d, 1]", r.System, r.Scenario, share, n)
	}
	if longest := m(MetricMaxWait); longest < float64(r.P99) {
		t.Errorf("%s × %s: longest wait %v < p99 %v", r.System, r.Scenario, time.Duration(longest), r.P99Duration())
	}
	if never := m(MetricNeverHeld); never < 0 || never > float64(n-1) {
		t.Errorf("%s × %s: %v clients never held the lock, of %d (one at least did)", r.System, r.Scenario, never, n)
	}
	// Two acquisitions closer than the hold are two holders at once: the
	// workers did not contend on one lock.
	if ov := m(MetricOverlaps); ov != 0 {
		t.Errorf("%s × %s: %v acquisitions came less than the hold after the one before", r.System, r.Scenario, ov)
	}
	if f := m(MetricFailed); f != 0 {
		t.Errorf("%s × %s: %v Lock or Release calls failed: %s", r.System, r.Scenario, f, r.note)
	}
}

func TestParseWaiters(t *testing.T) {
	got, err := ParseWaiters(" 1000,8, 64,8,256 ")
	if err != nil || !slices.Equal(got, []int{8, 64, 256, 1000}) {
		t.Errorf("ParseWaiters = %v, %v; want [8 64 256 1000]", got, err)
	}
	for _, bad := range []string{"", ",", "1", "0,8", "-3", "8,x", "2.5"} {
		if got, err := ParseWaiters(bad); err == nil {
			t.Errorf("ParseWaiters(%q) = %v, want an error", bad, got)
		}
	}
	for _, tc := range []struct {
		in   string
		base string
		n    int
	}{{"waiters/64", Waiters, 64}, {"waiters", Waiters, 0}, {"contended", Contended, 0}, {"waiters/x", "waiters/x", 0}, {"waiters/0", "waiters/0", 0}} {
		if b, n := splitScenario(tc.in); b != tc.base || n != tc.n {
			t.Errorf("splitScenario(%q) = %q, %d; want %q, %d", tc.in, b, n, tc.base, tc.n)
		}
	}
}

func TestSumCommandCalls(t *testing.T) {
	info := "# Commandstats\r\n" +
		"cmdstat_set:calls=10,usec=20,usec_per_call=2.00,rejected_calls=0,failed_calls=0\r\n" +
		"cmdstat_info:calls=7,usec=70,usec_per_call=10.00,rejected_calls=0,failed_calls=0\r\n" +
		"cmdstat_client|setinfo:calls=2,usec=1,usec_per_call=0.50,rejected_calls=0,failed_calls=0\r\n" +
		"cmdstat_evalsha:calls=5,usec=50,usec_per_call=10.00,rejected_calls=1,failed_calls=0\r\n"
	if n, err := sumCommandCalls(info); err != nil || n != 17 {
		t.Errorf("sumCommandCalls = %d, %v; want 17 (10 + 2 + 5, INFO left out)", n, err)
	}
	if _, err := sumCommandCalls("cmdstat_set:calls=x,usec=1\r\n"); err == nil {
		t.Error("sumCommandCalls took calls=x")
	}
}

// TestWaitersTableAndChart checks the report of the contended and waiters
// scenarios: counts in numeric order, "n/a" where the broker was not
// counted, and a well-formed chart with one line per system.
func TestWaitersTableAndChart(t *testing.T) {
	rep := &Report{Machine: ThisMachine()}
	for i, n := range []int{1000, 8, 64} {
		for _, sys := range []string{"redlockprio/N1", "amqpsem/mutex", "natsputex"} {
			metrics := map[string]float64{MetricSwitches: float64(100 * (i + 1)), MetricTopShare: 0.5, MetricMaxWait: 3e6,
				MetricNeverHeld: 0, MetricClients: float64(n), MetricProcesses: 1, MetricOverlaps: 0, MetricFailed: 0}
			if sys != "amqpsem/mutex" {
				metrics[MetricOpsPerHandoff] = 4.5
			}
			if sys == "natsputex" {
				metrics[MetricOutPerHandoff] = 9
			}
			rep.Add(Result{System: sys, Scenario: WaitersScenario(n), Samples: 10, P50: 1e5, P90: 2e5, P99: 3e5, Ops: 1000, Metrics: metrics})
		}
	}
	// A run in which nobody got the lock: no hand-offs, but the
	// broker's work per second.
	rep.Add(Result{System: "redlockprio/N3", Scenario: WaitersScenario(1000), Metrics: map[string]float64{MetricSwitches: 0, MetricTopShare: 0,
		MetricMaxWait: 2e9, MetricNeverHeld: 1000, MetricClients: 1000, MetricProcesses: 4, MetricOverlaps: 0, MetricFailed: 54, MetricOpsPerSecond: 12000}})
	var tab bytes.Buffer
	if err := rep.WriteTable(&tab); err != nil {
		t.Fatal(err)
	}
	s := tab.String()
	i8, i64, i1000 := strings.Index(s, "waiters/8|"), strings.Index(s, "waiters/64|"), strings.Index(s, "waiters/1000|")
	if i8 < 0 || i8 > i64 || i64 > i1000 {
		t.Errorf("waiter counts not in numeric order (8 at %d, 64 at %d, 1000 at %d):\n%s", i8, i64, i1000, s)
	}
	for _, want := range []string{"n/a", "4.50 (9.00 out)", "3.00ms", "50%", "- (12.0k ops/s)"} {
		if !strings.Contains(s, want) {
			t.Errorf("table lacks %q:\n%s", want, s)
		}
	}
	var svg bytes.Buffer
	if err := rep.WriteSVG(&svg); err != nil {
		t.Fatal(err)
	}
	d := xml.NewDecoder(bytes.NewReader(svg.Bytes()))
	for {
		if _, err := d.Token(); err != nil {
			if err != io.EOF {
				t.Fatalf("SVG is not well-formed XML: %v", err)
			}
			break
		}
	}
	if got := strings.Count(svg.String(), "<polyline"); got != 3 {
		t.Errorf("SVG has %d lines, want 3 (one per system)", got)
	}
}

// TestWaitersAMQPConnections checks that a waiter count needing more
// RabbitMQ connections than allowed is not applicable, before any I/O
// (the URL here leads nowhere).
func TestWaitersAMQPConnections(t *testing.T) {
	for _, name := range []string{"amqpsem/mutex", "floor/amqp"} {
		e, _ := Lookup(name)
		sys, err := e.New(t.Context(), Env{AMQP: "amqp://guest:guest@127.0.0.1:1/"})
		if err != nil {
			t.Fatal(err)
		}
		_, err = Run(t.Context(), sys, name, WaitersScenario(4), Params{Duration: time.Second, AMQPConnections: 4})
		if !errors.Is(err, ErrNotApplicable) || !strings.Contains(err.Error(), "5 RabbitMQ connections") {
			t.Errorf("%s at 4 waiters, 4 connections allowed: err = %v, want ErrNotApplicable naming 5 connections", name, err)
		}
		_ = sys.Close()
	}
}

// TestJoinedSystemShares checks what the waiters scenario's workers rely
// on: a system built in a worker from the parent's Env (with Env.Join set
// from the parent's system) locks the same names, and closing it deletes
// nothing the parent's system still uses.
func TestJoinedSystemShares(t *testing.T) {
	bk := newBrokers(t)
	for _, name := range []string{"natsputex", "floor/nats-kv", "redlockprio/N1", "amqpsem/mutex"} {
		t.Run(name, func(t *testing.T) {
			e, _ := Lookup(name)
			env := bk.env(t, e)
			ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
			defer cancel()
			parent, err := e.New(ctx, env)
			if err != nil {
				t.Fatal(err)
			}
			defer parent.Close()
			a, err := parent.NewClient(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer a.Close()
			lockName := lockPrefix("join")
			h, err := a.Lock(ctx, lockName)
			if err != nil {
				t.Fatal(err)
			}
			if j, ok := parent.(joinable); ok {
				env.Join = j.joinKey()
			}
			worker, err := e.New(ctx, env)
			if err != nil {
				t.Fatal(err)
			}
			b, err := worker.NewClient(ctx)
			if err != nil {
				t.Fatal(err)
			}
			// While a holds the name, the worker's client must not get it.
			short, cancelShort := context.WithTimeout(ctx, 300*time.Millisecond)
			if hb, err := b.Lock(short, lockName); err == nil {
				_ = hb.Release(ctx)
				t.Errorf("the worker's client got %q while the parent's held it: not one lock", lockName)
			}
			cancelShort()
			if err := h.Release(ctx); err != nil {
				t.Fatal(err)
			}
			hb, err := b.Lock(ctx, lockName)
			if err != nil {
				t.Fatalf("the worker's client, after the parent's released: %v", err)
			}
			if err := hb.Release(ctx); err != nil {
				t.Fatal(err)
			}
			if err := b.Close(); err != nil {
				t.Error(err)
			}
			if err := worker.Close(); err != nil {
				t.Error(err)
			}
			// The worker's Close left the parent's system whole.
			h, err = a.Lock(ctx, lockName)
			if err != nil {
				t.Fatalf("the parent's client after the worker closed: %v", err)
			}
			if err := h.Release(ctx); err != nil {
				t.Fatal(err)
			}
		})
	}
}
