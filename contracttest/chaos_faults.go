package contracttest

import (
	"cmp"
	"fmt"
	"slices"
	"time"
)

// Which clients [chaosRun.pick] prefers.
const (
	anySlot  = iota
	holding  // in a critical section: crashing a holder tests recovery
	stepping // holding or waiting: faulting its link hits a step of the protocol
)

// pick returns a random slot whose client is alive and for which ok
// returns true, or -1; one that is doing what prefer says if any is.
func (r *chaosRun) pick(prefer int, ok func(*chaosClient) bool) int {
	r.mu.Lock()
	slots := slices.Clone(r.slots)
	r.mu.Unlock()
	var all, active []int
	for i, cl := range slots {
		if cl == nil || !ok(cl) {
			continue
		}
		cl.mu.Lock()
		if !cl.dead {
			all = append(all, i)
			if len(cl.held) > 0 || prefer == stepping && cl.waiting != nil {
				active = append(active, i)
			}
		}
		cl.mu.Unlock()
	}
	if prefer != anySlot && len(active) > 0 {
		return active[r.faultRng.IntN(len(active))]
	}
	if len(all) == 0 {
		return -1
	}
	return all[r.faultRng.IntN(len(all))]
}

func anyClient(*chaosClient) bool { return true }

func hasLink(cl *chaosClient) bool {
	cl.mu.Lock()
	defer cl.mu.Unlock()
	return cl.link != nil && !cl.faulted && cl.armed == ""
}

func hasDelayer(cl *chaosClient) bool {
	_, ok := cl.link.(ReplyDelayer)
	return ok && hasLink(cl)
}

// kinds returns the fault kinds the run may inject.
func (r *chaosRun) kinds() []string {
	kinds := []string{FaultCrash, FaultAbandon, FaultClose}
	if r.links {
		kinds = append(kinds, FaultLostReplies, FaultLateReplies)
	}
	for _, b := range r.brk {
		kinds = append(kinds, b.Kind)
	}
	if r.cfg.Faults != nil {
		kinds = slices.DeleteFunc(kinds, func(k string) bool { return !slices.Contains(r.cfg.Faults, k) })
	}
	return kinds
}

// inject picks one fault and applies it, and returns the time to the
// next one. After a holder's crash, half the time the next fault is a
// broker fault (if the harness has any) within the time the crashed
// holder's names take to come back: a broker restarted during a takeover.
func (r *chaosRun) inject() (gap time.Duration) {
	gap = r.gap()
	kinds := r.kinds()
	if r.forced != "" {
		kinds, r.forced = []string{r.forced}, ""
	}
	if len(kinds) == 0 {
		return gap
	}
	kind := kinds[r.faultRng.IntN(len(kinds))]
	switch kind {
	case FaultAbandon:
		slot := r.pick(anySlot, anyClient)
		if slot < 0 {
			return gap
		}
		cl := r.slot(slot)
		r.count(kind)
		cl.mu.Lock()
		if cl.waiting != nil {
			cl.waiting()
		}
		cl.mu.Unlock()
	case FaultCrash, FaultClose:
		prefer := anySlot
		if kind == FaultCrash {
			prefer = holding
		}
		slot := r.pick(prefer, anyClient)
		if slot < 0 {
			return gap
		}
		r.count(kind)
		cl := r.slot(slot)
		held := r.stop(cl, kind == FaultCrash)
		r.setSlot(slot, nil)
		if held && len(r.brk) > 0 && !r.brokerDown && r.faultRng.IntN(2) == 0 {
			var brk []string
			for _, b := range r.brk {
				if slices.Contains(r.kinds(), b.Kind) {
					brk = append(brk, b.Kind)
				}
			}
			if len(brk) > 0 {
				r.forced = brk[r.faultRng.IntN(len(brk))]
				gap = r.between(0, cl.recovery)
			}
		}
		r.refill[slot] = time.Time{}
		r.refillSlots()
	case FaultLostReplies, FaultLateReplies:
		r.faultLink(kind)
	default:
		r.faultBroker(kind)
	}
	return gap
}

func (r *chaosRun) count(kind string) {
	r.mu.Lock()
	r.faults[kind]++
	r.mu.Unlock()
}

// stop crashes (Harness.Kill) or closes cl; it reports whether cl was
// holding a name when it crashed.
func (r *chaosRun) stop(cl *chaosClient, crashed bool) (held bool) {
	if !crashed {
		// A clean close: the client's sections end before it releases;
		// its link is healed first, so that it can say goodbye.
		for _, p := range r.pending {
			if p.cl == cl {
				r.dropHeal(cl)
				r.healOneNow(p)
				break
			}
		}
		cl.kill()
		cl.cancel()
		if err := closeClient(cl.c); err != nil {
			r.t.Logf("closing %s: %v", cl.id, err)
		}
		return false
	}
	at := r.now()
	names, _ := cl.kill()
	r.mu.Lock()
	for _, name := range names {
		r.crashes = append(r.crashes, crash{name: name, who: cl.id, at: at, bound: cl.recovery})
	}
	r.mu.Unlock()
	r.dropHeal(cl)
	cl.cancel()
	if err := r.h.Kill(r.ctx, cl.c); err != nil {
		r.t.Errorf("Kill(%s): %v", cl.id, err)
	}
	return len(names) > 0
}

