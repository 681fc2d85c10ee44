package benchmarks

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"slices"
	"time"
)

// RunAll builds each entry's system on env and runs the scenarios on it,
// one pair at a time, and returns the report. Systems it cannot build
// (not wired, broker missing, failing to start) and pairs that do not apply
// or fail are recorded in [Report.Skipped] with the reason; RunAll goes on
// with the rest. After each pair it writes one line to progress (nil for
// none). When ctx ends it stops and returns what it has, with ctx's error.
//
// With p.Rounds > 1 it runs everything that many times, each round in
// another order of the systems (rotated, and reversed every other round),
// so that no system always runs first on a cold machine, or right after
// the same neighbour; each pair reports the round with the median of the
// figure ratios are taken on (ops/s for contended and many, p50
// otherwise), and the metric "round_spread": (highest − lowest) ÷ median
// of that figure.
func RunAll(ctx context.Context, env Env, entries []Entry, scenarios []string, p Params, progress io.Writer) (*Report, error) {
	rep := &Report{Machine: ThisMachine()}
	scenarios = expandScenarios(scenarios, p)
	if p.Spread != nil && p.Spread.Env.NATS == "" && p.Spread.Env.NATSCluster == "" && len(p.Spread.Env.Redis) == 0 && p.Spread.Env.AMQP == "" {
		sp := *p.Spread
		sp.Env = env
		p.Spread = &sp
	}
	say := func(format string, args ...any) {
		if progress != nil {
			fmt.Fprintf(progress, format+"\n", args...)
		}
	}
	var runnable []Entry
	for _, e := range entries {
		if e.NotWired != "" {
			rep.Skip(e.Name, "", "not wired: "+e.NotWired)
			say("lockbench: %-19s left out: not wired: %s", e.Name, e.NotWired)
			continue
		}
		runnable = append(runnable, e)
	}
	rounds := max(p.Rounds, 1)
	type pair struct{ system, scenario string }
	got := map[pair][]Result{}
	failed := map[string]bool{} // systems left out: not built again
	total, done := rounds*len(runnable)*len(scenarios), 0
	for round := range rounds {
		tag := ""
		if rounds > 1 {
			tag = fmt.Sprintf("round %d/%d ", round+1, rounds)
		}
		for _, e := range roundOrder(runnable, round, rounds) {
			if failed[e.Name] {
				done += len(scenarios)
				continue
			}
			sys, err := e.New(ctx, env)
			if err != nil {
				if cerr := ctx.Err(); cerr != nil {
					return rep, cerr
				}
				failed[e.Name] = true
				rep.Skip(e.Name, "", err.Error())
				say("lockbench: %-19s left out: %v", e.Name, err)
				done += len(scenarios)
				continue
			}
			for _, sc := range scenarios {
				done++
				t0 := time.Now()
				res, err := Run(ctx, sys, e.Name, sc, p)
				took := time.Since(t0).Round(100 * time.Millisecond)
				switch {
				case ctx.Err() != nil:
					_ = sys.Close()
					return rep, ctx.Err()
				case errors.Is(err, ErrNotApplicable):
					if round == 0 {
						rep.Skip(e.Name, sc, err.Error())
					}
					say("[%s%3d/%d] %-19s %-11s  skipped: %v", tag, done, total, e.Name, sc, err)
				case err != nil:
					rep.Skip(e.Name, sc, fmt.Sprintf("failed%s: %v", roundNote(round, rounds), err))
					say("[%s%3d/%d] %-19s %-11s  FAILED after %v: %v", tag, done, total, e.Name, sc, took, err)
				default:
					k := pair{e.Name, sc}
					got[k] = append(got[k], res)
					if res.note != "" {
						rep.Notes = append(rep.Notes, Skipped{System: e.Name, Scenario: sc, Reason: res.note + roundNote(round, rounds)})
						say("lockbench: %s × %s: %s", e.Name, sc, res.note)
					}
					say("[%s%3d/%d] %-19s %-11s  %7d samples  p50 %-8s p99 %-8s %9s ops/s  (%v)", tag, done, total, e.Name, sc,
						res.Samples, FormatDuration(res.P50Duration()), FormatDuration(res.P99Duration()), FormatRate(res.Ops), took)
				}
			}
			if err := sys.Close(); err != nil {
				say("lockbench: %s: close: %v", e.Name, err)
			}
		}
	}
	for _, e := range runnable { // the report keeps the registry's order
		for _, sc := range scenarios {
			if rs := got[pair{e.Name, sc}]; len(rs) > 0 {
				rep.Add(medianRound(rs, rounds > 1))
			}
		}
	}
	rep.addOverheads()
	return rep, nil
}

// expandScenarios returns scenarios with the waiters scenario replaced
// by one scenario per waiter count of p.
func expandScenarios(scenarios []string, p Params) []string {
	var out []string
	for _, sc := range scenarios {
		if sc != Waiters {
			out = append(out, sc)
			continue
		}
		for _, n := range p.withDefaults().Waiters {
			out = append(out, WaitersScenario(n))
		}
	}
	return out
}

// roundOrder is the order of the systems in round r of n: round r starts
// at the system r·len/n places along the registry's order (the first
// round keeps it) and goes on forwards, or backwards in odd rounds, so that
// each round has another first system and other neighbours.
func roundOrder(entries []Entry, r, n int) []Entry {
	if len(entries) == 0 {
		return nil
	}
	k := r * len(entries) / n
	out := append(slices.Clone(entries[k:]), entries[:k]...)
	if r%2 == 1 {
		slices.Reverse(out[1:])
	}
	return out
}

func roundNote(r, n int) string {
	if n <= 1 {
		return ""
	}
	return fmt.Sprintf(" in round %d of %d", r+1, n)
}

// medianRound returns the result whose headline figure is the median of
// rs (the lower middle for an even count); with spread, it also records
// the spread of that figure across the rounds.
func medianRound(rs []Result, spread bool) Result {
	rs = slices.Clone(rs)
	slices.SortFunc(rs, func(a, b Result) int { return cmp.Compare(headline(a), headline(b)) })
	m := rs[(len(rs)-1)/2]
	if mid := headline(m); spread && len(rs) > 1 && mid > 0 {
		metrics := maps.Clone(m.Metrics)
		if metrics == nil {
			metrics = map[string]float64{}
		}
		metrics["round_spread"] = (headline(rs[len(rs)-1]) - headline(rs[0])) / mid
		m.Metrics = metrics
	}
	return m
}
