package amqpsem

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/latchkey-go/latchkey/locks"
	"github.com/latchkey-go/latchkey/locks/driver"
)

var (
	// ErrNoSlots reports an acquire on a semaphore that has no slots
	// (no slot queue A[1]): never created, destroyed, removed down to
	// zero, a misspelt name, or a semaphore of another layout. Acquire and
	// TryAcquire return it at once, unless [WithCreate] is set; it does
	// not match [locks.ErrNotAcquired]: nothing holds the name, and
	// waiting would not help.
	ErrNoSlots = errors.New("amqpsem: semaphore has no slots")

	// ErrAllHeld is the cause, inside a [locks.HeldError], of an acquire
	// that found every slot held.
	ErrAllHeld = errors.New("amqpsem: every slot is held")

	// ErrContention is the cause, inside a [locks.HeldError], of an
	// acquire that lost the race for a free slot (RESOURCE_LOCKED) the
	// maximum number of times (see [WithMaxAttempts]).
	ErrContention = errors.New("amqpsem: lost the race for a free slot too often")
)

// Semaphore is the persistent semaphore: the number of slots of name is
// the number of its slot queues A[1..C] at the broker, set by an [Admin]
// (or by [WithCreate]); a client holds slot L while its connection owns
// the exclusive holder queue B[L]. It implements [locks.Semaphore]; its
// leases are *[Lease]s whose Slot is L.
//
// Unlike the locks contract's fixed N, C is whatever the broker holds when
// an acquire scans it: administrators may change it at any time. The
// Semaphore's size (see [Client.Semaphore]) caps the slots it takes: it
// takes slot L only if L <= size, so its leases never exceed
// min(C, size). A semaphore must exist before it is acquired: on a name
// without slots, Acquire and TryAcquire fail at once with [ErrNoSlots]
// (so a misspelt name does not wait forever), unless the client was
// dialed [WithCreate], which creates it with size slots.
//
// A Semaphore is safe for concurrent use; one client may hold several
// slots of one name.
type Semaphore struct {
	cl    *Client
	c     *session // of one call; see bind
	opts  options
	size  int
	admin *Admin
}

var (
	_ locks.Semaphore   = (*Semaphore)(nil)
	_ driver.Observable = (*Semaphore)(nil)
)

// Observe implements [driver.Observable]: fn sees the client's events.
func (s *Semaphore) Observe(fn func(driver.Event)) (stop func()) { return s.cl.Observe(fn) }

// bind returns s bound to the client's live session, for one call,
// waiting for a reconnection until ctx ends.
func (s *Semaphore) bind(ctx context.Context) (*Semaphore, error) {
	if s.c != nil {
		return s, nil
	}
	sess, err := s.cl.session(ctx)
	if err != nil {
		return nil, err
	}
	b := *s
	b.c = sess
	b.admin = s.admin.on(sess)
	return &b, nil
}

// Semaphore returns a Semaphore of size slots, from 1 to
// [MaxSemaphoreSize], with the client's options; another size returns
// an error matching [locks.ErrInvalidOption] (and [ErrInvalidSlots])
// before any I/O.
//
// The slot count of a persistent semaphore is what the broker stores
// (C, the slot queues A[1..C]), not size. size is what this Semaphore
// trusts the name with, the safe reading of both: with [WithCreate], a
// missing semaphore is created with size slots; a semaphore that exists
// with another count is never resized by it, and its acquires take only
// slots 1..min(C, size). So a program that asks for 3 never holds more
// than 3 slots of a name, even if an administrator grew it to 10 (slots 4
// to 10 are for Semaphores of a larger size), and fewer when C is
// smaller. To take any slot the broker has, whatever C, use
// MaxSemaphoreSize.
func (c *Client) Semaphore(size int) (*Semaphore, error) {
	if size < 1 || size > MaxSemaphoreSize {
		return nil, driver.Errorf(backend, "semaphore", "", fmt.Errorf("%w: size must be in 1..%d, got %d", ErrInvalidSlots, MaxSemaphoreSize, size))
	}
	o := c.opts
	return &Semaphore{cl: c, opts: o, size: size, admin: &Admin{cl: c, opts: o, mutex: &Locker{cl: c, opts: o}}}, nil
}

// Size returns the Semaphore's size: the highest slot it takes.
func (s *Semaphore) Size() int { return s.size }

