package natsputex

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
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

var (
	_ locks.Locker      = (*Locker)(nil)
	_ driver.Observable = (*Locker)(nil)
)

// Locker returns the client's Locker.
func (c *Client) Locker() *Locker { return &Locker{c} }

// Lock blocks until it holds the key name, and returns the lease; see
// [locks.Locker.Lock]. A free key (missing or blank) is taken at once. A
// key held by another token is taken over once it has gone T = F·R
// without a write, counted from the write's time by the server's clock (a
// key silent for T already is taken at once), and handed over after C
// more renewal intervals of confirmation. Locks waiting for one name
// queue, first come, first served.
//
// On failure Lock returns an error and holds nothing; when ctx ends first,
// the error matches ctx.Err(). A write that would take the key is not
// interrupted when ctx ends: Lock then returns once it is answered, at
// most max(T, 1s) later, with the lease if the write won the key. A
// takeover given up before its confirmation leaves its last write in the
// key, so the next caller waits T. An invalid key name gives an error
// matching [locks.ErrInvalidName] before any I/O.
func (l *Locker) Lock(ctx context.Context, name string) (locks.Lease, error) {
	if err := keys.Check(name); err != nil {
		return nil, driver.Errorf(backend, "lock", "", err)
	}
	return l.c.acquire(ctx, "lock", name, []string{name}, true)
}

// TryLock takes the key name if it is free (missing or blank), or if its
// holder has not written it for T = F·R by the server's clock (a crashed
// holder's key), and returns an error matching [locks.ErrNotAcquired] at
// once otherwise, wrapping a [*locks.HeldError] (see [errors.As]) that
// names the holder's token. Taking
// a silent key over, TryLock confirms it like Lock does, so it returns
// after C renewal intervals. A TryLock made T or
// more after a crashed holder's last write takes the key: within T + R +
// C·R of the crash (the holder wrote at most R before it).
func (l *Locker) TryLock(ctx context.Context, name string) (locks.Lease, error) {
	if err := keys.Check(name); err != nil {
		return nil, driver.Errorf(backend, "trylock", "", err)
	}
	return l.c.acquire(ctx, "trylock", name, []string{name}, false)
}

// Observe implements [driver.Observable]: fn is told the events of the
// Locker's client (renewal rounds, takeovers, confirmations) until stop
// is called. It is safe for concurrent use.
func (l *Locker) Observe(fn func(driver.Event)) (stop func()) { return l.c.reg.Observe(fn) }

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

var (
	_ locks.Semaphore   = (*Semaphore)(nil)
	_ driver.Observable = (*Semaphore)(nil)
)

// MaxSemaphoreSize is the largest size of a [Semaphore]: every waiting
// Acquire tries each slot key in turn.
const MaxSemaphoreSize = 4096

// Semaphore returns a Semaphore with size slots per name. A size below 1
// or above [MaxSemaphoreSize] returns an error matching
// [locks.ErrInvalidOption]. Semaphores of different sizes may share a
// name: each uses only the first size slots.
func (c *Client) Semaphore(size int) (*Semaphore, error) {
	if size < 1 || size > MaxSemaphoreSize {
		return nil, driver.Errorf(backend, "semaphore", "", driver.InvalidOption("semaphore size must be in 1..%d, got %d", MaxSemaphoreSize, size))
	}
	return &Semaphore{c: c, size: size}, nil
}

// Observe implements [driver.Observable] as [Locker.Observe] does.
func (s *Semaphore) Observe(fn func(driver.Event)) (stop func()) { return s.c.reg.Observe(fn) }

// Acquire blocks until it holds a slot of name; see
// [locks.Semaphore.Acquire] and [Locker.Lock] for the rules of each slot.
func (s *Semaphore) Acquire(ctx context.Context, name string) (locks.Lease, error) {
	ks, err := s.slots("acquire", name)
	if err != nil {
		return nil, err
	}
	return s.c.acquire(ctx, "acquire", name, ks, true)
}

// TryAcquire takes a free slot of name if there is one, and returns an
// error matching [locks.ErrNotAcquired] at once otherwise; see
// [Locker.TryLock].
func (s *Semaphore) TryAcquire(ctx context.Context, name string) (locks.Lease, error) {
	ks, err := s.slots("tryacquire", name)
	if err != nil {
		return nil, err
	}
	return s.c.acquire(ctx, "tryacquire", name, ks, false)
}

// slots returns the slot keys of name, name.1 … name.N.
func (s *Semaphore) slots(op, name string) ([]string, error) {
	if err := keys.Check(name); err != nil {
		return nil, driver.Errorf(backend, op, "", err)
	}
	if len(name) > keyMaxLen-12 {
		return nil, driver.Errorf(backend, op, name, fmt.Errorf("%w: too long for slot keys", locks.ErrInvalidName))
	}
	ks := make([]string, s.size)
	for i := range ks {
		ks[i] = name + "." + strconv.Itoa(i+1)
	}
	return ks, nil
}

