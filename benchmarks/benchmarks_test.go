package benchmarks

import (
	"bytes"
	"context"
	"encoding/json"
	"encoding/xml"
	"errors"
	"math"
	"slices"
	"strings"
	"testing"
	"time"
)

// testTTL keeps the many scenario's renewal window short in tests (a
// TTL: three renewal intervals), and long enough for redlockprio's call
// timeout (TTL/10 here, 300ms) to outlast a stall of a loaded machine
// under the race detector (a CI run: with 900ms, 200ms, a release on five
// masters timed out on all of them).
const testTTL = 3 * time.Second

// testOps is how many operations each scenario measures in TestScenarios:
// enough to prove the harness works, not to measure anything.
const testOps = 20

// TestScenarios runs every system of the registry through every scenario a
// few times on real brokers. A system whose broker is missing is skipped
// through testenv.Missing (a failure under CI); a scenario that does not
// apply to a system is skipped with the reason.
func TestScenarios(t *testing.T) {
	bk := newBrokers(t)
	for _, e := range Systems() {
		t.Run(e.Name, func(t *testing.T) {
			if e.NotWired != "" {
				t.Skip(e.NotWired)
			}
			env := bk.env(t, e)
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			sys, err := e.New(ctx, env)
			if err != nil {
				t.Fatalf("New: %v", err)
			}
			t.Cleanup(func() {
				if err := sys.Close(); err != nil {
					t.Errorf("Close: %v", err)
				}
			})
			for _, sc := range Scenarios() {
				t.Run(sc, func(t *testing.T) {
					p := Params{Ops: testOps, Workers: 4, SemaphoreSize: 3, Leases: testOps, Timeout: 30 * time.Second}
					res, err := Run(ctx, sys, e.Name, sc, p)
					if errors.Is(err, ErrNotApplicable) {
						t.Skip(err)
					}
					if err != nil {
						t.Fatal(err)
					}
					checkResult(t, res, e.Name, sc)
					t.Logf("%s × %s: %d samples, p50 %v, p99 %v, %s ops/s, %v", e.Name, sc, res.Samples,
						res.P50Duration(), res.P99Duration(), FormatRate(res.Ops), res.Metrics)
				})
			}
		})
	}
}

func checkResult(t *testing.T, r Result, system, scenario string) {
	t.Helper()
	if r.System != system || r.Scenario != scenario {
		t.Errorf("result is for %s × %s, want %s × %s", r.System, r.Scenario, system, scenario)
	}
	if r.Samples != testOps {
		t.Errorf("%d samples, want %d", r.Samples, testOps)
	}
	if r.P50 <= 0 || r.P50 > r.P90 || r.P90 > r.P99 {
		t.Errorf("percentiles out of order: p50 %d p90 %d p99 %d", r.P50, r.P90, r.P99)
	}
	if scenario == Many {
		if _, ok := r.Metrics["bytes_per_lease"]; !ok {
			t.Errorf("many: no bytes_per_lease in %v", r.Metrics)
		}
		if r.Metrics["renew_errors"] != 0 {
			t.Errorf("many: %v renewals failed", r.Metrics["renew_errors"])
		}
		// The window lasts three renew intervals: every lease must have
		// been renewed at least once, in some round trip.
		if r.Ops <= 0 {
			t.Errorf("many: no renewal round trips in the window")
		}
		return
	}
	if r.Ops <= 0 {
		t.Errorf("ops/s = %v", r.Ops)
	}
	if scenario == Contended || scenario == Waiters {
		// Every system reports its fairness and longest wait, in one
		// process here (4 clients, Ops-bounded).
		m := func(name string) float64 {
			t.Helper()
			v, ok := r.Metrics[name]
			if !ok {
				t.Errorf("%s: no %s in %v", scenario, name, r.Metrics)
			}
			return v
		}
		checkCrowd(t, r, m, 4, 1)
	}
}

