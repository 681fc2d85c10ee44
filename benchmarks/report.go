package benchmarks

import (
	"encoding/json"
	"fmt"
	"io"
	"math"
	"os"
	"runtime"
	"slices"
	"sort"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
)

// Report is a whole run: where it ran, and what it measured. Its JSON form
// is the stable schema lockbench writes with --json:
//
//	{"machine": {...}, "results": [{"system", "scenario", "samples",
//	"p50_ns", "p90_ns", "p99_ns", "ops_per_s"}, ...], ...}
//
// Entries of results carry exactly those keys. Everything else (metrics,
// skipped systems, broker round-trip times) sits beside results.
type Report struct {
	Machine Machine  `json:"machine"`
	Results []Result `json:"results"`

	// Metrics are scenario-specific figures (see [Result.Metrics]).
	Metrics []Metric `json:"metrics,omitempty"`
	// Skipped lists the systems, or system×scenario pairs, left out, and why.
	Skipped []Skipped `json:"skipped,omitempty"`
	// Notes are what runs saw that their figures do not say (calls that
	// failed, the first error), by system×scenario.
	Notes []Skipped `json:"notes,omitempty"`
	// RTT is the median round trip of each broker, measured in the same
	// run with its cheapest request (Redis PING, NATS PING, AMQP basic.qos),
	// in nanoseconds, keyed by [Broker.String].
	RTT map[string]int64 `json:"broker_rtt_p50_ns,omitempty"`
	// IdleRTT is the same round trip started after IdleGap of silence on
	// the connection, as a hand-off's are (see [BrokerRTT]).
	IdleRTT map[string]int64 `json:"broker_idle_rtt_p50_ns,omitempty"`
}

// Metric is one scenario-specific figure.
type Metric struct {
	System   string  `json:"system"`
	Scenario string  `json:"scenario"`
	Name     string  `json:"name"`
	Value    float64 `json:"value"`
}

// Skipped is a system (Scenario empty) or a system×scenario pair that was
// not measured.
type Skipped struct {
	System   string `json:"system"`
	Scenario string `json:"scenario,omitempty"`
	Reason   string `json:"reason"`
}

// Machine describes where a run happened.
type Machine struct {
	Hostname  string            `json:"hostname"`
	OS        string            `json:"os"`
	Arch      string            `json:"arch"`
	Kernel    string            `json:"kernel,omitempty"`
	CPU       string            `json:"cpu,omitempty"`
	CPUs      int               `json:"cpus"`
	GoVersion string            `json:"go_version"`
	Started   time.Time         `json:"started"`
	Params    map[string]string `json:"params,omitempty"`
	Brokers   map[string]string `json:"brokers,omitempty"`
}

// ThisMachine describes the machine the process runs on.
func ThisMachine() Machine {
	m := Machine{OS: runtime.GOOS, Arch: runtime.GOARCH, CPUs: runtime.NumCPU(), GoVersion: runtime.Version(), Started: time.Now().UTC().Truncate(time.Second)}
	m.Hostname, _ = os.Hostname()
	if b, err := os.ReadFile("/proc/sys/kernel/osrelease"); err == nil {
		m.Kernel = strings.TrimSpace(string(b))
	}
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for line := range strings.SplitSeq(string(b), "\n") {
			if k, v, ok := strings.Cut(line, ":"); ok && strings.TrimSpace(k) == "model name" {
				m.CPU = strings.TrimSpace(v)
				break
			}
		}
	}
	return m
}

// Add records a result and its metrics.
func (rep *Report) Add(r Result) {
	rep.Results = append(rep.Results, r)
	names := make([]string, 0, len(r.Metrics))
	for k := range r.Metrics {
		names = append(names, k)
	}
	sort.Strings(names)
	for _, k := range names {
		rep.Metrics = append(rep.Metrics, Metric{System: r.System, Scenario: r.Scenario, Name: k, Value: r.Metrics[k]})
	}
}