// acquire takes one of ks (a lock's key, or a semaphore's slot keys) for
// name, waiting if wait is set. op names the call in errors.
func (c *Client) acquire(ctx context.Context, op, name string, ks []string, wait bool) (locks.Lease, error) {
	if err := driver.CheckContext(ctx, backend, op, name); err != nil {
		return nil, err
	}
	if c.reg.Closed() {
		return nil, c.reg.ErrClosed(op, name)
	}
	if err := ctx.Err(); err != nil {
		return nil, driver.Errorf(backend, op, name, err)
	}
	bctx, stop := c.reg.Call(ctx) // Close waits for it: a head hands its turn on first
	defer stop()
	cl := newClocks(len(ks))
	turn := unqueued
	if op == "lock" {
		turn = outside
	}
	var kn *knocks
	if op == "lock" || op == "trylock" {
		kn = c.listenForKnocks(ks[0])
		defer kn.drop()
	}
	try := func(ctx context.Context) (locks.Lease, error) {
		lease, err := c.tryKeys(ctx, op, name, ks, cl, turn, kn)
		if err != nil && wait && ctx.Err() == nil && transient(err) {
			// A broker between leaders: keep waiting, as for a held key.
			return nil, &locks.HeldError{Name: name, RetryAfter: c.o.renew, Err: err}
		}
		return lease, err
	}
	lease, err := try(bctx)
	if err != nil {
		// Only a lease won at once, outside the queue, listens for the
		// head's knocks: one won later is the head's, and leaves the key
		// reserved anyway. A waiter listening would be a herd of knocks.
		kn.drop()
		kn = nil
	}
	if err != nil && wait && errors.Is(err, locks.ErrNotAcquired) && turn == outside {
		// A Lock waits its turn in the key's queue, then as its head.
		var queued bool
		seeFreed := func(rev uint64) { cl.seeFreed(0, rev) }
		lease, err, queued = c.waitTurn(bctx, op, name, ks[0], seeFreed, func(ctx context.Context) (locks.Lease, error) {
			turn = head
			return try(ctx)
		})
		if !queued {
			turn = unqueued // no queue (a server refusing it): every waiter watches
		}
	}
	if err != nil && wait && errors.Is(err, locks.ErrNotAcquired) {
		var w *watch
		if w, err = c.watch(bctx, op, name, ks, cl); err == nil {
			defer c.stopWatch(w)
			lease, err = driver.Wait(bctx, w.wake, c.o.backoff, try)
		} else if bctx.Err() == nil {
			// No watch (a broker refusing consumers): poll.
			lease, err = driver.Wait(bctx, nil, c.o.backoff, try)
		}
	}
	switch {
	case err == nil:
		return lease, nil
	case ctx.Err() != nil:
		if !errors.Is(err, ctx.Err()) {
			err = driver.Errorf(backend, op, name, ctx.Err())
		}
	case c.reg.Closed():
		err = c.reg.ErrClosed(op, name)
	default:
		if _, held := err.(*locks.HeldError); held {
			// A name held elsewhere: the one shape of errors too,
			// "natsputex: trylock: locks: not acquired: "x" is held by …".
			err = driver.Errorf(backend, op, name, err)
		}
	}
	return nil, err
}

// tryKeys makes one attempt on each of ks, in an order starting at a
// random key, and returns the first lease won. When none is, it returns a
// HeldError with the soonest moment a takeover may become possible.
//
// turn says where the call stands in the key's queue (see queue.go).
// kn is the call's subscription to knocks, if any.
func (c *Client) tryKeys(ctx context.Context, op, name string, ks []string, cl *clocks, turn place, kn *knocks) (locks.Lease, error) {
	first := 0
	if len(ks) > 1 {
		first = rand.IntN(len(ks))
	}
	var soonest *locks.HeldError
	clock := &serverClock{st: c.st}
	for n := range ks {
		i := (first + n) % len(ks)
		slot := 0 // a lock's
		if op == "acquire" || op == "tryacquire" {
			slot = i + 1 // a semaphore's, from 1
		}
		lease, err := c.tryKey(ctx, attempt{op: op, name: name, key: ks[i], i: i, slot: slot, token: c.newToken(),
			yield: turn == outside, queued: turn == head, knocks: kn}, cl, clock)
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

// transient reports whether err is the broker being briefly unable to
// answer (a stream electing a leader, a request timing out), which a
// waiting Lock or Acquire rides out.
func transient(err error) bool {
	var apiErr *jetstream.APIError
	return errors.Is(err, nats.ErrTimeout) || errors.Is(err, context.DeadlineExceeded) ||
		errors.Is(err, nats.ErrNoResponders) || errors.Is(err, jetstream.ErrNoStreamResponse) ||
		errors.As(err, &apiErr) && apiErr.Code == 503
}
