package natsputex

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/latchkey-go/latchkey/locks"
	"github.com/latchkey-go/latchkey/locks/driver"
)

// Locker is a [locks.Locker] on a [Client]'s bucket: a lock is one key,
// named as the lock.
//
// A Locker is safe for concurrent use; one Locker may hold many names.
type Locker struct{ c *Client }

var _ locks.Locker = (*Locker)(nil)

// Locker returns the client's Locker.
func (c *Client) Locker() *Locker { return &Locker{c} }

// Lock blocks until it holds the key name, and returns the lease; see
// [locks.Locker.Lock]. A free key (missing or blank) is taken at once; a
// key held by another token is taken over only after it has gone T = F·R
// without any write, and then handed over after C more renewal intervals.
// The silence is counted from the key's last write as the server's clock
// stamped it, against the server's time when this call first reads the
// key (see the package doc), and from then on by this call's own clock;
// so a key silent for T already is taken over at once. The wait is woken
// by a KV watch on the key.
//
// On failure Lock returns an error and holds nothing; when ctx ends first,
// the error matches ctx.Err(). A takeover given up before its C intervals
// of confirmation are done (ctx ended, a write failed) leaves its last
// write in the key rather than blanking it: the holder it displaced may
// still be using its lease, so the next caller waits T without a write and
// confirms (the value written while confirming carries the longer T and
// C·R of this client's and the displaced holder's: see the package doc). A
// write that would take the key is not interrupted when ctx ends (it could
// land all the same, and leave the key held by no one for T): Lock then
// returns once it is answered, at most max(T, 1s) later, with the lease if
// the write won the key. An invalid key name gives an error matching
// [locks.ErrInvalidName] before any I/O.
func (l *Locker) Lock(ctx context.Context, name string) (locks.Lease, error) {
	if err := keys.Check(name); err != nil {
		return nil, fmt.Errorf("natsputex: lock: %w", err)
	}
	return l.c.acquire(ctx, name, []string{name}, true)
}

// TryLock takes the key name if it is free (missing or blank), or if its
// holder has not written it for T = F·R by the server's clock (a crashed
// holder's key: see the package doc), and returns an error matching
// [locks.ErrNotAcquired] at once otherwise: a [*locks.HeldError] naming
// the holder's token. Taking a silent key over, TryLock confirms it like
// Lock does, so it returns after C renewal intervals. A TryLock made T or
// more after a crashed holder's last write takes the key: within T + R +
// C·R of the crash (the holder wrote at most R before it).
func (l *Locker) TryLock(ctx context.Context, name string) (locks.Lease, error) {
	if err := keys.Check(name); err != nil {
		return nil, fmt.Errorf("natsputex: lock: %w", err)
	}
	return l.c.acquire(ctx, name, []string{name}, false)
}

// Semaphore is a [locks.Semaphore] on a [Client]'s bucket: the N slots of a
// name are the keys name.1 … name.N, each held by the rules of a lock.
// (So a lock named "jobs.1" is slot 1 of the semaphore "jobs".) Its leases
// implement [locks.SlotLease].
//
// A Semaphore is safe for concurrent use.
type Semaphore struct {
	c    *Client
	size int
}

var _ locks.Semaphore = (*Semaphore)(nil)

// MaxSemaphoreSize is the largest size of a [Semaphore]: every waiting
// Acquire tries each slot key in turn.
const MaxSemaphoreSize = 4096

// Semaphore returns a Semaphore with size slots per name. A size below 1
// or above [MaxSemaphoreSize] returns an error matching
// [locks.ErrInvalidOption]. Semaphores of different sizes may share a
// name: each uses only the first size slots.
func (c *Client) Semaphore(size int) (*Semaphore, error) {
	if size < 1 || size > MaxSemaphoreSize {
		return nil, fmt.Errorf("natsputex: %w", driver.InvalidOption("semaphore size must be in 1..%d, got %d", MaxSemaphoreSize, size))
	}
	return &Semaphore{c: c, size: size}, nil
}

// Acquire blocks until it holds a slot of name; see
// [locks.Semaphore.Acquire] and [Locker.Lock] for the rules of each slot.
func (s *Semaphore) Acquire(ctx context.Context, name string) (locks.Lease, error) {
	ks, err := s.slots(name)
	if err != nil {
		return nil, err
	}
	return s.c.acquire(ctx, name, ks, true)
}

// TryAcquire takes a free slot of name if there is one, and returns an
// error matching [locks.ErrNotAcquired] at once otherwise; see
// [Locker.TryLock].
func (s *Semaphore) TryAcquire(ctx context.Context, name string) (locks.Lease, error) {
	ks, err := s.slots(name)
	if err != nil {
		return nil, err
	}
	return s.c.acquire(ctx, name, ks, false)
}

