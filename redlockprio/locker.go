package redlockprio

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode"

	"github.com/redis/go-redis/v9"

	"github.com/latchkey-go/latchkey/locks"
	"github.com/latchkey-go/latchkey/locks/driver"
)

// names is the rule for lock names: the name becomes a Redis Cluster hash
// tag ({name}), so it must not contain braces.
var names = driver.NameRule{
	What:   "redlockprio name",
	MaxLen: 1024,
	Char:   func(r rune) bool { return r != '{' && r != '}' && !unicode.IsControl(r) },
}

// maxSlots bounds a Semaphore's size (each slot is a key every acquire
// script looks at).
const maxSlots = 1024

// master is one independent Redis master (or cluster).
type master struct {
	index int
	addr  string
	c     redis.UniversalClient

	// deadlines says the client ends a call at its context's deadline
	// (ContextTimeoutEnabled), so that a call may run on the caller's
	// goroutine without outliving the caller's wait.
	deadlines bool

	// oneShot says the client makes one attempt per command (no retries,
	// no cluster redirects): a dial error it returns then means the
	// command was never sent (see sendErr).
	oneShot bool

	renewScript atomic.Int32 // scriptUnknown, scriptLoading or scriptLoaded

	// verified says the master is known to be a server of its own (see
	// Locker.verify): only then do its grants count.
	verified atomic.Bool
}

// Locker is a [locks.Locker] over N independent Redis masters: a lease is
// held on a quorum (N/2+1) of them. Its Semaphores ([Locker.Semaphore])
// share its connections, renewal and notifications.
//
// A Locker is safe for concurrent use and may hold many names at once;
// all its leases are renewed together, one pipelined round trip per
// master per renewal tick. Close it when done: it releases what it holds.
// It never closes the go-redis clients it was given.
type Locker struct {
	masters []*master
	quorum  int
	o       options
	drift   time.Duration
	id      string // this Locker's identity, the readable part of holder ids
	inbox   string // channel on which thieves notify this Locker's victims
	nonce   string // holder ids start with it (see holderID)
	leases  atomic.Uint64
	callTO  time.Duration // per-master call timeout
	// dup is set once two masters are found to be the same server: every
	// later acquisition fails with it.
	dup         atomic.Pointer[error]
	identOnce   sync.Once
	identDone   chan struct{} // closed once the first identification is over
	identQuorum chan struct{} // closed once a quorum of masters is verified
	identGrace  time.Duration // set before identQuorum is closed
	// longest is the longest PTTL, in ms, this Locker has seen on a key of
	// another holder: how long a key it may have taken without hearing of
	// it can live (see keptFor).
	longest atomic.Int64

	mu      sync.Mutex
	closing bool // no new acquisitions
	closed  bool // no new I/O goroutines
	done    chan struct{}
	work    chan func() // hands calls to idle workers
	// closedFlag mirrors closed for spawn's lock-free check.
	closedFlag atomic.Bool

	seqMu    sync.Mutex
	seq      map[seqKey]chan struct{} // see sequence
	wg       sync.WaitGroup
	entries  map[string]*Lease // by holder id: held leases and attempts in flight
	renewing bool
	acks     map[string]chan struct{} // victim holder id -> closed on its ack
	// kept holds the ids of failed attempts that may have kept keys they
	// took from holders they never told (see deleteKeys), until those
	// keys have surely expired: a thief that finds such a key gets no
	// acknowledgement for it, and waits it out.
	kept map[string]time.Time

	subOnce   sync.Once
	subReady  chan struct{} // closed once the inbox is subscribed (or gave up)
	subMu     sync.Mutex    // serializes (un)subscriptions of release channels
	pubsubs   []*redis.PubSub
	watchers  map[string]*watchState // by release channel, guarded by mu
	sweeping  bool                   // a sweep goroutine runs; guarded by mu
	subAcked  []bool                 // per master: inbox subscription confirmed
	subQuorum chan struct{}          // closed once a quorum of masters confirmed
}