// Skip records that system (and scenario, if not empty) was not measured.
func (rep *Report) Skip(system, scenario, reason string) {
	rep.Skipped = append(rep.Skipped, Skipped{System: system, Scenario: scenario, Reason: reason})
}

// Find returns the result for system × scenario.
func (rep *Report) Find(system, scenario string) (Result, bool) {
	for _, r := range rep.Results {
		if r.System == system && r.Scenario == scenario {
			return r, true
		}
	}
	return Result{}, false
}

// Metric returns a metric's value.
func (rep *Report) Metric(system, scenario, name string) (float64, bool) {
	for _, m := range rep.Metrics {
		if m.System == system && m.Scenario == scenario && m.Name == name {
			return m.Value, true
		}
	}
	return 0, false
}

// HigherIsBetter reports whether a scenario's headline figure is a rate
// (ops/s, higher is better) rather than the p50 latency (lower is better).
// The many scenario's headline is its renewal round trips per second, where
// lower is better.
func HigherIsBetter(scenario string) bool {
	base, _ := splitScenario(scenario)
	return base == Contended || base == Waiters
}

// headline returns the figure ratios are taken on.
func headline(r Result) float64 {
	if HigherIsBetter(r.Scenario) || r.Scenario == Many {
		return r.Ops
	}
	return float64(r.P50)
}

// Ratio is one result's headline figure divided by another system's in the
// same scenario: p50 for latency scenarios, ops/s for contended (hand-offs)
// and many (renewal round trips).
type Ratio struct {
	Against string
	Value   float64
}

func (x Ratio) String() string {
	if x.Against == "" {
		return "-"
	}
	return fmt.Sprintf("%s× %s", fmtRatio(x.Value), x.Against)
}

func fmtRatio(v float64) string {
	switch {
	case v >= 100:
		return fmt.Sprintf("%.0f", v)
	case v >= 10:
		return fmt.Sprintf("%.1f", v)
	case v >= 0.01 || v == 0:
		return fmt.Sprintf("%.2f", v)
	default:
		return strconv.FormatFloat(v, 'g', 2, 64)
	}
}

// FloorRatio returns r against its system's floor, if both were measured.
func (rep *Report) FloorRatio(r Result) (Ratio, bool) {
	e, ok := Lookup(r.System)
	if !ok || e.Floor == "" {
		return Ratio{}, false
	}
	return rep.ratio(r, e.Floor)
}

// PeerRatio returns r against the best of its system's peers that was
// measured in the same scenario.
func (rep *Report) PeerRatio(r Result) (Ratio, bool) {
	e, ok := Lookup(r.System)
	if !ok {
		return Ratio{}, false
	}
	var best Result
	found := false
	for _, p := range e.Peers {
		pr, ok := rep.Find(p, r.Scenario)
		if !ok || headline(pr) == 0 {
			continue
		}
		better := headline(pr) < headline(best)
		if HigherIsBetter(r.Scenario) {
			better = headline(pr) > headline(best)
		}
		if !found || better {
			best, found = pr, true
		}
	}
	if !found {
		return Ratio{}, false
	}
	return rep.ratio(r, best.System)
}

func (rep *Report) ratio(r Result, against string) (Ratio, bool) {
	o, ok := rep.Find(against, r.Scenario)
	if !ok || headline(o) == 0 {
		return Ratio{}, false
	}
	return Ratio{Against: against, Value: headline(r) / headline(o)}, true
}

// sorted returns the results in registry order, then scenario order.
func (rep *Report) sorted() []Result {
	order := map[string]int{}
	for i, e := range Systems() {
		order[e.Name] = i
	}
	sc := map[string]int{}
	for i, s := range Scenarios() {
		sc[s] = i
	}
	out := append([]Result(nil), rep.Results...)
	sort.SliceStable(out, func(i, j int) bool {
		a, b := out[i], out[j]
		ab, an := splitScenario(a.Scenario)
		bb, bn := splitScenario(b.Scenario)
		if sc[ab] != sc[bb] {
			return sc[ab] < sc[bb]
		}
		if an != bn {
			return an < bn
		}
		return order[a.System] < order[b.System]
	})
	return out
}