func TestRegistry(t *testing.T) {
	want := []string{
		"memlock", "natsputex", "natsputex+otel", "natsputex/R3", "amqpsem/mutex", "amqpsem/semaphore",
		"amqpsem/quorum", "redlockprio/N1", "redlockprio/N3", "redlockprio/N3+otel", "redlockprio/N5",
		"redsync/N1", "redsync/N3", "redsync/N5", "redislock",
		"floor/redis", "floor/nats-kv", "floor/amqp",
	}
	es := Systems()
	if got := Names(es); !slices.Equal(got, want) {
		t.Fatalf("systems = %q, want %q", got, want)
	}
	for _, e := range es {
		for _, ref := range append([]string{e.Floor}, e.Peers...) {
			if ref == "" {
				continue
			}
			r, ok := Lookup(ref)
			if !ok {
				t.Errorf("%s refers to unknown system %q", e.Name, ref)
			} else if r.Kind == Backend {
				t.Errorf("%s is compared with backend %q", e.Name, ref)
			}
		}
		if e.New == nil {
			t.Errorf("%s has no constructor", e.Name)
		}
		if _, err := e.New(context.Background(), Env{}); e.Needs != 0 && !errors.Is(err, ErrUnavailable) {
			t.Errorf("%s on an empty Env: err = %v, want ErrUnavailable", e.Name, err)
		}
	}
	for _, tc := range []struct {
		patterns string
		want     []string
	}{
		{"redsync/*", []string{"redsync/N1", "redsync/N3", "redsync/N5"}},
		{"floor/", []string{"floor/redis", "floor/nats-kv", "floor/amqp"}},
		{"redislock, memlock", []string{"memlock", "redislock"}},
		{"*/N1", []string{"redlockprio/N1", "redsync/N1"}},
		{"redlockprio/*", []string{"redlockprio/N1", "redlockprio/N3", "redlockprio/N5"}},
		{"natsputex+otel,natsputex", []string{"natsputex", "natsputex+otel"}},
	} {
		got, err := Match(tc.patterns)
		if err != nil {
			t.Errorf("Match(%q): %v", tc.patterns, err)
			continue
		}
		if !slices.Equal(Names(got), tc.want) {
			t.Errorf("Match(%q) = %q, want %q", tc.patterns, Names(got), tc.want)
		}
	}
	if all, _ := Match(""); len(all) != len(want)-2 {
		t.Errorf("Match(\"\") = %d systems, want all %d but the 2 variants", len(all), len(want)-2)
	}
	n3, _ := Lookup("redlockprio/N3")
	withOtel := WithVariants([]Entry{es[0], es[1], n3})
	if got, want := Names(withOtel), []string{"memlock", "natsputex", "natsputex+otel", "redlockprio/N3", "redlockprio/N3+otel"}; !slices.Equal(got, want) {
		t.Errorf("WithVariants(memlock, natsputex, redlockprio/N3) = %q, want %q", got, want)
	}
	for _, bad := range []string{"nosuch", "redsync/[", "memlock,typo*"} {
		if _, err := Match(bad); err == nil {
			t.Errorf("Match(%q) did not fail", bad)
		}
	}
}

func TestPercentiles(t *testing.T) {
	var ds []time.Duration
	for i := 100; i >= 1; i-- {
		ds = append(ds, time.Duration(i))
	}
	r := newResult(ds, 100, time.Second)
	if r.P50 != 50 || r.P90 != 90 || r.P99 != 99 || r.Samples != 100 || r.Ops != 100 {
		t.Errorf("got %+v", r)
	}
	if r := newResult([]time.Duration{7}, 1, time.Second); r.P50 != 7 || r.P99 != 7 {
		t.Errorf("one sample: %+v", r)
	}
}

func sampleReport() *Report {
	rep := &Report{Machine: ThisMachine(), RTT: map[string]int64{"Redis": 50_000}}
	for _, r := range []Result{
		{System: "redlockprio/N1", Scenario: Uncontended, Samples: 10, P50: 110_000, P90: 150_000, P99: 200_000, Ops: 9000},
		{System: "redislock", Scenario: Uncontended, Samples: 10, P50: 100_000, P90: 140_000, P99: 190_000, Ops: 10000},
		{System: "redsync/N1", Scenario: Uncontended, Samples: 10, P50: 200_000, P90: 300_000, P99: 400_000, Ops: 5000},
		{System: "floor/redis", Scenario: Uncontended, Samples: 10, P50: 80_000, P90: 90_000, P99: 100_000, Ops: 12000},
		{System: "redlockprio/N1", Scenario: Contended, Samples: 10, P50: 1_000_000, P90: 2_000_000, P99: 3_000_000, Ops: 3000},
		{System: "redsync/N1", Scenario: Contended, Samples: 10, P50: 100_000_000, P90: 200_000_000, P99: 250_000_000, Ops: 30},
		{System: "redislock", Scenario: Contended, Samples: 10, P50: 20_000_000, P90: 30_000_000, P99: 40_000_000, Ops: 60},
		{System: "redlockprio/N1", Scenario: Handoff, Samples: 10, P50: 150_000, P90: 150_000, P99: 150_000, Ops: 100},
		{System: "redlockprio/N1", Scenario: Many, Samples: 10000, P50: 150_000, P90: 150_000, P99: 150_000, Ops: 1,
			Metrics: map[string]float64{"bytes_per_lease": 900, "round_trips_per_master_per_tick": 1, "renew_errors": 0}},
	} {
		rep.Add(r)
	}
	rep.Skip("amqpsem/mutex", "", "RabbitMQ is not available")
	return rep
}