// healOneNow heals p's fault now (its outage already closed).
func (r *chaosRun) healOneNow(p pendingHeal) {
	if err := p.heal(); err != nil {
		r.t.Errorf("chaos: healing %s: %v", p.kind, err)
	}
	p.cl.mu.Lock()
	p.cl.faulted = false
	p.cl.mu.Unlock()
}

// faultLink loses or delays the replies to a client for a while.
func (r *chaosRun) faultLink(kind string) {
	ok := hasLink
	if kind == FaultLateReplies {
		ok = hasDelayer
	}
	prefer := stepping
	if r.faultRng.IntN(4) == 0 {
		prefer = anySlot
	}
	slot := r.pick(prefer, ok)
	if slot < 0 {
		return
	}
	cl := r.slot(slot)
	long := r.between(10*time.Millisecond, r.cfg.MaxOutage)
	if kind == FaultLostReplies {
		steps := []string{stepAcquire, stepHold, stepRelease}
		cl.mu.Lock()
		cl.armed, cl.armedFor = steps[r.faultRng.IntN(len(steps))], long
		cl.mu.Unlock()
		return // its worker starts it at the step, and counts it
	}
	d := r.between(5*time.Millisecond, r.cfg.MaxOutage/2)
	what := fmt.Sprintf("%s for %v (by %v)", kind, long.Round(time.Millisecond), d.Round(time.Millisecond))
	cl.link.(ReplyDelayer).DelayReplies(d)
	cl.mu.Lock()
	cl.faulted = true
	cl.mu.Unlock()
	r.count(kind)
	r.t.Logf("chaos: at %v, %s: %s", r.now().Round(time.Millisecond), cl.id, what)
	r.addPending(kind+" "+cl.id, cl, long, func() error { cl.link.Restore(); return nil })
}

// faultBroker injects the broker fault kind, unless one is in force.
func (r *chaosRun) faultBroker(kind string) {
	if r.brokerDown {
		return
	}
	i := slices.IndexFunc(r.brk, func(b BrokerFault) bool { return b.Kind == kind })
	b := r.brk[i]
	long := r.between(cmp.Or(b.MinOutage, 10*time.Millisecond), cmp.Or(b.MaxOutage, r.cfg.MaxOutage))
	heal, err := b.Inject(r.ctx, r.faultRng)
	if err != nil {
		r.t.Errorf("chaos: injecting %s: %v", kind, err)
		return
	}
	r.brokerDown = true
	r.brokerGoroutines = append(r.brokerGoroutines, b.Goroutines...)
	r.count(kind)
	r.t.Logf("chaos: at %v, %s for %v", r.now().Round(time.Millisecond), kind, long.Round(time.Millisecond))
	r.addPending(kind, nil, long, heal)
}

// addPending records an outage that started now, to heal after long.
func (r *chaosRun) addPending(kind string, cl *chaosClient, long time.Duration, heal func() error) {
	r.addPendingFrom(kind, cl, r.now(), long, heal)
}

// addPendingFrom records an outage that started at from, to heal long
// after it.
func (r *chaosRun) addPendingFrom(kind string, cl *chaosClient, from, long time.Duration, heal func() error) {
	r.mu.Lock()
	r.outages = append(r.outages, outage{kind: kind, from: from})
	i := len(r.outages) - 1
	r.mu.Unlock()
	r.pending = append(r.pending, pendingHeal{at: r.start.Add(from + long), kind: kind, cl: cl, heal: heal, outage: i})
}

// firedFault records f, to heal in time; a client crashed meanwhile keeps
// its link as it is (a dead process stays dead).
func (r *chaosRun) firedFault(f firedFault) {
	r.addPendingFrom(f.kind, f.cl, f.from, f.long, f.heal)
	if f.cl.isDead() {
		r.dropHeal(f.cl)
	}
}

// firedFault is a client's lost replies, started by its worker at a step.
type firedFault struct {
	kind       string
	cl         *chaosClient
	from, long time.Duration
	heal       func() error
}

// Steps at which a client's replies are lost.
const (
	stepAcquire = "acquire" // its Lock
	stepHold    = "hold"    // its critical section: renewals
	stepRelease = "release" // its Release
)

// reach is called by cl's worker at step: if cl is armed for it, its
// replies are lost from now on, until the run heals it.
func (r *chaosRun) reach(cl *chaosClient, step string, stop <-chan struct{}) {
	cl.mu.Lock()
	if cl.armed != step || cl.dead {
		cl.mu.Unlock()
		return
	}
	long := cl.armedFor
	cl.armed, cl.faulted = "", true
	cl.mu.Unlock()
	cl.link.DropReplies()
	from := r.now()
	kind := FaultLostReplies + "@" + step
	r.count(kind)
	r.t.Logf("chaos: at %v, %s: %s for %v", from.Round(time.Millisecond), cl.id, kind, long.Round(time.Millisecond))
	f := firedFault{kind: kind + " " + cl.id, cl: cl, from: from, long: long, heal: func() error { cl.link.Restore(); return nil }}
	select {
	case r.fired <- f:
	case <-stop: // the run is over
		cl.link.Restore()
	}
}

// allowance is how long a wait of base that starts at from may take,
// given the outages that overlap it: each adds its length and recovery
// (to notice it healed, and to let what it left behind expire).
func (r *chaosRun) allowance(from, base, recovery time.Duration) time.Duration {
	allowed := base
	for _, o := range r.outages { // by start
		if o.from < from+allowed && o.to > from {
			allowed += o.to - max(o.from, from) + recovery
		}
	}
	return allowed
}
