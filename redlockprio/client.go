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
	"sync/atomic"
	"time"
	"unicode"

	"github.com/redis/go-redis/v9"

	"github.com/latchkey-go/latchkey/locks"
	"github.com/latchkey-go/latchkey/locks/driver"
)

// backend names the package in errors and events.
const backend = "redlockprio"

// names is the rule for lock names: the name becomes a Redis Cluster hash
// tag ({name}), so it must not contain braces.
var names = driver.NameRule{
	What:   "redlockprio name",
	MaxLen: 1024,
	Char:   func(r rune) bool { return r != '{' && r != '}' && !unicode.IsControl(r) },
}

// MaxSemaphoreSize is the largest size [Client.Semaphore] accepts: each
// slot is a key every acquire script looks at.
const MaxSemaphoreSize = 1024

// Client holds leases on N independent Redis masters: a lease is held on
// a quorum (N/2+1) of them. Its [Locker] and its [Semaphore]s share its
// connections, its renewal (all its leases in one pipelined round trip per
// master per renewal interval) and its notifications.
//
// A Client is safe for concurrent use and may hold many names at once.
// Close it when done: it releases what it holds. It never closes the
// go-redis clients it was given.
type Client struct {
	masters []*master
	quorum  int
	o       options
	drift   time.Duration
	id      string // this Client's identity, the readable part of holder ids
	inbox   string // channel on which thieves notify this Client's victims
	nonce   string // holder ids start with it (see holderID)
	leases  atomic.Uint64
	callTO  time.Duration // per-master call timeout
	reg     *driver.Registry
	locker  *Locker

	// dup is set once two masters are found to be the same server: every
	// later acquisition fails with it.
	dup         atomic.Pointer[error]
	identOnce   sync.Once
	identDone   chan struct{} // closed once the first identification is over
	identQuorum chan struct{} // closed once a quorum of masters is verified
	identGrace  time.Duration // set before identQuorum is closed
	// longest is the longest PTTL, in ms, this Client has seen on a key of
	// another holder: how long a key it may have taken without hearing of
	// it can live (see keptFor).
	longest atomic.Int64

	mu      sync.Mutex
	closing bool // no new acquisitions
	closed  bool // no new I/O goroutines
	done    chan struct{}
	work    chan func() // hands calls to idle workers
	// closedFlag mirrors closed for runOnWorker's lock-free check.
	closedFlag atomic.Bool

	seqMu sync.Mutex
	seq   map[seqKey]chan struct{} // see sequence
	// admitted holds, by name, the steps of this Client's arrivals and
	// waits under way (see admit); guarded by seqMu.
	admitted map[string]*admission
	wg       sync.WaitGroup
	// claims holds, by holder id, the attempts in flight and the leases
	// they became, until no notice about them can need waiting for.
	claims  map[string]*claim
	byLease map[*driver.Lease]*claim // the claims of the registered leases
	acks    map[string]*ackWait      // victim holder id -> its acknowledgement
	// kept holds the ids of failed attempts that may have kept keys they
	// took from holders they never told (see giveUp), until those keys
	// have surely expired: a thief that finds such a key gets no
	// acknowledgement for it, and waits it out.
	kept map[string]time.Time
	// vouched holds the ids of claims this Client forgot knowing every
	// key they left (a lease let go of or lost, an attempt that heard
	// every master), for as long as such a key can live (keptFor): a
	// thief's notice about one is answered "A", about any other id it
	// does not know "U" (see notice). vouchedQ lists them oldest first.
	vouched  map[string]time.Time
	vouchedQ []string

	subOnce   sync.Once
	subReady  chan struct{} // closed once the inbox is subscribed (or gave up)
	subMu     sync.Mutex    // serializes (un)subscriptions of release channels
	pubsubs   []*redis.PubSub
	watchers  map[string]*watchState // by release channel, guarded by mu
	sweeping  bool                   // a sweep goroutine runs; guarded by mu
	subAcked  []bool                 // per master: inbox subscription confirmed
	subQuorum chan struct{}          // closed once a quorum of masters confirmed
	// qwake holds, by queue member, the wake-up channel of each of this
	// Client's queued Locks (see queue.go); guarded by mu.
	qwake map[string]*queueWake
	// refreshes holds, by name, the queue entries this Client's Locks
	// keep there, refreshed together (see Client.refresh); made on first
	// use, guarded by mu.
	refreshes map[string]*nameRefresh
	// calls counts the Lock, TryLock, Acquire and TryAcquire calls under
	// way, so that Close lets them clean up (leave the queue, delete what
	// an attempt got) before the workers stop; added to under mu, and
	// only while the Client is not closing.
	calls sync.WaitGroup
}

