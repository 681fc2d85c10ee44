package redlockprio

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/latchkey-go/latchkey/locks"
	"github.com/latchkey-go/latchkey/locks/driver"
)

// Lease is a lock or semaphore slot held on a quorum of the masters. It
// implements [locks.Lease] and [locks.SlotLease]; its methods are safe for
// concurrent use.
//
// Its context ends with [locks.ErrReleased] after Release; with an error
// matching [locks.ErrPreempted] (and [locks.ErrLost]) when a higher
// priority took it; with an error matching [locks.ErrLost] when a quorum
// could not be renewed before its validity ran out (the lease ends before
// that deadline), when an administrator deleted its keys, or when its
// Locker was closed.
type Lease struct {
	l       *Locker
	name    string
	slot    int // from 1
	size    int
	id      string // holder id stored at the masters, unique to the lease
	key     string
	fence   string
	settled chan struct{} // closed once notices about this attempt may be acknowledged
	letGo   chan struct{} // closed when the holder lets go: Release (or Close) was called
	letOnce sync.Once

	releasing atomic.Bool // the release's calls to the masters have started

	// Guarded by l.mu.
	base        *driver.Lease // nil while the attempt is in flight
	token       uint64
	robbed      error // set when a thief's notice arrived
	waitOver    bool  // the wait for this thief's victims is over
	abandoned   bool  // Lock gave up waiting for the victims: release when over
	victimsLive bool  // holders this thief displaced may still run: keep its keys
}

var _ locks.SlotLease = (*Lease)(nil)

// Name returns the name the lease was acquired on.
func (e *Lease) Name() string { return e.name }

// Context returns the context that ends with the lease; see [Lease].
func (e *Lease) Context() context.Context { return e.base.Context() }

// Token returns the lease's fencing token: strictly greater for every
// later holder of the name (see the package doc for the argument and its
// limits).
func (e *Lease) Token() uint64 { return e.base.Token() }

// Slot returns the semaphore slot, from 1; a lock's lease is slot 1.
func (e *Lease) Slot() int { return e.slot }

// Deadline returns the end of the validity the lease can currently prove
// from the local monotonic clock; renewals move it.
func (e *Lease) Deadline() time.Time { return e.base.Deadline() }

// HolderID returns the id, unique to the lease, under which the masters
// store it: the Locker's id ([Locker.ID]), ':' and a random part.
func (e *Lease) HolderID() string { return e.id }

// Release ends the lease and deletes its keys on every master where they
// are still its own; see [locks.Lease.Release]. It returns once a quorum
// of masters has answered (the others are answered in the background), or
// a [*QuorumError] when fewer than a quorum answered (the keys left behind
// expire after the TTL).
func (e *Lease) Release(ctx context.Context) error { return e.base.Release(ctx) }

// release deletes the lease's keys at the masters; it is the driver.Lease's
// Release hook.
func (e *Lease) release(ctx context.Context) error {
	e.letOnce.Do(func() { close(e.letGo) })
	l := e.l
	l.mu.Lock()
	keep := e.victimsLive
	token := e.token
	if !keep && l.entries[e.id] == e {
		delete(l.entries, e.id) // forget e
	}
	l.mu.Unlock()
	if keep {
		// The Locker closed while this thief waited for its victims: its
		// keys, set after theirs, expire after their validity. Deleting
		// them now would free the name while a victim may still run; the
		// entry stays too, so that no notice about them is acknowledged.
		return nil
	}
	e.releasing.Store(true)
	// The lease has ended: once a quorum has deleted its keys, the name is
	// free. The other masters' calls go on in the background, on a
	// context of their own, so that the keys there go too and their
	// waiters hear of it, whatever becomes of ctx.
	// (With one master called on this goroutine (inline), nothing goes
	// on in the background: the call runs on ctx, if it is still live.)
	f := fan{enough: l.quorumAnswered, name: e.name}
	if !l.inline() || ctx.Err() != nil {
		f.calls, f.done = context.WithTimeout(context.WithoutCancel(ctx), l.callTO)
	}
	keys := []string{e.key, e.fence}
	channel := l.relChannel(e.name)
	rs := l.fanout(ctx, l.masters, func(ctx context.Context, m *master) (any, error) {
		return runScript(ctx, releaseScript, m.c, keys, e.id, token, channel)
	}, f)
	answered, errs := tally(rs)
	if answered < l.quorum {
		return &QuorumError{Got: answered, Need: l.quorum, Errs: errs}
	}
	return nil
}