var _ locks.Locker = (*Locker)(nil)

// New returns a Locker over masters, each an independent Redis master
// (a *redis.Client, or a *redis.ClusterClient: every key of a name shares
// the hash tag {name}). N = len(masters) must be at least 1; the quorum
// is N/2+1. A nil, repeated or missing master, two masters without
// [WithTwoMasters] (they tolerate no failure), or an invalid option,
// returns an error matching [locks.ErrInvalidOption] before any I/O; New
// itself does no I/O. Two clients of one server (the same address twice,
// or two names of one host) are found on first contact instead: see
// [Locker.Lock].
//
// So that a hung master (paused, partitioned) cannot hold a call past its
// context, give each client ContextTimeoutEnabled: true; otherwise the
// client's read and write timeouts bound such calls, and the Locker still
// stops waiting for them at the step's deadline.
func New(masters []redis.UniversalClient, opts ...Option) (*Locker, error) {
	if len(masters) == 0 {
		return nil, fmt.Errorf("redlockprio: %w", driver.InvalidOption("at least one master is needed"))
	}
	ms := make([]*master, len(masters))
	for i, c := range masters {
		if isNil(c) {
			return nil, fmt.Errorf("redlockprio: %w", driver.InvalidOption("master %d is nil", i))
		}
		for _, m := range ms[:i] {
			if sameClient(m.c, c) {
				return nil, fmt.Errorf("redlockprio: %w", driver.InvalidOption("master %d is given twice: masters must be independent", i))
			}
		}
		ms[i] = &master{index: i, addr: addrOf(c), c: c, deadlines: honorsDeadlines(c), oneShot: oneShot(c)}
	}
	o := defaults()
	if err := driver.Apply(&o, opts); err != nil {
		return nil, fmt.Errorf("redlockprio: %w", err)
	}
	if len(ms) == 2 && !o.twoMasters {
		return nil, fmt.Errorf("redlockprio: %w", driver.InvalidOption("two masters tolerate no failure (their quorum is both): use 1, 3 or more, or WithTwoMasters"))
	}
	if d := o.driftFor(); d >= o.ttl/2 {
		return nil, fmt.Errorf("redlockprio: %w", driver.InvalidOption("drift allowance %v leaves too little of the TTL %v", d, o.ttl))
	}
	callTO := o.callTimeoutFor()
	if most := (o.ttl - o.driftFor()) / 2; most < minCallTimeout {
		return nil, fmt.Errorf("redlockprio: %w", driver.InvalidOption("TTL %v is too short: a step would have %v per master call ((TTL − drift)/2), under %v", o.ttl, most, minCallTimeout))
	} else if callTO > most || callTO < minCallTimeout {
		return nil, fmt.Errorf("redlockprio: %w", driver.InvalidOption("call timeout %v must be in [%v, (TTL − drift)/2 = %v]", callTO, minCallTimeout, most))
	}
	// See WithRenewInterval for why a third of the validity.
	maxRenew := (o.ttl - o.driftFor()) / 3
	if o.renew == 0 {
		o.renew = maxRenew
	}
	if o.renew > maxRenew {
		return nil, fmt.Errorf("redlockprio: %w", driver.InvalidOption("renew interval %v must be at most (TTL − drift)/3 = %v", o.renew, maxRenew))
	}
	id := o.holderID
	if id == "" {
		id = randomID(8)
	}
	l := &Locker{
		masters:  ms,
		quorum:   len(ms)/2 + 1,
		o:        o,
		callTO:   callTO,
		drift:    o.driftFor(),
		id:       id,
		done:     make(chan struct{}),
		work:     make(chan func()),
		seq:      map[seqKey]chan struct{}{},
		entries:  map[string]*Lease{},
		acks:     map[string]chan struct{}{},
		kept:     map[string]time.Time{},
		subReady: make(chan struct{}),
		watchers: map[string]*watchState{},
		subAcked: make([]bool, len(ms)),
	}
	l.inbox = o.prefix + "inbox:" + id + ":" + randomID(8)
	l.nonce = id + ":" + randomID(12) + "-"
	return l, nil
}

