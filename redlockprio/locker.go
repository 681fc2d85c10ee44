package redlockprio

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"reflect"
	"strconv"
	"strings"
	"sync"
	"time"
	"unicode"

	"github.com/redis/go-redis/v9"

	"github.com/latchkey-go/latchkey/locks"
)

// names is the rule for lock names: the name becomes a Redis Cluster hash
// tag ({name}), so it must not contain braces.
var names = locks.NameRule{
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

	mu       sync.Mutex
	closing  bool // no new acquisitions
	closed   bool // no new I/O goroutines
	done     chan struct{}
	wg       sync.WaitGroup
	entries  map[string]*Lease // by holder id: held leases and attempts in flight
	renewing bool
	acks     map[string]chan struct{} // victim holder id -> closed on its ack

	subOnce  sync.Once
	subReady chan struct{} // closed once the inbox is subscribed (or gave up)
	subMu    sync.Mutex    // serializes (un)subscriptions of release channels
	pubsubs  []*redis.PubSub
	watchers map[string]map[chan struct{}]struct{} // release channel -> waiters
	subAcked []bool                                // per master: inbox subscription confirmed
	subAll   chan struct{}                         // closed once every master confirmed
}

var _ locks.Locker = (*Locker)(nil)

// New returns a Locker over masters, each an independent Redis master
// (a *redis.Client, or a *redis.ClusterClient: every key of a name shares
// the hash tag {name}). N = len(masters) must be at least 1; the quorum
// is N/2+1. A nil, repeated or missing master, or an invalid option,
// returns an error matching [locks.ErrInvalidOption] before any I/O; New
// itself does no I/O.
//
// So that a hung master (paused, partitioned) cannot hold a call past its
// context, give each client ContextTimeoutEnabled: true; otherwise the
// client's read and write timeouts bound such calls, and the Locker still
// stops waiting for them at the step's deadline.
func New(masters []redis.UniversalClient, opts ...Option) (*Locker, error) {
	if len(masters) == 0 {
		return nil, fmt.Errorf("redlockprio: %w", locks.InvalidOption("at least one master is needed"))
	}
	ms := make([]*master, len(masters))
	for i, c := range masters {
		if isNil(c) {
			return nil, fmt.Errorf("redlockprio: %w", locks.InvalidOption("master %d is nil", i))
		}
		for _, m := range ms[:i] {
			if sameClient(m.c, c) {
				return nil, fmt.Errorf("redlockprio: %w", locks.InvalidOption("master %d is given twice: masters must be independent", i))
			}
		}
		ms[i] = &master{index: i, addr: addrOf(c), c: c}
	}
	o := defaults()
	if err := locks.Apply(&o, opts); err != nil {
		return nil, fmt.Errorf("redlockprio: %w", err)
	}
	if d := o.driftFor(); d >= o.ttl/2 {
		return nil, fmt.Errorf("redlockprio: %w", locks.InvalidOption("drift allowance %v leaves too little of the TTL %v", d, o.ttl))
	}
	// See WithRenewInterval for why a third of the validity.
	maxRenew := (o.ttl - o.driftFor()) / 3
	if o.renew == 0 {
		o.renew = maxRenew
	}
	if o.renew > maxRenew {
		return nil, fmt.Errorf("redlockprio: %w", locks.InvalidOption("renew interval %v must be at most (TTL − drift)/3 = %v", o.renew, maxRenew))
	}
	id := o.holderID
	if id == "" {
		id = randomID(8)
	}
	l := &Locker{
		masters:  ms,
		quorum:   len(ms)/2 + 1,
		o:        o,
		drift:    o.driftFor(),
		id:       id,
		done:     make(chan struct{}),
		entries:  map[string]*Lease{},
		acks:     map[string]chan struct{}{},
		subReady: make(chan struct{}),
		watchers: map[string]map[chan struct{}]struct{}{},
		subAcked: make([]bool, len(ms)),
	}
	l.inbox = o.prefix + "inbox:" + id + ":" + randomID(8)
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
// and returns once the holder has acknowledged or its validity has
// provably run out.
//
// When fewer than a quorum of masters answer, Lock fails at once with a
// [*QuorumError]. When ctx ends first, Lock returns an error matching
// ctx.Err() and holds nothing.
func (l *Locker) Lock(ctx context.Context, name string) (locks.Lease, error) {
	if err := names.Check(name); err != nil {
		return nil, fmt.Errorf("redlockprio: lock: %w", err)
	}
	return l.wait(ctx, name, 1)
}

// TryLock takes name if it is free (or held by a lower priority); see
// [locks.Locker.TryLock]. When it is held elsewhere, TryLock returns a
// [*locks.HeldError] (matching [locks.ErrNotAcquired]) whose RetryAfter
// is the holder's remaining TTL; when fewer than a quorum of masters
// answer, a [*QuorumError].
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
	if err == nil || !errors.Is(err, locks.ErrNotAcquired) || ctx.Err() != nil {
		return lease, err
	}
	wake, stop := l.watch(ctx, l.relChannel(name))
	defer stop()
	return locks.Wait(ctx, wake, l.o.backoff, func(ctx context.Context) (locks.Lease, error) {
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

	cause := locks.Lost(fmt.Errorf("redlockprio: locker %s: %w", l.id, locks.ErrClosed))
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

// fanout runs step on every master in parallel and collects the answers
// until all are in, ctx ends, or enough(answers so far) says the outcome
// is decided. Masters that have not answered get a context error. Calls
// still running when fanout returns finish in the background (Close waits
// for them).
func (l *Locker) fanout(ctx context.Context, ms []*master, step func(ctx context.Context, m *master) (any, error), enough func([]result) bool) []result {
	ch := make(chan result, len(ms))
	started := 0
	for _, m := range ms {
		if l.goTracked(func() {
			v, err := step(ctx, m)
			ch <- result{m: m, val: v, err: err}
		}) {
			started++
		}
	}
	got := make([]result, 0, len(ms))
	answered := map[*master]bool{}
	for len(got) < started {
		select {
		case r := <-ch:
			if r.err != nil {
				r.err = &masterError{index: r.m.index, addr: r.m.addr, err: r.err}
			}
			got = append(got, r)
			answered[r.m] = true
			if enough != nil && enough(got) {
				return got
			}
			continue
		case <-ctx.Done():
		}
		break
	}
	for _, m := range ms {
		if !answered[m] {
			err := ctx.Err()
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

// runScript runs s by SHA on c, falling back to EVAL (which loads it) on
// NOSCRIPT.
func runScript(ctx context.Context, s *redis.Script, c redis.UniversalClient, keys []string, args ...any) (any, error) {
	return s.Run(ctx, c, keys, args...).Result()
}

// isClosed reports whether err says the client itself was closed.
func isClosed(err error) bool {
	return errors.Is(err, redis.ErrClosed)
}