// WriteTable writes the results as one aligned text table, followed by the
// many scenario's figures, the broker round trips and what was skipped.
func (rep *Report) WriteTable(w io.Writer) error {
	if err := rep.writeResults(w); err != nil {
		return err
	}
	var many, contended []Result
	for _, r := range rep.sorted() {
		switch base, _ := splitScenario(r.Scenario); base {
		case Many:
			many = append(many, r)
		case Contended, Waiters:
			contended = append(contended, r)
		}
	}
	if err := rep.writeContended(w, contended); err != nil {
		return err
	}
	if err := rep.writeMany(w, many); err != nil {
		return err
	}
	if err := rep.writeOverheads(w); err != nil {
		return err
	}
	rep.writeRTT(w)
	if len(rep.Notes) > 0 {
		fmt.Fprintln(w)
		fmt.Fprintln(w, "notes:")
		for _, n := range rep.Notes {
			fmt.Fprintf(w, "  %s × %s: %s\n", n.System, n.Scenario, n.Reason)
		}
	}
	rep.writeSkipped(w)
	return nil
}

// writeResults writes the main table: one row per system and scenario.
func (rep *Report) writeResults(w io.Writer) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight|tabwriter.Debug)
	spread := slices.ContainsFunc(rep.Metrics, func(m Metric) bool { return m.Name == "round_spread" })
	head := "system\tscenario\tsamples\tp50\tp90\tp99\tops/s\tvs floor\tvs best peer\t"
	if spread {
		head += "spread of rounds\t"
	}
	fmt.Fprintln(tw, head)
	for _, r := range rep.sorted() {
		fr, ok := rep.FloorRatio(r)
		if !ok {
			fr = Ratio{}
		}
		pr, ok := rep.PeerRatio(r)
		if !ok {
			pr = Ratio{}
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%s\t%s\t%s\t%s\t%s\t", r.System, r.Scenario, r.Samples,
			FormatDuration(r.P50Duration()), FormatDuration(r.P90Duration()), FormatDuration(r.P99Duration()),
			FormatRate(r.Ops), fr, pr)
		if spread {
			if v, ok := rep.Metric(r.System, r.Scenario, "round_spread"); ok {
				fmt.Fprintf(tw, "%.0f%%\t", 100*v)
			} else {
				fmt.Fprint(tw, "-\t")
			}
		}
		fmt.Fprintln(tw)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintln(w, "ratios: p50 ÷ reference's p50 for uncontended, handoff, semaphore (lower is better);")
	fmt.Fprintln(w, "        ops/s ÷ reference's ops/s for contended (hand-offs, higher is better) and many (renewal round trips, lower is better).")
	fmt.Fprintln(w, "many: samples and percentiles are the acquires of the leases; ops/s is renewal round trips per second, all masters together.")
	if spread {
		fmt.Fprintln(w, "each figure is the median round's; spread of rounds: (highest − lowest) ÷ median of the figure ratios are taken on.")
	}
	return nil
}