// quorumAnswered says whether a quorum of masters answered without error.
func (l *Locker) quorumAnswered(rs []result) bool {
	n := 0
	for _, r := range rs {
		if r.err == nil {
			n++
		}
	}
	return n >= l.quorum
}

// forget drops e from the registry.
func (l *Locker) forget(e *Lease) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.entries[e.id] == e {
		delete(l.entries, e.id)
	}
}

func tally(rs []result) (answered int, errs []error) {
	for _, r := range rs {
		if r.err != nil {
			errs = append(errs, r.err)
		} else {
			answered++
		}
	}
	return answered, errs
}

// grant is one master's answer to the acquire script.
type grant struct {
	m       *master
	status  int64 // 0 held, 1 free slot taken, 2 slot taken from a lower priority
	slot    int
	counter uint64
	holder  string // held: a holder's id; theft: the victim's id
	vprio   int64
	pttl    time.Duration
	vinbox  string
	at      time.Time // when the answer arrived
}

// parseGrant decodes a master's answer to the acquire script on a name
// of size slots. Whatever the answer, it gives a grant or an error, never
// a panic: a status or slot out of range is an error, and a displaced
// holder whose remaining time the master could not tell (a key without an
// expiry, which only a stranger's write makes) is assumed to have a whole
// ttl left, so that a theft waits for it rather than not at all.
func parseGrant(r result, size int, ttl time.Duration) (grant, error) {
	g := grant{m: r.m}
	vals, ok := r.val.([]any)
	if !ok || len(vals) < 3 {
		return g, fmt.Errorf("redlockprio: unexpected acquire reply %v", r.val)
	}
	num := func(i int) int64 {
		if i < len(vals) {
			n, _ := vals[i].(int64)
			return n
		}
		return 0
	}
	str := func(i int) string {
		if i < len(vals) {
			s, _ := vals[i].(string)
			return s
		}
		return ""
	}
	g.status, g.counter = num(0), uint64(max(num(2), 0))
	switch g.status {
	case 0:
		g.holder, g.pttl = str(3), millis(max(num(4), 0))
	case 1, 2:
		slot := num(1)
		if slot < 1 || slot > int64(size) {
			return grant{m: r.m}, fmt.Errorf("redlockprio: acquire reply names slot %d of %d", slot, size)
		}
		g.slot = int(slot)
		if g.status == 2 {
			g.holder, g.vprio, g.vinbox = str(3), num(4), str(6)
			g.pttl = millis(num(5))
			if num(5) < 0 {
				g.pttl = ttl
			}
		}
	default:
		return grant{m: r.m}, fmt.Errorf("redlockprio: acquire reply with status %d", g.status)
	}
	return g, nil
}

// millis converts a master's milliseconds to a Duration, capped (at about
// 35 years) so that no answer overflows into a negative wait.
func millis(ms int64) time.Duration {
	return time.Duration(min(ms, 1<<40)) * time.Millisecond
}

