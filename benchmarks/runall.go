package benchmarks

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"
)

// RunAll builds each entry's system on env and runs the scenarios on it,
// one pair at a time, and returns the report. Systems it cannot build
// (not wired, broker missing, failing to start) and pairs that do not apply
// or fail are recorded in [Report.Skipped] with the reason; RunAll goes on
// with the rest. After each pair it writes one line to progress (nil for
// none). When ctx ends it stops and returns what it has, with ctx's error.
func RunAll(ctx context.Context, env Env, entries []Entry, scenarios []string, p Params, progress io.Writer) (*Report, error) {
	rep := &Report{Machine: ThisMachine()}
	say := func(format string, args ...any) {
		if progress != nil {
			fmt.Fprintf(progress, format+"\n", args...)
		}
	}
	total, done := len(entries)*len(scenarios), 0
	for _, e := range entries {
		if e.NotWired != "" {
			rep.Skip(e.Name, "", "not wired: "+e.NotWired)
			say("lockbench: %-18s left out: not wired: %s", e.Name, e.NotWired)
			done += len(scenarios)
			continue
		}
		sys, err := e.New(ctx, env)
		if err != nil {
			if cerr := ctx.Err(); cerr != nil {
				return rep, cerr
			}
			rep.Skip(e.Name, "", err.Error())
			say("lockbench: %-18s left out: %v", e.Name, err)
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
				rep.Skip(e.Name, sc, err.Error())
				say("[%3d/%d] %-18s %-11s  skipped: %v", done, total, e.Name, sc, err)
			case err != nil:
				rep.Skip(e.Name, sc, "failed: "+err.Error())
				say("[%3d/%d] %-18s %-11s  FAILED after %v: %v", done, total, e.Name, sc, took, err)
			default:
				rep.Add(res)
				say("[%3d/%d] %-18s %-11s  %7d samples  p50 %-8s p99 %-8s %9s ops/s  (%v)", done, total, e.Name, sc,
					res.Samples, FormatDuration(res.P50Duration()), FormatDuration(res.P99Duration()), FormatRate(res.Ops), took)
			}
		}
		if err := sys.Close(); err != nil {
			say("lockbench: %s: close: %v", e.Name, err)
		}
	}
	return rep, nil
}