func (s *Semaphore) slots(name string) ([]string, error) {
	if err := keys.Check(name); err != nil {
		return nil, fmt.Errorf("natsputex: acquire: %w", err)
	}
	if len(name) > keyMaxLen-12 {
		return nil, fmt.Errorf("natsputex: acquire: %w %q: too long for slot keys", locks.ErrInvalidName, name)
	}
	ks := make([]string, s.size)
	for i := range ks {
		ks[i] = name + "." + strconv.Itoa(i+1)
	}
	return ks, nil
}

// acquire takes one of ks (a lock's key, or a semaphore's slot keys) for
// name, waiting if wait is set.
func (c *Client) acquire(ctx context.Context, name string, ks []string, wait bool) (locks.Lease, error) {
	if c.ctx.Err() != nil {
		return nil, c.closedErr(fmt.Sprintf("%q", name))
	}
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("natsputex: %q: %w", name, err)
	}
	bctx, stop := c.bind(ctx)
	defer stop()
	cl := newClocks(len(ks))
	try := func(ctx context.Context) (locks.Lease, error) {
		lease, err := c.tryKeys(ctx, name, ks, cl)
		if err != nil && wait && ctx.Err() == nil && transient(err) {
			// A broker between leaders: keep waiting, as for a held key.
			return nil, &locks.HeldError{Name: name, RetryAfter: c.o.renew, Err: err}
		}
		return lease, err
	}
	lease, err := try(bctx)
	if err != nil && wait && errors.Is(err, locks.ErrNotAcquired) {
		var w *watch
		if w, err = c.watch(bctx, name, ks, cl); err == nil {
			defer c.stopWatch(w)
			lease, err = driver.Wait(bctx, w.wake, c.o.backoff, try)
		} else if bctx.Err() == nil {
			// No watch (a broker refusing consumers): poll.
			lease, err = driver.Wait(bctx, nil, c.o.backoff, try)
		}
	}
	if err == nil {
		return lease, nil
	}
	switch {
	case ctx.Err() != nil:
		if !errors.Is(err, ctx.Err()) {
			err = fmt.Errorf("natsputex: %q: %w", name, ctx.Err())
		}
	case c.ctx.Err() != nil:
		err = c.closedErr(fmt.Sprintf("%q", name))
	}
	return nil, err
}

// tryKeys makes one attempt on each of ks, in an order starting at a
// random key, and returns the first lease won. When none is, it returns a
// HeldError with the soonest moment a takeover may become possible.
func (c *Client) tryKeys(ctx context.Context, name string, ks []string, cl *clocks) (locks.Lease, error) {
	first := 0
	if len(ks) > 1 {
		first = rand.IntN(len(ks))
	}
	var soonest *locks.HeldError
	clock := &serverClock{st: c.st}
	for n := range ks {
		i := (first + n) % len(ks)
		lease, err := c.tryKey(ctx, name, ks[i], i, len(ks) > 1, cl, clock)
		if err == nil {
			return lease, nil
		}
		var held *locks.HeldError
		if !errors.As(err, &held) {
			return nil, err
		}
		if soonest == nil || held.RetryAfter < soonest.RetryAfter {
			soonest = held
		}
	}
	return nil, soonest
}

// serverClock asks the server for its time once per attempt on a set of
// keys (see [store.now]): a time asked before a key was read only makes
// the key look younger than it is.
type serverClock struct {
	st   store
	t    time.Time
	err  error
	done bool
}

func (sc *serverClock) now(ctx context.Context) (time.Time, error) {
	if !sc.done {
		sc.t, sc.err = sc.st.now(ctx)
		sc.done = true
	}
	return sc.t, sc.err
}