// New returns a Client over masters, each an independent Redis master (a
// *redis.Client, or a *redis.ClusterClient: every key of a name shares the
// hash tag {name}); a []*redis.Client is taken as it is. N = len(masters)
// must be at least 1; the quorum is N/2+1. A nil, repeated or missing
// master, two masters without [WithTwoMasters] (they tolerate no failure),
// or an invalid option, returns an error matching [locks.ErrInvalidOption]
// before any I/O; New itself does no I/O. Two clients of one server (the
// same address twice, or two names of one host) are found on first
// contact instead: see [Locker.Lock].
//
// So that a hung master (paused, partitioned) cannot hold a call past its
// context, give each client ContextTimeoutEnabled: true; otherwise the
// client's read and write timeouts bound such calls, and the Client still
// stops waiting for them at the step's deadline.
func New[C redis.UniversalClient](masters []C, opts ...Option) (*Client, error) {
	ms, err := newMasters(masters)
	if err != nil {
		return nil, driver.Errorf(backend, "new", "", err)
	}
	o, err := checkOptions(len(ms), opts)
	if err != nil {
		return nil, driver.Errorf(backend, "new", "", err)
	}
	id := o.holderID
	if id == "" {
		id = randomID(8)
	}
	c := &Client{
		masters:  ms,
		quorum:   len(ms)/2 + 1,
		o:        o,
		callTO:   o.callTimeoutFor(),
		drift:    o.driftFor(),
		id:       id,
		done:     make(chan struct{}),
		work:     make(chan func()),
		seq:      map[seqKey]chan struct{}{},
		admitted: map[string]*admission{},
		claims:   map[string]*claim{},
		byLease:  map[*driver.Lease]*claim{},
		acks:     map[string]*ackWait{},
		kept:     map[string]time.Time{},
		vouched:  map[string]time.Time{},
		subReady: make(chan struct{}),
		watchers: map[string]*watchState{},
		qwake:    map[string]*queueWake{},
		subAcked: make([]bool, len(ms)),
	}
	c.inbox = o.prefix + "inbox:" + id + ":" + randomID(8)
	c.nonce = id + ":" + randomID(12) + "-"
	c.reg, err = driver.NewRegistry(driver.Config{Backend: backend, RenewEvery: o.renew, Renew: c.renew})
	if err != nil {
		return nil, driver.Errorf(backend, "new", "", err)
	}
	c.locker = &Locker{c: c}
	return c, nil
}

// newMasters checks the clients given to New: none nil, none twice.
func newMasters[C redis.UniversalClient](masters []C) ([]*master, error) {
	if len(masters) == 0 {
		return nil, driver.InvalidOption("at least one master is needed")
	}
	ms := make([]*master, len(masters))
	for i, mc := range masters {
		var rc redis.UniversalClient = mc
		if isNil(rc) {
			return nil, driver.InvalidOption("master %d is nil", i)
		}
		for _, m := range ms[:i] {
			if sameClient(m.c, rc) {
				return nil, driver.InvalidOption("master %d is given twice: masters must be independent", i)
			}
		}
		ms[i] = &master{index: i, addr: addrOf(rc), c: rc, deadlines: honorsDeadlines(rc), oneShot: oneShot(rc)}
	}
	return ms, nil
}