func isNil(c redis.UniversalClient) bool {
	if c == nil {
		return true
	}
	switch v := reflect.ValueOf(c); v.Kind() {
	case reflect.Pointer, reflect.Map, reflect.Slice, reflect.Func, reflect.Chan:
		return v.IsNil()
	}
	return false
}

// sameClient reports whether a and b are the same client. Clients of a
// type that is not comparable (== would panic) are taken as distinct.
func sameClient(a, b redis.UniversalClient) bool {
	va, vb := reflect.ValueOf(a), reflect.ValueOf(b)
	return va.Type() == vb.Type() && va.Comparable() && va.Equal(vb)
}

func addrOf(c redis.UniversalClient) string {
	switch c := c.(type) {
	case *redis.Client:
		return c.Options().Addr
	case *redis.ClusterClient:
		return "cluster " + strings.Join(c.Options().Addrs, ",")
	}
	return fmt.Sprintf("%T", c)
}

// honorsDeadlines reports whether c ends each call at its context's
// deadline.
func honorsDeadlines(c redis.UniversalClient) bool {
	switch c := c.(type) {
	case *redis.Client:
		return c.Options().ContextTimeoutEnabled
	case *redis.ClusterClient:
		return c.Options().ContextTimeoutEnabled
	}
	return false
}

// oneShot reports whether c makes one attempt per command: a
// *redis.Client with MaxRetries -1, a *redis.ClusterClient with
// MaxRedirects -1 (go-redis stores both as 0).
func oneShot(c redis.UniversalClient) bool {
	switch c := c.(type) {
	case *redis.Client:
		return c.Options().MaxRetries == 0
	case *redis.ClusterClient:
		return c.Options().MaxRedirects == 0
	}
	return false
}

// holderID returns a new holder id, unique to the lease: the Locker's
// id, ':', a random part drawn once per Locker, and a counter.
func (l *Locker) holderID() string {
	n := l.leases.Add(1)
	id := make([]byte, 0, len(l.nonce)+17)
	id = append(id, l.nonce...)
	id = strconv.AppendUint(id, n, 16)
	return string(id)
}

func randomID(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b) // never fails (crypto/rand panics rather)
	return hex.EncodeToString(b)
}

// Quorum returns how many masters must grant a lease: N/2+1.
func (l *Locker) Quorum() int { return l.quorum }

// ID returns the Locker's holder identity ([WithHolderID]).
func (l *Locker) ID() string { return l.id }

// Lock blocks until it holds name on a quorum of the masters; see
// [locks.Locker.Lock]. It is woken by the release notifications the
// holder publishes, and polls with jitter ([WithBackoff]) no later than
// when the holder's keys expire. When the Locker has a higher priority
// than the holder ([WithPriority]), it takes the name, tells the holder,
// and returns once the holder has let go (its Release; see the package
// doc) or its validity has provably run out.
//
// A held name is waited for also while a minority of the masters is
// down or hung. Only when fewer than a quorum of masters answer does
// Lock fail at once, with a [*QuorumError]. Two masters found to be one
// server on first contact fail it with an error matching
// [locks.ErrInvalidOption]. When ctx ends first, Lock returns an error
// matching ctx.Err() and holds nothing. Lock is safe for concurrent use.
func (l *Locker) Lock(ctx context.Context, name string) (locks.Lease, error) {
	if err := names.Check(name); err != nil {
		return nil, fmt.Errorf("redlockprio: lock: %w", err)
	}
	return l.wait(ctx, name, 1)
}