// tryKey makes one attempt at key, slot i of ks.
func (c *Client) tryKey(ctx context.Context, name, key string, i int, slotted bool, cl *clocks, clock *serverClock) (*lease, error) {
	slot := 0
	if slotted {
		slot = i + 1
	}
	token := c.newToken()
	blank, ok := c.knownBlank(key)
	if !ok {
		blank, ok = cl.takeBlank(i, c.o.ttl())
	}
	if ok {
		// This client blanked the key last, or this call's watch saw it
		// blanked: try to write over that blank directly, one round trip;
		// a conflict means someone wrote since.
		start := time.Now()
		octx, cancel := c.writeContext(ctx)
		nrev, err := c.st.renew(octx, key, token, blank)
		cancel()
		if err == nil {
			return c.hold(ctx, name, key, slot, token, nrev, nrev, start)
		}
		if !isConflict(err) {
			return nil, fmt.Errorf("natsputex: %q: %w", name, err)
		}
	}
	octx, cancel := c.opContext(ctx)
	r, err := c.st.read(octx, key)
	cancel()
	if err != nil {
		return nil, fmt.Errorf("natsputex: %q: read %q: %w", name, key, err)
	}
	quiet := cl.see(i, r.rev, r.at)
	held := func(retry time.Duration, err error) *locks.HeldError {
		return &locks.HeldError{Name: name, Holder: r.holder, RetryAfter: retry, Err: err}
	}
	// The holder's timing counts when it is longer than this client's: a
	// holder renews for its own T, and a taker-over that waited less
	// could take a live holder's key between two of its renewals. A
	// Locker's token carries its T, a Supervisor's value its T and C·R.
	_, ht, _ := parseValue(r.holder)
	cl.noteTiming(i, ht)
	// A free key is taken at once, unless this call saw it vanish or its
	// revision go back (the bucket made again) less than T ago: a holder
	// of the key's past may still hold it, so it is taken as a held key,
	// after T of silence.
	if r.free() && !cl.rebornHold(i, c.o.ttl()) {
		start := time.Now()
		octx, cancel := c.writeContext(ctx)
		rev, err := c.st.claim(octx, key, token, r)
		cancel()
		switch {
		case isConflict(err):
			return nil, held(0, err)
		case err != nil:
			return nil, fmt.Errorf("natsputex: %q: write %q: %w", name, key, err)
		}
		return c.hold(ctx, name, key, slot, token, rev, rev, start)
	}
	if r.free() {
		ht = cl.longest(i) // a holder of the key's past: the longest seen
	}
	T := max(c.o.ttl(), ht.ttl)
	if quiet < T && !r.at.IsZero() && !cl.measured(i, r.rev) {
		// The first sight of this write by this call (every TryLock's):
		// ask the server how long ago it was stored, by its own clock,
		// so that a key silent for T already is taken over now, not
		// after this call has watched it for T. If the server cannot
		// tell, this call's own clock counts alone.
		octx, cancel := c.opContext(ctx)
		now, err := clock.now(octx)
		cancel()
		if err == nil {
			quiet = cl.backdate(i, r.rev, now.Sub(r.at))
		}
	}
	if quiet < T {
		return nil, held(T-quiet, nil)
	}
	// The key has gone T without a write, by the server's clock or this
	// call's own: the holder is presumed dead. Take it over, then confirm
	// for C intervals.
	if err := c.healthCheck(ctx, Standby); err != nil {
		return nil, held(c.o.renew, err)
	}
	// While it confirms, the taker-over writes its token with the longer
	// of its own timing and the displaced holder's (as a Supervisor's
	// value carries it): should it give up or die before its
	// confirmations are done, the key keeps that write, and the next
	// taker waits T without a write and confirms as long as the
	// displaced holder counts on, along a chain of confirmers too. The
	// last confirmation writes the lease's own token.
	steps := c.o.confirmSteps(ht.confirm)
	value := token
	if steps > 0 {
		value = valueOf(token, timing{T, max(time.Duration(c.o.confirm)*c.o.renew, ht.confirm)})
	}
	start := time.Now()
	octx, cancel = c.writeContext(ctx)
	won, err := c.st.claim(octx, key, value, r)
	cancel()
	switch {
	case isConflict(err):
		return nil, held(0, err)
	case err != nil:
		return nil, fmt.Errorf("natsputex: %q: take over %q: %w", name, key, err)
	}
	rev := won
	for step := range steps {
		if err = sleepCtx(ctx, c.o.renewEvery()); err != nil {
			break
		}
		if step == steps-1 {
			value = token
		}
		start = time.Now()
		var nrev uint64
		octx, cancel := c.opContext(ctx)
		nrev, err = c.st.renew(octx, key, value, rev)
		cancel()
		if err != nil {
			break
		}
		rev = nrev
	}
	if err != nil {
		// Not blanked: the displaced holder may still be using its lease
		// (cut off, it ends it only at its T minus the margin, and counts
		// on C·R more); a blank key would be taken at once. The next
		// taker waits T without a write and confirms.
		if isConflict(err) {
			return nil, held(0, fmt.Errorf("lost the key while confirming the takeover: %w", err))
		}
		return nil, fmt.Errorf("natsputex: %q: confirm takeover of %q: %w", name, key, err)
	}
	return c.hold(ctx, name, key, slot, token, won, rev, start)
}