// TryAcquire scans the slots of name from 1 as the specification says:
// the first slot L whose A[L] exists and whose B[L] does not, it claims
// by declaring B[L] exclusive. Existence is checked with pipelined
// probes, a window of slots per round trip. When another client wins
// B[L] first (RESOURCE_LOCKED), it waits a random skew and scans again
// from 1, up to the maximum attempts. Once it holds B[L] it verifies that
// A[L] still exists, and returns the lease, whose Slot is L.
//
// When every slot is held it returns an error matching
// [locks.ErrNotAcquired] (a [locks.HeldError] whose cause is [ErrAllHeld],
// or [ErrContention] after too many lost races). When the semaphore has no
// slots it returns an error matching [ErrNoSlots] (unless [WithCreate]
// creates it), which does not match [locks.ErrNotAcquired]. Invalid names return an
// error matching [locks.ErrInvalidName] before any I/O. On failure nothing
// is held; when ctx ends first, the error matches ctx.Err().
func (s *Semaphore) TryAcquire(ctx context.Context, name string) (locks.Lease, error) {
	if err := checkCtx(ctx, "tryacquire", name); err != nil {
		return nil, err
	}
	if err := s.opts.layout.checkSemName(name); err != nil {
		return nil, opError("tryacquire", name, err)
	}
	ctx, cancel := s.cl.reg.Bind(ctx)
	defer cancel()
	b, err := s.bind(ctx)
	if err != nil {
		return nil, s.cl.fail(ctx, "tryacquire", name, err)
	}
	l, err := b.try(ctx, name)
	if err != nil {
		return nil, s.cl.fail(ctx, "tryacquire", name, err)
	}
	return l, nil
}

// Acquire blocks until it holds a slot of name. A clean release wakes it
// at once (see [WithWakeExchange]), so do slots added by an [Admin]; a
// crashed holder's slot is found by polling with the back-off once the
// broker drops the dead connection. It does not wait for a semaphore
// that has no slots: when name has none, at the start or at any check
// while it waits (the semaphore was destroyed), it returns an error
// matching [ErrNoSlots] at once, unless [WithCreate] creates it. On
// failure nothing is held; when ctx ends first, the error matches
// ctx.Err().
func (s *Semaphore) Acquire(ctx context.Context, name string) (locks.Lease, error) {
	if err := checkCtx(ctx, "acquire", name); err != nil {
		return nil, err
	}
	if err := s.opts.layout.checkSemName(name); err != nil {
		return nil, opError("acquire", name, err)
	}
	ctx, cancel := s.cl.reg.Bind(ctx)
	defer cancel()
	b, err := s.bind(ctx)
	if err != nil {
		return nil, s.cl.fail(ctx, "acquire", name, err)
	}
	l, err := b.try(ctx, name)
	if err != nil && errors.Is(err, locks.ErrNotAcquired) {
		sub, unsubscribe := b.c.wakes.subscribe(ctx, name)
		defer unsubscribe()
		l, err = driver.Wait(ctx, sub.c, b.opts.backoff, b.tryFunc(name))
	}
	if err != nil {
		return nil, s.cl.fail(ctx, "acquire", name, err)
	}
	return l, nil
}

func (s *Semaphore) tryFunc(name string) func(context.Context) (*Lease, error) {
	return func(ctx context.Context) (*Lease, error) { return s.try(ctx, name) }
}

// try is one acquire attempt of a bound Semaphore: it scans for a free
// slot and claims it, scanning again from 1 after each lost race, up to
// the maximum attempts.
func (s *Semaphore) try(ctx context.Context, name string) (*Lease, error) {
	if err := s.opts.layout.checkSemName(name); err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if err := s.c.errClosed(); err != nil {
		return nil, err
	}
	created := false
	for attempt := 0; ; {
		slot, err := s.scan(ctx, name)
		if err != nil {
			return nil, err
		}
		if slot < 0 { // no slots at all
			if s.opts.create && !created {
				created = true
				if err := s.admin.ensure(ctx, name, s.size); err != nil {
					return nil, err
				}
				continue
			}
			return nil, s.noSlots(ctx, name)
		}
		if slot == 0 {
			return nil, &locks.HeldError{Name: name, Err: unprefixed{ErrAllHeld}}
		}
		l, err := s.claim(ctx, name, slot)
		if err == nil || !errors.Is(err, locks.ErrNotAcquired) {
			return l, err
		}
		if l == nil && err == errReservedHere {
			continue // another call of this client just took it
		}
		// Lost the race (RESOURCE_LOCKED: the channel is closed and
		// dropped from the pool; the connection lives on), or the slot
		// went away: wait a random skew and scan again from 1.
		if amqpCode(err) == amqp.ResourceLocked {
			s.cl.reg.Emit(driver.Event{Kind: driver.EventResourceLocked, Name: name, Err: err})
		}
		attempt++
		if attempt >= s.opts.maxAttempts {
			return nil, &locks.HeldError{Name: name, Err: errorf("%w (%d attempts): %w", ErrContention, attempt, err)}
		}
		if err := s.pause(ctx, err); err != nil {
			return nil, err
		}
	}
}