func TestReportRatios(t *testing.T) {
	rep := sampleReport()
	r, _ := rep.Find("redlockprio/N1", Uncontended)
	if fr, ok := rep.FloorRatio(r); !ok || fr.Against != "floor/redis" || fr.Value != 110.0/80 {
		t.Errorf("floor ratio = %+v, %v", fr, ok)
	}
	// The best peer for latency is the lowest p50: redislock.
	if pr, ok := rep.PeerRatio(r); !ok || pr.Against != "redislock" || pr.Value != 1.1 {
		t.Errorf("peer ratio = %+v, %v", pr, ok)
	}
	// For contended, the best peer is the highest rate: redislock again.
	r, _ = rep.Find("redlockprio/N1", Contended)
	if pr, ok := rep.PeerRatio(r); !ok || pr.Against != "redislock" || pr.Value != 50 {
		t.Errorf("contended peer ratio = %+v, %v", pr, ok)
	}
	r, _ = rep.Find("floor/redis", Uncontended)
	if _, ok := rep.FloorRatio(r); ok {
		t.Errorf("a floor has a floor ratio")
	}
}

func TestReportJSONSchema(t *testing.T) {
	var buf bytes.Buffer
	if err := sampleReport().WriteJSON(&buf); err != nil {
		t.Fatal(err)
	}
	var doc map[string]json.RawMessage
	if err := json.Unmarshal(buf.Bytes(), &doc); err != nil {
		t.Fatal(err)
	}
	if _, ok := doc["machine"]; !ok {
		t.Error("no machine")
	}
	var results []map[string]any
	if err := json.Unmarshal(doc["results"], &results); err != nil {
		t.Fatal(err)
	}
	want := []string{"ops_per_s", "p50_ns", "p90_ns", "p99_ns", "samples", "scenario", "system"}
	for _, r := range results {
		var keys []string
		for k := range r {
			keys = append(keys, k)
		}
		slices.Sort(keys)
		if !slices.Equal(keys, want) {
			t.Fatalf("result keys = %q, want exactly %q", keys, want)
		}
	}
	if len(results) != 9 || results[0]["system"] != "redlockprio/N1" || results[0]["p50_ns"] != 110000.0 {
		t.Errorf("results = %v", results)
	}
}

func TestReportTableAndSVG(t *testing.T) {
	rep := sampleReport()
	var tab bytes.Buffer
	if err := rep.WriteTable(&tab); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"redlockprio/N1", "1.38× floor/redis", "1.10× redislock", "50.0× redislock", "handoff p50 in broker round trips: redlockprio/N1 3.0", "amqpsem/mutex: RabbitMQ is not available"} {
		if !strings.Contains(tab.String(), want) {
			t.Errorf("table lacks %q:\n%s", want, tab.String())
		}
	}
	var svg bytes.Buffer
	if err := rep.WriteSVG(&svg); err != nil {
		t.Fatal(err)
	}
	d := xml.NewDecoder(bytes.NewReader(svg.Bytes()))
	n := 0
	for {
		_, err := d.Token()
		if err != nil {
			if err.Error() != "EOF" {
				t.Fatalf("SVG is not well-formed XML: %v", err)
			}
			break
		}
		n++
	}
	if n < 20 || !strings.Contains(svg.String(), "redislock") {
		t.Errorf("SVG looks empty (%d tokens)", n)
	}
}

// The benchmarks run the same scenarios with b.N operations. They start
// every broker they need through testenv, once per benchmark function.

func BenchmarkUncontended(b *testing.B) { benchScenario(b, Uncontended) }
func BenchmarkContended(b *testing.B)   { benchScenario(b, Contended) }
func BenchmarkHandoff(b *testing.B)     { benchScenario(b, Handoff) }
func BenchmarkSemaphore(b *testing.B)   { benchScenario(b, Semaphore) }

// BenchmarkMany holds 10,000 leases per system once, whatever b.N.
func BenchmarkMany(b *testing.B) { benchScenario(b, Many) }