// abandon blanks key if it still holds token, with a context of its own:
// the call that wrote it is failing, maybe because its context ended.
func (c *Client) abandon(key, token string, rev uint64) {
	ctx, cancel := context.WithTimeout(context.Background(), c.o.ttl())
	defer cancel()
	if nrev, err := c.st.clear(ctx, key, token, rev); err == nil && nrev > 0 {
		c.rememberBlank(key, nrev)
	}
}

// lease is a held key.
type lease struct {
	*driver.Lease
	c     *Client
	key   string
	token string

	mu       sync.Mutex
	rev      uint64 // revision of the last successful write
	blankErr error  // why Release could not blank the key, if it could not
}

// hold makes the lease for key, won at revision won (the fencing token)
// and last written at rev by a write that started at start.
func (c *Client) hold(ctx context.Context, name, key string, slot int, token string, won, rev uint64, start time.Time) (*lease, error) {
	l := &lease{c: c, key: key, token: token, rev: rev}
	l.Lease = driver.NewLease(ctx, driver.Spec{
		Name:     name,
		Token:    won,
		Slot:     slot,
		Deadline: start.Add(c.o.validity()),
		Release:  l.release,
	})
	c.mu.Lock()
	if c.ctx.Err() != nil {
		c.mu.Unlock()
		l.End(driver.Lost(locks.ErrClosed))
		_ = l.Release(context.WithoutCancel(ctx))
		return nil, c.closedErr(fmt.Sprintf("%q", name))
	}
	c.leases[l] = struct{}{}
	c.mu.Unlock()
	context.AfterFunc(l.Context(), func() {
		c.mu.Lock()
		delete(c.leases, l)
		c.mu.Unlock()
	})
	if !l.Live() { // the write took longer than the validity
		_ = l.Release(context.WithoutCancel(ctx))
		return nil, &locks.HeldError{Name: name, Err: errors.New("natsputex: the winning write took longer than the lease's validity")}
	}
	l.KeepAlive(c.o.renewEvery(), l.renew)
	return l, nil
}

// renew runs the health check, then rewrites the token at the last
// revision. Any failure ends the lease at once; a failed health check
// ends it before one attempt to blank the key (so that a waiter takes
// over at once), never after: the key is free only once the lease is over.
func (l *lease) renew(ctx context.Context) (time.Time, error) {
	c := l.c
	if err := c.healthCheck(ctx, Active); err != nil {
		lost := driver.Lost(fmt.Errorf("natsputex: %q: %w", l.Name(), err))
		l.End(lost)
		l.mu.Lock()
		rev := l.rev
		l.mu.Unlock()
		c.abandon(l.key, l.token, rev)
		return time.Time{}, lost
	}
	ctx, cancel := context.WithTimeout(ctx, c.o.ttl())
	defer cancel()
	l.mu.Lock()
	defer l.mu.Unlock()
	start := time.Now()
	rev, err := c.st.renew(ctx, l.key, l.token, l.rev)
	if isConflict(err) {
		// A conflict may answer this very write, applied all the same: a
		// stream leader that lost its leadership answers it late, after
		// the new leader stored it. The key still holding this lease's
		// token (unique to it) at a later revision says so.
		if r, rerr := c.st.read(ctx, l.key); rerr == nil && r.holder == l.token && r.rev > l.rev {
			rev, err = r.rev, nil
		}
	}
	if err != nil {
		why := "renewal failed"
		if isConflict(err) {
			why = "the key was written by someone else"
		}
		return time.Time{}, driver.Lost(fmt.Errorf("natsputex: %q: %s (key %q, revision %d): %w", l.Name(), why, l.key, l.rev, err))
	}
	l.rev = rev
	return start.Add(c.o.validity()), nil
}

// release blanks the key if it is still this lease's.
func (l *lease) release(ctx context.Context) error {
	l.mu.Lock()
	rev := l.rev
	l.mu.Unlock()
	ctx, cancel := l.c.opContext(ctx)
	defer cancel()
	nrev, err := l.c.st.clear(ctx, l.key, l.token, rev)
	if err != nil {
		err = fmt.Errorf("natsputex: blank %q: %w", l.key, err)
		l.mu.Lock()
		l.blankErr = err
		l.mu.Unlock()
		return err
	}
	if nrev > 0 {
		l.c.rememberBlank(l.key, nrev)
	}
	return nil
}

// watch wakes a waiting call when one of its keys becomes free, and
// restarts the takeover clocks on every write it sees. Its KV watcher is
// made again each time the connection reconnects: the watcher's consumer
// may be gone with the server that ran it (a restart, a node lost), and
// nats.go would only notice after missing its heartbeats for 5–10 s.
type watch struct {
	wake chan struct{}

	quit   chan struct{} // closed by stop
	once   sync.Once
	cancel context.CancelFunc // ends every watcher's context, after the loop
	done   chan struct{}      // closed when the loop has returned
}