// checkOptions applies opts for n masters and checks that the TTL leaves
// room for a step's calls and the renewals.
func checkOptions(n int, opts []Option) (options, error) {
	o := defaults()
	if err := driver.Apply(&o, opts); err != nil {
		return o, err
	}
	if n == 2 && !o.twoMasters {
		return o, driver.InvalidOption("two masters tolerate no failure (their quorum is both): use 1, 3 or more, or WithTwoMasters")
	}
	if d := o.driftFor(); d >= o.ttl/2 {
		return o, driver.InvalidOption("drift allowance %v leaves too little of the TTL %v", d, o.ttl)
	}
	callTO := o.callTimeoutFor()
	if most := (o.ttl - o.driftFor()) / 2; most < minCallTimeout {
		return o, driver.InvalidOption("TTL %v is too short: a step would have %v per master call ((TTL − drift)/2), under %v", o.ttl, most, minCallTimeout)
	} else if callTO > most || callTO < minCallTimeout {
		return o, driver.InvalidOption("call timeout %v must be in [%v, (TTL − drift)/2 = %v]", callTO, minCallTimeout, most)
	}
	// See WithRenewInterval for why a third of the validity.
	maxRenew := (o.ttl - o.driftFor()) / 3
	if o.renew == 0 {
		o.renew = maxRenew
	}
	if o.renew > maxRenew {
		return o, driver.InvalidOption("renew interval %v must be at most (TTL − drift)/3 = %v", o.renew, maxRenew)
	}
	return o, nil
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

// holderID returns a new holder id, unique to the lease: the Client's
// id, ':', a random part drawn once per Client, and a counter.
func (c *Client) holderID() string {
	n := c.leases.Add(1)
	id := make([]byte, 0, len(c.nonce)+17)
	id = append(id, c.nonce...)
	id = strconv.AppendUint(id, n, 16)
	return string(id)
}

func randomID(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b) // never fails (crypto/rand panics rather)
	return hex.EncodeToString(b)
}

// Quorum returns how many masters must grant a lease: N/2+1.
func (c *Client) Quorum() int { return c.quorum }

// ID returns the Client's holder identity ([WithHolderID]).
func (c *Client) ID() string { return c.id }

// Locker returns the Client's [Locker]. Every call returns the same
// Locker.
func (c *Client) Locker() *Locker { return c.locker }

// Semaphore returns a [Semaphore] with size slots per name sharing the
// Client's connections, options and renewal. A size outside
// [1, MaxSemaphoreSize] returns an error matching [locks.ErrInvalidOption],
// without I/O.
func (c *Client) Semaphore(size int) (*Semaphore, error) {
	if size < 1 || size > MaxSemaphoreSize {
		return nil, driver.Errorf(backend, "semaphore", "", driver.InvalidOption("semaphore size must be in [1, %d], got %d", MaxSemaphoreSize, size))
	}
	return &Semaphore{c: c, size: size}, nil
}

// Close ends every lease of the Client (their contexts end with an error
// matching [locks.ErrLost] and [locks.ErrClosed]) and releases them at
// the masters, makes waiting calls return and later calls fail with an
// error matching [locks.ErrClosed], and stops the Client's renewal and
// notification goroutines. A theft still waiting for its victims, or one
// given up, leaves its keys at the masters to expire after the TTL (a
// victim may still run until then) rather than delaying Close. Every wait
// is bounded by ctx: when ctx ends first, Close returns an error matching
// ctx.Err() and the rest finishes in the background.
//
// With a ctx that never ends, Close returns within the call timeout
// ([WithCallTimeout]) of its start when masters do not answer (paused,
// partitioned: their connections open and silent), whether they hung
// before the Client's first call or while it held leases; within twice
// it when a waiting Lock must also leave the name's queue. The releases
// wait that long for them; then their calls, and the closing of the
// Client's subscriptions on them (go-redis holds a subscription while it
// connects), are left to end in the background: at their deadlines with
// go-redis's ContextTimeoutEnabled (the call timeout; max(TTL/2, 1s) for
// a notice to another Client), else, and for a subscription reconnecting
// after its connection broke, when go-redis gives them up (its dial and
// read timeouts, 5s and 3s by default, and its retries). It does not
// close the masters' clients. Close is idempotent (later calls return
// nil at once) and safe from any goroutine.
func (c *Client) Close(ctx context.Context) error {
	if err := driver.CheckContext(ctx, backend, "close", ""); err != nil {
		return err
	}
	c.mu.Lock()
	if c.closing {
		c.mu.Unlock()
		return nil
	}
	c.closing = true // no attempt registers a lease from now on
	c.mu.Unlock()
	start := time.Now()

	err := c.reg.Close(ctx, nil)
	select {
	case <-c.reg.Done():
		// The calls under way, whose contexts reg.Close ended, clean up
		// on the workers before they stop: a queued Lock leaves the
		// queue, so that it does not block it for a TTL.
		calls := make(chan struct{})
		go func() {
			c.calls.Wait()
			close(calls)
		}()
		wait := time.NewTimer(c.callTO) // a cleanup on a hung master
		select {
		case <-calls:
		case <-wait.C:
		case <-ctx.Done():
		}
		wait.Stop()
		c.stop()
	default:
		// ctx ended before the releases did: they (and the victims'
		// acknowledgements they send) still need the workers and the
		// subscriptions, so those stop only once the releases are over.
		go func() {
			<-c.reg.Done()
			c.stop()
		}()
		return driver.Errorf(backend, "close", "", err)
	}
	stopped := make(chan struct{})
	go func() {
		c.wg.Wait()
		close(stopped)
	}()
	// A call to a master that does not answer is the caller's no longer
	// after the call timeout: Close does not wait for it longer either.
	// (Its goroutine ends when go-redis gives the call up: at once with
	// ContextTimeoutEnabled, else after go-redis's own read timeout.)
	abandon := time.NewTimer(max(time.Until(start.Add(c.callTO)), 0))
	defer abandon.Stop()
	select {
	case <-stopped:
	case <-abandon.C:
	case <-ctx.Done():
		err = errors.Join(err, ctx.Err())
	}
	return driver.Errorf(backend, "close", "", err)
}