func benchScenario(b *testing.B, scenario string) {
	bk := newBrokers(b)
	for _, e := range Systems() {
		var sys System
		b.Run(e.Name, func(b *testing.B) {
			if e.NotWired != "" {
				b.Skip(e.NotWired)
			}
			ctx := context.Background()
			if sys == nil {
				env := bk.env(b, e)
				env.TTL = DefaultTTL
				s, err := e.New(ctx, env)
				if err != nil {
					b.Fatal(err)
				}
				sys = s
			}
			p := Params{Ops: b.N}
			if scenario == Many {
				p = Params{Duration: time.Second}
			}
			res, err := Run(ctx, sys, e.Name, scenario, p)
			if errors.Is(err, ErrNotApplicable) {
				b.Skip(err)
			}
			if err != nil {
				b.Fatal(err)
			}
			if res.Ops > 0 {
				b.ReportMetric(1e9/res.Ops, "ns/op")
			}
			b.ReportMetric(float64(res.P50), "p50-ns")
			b.ReportMetric(float64(res.P99), "p99-ns")
			b.ReportMetric(res.Ops, "ops/s")
			for k, v := range res.Metrics {
				b.ReportMetric(v, k)
			}
		})
		if sys != nil {
			_ = sys.Close()
		}
	}
}

func TestOverheads(t *testing.T) {
	rep := &Report{}
	rep.Add(Result{System: "natsputex", Scenario: Uncontended, P50: 1000, Ops: 900})
	rep.Add(Result{System: "natsputex+otel", Scenario: Uncontended, P50: 1030, Ops: 880})
	rep.Add(Result{System: "natsputex", Scenario: Contended, P50: 1, Ops: 500})
	rep.Add(Result{System: "natsputex+otel", Scenario: Contended, P50: 1, Ops: 400})
	rep.Add(Result{System: "redlockprio/N3+otel", Scenario: Uncontended, P50: 1000}) // no twin measured
	rep.addOverheads()
	if v, ok := rep.Metric("natsputex+otel", Uncontended, OverheadMetric); !ok || math.Abs(v-0.03) > 1e-9 {
		t.Errorf("uncontended overhead = %v, %v; want 0.03 (1030 ÷ 1000 − 1)", v, ok)
	}
	if v, ok := rep.Metric("natsputex+otel", Contended, OverheadMetric); !ok || math.Abs(v-0.25) > 1e-9 {
		t.Errorf("contended overhead = %v, %v; want 0.25 (500 ÷ 400 − 1)", v, ok)
	}
	if v, ok := rep.Metric("redlockprio/N3+otel", Uncontended, OverheadMetric); ok {
		t.Errorf("overhead without a twin = %v, want none", v)
	}
	var out bytes.Buffer
	if err := rep.WriteTable(&out); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), "+3.0%") || !strings.Contains(out.String(), "+25.0%") {
		t.Errorf("table has no +3.0%% and +25.0%% overheads:\n%s", out.String())
	}
}

func TestRoundOrder(t *testing.T) {
	var entries []Entry
	for _, n := range []string{"a", "b", "c", "d", "e", "f"} {
		entries = append(entries, Entry{Name: n})
	}
	names := func(es []Entry) string {
		var b strings.Builder
		for _, e := range es {
			b.WriteString(e.Name)
		}
		return b.String()
	}
	var got []string
	for r := range 3 {
		got = append(got, names(roundOrder(entries, r, 3)))
	}
	if want := []string{"abcdef", "cbafed", "efabcd"}; !slices.Equal(got, want) {
		t.Errorf("orders of 3 rounds: %q, want %q", got, want)
	}
}

func TestMedianRound(t *testing.T) {
	rs := []Result{
		{System: "x", Scenario: Uncontended, P50: 300},
		{System: "x", Scenario: Uncontended, P50: 100},
		{System: "x", Scenario: Uncontended, P50: 200, Metrics: map[string]float64{"k": 1}},
	}
	m := medianRound(rs, true)
	if m.P50 != 200 || m.Metrics["k"] != 1 || m.Metrics["round_spread"] != 1 {
		t.Errorf("median of p50s 300, 100, 200: %+v, want p50 200, k 1, round_spread (300-100)/200 = 1", m)
	}
	if rs[2].Metrics["round_spread"] != 0 {
		t.Errorf("medianRound changed its input's metrics: %v", rs[2].Metrics)
	}
	c := medianRound([]Result{{Scenario: Contended, Ops: 10}, {Scenario: Contended, Ops: 30}}, false)
	if c.Ops != 10 || c.Metrics != nil {
		t.Errorf("median of two contended rounds without spread: %+v, want the lower, no metrics", c)
	}
}