// acquire makes one attempt at a slot of name among size slots. On
// failure it holds nothing; floor carries the largest fence counter seen
// from one attempt to the next.
func (l *Locker) acquire(ctx context.Context, name string, size int, floor *uint64) (locks.Lease, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if err := l.dupErr(); err != nil {
		return nil, fmt.Errorf("redlockprio: lock %q: %w", name, err)
	}
	if err := l.subscribeInbox(ctx); err != nil {
		return nil, err
	}
	if err := l.identify(ctx); err != nil {
		return nil, fmt.Errorf("redlockprio: lock %q: %w", name, err)
	}
	keys := make([]string, 0, size+1)
	keys = append(keys, l.fenceKey(name))
	for s := 1; s <= size; s++ {
		keys = append(keys, l.key(name, s))
	}
	e := &Lease{
		l: l, name: name, size: size,
		id:      l.holderID(),
		fence:   keys[0],
		settled: make(chan struct{}),
		letGo:   make(chan struct{}),
	}
	l.mu.Lock()
	if l.closing {
		l.mu.Unlock()
		return nil, fmt.Errorf("redlockprio: %q: %w", name, locks.ErrClosed)
	}
	l.entries[e.id] = e // from now on a thief's notice finds the attempt
	l.mu.Unlock()

	first := 0
	if size > 1 {
		first = rand.IntN(size)
	}
	ttlMS := l.o.ttl.Milliseconds()
	start := time.Now()
	// The calls run on a context of their own, which ctx's end does not
	// cut short, until the per-master call timeout: calls still running
	// when the outcome is decided go on, so that the key (and counter)
	// lands on every master, and the answers that come after Lock
	// returned are seen to (lateAnswers). ctx bounds the wait for them,
	// and so does the call timeout: a master that has not answered by
	// then counts as failed.
	// With one master called on this goroutine (inline), nothing goes on
	// in the background: the call runs on ctx.
	var late *lateAnswers
	f := fan{name: name}
	if !l.inline() {
		f.calls, f.done = context.WithDeadline(context.WithoutCancel(ctx), start.Add(l.callTO))
		late = &lateAnswers{l: l, e: e}
		defer late.decide(0) // a failed attempt, unless decided otherwise
		f.late = late.add
		f.grace = true
		if size == 1 {
			f.enough = l.grantDecided
		} // else wait for all (but stragglers): masters may pick different slots
	}
	fl := *floor
	rs := l.fanout(ctx, l.masters, func(ctx context.Context, m *master) (any, error) {
		if err := l.verify(ctx, m); err != nil {
			return nil, unsent(err) // the acquire script was not sent
		}
		v, err := runScript(ctx, acquireScript, m.c, keys, e.id, ttlMS, l.o.priority, l.inbox, fl, first)
		return v, m.sendErr(err)
	}, f)

	// Sort the answers out.
	var (
		grants  []grant
		held    []grant
		errs    []error
		unknown []*master // may have granted (its call failed, not known unsent): release there too
		slow    []*master // stragglers: late sees to them until the token is set
		bySlot  []slotGrants
	)
	for _, r := range rs {
		if r.err == nil {
			g, err := parseGrant(r, size, l.o.ttl)
			if err != nil {
				r.err = &masterError{index: r.m.index, addr: r.m.addr, err: err}
			} else {
				g.at = time.Now()
				*floor = max(*floor, g.counter)
				l.noteLongest(g.pttl)
				if g.status == 0 {
					held = append(held, g)
				} else {
					grants = append(grants, g)
					if i := slices.IndexFunc(bySlot, func(sg slotGrants) bool { return sg.slot == g.slot }); i >= 0 {
						bySlot[i].gs = append(bySlot[i].gs, g)
					} else {
						bySlot = append(bySlot, slotGrants{g.slot, []grant{g}})
					}
				}
				continue
			}
		}
		errs = append(errs, r.err)
		switch {
		case late != nil && errors.Is(r.err, errStraggler):
			slow = append(slow, r.m) // its answer goes to late
		case !notSent(r.err):
			// A refused dial, say, took nothing: the attempt knows that
			// master's state, and it does not count as unknown (which
			// would keep the attempt from acknowledging a thief's notice
			// about its other keys: see rememberKept).
			unknown = append(unknown, r.m)
		}
	}
	var best slotGrants
	for _, sg := range bySlot {
		if len(sg.gs) > len(best.gs) || len(sg.gs) == len(best.gs) && sg.slot < best.slot {
			best = sg
		}
	}
	won := best.gs

	tokenSet := false // late has the token: it no longer sees to failed attempts
	// others are the masters whose state the attempt does not know, to
	// clean up as it gives up: those whose call failed (unknown), and
	// those yet to answer, which may grant (deleted after the acquire,
	// which sequence orders first) — unless the attempt failed before its
	// token was set, when their answers go to late (decided 0 as acquire
	// returns), which deletes what they grant: a failure decided without
	// them (grantDecided) must not wait for a hung master. Masters that
	// answered "held", or whose call was never sent (notSent), took
	// nothing.
	others := func() []*master {
		ms := slices.Clone(unknown)
		for _, m := range l.masters {
			if !slices.ContainsFunc(rs, func(r result) bool { return r.m == m }) && (late == nil || tokenSet) {
				ms = append(ms, m)
			}
		}
		if tokenSet {
			ms = append(ms, slow...)
		}
		return ms
	}
	fail := func(err error) (locks.Lease, error) {
		l.abandon(ctx, e, grants, others())
		if cerr := ctx.Err(); cerr != nil {
			return nil, fmt.Errorf("redlockprio: lock %q: %w", name, cerr)
		}
		return nil, err
	}
	if err := l.dupErr(); err != nil {
		return fail(fmt.Errorf("redlockprio: lock %q: %w", name, err))
	}
	if len(won) < l.quorum {
		// Held, unless fewer than a quorum answered at all: a dead or
		// hung minority does not turn contention into a QuorumError.
		if answered := len(grants) + len(held); answered < l.quorum {
			return fail(&QuorumError{Got: answered, Need: l.quorum, Errs: errs})
		}
		return fail(heldError(name, held, l.quorum, size, errors.Join(errs...)))
	}
	// Other slots granted by a minority are not ours to keep; those taken
	// from a victim are kept until it has stopped (see below).
	var extraFree, extraTaken []grant
	for _, sg := range bySlot {
		if sg.slot != best.slot {
			for _, g := range sg.gs {
				if g.status == 2 {
					extraTaken = append(extraTaken, g)
				} else {
					extraFree = append(extraFree, g)
				}
			}
		}
	}

	// The token: the largest counter of the granting masters, which must
	// then be on a quorum of masters before anyone may use it. A master
	// that answered with a counter at least the token has it already (its
	// counter never decreases); the others are raised to it. The answers
	// still to come are checked as they arrive (late).
	var token uint64
	for _, g := range won {
		token = max(token, g.counter)
	}
	if late != nil {
		late.decide(token)
		tokenSet = true
	}
	atToken := 0
	var lower, pending []*master
	for _, m := range l.masters {
		switch {
		case !slices.ContainsFunc(rs, func(r result) bool { return r.m == m }):
			pending = append(pending, m)
		case slices.ContainsFunc(won, func(g grant) bool { return g.m == m && g.counter >= token }):
			// Only a counter set with our key in place records the token:
			// a thief's grant there comes after it. A master that answered
			// "held" (or granted another slot) with a high counter does
			// not: a thief may hold it since before and have stolen our
			// keys elsewhere, where the counters were lower.
			atToken++
		default:
			lower = append(lower, m)
		}
	}
	if atToken < l.quorum {
		// The masters' counters differ (failed attempts and split votes
		// raise some only; one restarted, say). Raise every master not
		// known to have the token, and wait for enough that still hold
		// our key as they record it (raiseScript checks, atomically): a
		// higher priority may have taken the key between our grant and
		// this write-back, its token read from the counter before it was
		// raised, and our notice of it may come only after Lock returned.
		need := l.quorum - atToken
		slotKey := keys[best.slot]
		recorded := func(r result) bool {
			v, ok := r.val.(int64)
			return r.err == nil && ok && v >= 0 && uint64(v) >= token
		}
		wcalls, wcancel := context.WithTimeout(context.WithoutCancel(ctx), l.callTO)
		wrs := l.fanout(ctx, append(lower, pending...), func(ctx context.Context, m *master) (any, error) {
			return runScript(ctx, raiseScript, m.c, []string{e.fence, slotKey}, token, e.id)
		}, fan{enough: func(rs []result) bool {
			n := 0
			for _, r := range rs {
				if recorded(r) {
					n++
				}
			}
			return n >= need
		}, done: wcancel, calls: wcalls})
		taken := false // a master that granted no longer holds our key
		for _, r := range wrs {
			switch v, _ := r.val.(int64); {
			case recorded(r):
				atToken++
			case r.err != nil:
				errs = append(errs, r.err)
			case v < 0 && slices.ContainsFunc(won, func(g grant) bool { return g.m == r.m }):
				taken = true
			}
		}
		if atToken < l.quorum {
			if taken {
				return fail(&locks.HeldError{Name: name, Err: errors.New("redlockprio: taken by another holder before the token was recorded")})
			}
			return fail(&QuorumError{Got: atToken, Need: l.quorum, Errs: errs})
		}
	} else {
		// Not needed for this grant, but it keeps the token on more than a
		// bare quorum, so that a master restarting empty later does not
		// take the last copy with it.
		for _, m := range lower {
			l.raiseLater(e.fence, m, token)
		}
	}

	deadline := l.deadlineFor(start)
	if !time.Now().Before(deadline) {
		return fail(&locks.HeldError{Name: name, Err: fmt.Errorf("redlockprio: acquiring took longer than the validity (TTL %v)", l.o.ttl)})
	}
	e.slot = best.slot
	e.key = keys[best.slot]
	l.releaseExtra(ctx, e, extraFree)
	spec := driver.Spec{Name: name, Token: token, Deadline: deadline, Release: e.release}
	if size > 1 {
		spec.Slot = best.slot
	}
	base := driver.NewLease(ctx, spec)

	// Victims to tell: those of the slot we keep and of the others.
	victims := l.victimsOf(grants)

	l.mu.Lock()
	robbed := e.robbed
	closing := l.closing
	if robbed == nil && !closing {
		e.base, e.token = base, token
		e.victimsLive = len(victims) > 0
		l.startRenewerLocked()
	}
	l.mu.Unlock()
	if robbed != nil || closing {
		base.End(driver.Lost(errors.New("redlockprio: preempted while acquiring")))
		l.abandon(ctx, e, grants, others())
		if closing {
			return nil, fmt.Errorf("redlockprio: %q: %w", name, locks.ErrClosed)
		}
		return nil, &locks.HeldError{Name: name, Err: robbed}
	}
	if len(victims) == 0 {
		close(e.settled)
		return e, nil
	}

	// A theft: tell each victim and wait for its acknowledgement or the end
	// of its validity, whichever comes first.
	cutoff := time.Time{}
	if l.o.unsafeSteal >= 0 {
		cutoff = start.Add(time.Duration(l.o.unsafeSteal * float64(l.o.ttl)))
	}
	acks := l.tell(victims)
	started := l.goTracked(func() {
		over := l.waitVictims(victims, acks, cutoff)
		l.mu.Lock()
		e.waitOver = true
		e.victimsLive = !over // the Locker closed: leave the keys to expire
		abandoned := e.abandoned
		close(e.settled)
		l.mu.Unlock()
		if over {
			l.releaseExtra(context.Background(), e, extraTaken)
		}
		if abandoned {
			_ = base.Release(context.Background())
		}
	})
	if !started {
		l.forgetAcks(acks)
		close(e.settled)
		_ = base.Release(context.Background()) // keeps the keys (victimsLive)
		return nil, fmt.Errorf("redlockprio: %q: %w", name, locks.ErrClosed)
	}
	select {
	case <-e.settled:
	case <-ctx.Done():
		l.mu.Lock()
		over := e.waitOver
		e.abandoned = !over
		l.mu.Unlock()
		if over {
			_ = base.Release(context.WithoutCancel(ctx))
		}
		return nil, fmt.Errorf("redlockprio: lock %q: waiting for the displaced holder: %w", name, ctx.Err())
	}
	if !base.Live() {
		cause := context.Cause(base.Context())
		_ = base.Release(context.WithoutCancel(ctx))
		return nil, &locks.HeldError{Name: name, Err: cause}
	}
	return e, nil
}