// writeContended writes the contended and waiters scenarios' fairness,
// waits and broker operations.
func (rep *Report) writeContended(w io.Writer, contended []Result) error {
	if len(contended) == 0 {
		return nil
	}
	fmt.Fprintln(w)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight|tabwriter.Debug)
	fmt.Fprintln(tw, "contended, waiters: system\tscenario\tclients\tprocesses\thand-offs/s\tto another client/s\tp50 wait\tp99 wait\tlongest wait\tbusiest client's share\tnever held\tfailed calls\tbroker ops/hand-off\t")
	na := false
	for _, r := range contended {
		m := func(name string) (float64, bool) { return rep.Metric(r.System, r.Scenario, name) }
		sw, _ := m(MetricSwitches)
		share, _ := m(MetricTopShare)
		cell := func(name string) string {
			if v, ok := m(name); ok {
				return strconv.FormatFloat(v, 'f', 0, 64)
			}
			return "-"
		}
		longest := "-"
		if v, ok := m(MetricMaxWait); ok {
			longest = FormatDuration(time.Duration(v))
		}
		ops := "n/a"
		shareCell := fmt.Sprintf("%.0f%%", 100*share)
		if r.Samples == 0 {
			shareCell = "-"
		}
		if v, ok := m(MetricOpsPerSecond); ok && r.Samples == 0 {
			ops = "- (" + FormatRate(v) + " ops/s)"
		}
		if v, ok := m(MetricOpsPerHandoff); ok {
			ops = fmtRatio(v)
			if out, ok := m(MetricOutPerHandoff); ok {
				ops += " (" + fmtRatio(out) + " out)"
			}
		} else if !strings.HasPrefix(ops, "-") {
			na = true
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t\n", r.System, r.Scenario, cell(MetricClients), cell(MetricProcesses),
			FormatRate(r.Ops), FormatRate(sw), FormatDuration(r.P50Duration()), FormatDuration(r.P99Duration()), longest, shareCell, cell(MetricNeverHeld), cell(MetricFailed), ops)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintln(w, "waits are in Lock; the longest counts waits still unanswered at the end; never held: clients that never got the lock;")
	fmt.Fprintln(w, "failed calls: Locks and Releases that failed before the end (the clients waited on; see notes).")
	fmt.Fprintln(w, "broker ops/hand-off: Redis commands executed on every master the system uses (INFO commandstats calls, commands run by")
	fmt.Fprintln(w, "  scripts included); NATS messages the clients published (and, out, received), counted by their connections;")
	fmt.Fprintln(w, "  without a hand-off, the operations per second.")
	if na {
		fmt.Fprintln(w, "  n/a: RabbitMQ (and in-process memlock) offer no counter of one system's operations: the shared broker has no")
		fmt.Fprintln(w, "  management API here, and its per-connection counters cannot tell lockbench's connections from other users'.")
	}
	return nil
}

// writeMany writes the many scenario's renewal figures.
func (rep *Report) writeMany(w io.Writer, many []Result) error {
	if len(many) == 0 {
		return nil
	}
	fmt.Fprintln(w)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight|tabwriter.Debug)
	fmt.Fprintln(tw, "many: system\tleases\trenewal round trips/s\tper master per tick\theap per lease\trenew errors\tleases renewed per tick\t")
	for _, r := range many {
		perTick, _ := rep.Metric(r.System, Many, "round_trips_per_master_per_tick")
		bytes, _ := rep.Metric(r.System, Many, "bytes_per_lease")
		errs, _ := rep.Metric(r.System, Many, "renew_errors")
		kept := "by itself"
		if v, ok := rep.Metric(r.System, Many, "renewed_per_lease_per_tick"); ok {
			kept = fmt.Sprintf("%.0f%% (by the user)", 100*v)
		}
		fmt.Fprintf(tw, "%s\t%d\t%s\t%s\t%s\t%.0f\t%s\t\n", r.System, r.Samples, FormatRate(r.Ops), fmtRatio(perTick), formatBytes(bytes), errs, kept)
	}
	return tw.Flush()
}

// writeRTT writes the brokers' round trips and the handoffs in round
// trips.
func (rep *Report) writeRTT(w io.Writer) {
	if len(rep.RTT) == 0 {
		return
	}
	fmt.Fprintln(w)
	var bs []string
	for b := range rep.RTT {
		bs = append(bs, b)
	}
	sort.Strings(bs)
	for _, b := range bs {
		fmt.Fprintf(w, "broker round trip p50: %-12s %s", b, FormatDuration(time.Duration(rep.RTT[b])))
		if idle := rep.IdleRTT[b]; idle > 0 {
			fmt.Fprintf(w, " back to back, %s after %s idle", FormatDuration(time.Duration(idle)), IdleGap)
		}
		fmt.Fprintln(w)
	}
	var lines []string
	for _, r := range rep.sorted() {
		if r.Scenario != Handoff {
			continue
		}
		e, ok := Lookup(r.System)
		if !ok || e.Needs == 0 {
			continue
		}
		if rtt := rep.RTT[e.Needs.String()]; rtt > 0 {
			line := fmt.Sprintf("%s %.1f", r.System, float64(r.P50)/float64(rtt))
			if idle := rep.IdleRTT[e.Needs.String()]; idle > 0 {
				line += fmt.Sprintf(" (%.1f idle)", float64(r.P50)/float64(idle))
			}
			lines = append(lines, line)
		}
	}
	if len(lines) > 0 {
		fmt.Fprintf(w, "handoff p50 in broker round trips: %s\n", strings.Join(lines, ", "))
	}
}

