package contracttest

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/anishathalye/porcupine"
	"go.uber.org/goleak"
)

// check turns the recorded history into a summary with its violations.
func (r *chaosRun) check() ChaosSummary {
	r.mu.Lock()
	defer r.mu.Unlock()
	s := ChaosSummary{
		Seed: r.cfg.Seed, Faults: r.faults, FencedRejections: r.rejected, LeasesEnded: r.ended, EndedBeforeEntry: r.empty,
		LockErrors: r.lockErrs, Clients: map[string]string{},
	}
	for _, cl := range r.all {
		s.Clients[cl.id] = cl.opts
	}
	end := r.now()
	for i := range r.outages {
		if r.outages[i].to == 0 {
			r.outages[i].to = end
		}
	}
	recovery := bound(r.maxRecovery)
	violation := func(format string, args ...any) {
		s.Violations = append(s.Violations, r.withOptions(fmt.Sprintf(format, args...)))
	}
	for _, name := range r.names {
		spans := r.spans[name]
		s.Acquisitions += len(spans)
		h := &History{Limit: 1, spans: spans}
		if err := h.Check(); err != nil {
			violation("%s: %v", name, err)
		}
		slices.SortFunc(spans, func(a, b Span) int { return int(a.Enter - b.Enter) })
		stall := 2*recovery + time.Second
		last := time.Duration(0)
		for _, sp := range spans {
			if gap := sp.Enter - last; gap > r.allowance(last, stall, recovery) {
				violation("%s: nobody held it from %v to %v (%v; allowed %v, more during faults)", name, last, sp.Enter, gap.Round(time.Millisecond), stall)
			}
			last = max(last, sp.Exit)
		}
		if r.caps.Fencing {
			// Every later holder has a greater token: sections that
			// do not overlap (those that do are a violation already)
			// carry tokens increasing in the order they were held.
			inverted, first := 0, ""
			for i := 1; i < len(spans); i++ {
				a, b := spans[i-1], spans[i]
				if a.Exit <= b.Enter && b.Token <= a.Token {
					inverted++
					if first == "" {
						first = fmt.Sprintf("%s held it %v-%v with token %d after %s held it %v-%v with token %d",
							b.Who, b.Enter, b.Exit, b.Token, a.Who, a.Enter, a.Exit, a.Token)
					}
				}
			}
			if inverted > 0 {
				violation("%s: %d holders had a token no greater than the holder before them; first: %s", name, inverted, first)
			}
		}
	}
	for _, c := range r.crashes {
		limit := r.allowance(c.at, bound(c.bound), recovery)
		i := slices.IndexFunc(r.spans[c.name], func(sp Span) bool { return sp.Enter > c.at })
		if i < 0 {
			if end-c.at > limit {
				violation("%s: never held again after its holder %s crashed at %v", c.name, c.who, c.at)
			}
			continue
		}
		took := r.spans[c.name][i].Enter - c.at
		s.Recoveries++
		s.WorstRecovery = max(s.WorstRecovery, took)
		if took > limit {
			violation("%s: held again %v after its holder %s crashed at %v (allowed %v with the faults then)", c.name, took.Round(time.Millisecond), c.who, c.at, limit.Round(time.Millisecond))
		}
	}
	if r.guard != nil {
		r.checkGuarded(&s, violation)
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
		for _, name := range r.names {
			if v := tokenRegressions(name, r.ops[name]); v != "" {
				violation("%s", v)
			}
		}
	}
	return s
}

// withOptions appends to v the options of every client it names, and the
// faults in force around the moment it names.
func (r *chaosRun) withOptions(v string) string {
	if at, ok := momentOf(v); ok {
		var near []string
		for _, o := range r.outages {
			if o.from <= at && o.to >= at-bound(r.maxRecovery) {
				near = append(near, fmt.Sprintf("%s %v-%v", o.kind, o.from.Round(time.Millisecond), o.to.Round(time.Millisecond)))
			}
		}
		if len(near) > 0 {
			v += "; faults then: " + strings.Join(near, ", ")
		}
	}
	var mix []string
	for _, cl := range r.all {
		if cl.opts != "" && (strings.Contains(v, cl.id+"(") || strings.Contains(v, cl.id+" ") || strings.Contains(v, cl.id+"'")) {
			mix = append(mix, fmt.Sprintf("%s{%s}", cl.id, cl.opts))
		}
	}
	if len(mix) > 0 {
		v += "; options: " + strings.Join(mix, ", ")
	}
	return v
}