func later(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}

// victim is a holder an attempt displaced, with how long it may still
// believe it holds.
type victim struct {
	inbox string
	until time.Time
}

// victimsOf returns the holders that gs displaced, by holder id: each may
// run until the largest PTTL its keys had when displaced, plus the drift
// allowance over that time (at least the Locker's own), counted from when
// the answer arrived. A displaced key's PTTL covers the validity of every
// holder displaced before it too, whatever their TTLs: a thief's key
// never expires before the key it displaced would have, and renewals
// never shorten a key (see acquireScript).
func (l *Locker) victimsOf(gs []grant) map[string]*victim {
	var victims map[string]*victim // nil when nobody was displaced
	for _, g := range gs {
		if g.status != 2 || g.holder == "" {
			continue
		}
		until := g.at.Add(g.pttl + max(l.drift, l.o.driftOver(g.pttl)))
		if v := victims[g.holder]; v == nil {
			if victims == nil {
				victims = map[string]*victim{}
			}
			victims[g.holder] = &victim{inbox: g.vinbox, until: until}
		} else if until.After(v.until) {
			v.until = until
		}
	}
	return victims
}

// tell sends each victim a theft notice and returns, by victim id, the
// channels its acknowledgement closes; hand them to waitVictims or
// forgetAcks.
func (l *Locker) tell(victims map[string]*victim) map[string]chan struct{} {
	acks := map[string]chan struct{}{}
	l.mu.Lock()
	for id := range victims {
		ch := l.acks[id]
		if ch == nil {
			ch = make(chan struct{})
			l.acks[id] = ch
		}
		acks[id] = ch
	}
	l.mu.Unlock()
	desc := strings.ReplaceAll(fmt.Sprintf("%s with priority %d", l.id, l.o.priority), "|", "/")
	for id, v := range victims {
		l.publish(v.inbox, "N|"+id+"|"+l.inbox+"|"+desc)
	}
	return acks
}