// IdleGap is how long a connection is left idle before each round trip
// of [Report.IdleRTT].
const IdleGap = 2 * time.Millisecond

// WriteJSON writes the report as indented JSON.
func (rep *Report) WriteJSON(w io.Writer) error {
	out := *rep
	if out.Results == nil {
		out.Results = []Result{}
	}
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(out)
}

// FormatDuration formats d with three significant digits: 87.3µs, 1.24ms.
func FormatDuration(d time.Duration) string {
	if d <= 0 {
		return "-"
	}
	v, unit := float64(d), "ns"
	for _, u := range []struct {
		s string
		d time.Duration
	}{{"s", time.Second}, {"ms", time.Millisecond}, {"µs", time.Microsecond}} {
		if d >= u.d {
			v, unit = float64(d)/float64(u.d), u.s
			break
		}
	}
	switch {
	case v >= 100:
		return fmt.Sprintf("%.0f%s", v, unit)
	case v >= 10:
		return fmt.Sprintf("%.1f%s", v, unit)
	default:
		return fmt.Sprintf("%.2f%s", v, unit)
	}
}

// FormatRate formats a per-second rate with three significant digits.
func FormatRate(v float64) string {
	switch {
	case v <= 0 || math.IsNaN(v):
		return "-"
	case v >= 1e6:
		return fmt.Sprintf("%.2fM", v/1e6)
	case v >= 1e4:
		return fmt.Sprintf("%.1fk", v/1e3)
	case v >= 100:
		return fmt.Sprintf("%.0f", v)
	case v >= 10:
		return fmt.Sprintf("%.1f", v)
	default:
		return fmt.Sprintf("%.2f", v)
	}
}

func formatBytes(v float64) string {
	switch {
	case v >= 1<<20:
		return fmt.Sprintf("%.1f MiB", v/(1<<20))
	case v >= 1<<10:
		return fmt.Sprintf("%.1f KiB", v/(1<<10))
	default:
		return fmt.Sprintf("%.0f B", v)
	}
}

// writeSkipped lists left-out systems and failed pairs one per line, and
// pairs that do not apply grouped by reason.
func (rep *Report) writeSkipped(w io.Writer) {
	var out []string
	na := map[string][]string{}
	var reasons []string
	for _, s := range rep.Skipped {
		switch {
		case s.Scenario == "":
			out = append(out, fmt.Sprintf("  %s: %s", s.System, s.Reason))
		case strings.HasPrefix(s.Reason, ErrNotApplicable.Error()):
			key := s.Scenario + " (" + strings.TrimPrefix(s.Reason, ErrNotApplicable.Error()+": ") + ")"
			if na[key] == nil {
				reasons = append(reasons, key)
			}
			na[key] = append(na[key], s.System)
		default:
			out = append(out, fmt.Sprintf("  %s × %s: %s", s.System, s.Scenario, s.Reason))
		}
	}
	if len(out) > 0 {
		fmt.Fprintln(w)
		fmt.Fprintln(w, "left out:")
		for _, l := range out {
			fmt.Fprintln(w, l)
		}
	}
	if len(reasons) > 0 {
		fmt.Fprintln(w)
		fmt.Fprintln(w, "not applicable:")
		for _, k := range reasons {
			fmt.Fprintf(w, "  %s: %s\n", k, strings.Join(na[k], ", "))
		}
	}
}