// TryLock takes name if it is free (or held by a lower priority); see
// [locks.Locker.TryLock]. When it is held elsewhere, TryLock returns a
// [*locks.HeldError] (matching [locks.ErrNotAcquired]) naming the holder,
// whose RetryAfter is the holder's remaining TTL — also while a minority
// of the masters is down; only when fewer than a quorum of masters
// answer, a [*QuorumError].
//
// The one exception to "TryLock does not wait": when the holder has a
// lower priority, TryLock takes the name and, like Lock, returns once
// the displaced holder has let go or its validity has provably run out
// (at most its remaining PTTL plus the drift allowance), or when ctx
// ends (then holding nothing). Without that wait it would hand out a
// name the victim may still use. TryLock is safe for concurrent use.
func (l *Locker) TryLock(ctx context.Context, name string) (locks.Lease, error) {
	if err := names.Check(name); err != nil {
		return nil, fmt.Errorf("redlockprio: lock: %w", err)
	}
	var floor uint64
	return l.acquire(ctx, name, 1, &floor)
}

// wait runs the shared wait loop on name, woken by release notifications.
func (l *Locker) wait(ctx context.Context, name string, size int) (locks.Lease, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if err := l.subscribeInbox(ctx); err != nil {
		return nil, err
	}
	// Uncontended, the first attempt wins: no subscription needed. Else
	// subscribe to the name's releases, then try again at once (a release
	// in between is not missed).
	var floor uint64
	lease, err := l.acquire(ctx, name, size, &floor)
	if cerr := ctx.Err(); err != nil && cerr != nil && !errors.Is(err, cerr) {
		// ctx ended while the attempt failed for another reason (it was
		// robbed while it waited for its victim, say): say ctx's error,
		// as driver.Wait does.
		return nil, fmt.Errorf("redlockprio: lock %q: %w (the attempt: %v)", name, cerr, err)
	}
	if err == nil || !errors.Is(err, locks.ErrNotAcquired) || ctx.Err() != nil {
		return lease, err
	}
	wake, stop := l.watch(ctx, l.relChannel(name))
	defer stop()
	return driver.Wait(ctx, wake, l.o.backoff, func(ctx context.Context) (locks.Lease, error) {
		return l.acquire(ctx, name, size, &floor)
	})
}

// Close releases every lease the Locker holds (their contexts end with an
// error matching [locks.ErrLost] and [locks.ErrClosed]), stops its
// renewal and notification goroutines, and makes later calls return
// [locks.ErrClosed]. A theft still waiting for its victims, or an
// abandoned one, leaves its keys at the masters to expire after the TTL
// (a victim may still run until then) rather than delaying Close. It does
// not close the masters' clients. Close is idempotent and safe from any
// goroutine.
func (l *Locker) Close() error {
	l.mu.Lock()
	if l.closing {
		l.mu.Unlock()
		return nil
	}
	l.closing = true
	var held []*Lease
	for _, e := range l.entries {
		if e.base != nil {
			held = append(held, e)
		}
	}
	l.mu.Unlock()

	cause := driver.Lost(fmt.Errorf("redlockprio: locker %s: %w", l.id, locks.ErrClosed))
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	var wg sync.WaitGroup
	for _, e := range held {
		e.base.End(cause)
		wg.Go(func() { _ = e.base.Release(ctx) })
	}
	wg.Wait()
	cancel()

	l.mu.Lock()
	l.closed = true
	l.closedFlag.Store(true)
	close(l.done)
	l.mu.Unlock()
	l.subOnce.Do(l.subReadyOnce) // no subscription from now on
	l.subMu.Lock()
	for _, ps := range l.pubsubs {
		_ = ps.Close()
	}
	l.pubsubs = nil
	l.subMu.Unlock()
	l.wg.Wait()
	return nil
}

// goTracked runs f in a goroutine that Close waits for, unless the Locker
// is closed; it reports whether f was started.
func (l *Locker) goTracked(f func()) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return false
	}
	l.wg.Go(f)
	return true
}

func (l *Locker) key(name string, slot int) string {
	return l.o.prefix + "{" + name + "}:" + strconv.Itoa(slot)
}

func (l *Locker) fenceKey(name string) string { return l.o.prefix + "{" + name + "}:fence" }