// momentOf finds the moment a violation names: after "overlap at ",
// "crashed at " or " held it ".
func momentOf(v string) (time.Duration, bool) {
	for _, key := range []string{"overlap at ", "crashed at ", " held it "} {
		if _, rest, ok := strings.Cut(v, key); ok {
			end := strings.IndexAny(rest, ",- ")
			if end < 0 {
				end = len(rest)
			}
			if d, err := time.ParseDuration(rest[:end]); err == nil {
				return d, true
			}
		}
	}
	return 0, false
}

// tokenRegressions describes the Locks on name that returned a token no
// greater than one returned by a Lock that had returned before they were
// called (each is enough to make the history illegal for tokenModel), or
// returns "" if there is none.
func tokenRegressions(name string, ops []porcupine.Operation) string {
	byCall := slices.Clone(ops)
	slices.SortFunc(byCall, func(a, b porcupine.Operation) int { return cmp.Compare(a.Call, b.Call) })
	byReturn := slices.Clone(ops)
	slices.SortFunc(byReturn, func(a, b porcupine.Operation) int { return cmp.Compare(a.Return, b.Return) })
	var (
		top   porcupine.Operation // the largest token returned so far
		next  int
		n     int
		first string
	)
	for _, b := range byCall {
		for ; next < len(byReturn) && byReturn[next].Return < b.Call; next++ {
			if a := byReturn[next]; a.Output.(uint64) > tokenOf(top) || top.Output == nil {
				top = a
			}
		}
		if top.Output == nil || b.Output.(uint64) > tokenOf(top) {
			continue
		}
		n++
		if first == "" {
			first = fmt.Sprintf("client-%d's Lock (called at %v, returned at %v) got token %d, though client-%d's Lock had returned token %d at %v",
				b.ClientId, time.Duration(b.Call), time.Duration(b.Return), b.Output, top.ClientId, top.Output, time.Duration(top.Return))
		}
	}
	if n == 0 {
		return ""
	}
	return fmt.Sprintf("%s: %d Locks got a token no greater than an earlier Lock's; first: %s", name, n, first)
}

func tokenOf(op porcupine.Operation) uint64 {
	if op.Output == nil {
		return 0
	}
	return op.Output.(uint64)
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
	r.healDue(time.Time{})
	r.cancel()
	start := time.Now()
	for _, c := range r.all {
		if err := closeClient(c.c); err != nil && !errors.Is(err, context.Canceled) {
			r.t.Logf("closing %s: %v", c.id, err)
		}
	}
	r.slow("closing the clients", start)
	if r.guard != nil {
		if err := r.guard.Close(); err != nil {
			r.t.Errorf("closing the guarded store: %v", err)
		}
	}
	start = time.Now()
	if err := r.h.Close(); err != nil {
		r.t.Errorf("closing the harness: %v", err)
	}
	r.slow("closing the harness", start)
	leaks := r.leaks
	if len(r.brokerGoroutines) > 0 {
		leaks = append(slices.Clip(leaks), brokerLeaks(r.brokerGoroutines)...)
	}
	if err := goleak.Find(leaks...); err != nil {
		r.t.Errorf("goroutines outlived the run: %v", err)
	}
}

// brokerLeaks returns goleak options ignoring every goroutine now running
// a function whose name starts with one of prefixes.
func brokerLeaks(prefixes []string) []goleak.Option {
	seen := map[string]bool{}
	var opts []goleak.Option
	for line := range strings.SplitSeq(strings.Join(goroutineStacks(), "\n"), "\n") {
		if !slices.ContainsFunc(prefixes, func(p string) bool { return strings.HasPrefix(line, p) }) {
			continue
		}
		fn := line
		if i := strings.LastIndex(fn, "("); i > 0 && strings.HasSuffix(fn, ")") {
			fn = fn[:i]
		}
		if !seen[fn] {
			seen[fn] = true
			opts = append(opts, goleak.IgnoreAnyFunction(fn))
		}
	}
	return opts
}