// stop refuses new work, closes the subscriptions and tells the workers
// to go: the last step of Close, once every lease is released.
//
// The subscriptions are closed on goroutines of c.wg, which Close waits
// for no longer than its bound: a PubSub's Close waits for go-redis's
// lock on it, which a call under way holds (a subscription connecting to
// a master that accepted the connection and never answers holds it until
// the call's deadline, the call timeout, or without ContextTimeoutEnabled
// go-redis's own dial and read timeouts), and so does subMu, held by a
// subscription of a release channel.
func (c *Client) stop() {
	c.mu.Lock()
	c.closed = true
	c.closedFlag.Store(true)
	close(c.done)
	c.mu.Unlock()
	c.subOnce.Do(c.subReadyOnce) // no subscription from now on
	c.wg.Go(func() {
		c.subMu.Lock()
		pss := c.pubsubs
		c.pubsubs = nil
		c.subMu.Unlock()
		for _, ps := range pss {
			c.wg.Go(func() { _ = ps.Close() })
		}
	})
}

// goTracked runs f in a goroutine that Close waits for, unless the Client
// is closed; it reports whether f was started.
func (c *Client) goTracked(f func()) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return false
	}
	c.wg.Go(f)
	return true
}

func (c *Client) key(name string, slot int) string {
	return c.o.prefix + "{" + name + "}:" + strconv.Itoa(slot)
}

func (c *Client) fenceKey(name string) string { return c.o.prefix + "{" + name + "}:fence" }

func (c *Client) queueKeys(name string) (q, qt, qn string) {
	p := c.o.prefix + "{" + name + "}:"
	return p + "q", p + "qt", p + "qn"
}

func (c *Client) relChannel(name string) string { return c.o.prefix + "{" + name + "}:released" }

// deadlineFor is the end of the validity of a step started at start: the
// TTL minus the drift allowance.
func (c *Client) deadlineFor(start time.Time) time.Time {
	return start.Add(c.o.ttl - c.drift)
}

// quorumError returns the error of a step that reached got masters of the
// quorum needed, and reports one [driver.EventQuorumError] per master that
// failed.
func (c *Client) quorumError(name string, got int, errs []error) *QuorumError {
	for _, err := range errs {
		ev := driver.Event{Kind: driver.EventQuorumError, Name: name, Err: err}
		var me *masterError
		if errors.As(err, &me) {
			ev.Master = me.addr
		}
		c.reg.Emit(ev)
	}
	return &QuorumError{Got: got, Need: c.quorum, Errs: errs}
}

// callError is the error a call op on name returns for err: the one shape
// of [driver.Errorf], the name left to a [locks.HeldError] that names it
// already, and [locks.ErrClosed] when the Client closed under the call.
func (c *Client) callError(op, name string, err error) error {
	if err == nil {
		return nil
	}
	var he *locks.HeldError
	if errors.As(err, &he) {
		name = ""
	}
	return driver.Errorf(backend, op, name, err)
}
