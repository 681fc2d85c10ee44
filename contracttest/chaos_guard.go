package contracttest

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/latchkey-go/latchkey/locks"
)

// guardWrite is one write of the run through [ChaosConfig.Guard].
type guardWrite struct {
	who       string
	token     uint64
	call, ret time.Duration
	accepted  bool // the guard took it (no error)
	late      bool // its lease had ended, or its client had crashed
}

// guardKey is the key of name's data in the guarded store.
func guardKey(name string) string { return "d-" + name }

// guardValue is what a write puts: who wrote it, with which token.
func guardValue(who string, token uint64, seq int) string {
	return fmt.Sprintf("%s/%d/%d", who, token, seq)
}

// guardWriteThrough writes name's data through the run's guard with
// lease, as cl; late says its lease had ended or cl had crashed (a
// process that did not look, or was paused, or whose write was in
// flight). It records the outcome.
func (r *chaosRun) guardWriteThrough(cl *chaosClient, name string, lease locks.Lease, late bool) {
	r.mu.Lock()
	r.guardSeq++
	seq := r.guardSeq
	r.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), opTimeout)
	defer cancel()
	w := guardWrite{who: cl.id, token: lease.Token(), late: late, call: r.now()}
	err := r.guard.Write(ctx, lease, guardKey(name), guardValue(cl.id, lease.Token(), seq), nil)
	w.ret = r.now()
	w.accepted = err == nil
	r.mu.Lock()
	defer r.mu.Unlock()
	r.guardOps[name] = append(r.guardOps[name], w)
	switch {
	case err == nil:
		r.guardStats.accepted++
		if w.token > r.guardNewest[name] {
			r.guardNewest[name] = w.token
		}
	case r.guard.IsStale(err):
		r.guardStats.refused++
	default:
		r.guardStats.errs++
	}
	if late {
		r.guardStats.late++
	}
}

// lateWrite is the write a crashed holder had in flight: it lands once a
// later holder of name has written through the guard (or not at all, if
// none does within the wait bound or before the run stops), which the
// guard must refuse.
func (r *chaosRun) lateWrite(cl *chaosClient, name string, lease locks.Lease, stop <-chan struct{}) {
	r.lateWG.Go(func() {
		deadline := time.Now().Add(r.waitBound())
		tick := time.NewTicker(5 * time.Millisecond)
		defer tick.Stop()
		for {
			r.mu.Lock()
			newer := r.guardNewest[name] > lease.Token()
			r.mu.Unlock()
			if newer {
				r.guardWriteThrough(cl, name, lease, true)
				return
			}
			if time.Now().After(deadline) {
				return
			}
			select {
			case <-stop:
				return
			case <-tick.C:
			}
		}
	})
}

// readGuarded reads every name's data from the guarded store at the end
// of the run, for the check.
func (r *chaosRun) readGuarded() {
	for _, name := range r.names {
		ctx, cancel := context.WithTimeout(context.Background(), opTimeout)
		v, err := r.guard.Read(ctx, guardKey(name))
		cancel()
		r.mu.Lock()
		if err != nil {
			r.guardFinal[name] = "read failed: " + err.Error()
		} else {
			r.guardFinal[name] = v
		}
		r.mu.Unlock()
	}
}

// checkGuarded checks the writes through the guard (r.mu held): no write
// the guard took had a token below one of a write it had taken before
// (a stale write that landed), and each name's data at the end was
// written with a token no smaller than every token the guard took.
func (r *chaosRun) checkGuarded(s *ChaosSummary, violation func(format string, args ...any)) {
	s.GuardedWrites, s.GuardRefused, s.GuardErrors, s.LateWrites = r.guardStats.accepted, r.guardStats.refused, r.guardStats.errs, r.guardStats.late
	for _, name := range r.names {
		var taken []guardWrite
		for _, w := range r.guardOps[name] {
			if w.accepted {
				taken = append(taken, w)
			}
		}
		n, first := staleLanded(taken)
		s.StaleLanded += n
		if n > 0 {
			violation("%s: %d stale writes landed through the guard; first: %s", name, n, first)
		}
		if len(taken) == 0 {
			continue
		}
		newest := slices.MaxFunc(taken, func(a, b guardWrite) int { return cmp.Compare(a.token, b.token) })
		final := r.guardFinal[name]
		var who string
		var token uint64
		var seq int
		if _, err := fmt.Sscanf(strings.ReplaceAll(final, "/", " "), "%s %d %d", &who, &token, &seq); err != nil {
			violation("%s: the guarded data at the end is %q, not a write of the run (the newest write taken had token %d)", name, final, newest.token)
			continue
		}
		if token < newest.token {
			violation("%s: the guarded data at the end was written by %s with token %d, below token %d of %s's write the guard took at %v", name, who, token, newest.token, newest.who, newest.ret)
		}
	}
}

// staleLanded counts the writes of taken (writes the guard took) called
// after a write with a greater token had returned, and describes the
// first.
func staleLanded(taken []guardWrite) (n int, first string) {
	byCall := slices.Clone(taken)
	slices.SortFunc(byCall, func(a, b guardWrite) int { return cmp.Compare(a.call, b.call) })
	byRet := slices.Clone(taken)
	slices.SortFunc(byRet, func(a, b guardWrite) int { return cmp.Compare(a.ret, b.ret) })
	var (
		top  guardWrite
		next int
	)
	for _, w := range byCall {
		for ; next < len(byRet) && byRet[next].ret < w.call; next++ {
			if byRet[next].token > top.token {
				top = byRet[next]
			}
		}
		if w.token < top.token {
			n++
			if first == "" {
				first = fmt.Sprintf("%s's write with token %d (late %t) at %v-%v, after %s's with token %d returned at %v", w.who, w.token, w.late, w.call, w.ret, top.who, top.token, top.ret)
			}
		}
	}
	return n, first
}