// waitVictims waits until each victim has acknowledged or its validity has
// run out, or until cutoff if it is not zero, and returns true; when the
// Locker closes first it returns false at once: the victims may then
// still run.
func (l *Locker) waitVictims(victims map[string]*victim, acks map[string]chan struct{}, cutoff time.Time) bool {
	defer l.forgetAcks(acks)
	for id, v := range victims {
		until := v.until
		if !cutoff.IsZero() && cutoff.Before(until) {
			until = cutoff
		}
		t := time.NewTimer(time.Until(until))
		select {
		case <-acks[id]:
		case <-t.C:
		case <-l.done:
			t.Stop()
			return false
		}
		t.Stop()
	}
	return true
}

func (l *Locker) forgetAcks(acks map[string]chan struct{}) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for id, ch := range acks {
		if l.acks[id] == ch {
			delete(l.acks, id)
		}
	}
}

// abandon ends an attempt that will not be used: it deletes what the
// attempt got on the masters of gs and on others. Where a grant displaced
// a holder, the key stays until that holder has acknowledged the notice
// abandon sends it or its validity has run out, so that nobody takes the
// name while it may still run; meanwhile the attempt stays registered, and
// a notice from a thief that displaced it is acknowledged only then (the
// chain of thieves). If the Locker closes first, those keys are left to
// expire: set after the victim's, they outlast its validity.
func (l *Locker) abandon(ctx context.Context, e *Lease, gs []grant, others []*master) {
	victims := l.victimsOf(gs)
	var now, taken, unknown []*master
	for _, g := range gs {
		if g.status == 2 && len(victims) > 0 {
			taken = append(taken, g.m)
		} else {
			now = append(now, g.m)
		}
	}
	for _, m := range others {
		if !slices.Contains(taken, m) && !slices.Contains(now, m) {
			now = append(now, m)
			unknown = append(unknown, m)
		}
	}
	// On the masters whose answer the attempt did not get (unknown), a
	// key it took from a holder it does not know of is kept: see
	// releaseScript. Where it got the answer, it knows it took nothing
	// from anyone it has not told, and the key goes.
	if len(victims) == 0 {
		l.abort(ctx, e, now, unknown)
		return
	}
	l.deleteKeys(ctx, e, now, unknown)
	acks := l.tell(victims)
	if !l.goTracked(func() {
		if l.waitVictims(victims, acks, time.Time{}) {
			l.abort(context.Background(), e, taken, nil)
		} else {
			l.abort(context.Background(), e, nil, nil)
		}
	}) {
		l.forgetAcks(acks)
		l.abort(ctx, e, nil, nil)
	}
}