func (l *Locker) relChannel(name string) string { return l.o.prefix + "{" + name + "}:released" }

// deadlineFor is the end of the validity of a step started at start: the
// TTL minus the drift allowance.
func (l *Locker) deadlineFor(start time.Time) time.Time {
	return start.Add(l.o.ttl - l.drift)
}

// result is one master's answer to a step.
type result struct {
	m   *master
	val any
	err error
}

// workerIdle is how long an idle worker waits for a call before it exits.
const workerIdle = 5 * time.Second

// spawn runs f on one of the Locker's workers: an idle one, or a new one
// that Close waits for. Reusing workers spares each call to a master a
// goroutine start and the growth of its stack through the client's call
// path. It reports whether f will run: not once the Locker is closed.
func (l *Locker) spawn(f func()) bool {
	if l.closedFlag.Load() {
		return false
	}
	select {
	case l.work <- f:
		return true
	default:
	}
	return l.goTracked(func() { l.worker(f) })
}

func (l *Locker) worker(f func()) {
	idle := time.NewTimer(workerIdle)
	defer idle.Stop()
	for {
		f()
		f = nil
		idle.Reset(workerIdle)
		select {
		case f = <-l.work:
		case <-idle.C:
			return
		case <-l.done:
			return
		}
	}
}

// fan tunes a fanout.
type fan struct {
	// enough, if set, says from the answers so far that the outcome is
	// decided: fanout returns them without waiting for the others.
	enough func([]result) bool
	// late, if set, gets each answer that arrives after fanout returned,
	// on the worker that got it.
	late func(result)
	// done, if set, is called once every call has returned (after late).
	done func()
	// calls, if set, is the context of the calls; ctx then bounds only
	// the wait for their answers.
	calls context.Context
	// name, if set, orders the calls: each call to a master about name
	// waits until this Locker's previous one there has returned (see
	// sequence).
	name string
	// grace, if set, bounds the wait for stragglers: once a majority of
	// the masters called have answered without error, the others are
	// waited for at most as long again as that took (graceMin at least),
	// then given errStraggler; their answers go to late. A hung minority
	// then costs a step a round trip or two, not the call timeout.
	grace bool
}

// graceMin is the least wait for stragglers (see fan.grace).
const graceMin = 2 * time.Millisecond

// errStraggler is the error fanout gives a master that had not answered
// when a majority had and the grace for the others was over; its answer
// goes to fan.late.
var errStraggler = errors.New("redlockprio: no answer within the grace after a majority answered")

// fanState is what the calls of one fanout share with its collector.
type fanState struct {
	mu      sync.Mutex
	ch      chan result
	stopped bool // the collector returned: answers go to late
	left    atomic.Int32
	late    func(result)
	done    func()
}

func (st *fanState) deliver(r result) {
	st.mu.Lock()
	if !st.stopped {
		st.ch <- r // buffered for every call: never blocks
		st.mu.Unlock()
	} else {
		st.mu.Unlock()
		if st.late != nil {
			st.late(r)
		}
	}
	st.finish()
}

func (st *fanState) finish() {
	if st.left.Add(-1) == 0 && st.done != nil {
		st.done()
	}
}