// rewatchPause bounds the pause between attempts to make a watcher again
// after a reconnect, while the server cannot make one yet.
const rewatchPause = 500 * time.Millisecond

func (c *Client) watch(ctx context.Context, name string, ks []string, cl *clocks) (*watch, error) {
	pattern := ks[0]
	if len(ks) > 1 {
		pattern = name + ".*" // one filter: NATS 2.9 has no multi-filter consumers
	}
	// The watch is a consumer on the server, and nats.go ends it when the
	// context it was made with ends. So its context is its own, not ctx:
	// a ctx ending in the middle of the creation would leave a consumer
	// this call never learns of. stop ends it.
	wctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	// Listen for reconnects before the first watcher is made, so that none
	// is missed between the two.
	reconnected := c.st.nc.StatusChanged(nats.CONNECTED)
	kw, err := c.st.kv.Watch(wctx, pattern)
	if err != nil {
		c.st.nc.RemoveStatusListener(reconnected)
		cancel()
		return nil, fmt.Errorf("natsputex: %q: watch: %w", name, err)
	}
	w := &watch{wake: make(chan struct{}, 1), quit: make(chan struct{}), cancel: cancel, done: make(chan struct{})}
	index := make(map[string]int, len(ks))
	for i, k := range ks {
		index[k] = i
	}
	wake := func() {
		select {
		case w.wake <- struct{}{}:
		default:
		}
	}
	// drain handles kw's entries until it closes its channel (after Stop
	// or when the connection closes): its callback blocks on a full
	// channel.
	drain := func(kw jetstream.KeyWatcher) {
		for e := range kw.Updates() {
			if e == nil {
				continue
			}
			i, ok := index[e.Key()]
			if !ok {
				continue
			}
			if e.Operation() == jetstream.KeyValuePut && len(e.Value()) == 0 {
				cl.seeBlank(i, e.Revision(), e.Created())
			} else {
				cl.see(i, e.Revision(), e.Created())
			}
			if e.Operation() != jetstream.KeyValuePut || len(e.Value()) == 0 {
				wake()
			}
		}
	}
	go func() {
		defer close(w.done)
		var bg sync.WaitGroup
		defer bg.Wait()
		defer c.st.nc.RemoveStatusListener(reconnected)
		first := kw // the closure must not see kw replaced below
		bg.Go(func() { drain(first) })
		var retry <-chan time.Time
		for {
			select {
			case <-w.quit:
				_ = kw.Stop()
				return
			case _, ok := <-reconnected:
				if !ok {
					return
				}
			case <-retry:
			}
			retry = nil
			// The connection is back: a release may have gone unseen
			// while it was down, so the waiter looks again at once, and
			// a new watcher replaces the old one.
			wake()
			nkw, err := c.st.kv.Watch(wctx, pattern)
			if err != nil {
				retry = time.After(rewatchPause)
				continue
			}
			old := kw
			kw = nkw
			bg.Go(func() { drain(nkw) })
			bg.Go(func() { _ = old.Stop() })
		}
	}()
	return w, nil
}

// stopWatch stops w in the background, so that a waiting call returns as
// soon as it has its answer: stopping the watch deletes its consumer, a
// request that waits out its timeout (5s) when the node running the
// consumer, or the meta leader, is unreachable. A closed client stops it
// here.
func (c *Client) stopWatch(w *watch) {
	c.mu.Lock()
	if c.ctx.Err() != nil {
		c.mu.Unlock()
		w.stop()
		return
	}
	c.stopping.Add(1)
	c.mu.Unlock()
	go func() {
		defer c.stopping.Done()
		w.stop()
	}()
}

// stop ends the watch and waits, up to 5 s, for its goroutines to end.
func (w *watch) stop() {
	w.once.Do(func() { close(w.quit) })
	select {
	case <-w.done:
	case <-time.After(5 * time.Second):
	}
	w.cancel()
	select {
	case <-w.done:
	case <-time.After(5 * time.Second):
	}
}

// transient reports whether err is the broker being briefly unable to
// answer (a stream electing a leader, a request timing out), which a
// waiting Lock or Acquire rides out.
func transient(err error) bool {
	var apiErr *jetstream.APIError
	return errors.Is(err, nats.ErrTimeout) || errors.Is(err, context.DeadlineExceeded) ||
		errors.Is(err, nats.ErrNoResponders) || errors.Is(err, jetstream.ErrNoStreamResponse) ||
		errors.As(err, &apiErr) && apiErr.Code == 503
}