func heldError(name string, held []grant, quorum, size int, err error) error {
	he := &locks.HeldError{Name: name, Err: err}
	// A lock held by different holders on different masters, none on a
	// quorum of the answers, is a split vote between attempts (waiters
	// that all retried as the last holder's keys expired): their keys go
	// at once, so waiting out their PTTLs (a whole TTL) would leave the
	// name free for nothing. Retry soon, at a random moment. (One holder
	// seen on fewer masters, the others down, is waited out as before.)
	owners := map[string]int{}
	for _, g := range held {
		owners[g.holder]++
	}
	split := size == 1 && len(owners) > 1
	for _, g := range held {
		if split && owners[g.holder] < quorum {
			continue
		}
		if g.pttl > 0 && (he.RetryAfter == 0 || g.pttl < he.RetryAfter) {
			he.RetryAfter = g.pttl
			he.Holder = g.holder
		}
	}
	if he.RetryAfter == 0 {
		he.RetryAfter = splitRetry + rand.N(splitRetry*3) // split votes: retry soon
	}
	return he
}

// splitRetry is the least wait before retrying after a split vote.
const splitRetry = 5 * time.Millisecond

// abort forgets a failed attempt and deletes whatever it got on ms (see
// deleteKeys for unknown).
func (l *Locker) abort(ctx context.Context, e *Lease, ms, unknown []*master) {
	l.forget(e)
	select {
	case <-e.settled:
	default:
		close(e.settled)
	}
	l.deleteKeys(ctx, e, ms, unknown)
}

