package amqpsem

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"time"

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
// leases are [locks.SlotLease]s (*[Lease]).
//
// Unlike the locks contract's fixed N, C is whatever the broker holds when
// an acquire scans it: administrators may change it at any time. A
// semaphore must exist before it is acquired: on a name without slots,
// Acquire and TryAcquire fail at once with [ErrNoSlots] (so a misspelt
// name does not wait forever), unless the Semaphore was made
// [WithCreate], which creates it.
//
// A Semaphore is safe for concurrent use; one client may hold several
// slots of one name.
type Semaphore struct {
	cl    *Client
	c     *session // of one call; see bind
	opts  options
	admin *Admin
}

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

var _ locks.Semaphore = (*Semaphore)(nil)

// Semaphore returns a Semaphore of the client, with opts on top of the
// client's options. Invalid options, and connection options, return an
// error matching [locks.ErrInvalidOption].
func (c *Client) Semaphore(opts ...Option) (*Semaphore, error) {
	o, err := c.derive(opts)
	if err != nil {
		return nil, err
	}
	return &Semaphore{cl: c, opts: o, admin: &Admin{cl: c, opts: o, mutex: &Mutex{cl: c, opts: o}}}, nil
}

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
	if err := s.opts.layout.checkSemName(name); err != nil {
		return nil, err
	}
	s, err := s.bind(ctx)
	if err != nil {
		return nil, errorf("amqpsem: acquire %q: %w", name, err)
	}
	l, err := s.try(ctx, name)
	if err != nil {
		return nil, err
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
	if err := s.opts.layout.checkSemName(name); err != nil {
		return nil, err
	}
	s, err := s.bind(ctx)
	if err != nil {
		return nil, errorf("amqpsem: acquire %q: %w", name, err)
	}
	l, err := s.try(ctx, name)
	if err == nil {
		return l, nil
	}
	if !errors.Is(err, locks.ErrNotAcquired) {
		return nil, err
	}
	sub, unsubscribe := s.c.wakes.subscribe(ctx, name)
	defer unsubscribe()
	l, err = driver.Wait(ctx, sub.c, s.opts.backoff, s.tryFunc(name))
	if err != nil {
		return nil, err
	}
	return l, nil
}

func (s *Semaphore) tryFunc(name string) func(context.Context) (*Lease, error) {
	return func(ctx context.Context) (*Lease, error) { return s.try(ctx, name) }
}

func (s *Semaphore) try(ctx context.Context, name string) (*Lease, error) {
	lay := s.opts.layout
	if err := lay.checkSemName(name); err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	c := s.c
	if err := c.errClosed(); err != nil {
		return nil, errorf("amqpsem: acquire %q: %w", name, err)
	}
	created := false
	var lastRace error
	for attempt := 0; ; {
		slot, err := s.scan(ctx, name)
		if err != nil {
			return nil, err
		}
		if slot < 0 { // no slots at all
			if s.opts.create > 0 && !created {
				created = true
				if err := s.admin.ensure(ctx, name, s.opts.create); err != nil {
					return nil, err
				}
				continue
			}
			err := fmt.Errorf("%w: %q (no slot queue %q; create it with an Admin, or acquire WithCreate)", ErrNoSlots, name, lay.Slot(name, 1))
			if others, oerr := s.admin.otherLayouts(ctx, name); oerr == nil && len(others) > 0 {
				err = fmt.Errorf("%w: %q has no slots in the %s layout, but is a semaphore of %s", ErrNoSlots, name, lay.name(), describe(others))
			}
			return nil, err
		}
		if slot == 0 {
			return nil, &locks.HeldError{Name: name, Err: ErrAllHeld}
		}
		b, a := lay.Holder(name, slot), lay.Slot(name, slot)
		h, err := c.reserve(b, name)
		if err != nil {
			return nil, errorf("amqpsem: acquire %q: %w", name, err)
		}
		if h == nil {
			continue // another call of this client just took it
		}
		if f := s.opts.hooks.beforeDeclare; f != nil {
			f(slot)
		}
		sent := time.Now()
		err = c.declareExclusive(ctx, h, lay.Args)
		if err == nil {
			// Verify before returning, as the specification recommends:
			// A[L] may have been removed since the scan.
			got, _, perr := c.probes.probe(ctx, a)
			if perr != nil || !got[0] {
				_ = c.free(context.WithoutCancel(ctx), h)
				if perr != nil {
					return nil, perr
				}
				err = &locks.HeldError{Name: name, Err: fmt.Errorf("%w: slot %d removed while acquiring it", ErrSlotRemoved, slot)}
			} else {
				return c.newLease(ctx, name, slot, a, h, sent)
			}
		} else {
			err = declareError("acquire", name, b, err)
		}
		if !errors.Is(err, locks.ErrNotAcquired) {
			return nil, err
		}
		// Lost the race (RESOURCE_LOCKED: the channel is closed and
		// dropped from the pool; the connection lives on), or the slot
		// went away: wait a random skew and scan again from 1.
		lastRace = err
		attempt++
		if attempt >= s.opts.maxAttempts {
			return nil, &locks.HeldError{Name: name, Err: fmt.Errorf("%w (%d attempts): %w", ErrContention, attempt, lastRace)}
		}
		if s.opts.skew > 0 {
			d := rand.N(s.opts.skew)
			if f := s.opts.hooks.skew; f != nil {
				f(d, lastRace)
			}
			t := time.NewTimer(d)
			select {
			case <-ctx.Done():
				t.Stop()
				return nil, ctx.Err()
			case <-t.C:
			}
		}
	}
}

// scan returns the first free slot of name: > 0 a slot whose A exists and
// whose B does not; 0 when every slot is held; -1 when A[1] does not
// exist. It probes a growing window of slots per round trip.
func (s *Semaphore) scan(ctx context.Context, name string) (int, error) {
	lay := s.opts.layout
	lo, size, limit := 1, 4, lay.SlotLimit(name)
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