// fanout runs step on every master of ms in parallel and collects the
// answers until all are in, ctx ends, or f.enough says the outcome is
// decided. When ctx ends first, masters that have not answered get a
// context error. Calls still running when fanout returns finish in the
// background (Close waits for them); see fan for what becomes of them.
func (l *Locker) fanout(ctx context.Context, ms []*master, step func(ctx context.Context, m *master) (any, error), f fan) []result {
	calls := f.calls
	if calls == nil {
		calls = ctx
	}
	if l.inline() && len(ms) == 1 && ctx.Err() == nil {
		// One master: its answer is the outcome, so the call runs on the
		// caller's goroutine, sparing two goroutine switches. The client
		// ends it at the context's deadline (see inlineContext). (Once
		// ctx has ended, a call is made on a worker, and not waited for.)
		// It waits for this Locker's calls about the name still running
		// in the background (see sequence), but need not be waited for:
		// the caller makes its next call after this one returns.
		m := ms[0]
		cctx := inlineContext(ctx, calls)
		var prev <-chan struct{}
		if f.name != "" {
			prev = l.pending(m, f.name)
		}
		var v any
		err := unsent(waitFor(cctx, prev))
		if err == nil {
			v, err = step(cctx, m)
		}
		if err != nil && cctx == ctx {
			if d, ok := ctx.Deadline(); ok && !time.Now().Before(d) {
				// The client's timeout may come a hair before ctx's own
				// timer: let ctx say so, so that callers see its error.
				<-ctx.Done()
			}
		}
		if err != nil {
			err = &masterError{index: m.index, addr: m.addr, err: err}
		}
		if f.done != nil {
			f.done()
		}
		return []result{{m: m, val: v, err: err}}
	}
	st := &fanState{ch: make(chan result, len(ms)), late: f.late, done: f.done}
	st.left.Store(int32(len(ms)))
	started := 0
	for _, m := range ms {
		var prev <-chan struct{}
		seqDone := func() {}
		if f.name != "" {
			prev, seqDone = l.sequence(m, f.name)
		}
		if l.spawn(func() {
			var v any
			err := unsent(waitFor(calls, prev))
			if err == nil {
				v, err = step(calls, m)
			}
			seqDone()
			st.deliver(result{m: m, val: v, err: err})
		}) {
			started++
		} else {
			seqDone()
			st.finish()
		}
	}
	got := make([]result, 0, len(ms))
	add := func(r result) {
		if r.err != nil {
			r.err = &masterError{index: r.m.index, addr: r.m.addr, err: r.err}
		}
		got = append(got, r)
	}
	var callsDone <-chan struct{} // the calls' deadline: stop waiting then too
	if f.calls != nil {
		callsDone = f.calls.Done()
	}
	var (
		graceC    <-chan time.Time
		graceOver bool
		begun     = time.Now()
	)
	decided := false
	for !decided && len(got) < started {
		select {
		case r := <-st.ch:
			add(r)
			decided = f.enough != nil && f.enough(got)
			if f.grace && graceC == nil && !decided {
				ok := 0
				for _, r := range got {
					if r.err == nil {
						ok++
					}
				}
				if ok >= len(ms)/2+1 {
					t := time.NewTimer(max(2*time.Since(begun), graceMin))
					defer t.Stop()
					graceC = t.C
				}
			}
			continue
		case <-ctx.Done():
		case <-callsDone:
		case <-graceC:
			graceOver = true
		}
		break
	}
	st.mu.Lock()
	st.stopped = true
	for drained := false; !drained; {
		select {
		case r := <-st.ch: // answered meanwhile: as good as in time
			add(r)
		default:
			drained = true
		}
	}
	st.mu.Unlock()
	if decided || len(got) == len(ms) {
		return got
	}
	for _, m := range ms {
		if !slices.ContainsFunc(got, func(r result) bool { return r.m == m }) {
			err := ctx.Err()
			if err == nil && f.calls != nil {
				err = f.calls.Err()
			}
			if err == nil && graceOver {
				err = errStraggler
			}
			if started < len(ms) && err == nil {
				err = locks.ErrClosed
			}
			if err == nil {
				err = context.Canceled
			}
			got = append(got, result{m: m, err: &masterError{index: m.index, addr: m.addr, err: err}})
		}
	}
	return got
}

// inline says whether the Locker's calls run on the caller's goroutine:
// with one master, whose client ends each call at its context's deadline.
func (l *Locker) inline() bool {
	return len(l.masters) == 1 && l.masters[0].deadlines
}