// deleteKeys deletes the attempt's keys, of every slot, on ms; on those
// of them in unknown (masters whose answer the attempt did not get), not
// those it took from another holder (see releaseScript), and it
// remembers that it may have kept some (see notice). It waits for the
// answers until ctx ends or the call timeout; the calls go on regardless
// until then, so that a Lock whose context ended returns at once and
// still cleans up.
func (l *Locker) deleteKeys(ctx context.Context, e *Lease, ms, unknown []*master) {
	if len(ms) == 0 {
		return
	}
	calls, cancel := context.WithTimeout(context.WithoutCancel(ctx), l.callTO)
	var keys []string
	for s := 1; s <= e.size; s++ {
		keys = append(keys, l.key(e.name, s))
	}
	if len(unknown) > 0 {
		l.rememberKept(e.id)
	}
	l.fanout(ctx, ms, func(ctx context.Context, m *master) (any, error) {
		keep := "0"
		if slices.Contains(unknown, m) {
			keep = "1"
		}
		for _, k := range keys {
			if _, err := runScript(ctx, releaseScript, m.c, []string{k, e.fence}, e.id, 0, "", keep); err != nil {
				return nil, err
			}
		}
		return nil, nil
	}, fan{name: e.name, calls: calls, done: cancel, grace: true})
}

// lateAnswers handles the acquire answers that arrive after the outcome
// was decided. Once the token is known, a master whose answer does not
// show a counter at least the token (or that failed) is raised to it in
// the background, so that the token spreads beyond the quorum that
// recorded it. After a failed attempt (token 0), a free slot granted late
// is deleted, as abandon deletes those granted in time; a slot taken from
// a victim is left to expire, set after the victim's key (as when the
// Locker closes during a theft), since deleting it could free the name
// while the victim, never told, still runs.
type lateAnswers struct {
	l *Locker
	e *Lease

	mu      sync.Mutex
	decided bool
	token   uint64
	pending []result
}

func (a *lateAnswers) add(r result) {
	a.mu.Lock()
	if !a.decided {
		a.pending = append(a.pending, r)
		a.mu.Unlock()
		return
	}
	token := a.token
	a.mu.Unlock()
	a.check(r, token)
}

// decide sets the token (0 for a failed attempt) and sees to the answers
// that came before it; only its first call counts.
func (a *lateAnswers) decide(token uint64) {
	a.mu.Lock()
	if a.decided {
		a.mu.Unlock()
		return
	}
	a.decided, a.token = true, token
	pending := a.pending
	a.pending = nil
	a.mu.Unlock()
	for _, r := range pending {
		a.l.spawn(func() { a.check(r, token) })
	}
}