// errReservedHere is claim's answer when another call of this client
// is declaring or holds the slot's holder queue: scan again at once.
var errReservedHere = &locks.HeldError{Err: errors.New("amqpsem: reserved by this client")}

// claim declares slot's holder queue B exclusive and, once it holds it,
// verifies that the slot queue A still exists, as the specification
// recommends (A may have been removed since the scan). It returns an
// error matching [locks.ErrNotAcquired] when it lost the race or the
// slot went away, and nothing is then held.
func (s *Semaphore) claim(ctx context.Context, name string, slot int) (*Lease, error) {
	c, lay := s.c, s.opts.layout
	b, a := lay.Holder(name, slot), lay.Slot(name, slot)
	h, err := c.reserve(b, name)
	if err != nil {
		return nil, err
	}
	if h == nil {
		return nil, errReservedHere
	}
	if f := s.opts.hooks.beforeDeclare; f != nil {
		f(slot)
	}
	sent := time.Now()
	if err := c.declareExclusive(ctx, h, lay.Args); err != nil {
		return nil, declareError(name, b, err)
	}
	got, _, perr := c.probes.probe(ctx, a)
	if perr != nil || !got[0] {
		_ = c.free(context.WithoutCancel(ctx), h)
		if perr != nil {
			return nil, perr
		}
		return nil, &locks.HeldError{Name: name, Err: errorf("%w: slot %d removed while acquiring it", ErrSlotRemoved, slot)}
	}
	return c.newLease(ctx, name, slot, a, h, sent)
}

// noSlots returns the [ErrNoSlots] error of name, saying in which other
// layout it is a semaphore, if it is one.
func (s *Semaphore) noSlots(ctx context.Context, name string) error {
	lay := s.opts.layout
	err := fmt.Errorf("%w (no slot queue %q; create it with an Admin, or acquire WithCreate)", ErrNoSlots, lay.Slot(name, 1))
	if others, oerr := s.admin.otherLayouts(ctx, name); oerr == nil && len(others) > 0 {
		err = fmt.Errorf("%w in the %s layout, but it is a semaphore of %s", ErrNoSlots, lay.name(), describe(others))
	}
	return err
}

// pause waits a random skew after a lost race, so that racing clients
// spread out; it returns ctx's error when ctx ends first.
func (s *Semaphore) pause(ctx context.Context, race error) error {
	if s.opts.skew <= 0 {
		return nil
	}
	d := rand.N(s.opts.skew)
	if f := s.opts.hooks.skew; f != nil {
		f(d, race)
	}
	return driver.Sleep(ctx, d)
}

// scan returns the first free slot of name up to the Semaphore's size:
// > 0 a slot whose A exists and whose B does not; 0 when every slot is
// held; -1 when A[1] does not exist. It probes a growing window of slots per round trip.
func (s *Semaphore) scan(ctx context.Context, name string) (int, error) {
	lay := s.opts.layout
	lo, size, limit := 1, 4, min(lay.SlotLimit(name), s.size)
	queues := make([]string, 0, 2*maxBatch)
	for lo <= limit {
		hi := min(lo+size-1, limit)
		queues = queues[:0]
		for i := lo; i <= hi; i++ {
			queues = append(queues, lay.Slot(name, i), lay.Holder(name, i))
		}
		got, _, err := s.c.probes.probe(ctx, queues...)
		if err != nil {
			return 0, err
		}
		for i := lo; i <= hi; i++ {
			k := 2 * (i - lo)
			switch {
			case !got[k] && i == 1:
				return -1, nil
			case !got[k]:
				return 0, nil
			case !got[k+1] && !s.c.reserved(queues[k+1]):
				return i, nil
			}
		}
		lo, size = hi+1, min(size*4, maxBatch/2)
	}
	return 0, nil
}