// inlineContext is the context of a call fanout runs on the caller's
// goroutine: calls, unless ctx is live and has an earlier deadline, so
// that the call ends no later than the wait for it would have (a client
// that honors deadlines ends it then; a plain cancellation of ctx cannot
// cut it short), and a call the caller wants to outlive ctx (a release)
// is still made when ctx has ended.
func inlineContext(ctx, calls context.Context) context.Context {
	if calls == ctx || ctx.Err() != nil {
		return calls
	}
	cd, ok := calls.Deadline()
	if d, has := ctx.Deadline(); has && (!ok || d.Before(cd)) {
		return ctx
	}
	return calls
}

// seqKey is a name at one master.
type seqKey struct {
	master int
	name   string
}

// sequence orders this Locker's calls about name at m: it returns a
// channel closed once the previous call there has returned (nil if none
// is running), and the function to call when this one has returned.
// Calls are sequenced in the order fanout issues them, so that at each
// master a lease's acquire comes before its release, and a release before
// the next acquire of the name, though fanout returns once a quorum has
// answered and the other calls go on in the background: otherwise a
// straggler's late acquire could overtake the release (leaving a key
// until the TTL), or a quick re-acquire find the previous lease's key
// still there (holding the name on a bare quorum).
func (l *Locker) sequence(m *master, name string) (<-chan struct{}, func()) {
	k := seqKey{m.index, name}
	mine := make(chan struct{})
	l.seqMu.Lock()
	prev := l.seq[k]
	l.seq[k] = mine
	l.seqMu.Unlock()
	return prev, func() {
		close(mine)
		l.seqMu.Lock()
		if l.seq[k] == mine {
			delete(l.seq, k)
		}
		l.seqMu.Unlock()
	}
}

// pending returns a channel closed once this Locker's last call about
// name at m has returned, or nil if none is running.
func (l *Locker) pending(m *master, name string) <-chan struct{} {
	l.seqMu.Lock()
	defer l.seqMu.Unlock()
	return l.seq[seqKey{m.index, name}]
}

// waitFor waits until prev is closed (at once if it is nil) or ctx ends.
func waitFor(ctx context.Context, prev <-chan struct{}) error {
	if prev == nil {
		return nil
	}
	select {
	case <-prev:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// runScript runs s by SHA on c, falling back to EVAL (which loads it) on
// NOSCRIPT.
func runScript(ctx context.Context, s *redis.Script, c redis.UniversalClient, keys []string, args ...any) (any, error) {
	return s.Run(ctx, c, keys, args...).Result()
}

// isClosed reports whether err says the client itself was closed.
func isClosed(err error) bool {
	return errors.Is(err, redis.ErrClosed)
}

// notSentError is the error of a call that never reached its master:
// the master took nothing from it.
type notSentError struct{ err error }

func (e *notSentError) Error() string { return e.err.Error() }
func (e *notSentError) Unwrap() error { return e.err }

// unsent marks err, if not nil, as the error of a call that was never
// sent.
func unsent(err error) error {
	if err == nil {
		return nil
	}
	return &notSentError{err: err}
}

// sendErr classifies the error of one command sent through m's client:
// a dial that failed (refused, unreachable, timed out: *net.OpError with
// Op "dial", which go-redis also returns at once while its pool remembers
// the last dial failure) or no connection from the pool means the command
// was never written, when the client makes one attempt per command. A
// client that retries may have written it on an earlier attempt whose
// error it does not return: its errors stay unclassified (the master may
// have run the command).
func (m *master) sendErr(err error) error {
	if err == nil || !m.oneShot {
		return err
	}
	var op *net.OpError
	if errors.As(err, &op) && op.Op == "dial" || errors.Is(err, redis.ErrPoolTimeout) || errors.Is(err, redis.ErrPoolExhausted) {
		return unsent(err)
	}
	return err
}

// notSent reports whether err says a call never reached its master, so
// that the master certainly took nothing from it: the step ended before
// the call was made (a failed verification, the wait for an earlier call
// about the name), the dial failed (see sendErr), or the client was
// closed. Every other error leaves the master's state unknown: the call
// may have run there, its answer lost.
func notSent(err error) bool {
	var ns *notSentError
	return errors.As(err, &ns) || isClosed(err)
}