// check sees to one answer; it runs in the background.
func (a *lateAnswers) check(r result, token uint64) {
	var g grant
	err := r.err
	if err == nil {
		g, err = parseGrant(r, a.e.size, a.l.o.ttl)
	}
	ctx, cancel := context.WithTimeout(context.Background(), a.l.callTO)
	defer cancel()
	switch {
	case token == 0 && err == nil && g.status == 2:
		// A theft answered too late: the key is left to expire, after
		// its victim's validity (it keeps the longer PTTL), and for as
		// long no later thief's notice about it is acknowledged, since
		// that victim was never told.
		a.l.rememberKeptFor(a.e.id, g.pttl+a.l.o.driftOver(g.pttl))
	case token == 0 && err == nil && g.status == 1:
		_, _ = runScript(ctx, releaseScript, r.m.c, []string{a.l.key(a.e.name, g.slot), a.e.fence}, a.e.id, 0, "")
	case token == 0 && err != nil && !notSent(err):
		// The call may have granted all the same: delete there, as the
		// failed attempt does where a call failed in time (keeping a key
		// taken from a holder it cannot tell).
		a.l.rememberKept(a.e.id)
		for s := 1; s <= a.e.size; s++ {
			_, _ = runScript(ctx, releaseScript, r.m.c, []string{a.l.key(a.e.name, s), a.e.fence}, a.e.id, 0, "", "1")
		}
	case token == 0, err == nil && g.counter >= token:
	case a.e.releasing.Load():
		// The lease's release, under way, raises every master it reaches
		// to the token: this master's counter too.
	default:
		_, _ = runScript(ctx, raiseScript, r.m.c, []string{a.e.fence}, token)
	}
}

// raiseLater raises m's fence counter to token in the background.
func (l *Locker) raiseLater(fence string, m *master, token uint64) {
	l.spawn(func() {
		ctx, cancel := context.WithTimeout(context.Background(), l.callTO)
		defer cancel()
		_, _ = runScript(ctx, raiseScript, m.c, []string{fence}, token)
	})
}

// slotGrants are the grants of one slot.
type slotGrants struct {
	slot int
	gs   []grant
}

// grantDecided says whether the acquire answers so far decide the
// outcome of an attempt at a lock (one slot), and so which outcome it
// is: a quorum granted (won); so many masters failed that fewer than a
// quorum can answer (a QuorumError); or a quorum answered and so few
// granted that the masters yet to answer cannot make a quorum (held).
// Failures and "held" answers are not added up: with a dead minority, a
// held name must read as held, not as a quorum failure, so the live
// masters' answers are awaited (up to the call timeout).
func (l *Locker) grantDecided(rs []result) bool {
	granted, answered, failed := 0, 0, 0
	for _, r := range rs {
		if r.err != nil {
			failed++
			continue
		}
		answered++
		if v, ok := r.val.([]any); ok && len(v) > 0 && v[0] != int64(0) {
			granted++
		}
	}
	pending := len(l.masters) - len(rs)
	switch {
	case granted >= l.quorum:
		return true
	case failed > len(l.masters)-l.quorum:
		return true
	case answered >= l.quorum && granted+pending < l.quorum:
		return true
	}
	return false
}

// noteLongest records the PTTL of another holder's key seen in an answer.
func (l *Locker) noteLongest(d time.Duration) {
	ms := d.Milliseconds()
	for {
		cur := l.longest.Load()
		if ms <= cur || l.longest.CompareAndSwap(cur, ms) {
			return
		}
	}
}

// keptFor is how long a key that a failed attempt may have taken, on a
// master whose answer it did not get, can live: the key was set to the
// longer of the attempt's TTL and the displaced key's PTTL, which the
// attempt did not see; the longest PTTL this Locker has seen on another
// holder's key stands in for it.
func (l *Locker) keptFor() time.Duration {
	d := max(l.o.ttl, time.Duration(l.longest.Load())*time.Millisecond)
	return d + l.o.driftOver(d)
}

// releaseExtra deletes the attempt's keys of the other slots that gs
// granted: they are not the attempt's to keep. Like deleteKeys, it waits
// until ctx ends at most.
func (l *Locker) releaseExtra(ctx context.Context, e *Lease, gs []grant) {
	if len(gs) == 0 {
		return
	}
	calls, cancel := context.WithTimeout(context.WithoutCancel(ctx), l.callTO)
	ms := make([]*master, len(gs))
	for i, g := range gs {
		ms[i] = g.m
	}
	l.fanout(ctx, ms, func(ctx context.Context, m *master) (any, error) {
		g := gs[slices.IndexFunc(gs, func(g grant) bool { return g.m == m })]
		return runScript(ctx, releaseScript, m.c, []string{l.key(e.name, g.slot), e.fence}, e.id, 0, "")
	}, fan{name: e.name, calls: calls, done: cancel, grace: true})
}
