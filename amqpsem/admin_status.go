package amqpsem

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/latchkey-go/latchkey/locks"
	"github.com/latchkey-go/latchkey/locks/driver"
)

// Status is a snapshot of a semaphore.
type Status struct {
	// Layout is the name of the layout the status was taken in.
	Layout string
	// OtherLayouts lists this package's other layouts in which the name
	// has a first slot queue, as [Admin.OtherLayouts] does.
	OtherLayouts []string
	// Slots is the maximum C.
	Slots int
	// Held lists the slots 1..C whose holder queue B[L] exists.
	Held []int
	// Removed lists the slots above C whose holder queue still exists:
	// holders of removed slots that have not let go yet. Every slot up to
	// the name's [Layout.SlotLimit] is checked.
	Removed []int
}

// Status returns a snapshot of name: its slots and which are held, and
// which slots above C, removed, are still held, whatever their number:
// it checks the holder queue of every slot up to the name's
// [Layout.SlotLimit] (65535 probes, pipelined: about a second on a local
// broker). It does not take the mutex. The probes go over a short-lived
// connection of their own, dialled with the client's URL and options, so
// that they do not delay the verification of the client's leases; when
// that connection cannot be dialled, they go over the client's, as the
// answer is the same.
func (a *Admin) Status(ctx context.Context, name string) (Status, error) {
	if err := checkCtx(ctx, "status", name); err != nil {
		return Status{}, err
	}
	lay := a.opts.layout
	if err := lay.checkSemName(name); err != nil {
		return Status{}, opError("status", name, err)
	}
	a, err := a.bind(ctx)
	if err != nil {
		return Status{}, opError("status", name, err)
	}
	st := Status{Layout: lay.name()}
	err = a.scanning(ctx, func(ctx context.Context, a *Admin) error {
		others, err := a.otherLayouts(ctx, name)
		if err != nil {
			return err
		}
		for _, o := range others {
			st.OtherLayouts = append(st.OtherLayouts, o.layout)
		}
		if st.Slots, err = a.max(ctx, name); err != nil {
			return err
		}
		held, err := a.heldBetween(ctx, name, 1, lay.SlotLimit(name))
		if err != nil {
			return err
		}
		for _, i := range held {
			if i <= st.Slots {
				st.Held = append(st.Held, i)
			} else {
				st.Removed = append(st.Removed, i)
			}
		}
		return nil
	})
	if err != nil {
		return Status{}, opError("status", name, err)
	}
	return st, nil
}

// heldBetween returns the slots in lo..hi whose B queue exists.
func (a *Admin) heldBetween(ctx context.Context, name string, lo, hi int) ([]int, error) {
	slots := make([]int, 0, max(hi-lo+1, 0))
	for i := lo; i <= hi; i++ {
		slots = append(slots, i)
	}
	return a.heldOf(ctx, name, slots)
}

// heldOf returns the slots of slots whose B queue exists.
func (a *Admin) heldOf(ctx context.Context, name string, slots []int) ([]int, error) {
	held, err := existing(ctx, a.prober(), slots, func(i int) string { return a.opts.layout.Holder(name, i) })
	if err != nil {
		return nil, errorf("amqpsem: holders: %w", err)
	}
	return held, nil
}

// above returns the slots of slots above c.
func above(slots []int, c int) []int {
	var out []int
	for _, i := range slots {
		if i > c {
			out = append(out, i)
		}
	}
	return out
}

// WaitReleased waits until no slot of name above its current maximum C
// is held, whatever its number: until the holders of removed slots have
// let go. It returns nil only after a check of every slot number made
// holding name's administration mutex: with the mutex held, C is read,
// then the holder queue of every slot from C+1 to the name's
// [Layout.SlotLimit] is checked (65535 probes, pipelined: about a second
// on a local broker, a few under the race detector), and none is held.
// Administrators take the mutex for every change, so C cannot change
// during that check, and no slot above C can be created, taken and
// removed again behind it.
//
// It makes that check first; while it finds slots held, it polls only
// those (and the slots newly removed when C drops), with the back-off,
// woken early by releases, and once none of them is held it makes the
// check again, holding the mutex, and waits on if it finds any: a slot
// taken while the semaphore was grown during the wait, and removed again
// before a poll saw C change, is found. So returning nil after holders
// were found costs a second check of every slot number, and the mutex is
// held for each check, delaying administrators' changes that long. It
// waits for the mutex while another connection holds it (calling the
// [WithMutexWaitNotice] notice once), so do not call it while holding
// name's administration mutex (a [Locker] lease on name), which would make
// it wait until ctx ends.
//
// The mutex is held on the client's connection, but the probes of each
// check of every slot number (and of a poll over more than a thousand
// newly removed slots) go over a short-lived connection of their own,
// dialled with the client's URL and options before the mutex is taken and
// closed when the check ends, so that they do not delay the verification
// of the client's leases, the mutex's included. When that connection
// cannot be dialled, the probes go over the client's, as the answer is the
// same; when it is lost during a check, WaitReleased fails.
//
// What it cannot see: a slot taken after its last check. A client of this
// package that found a slot before its removal and declares the slot's
// holder queue after that check verifies the slot, finds it gone and lets
// go without using it; clients scan slots in order from 1 and stop at the
// first missing one, so they never take a slot above C. A client of
// another implementation that does not verify after declaring, or scans
// non-linearly and takes a slot whose slot queue exists above a gap
// (ascending deletes that failed half-way, a queue made by hand; the
// overshoot of [WithOvershoot] deletes such strays), can hold a slot above
// C after WaitReleased returned; so can one whose administrator changes
// the semaphore without the mutex. When ctx ends first, the error matches
// ctx.Err(), and says what the last check or poll found: the slots it
// found held, inside a [locks.HeldError] (so the error matches
// [locks.ErrNotAcquired] too); or, when the last poll found none held and
// ctx ended during the check of every slot number that follows it, that
// none was held then (the error does not match [locks.ErrNotAcquired]).
func (a *Admin) WaitReleased(ctx context.Context, name string) error {
	if err := checkCtx(ctx, "waitreleased", name); err != nil {
		return err
	}
	lay := a.opts.layout
	if err := lay.checkSemName(name); err != nil {
		return opError("waitreleased", name, err)
	}
	a, err := a.bind(ctx)
	if err != nil {
		return opError("waitreleased", name, err)
	}
	var (
		last    error     // the slots the last check or poll found held; nil if it found none
		clearAt time.Time // when the last poll found none held (zero: none did)
		known   []int     // removed slots found held at the last check
		from    = 0       // slots from here up were all checked (0: none yet)
		noticed bool      // the mutex-wait notice was given
	)
	try := func(ctx context.Context) (struct{}, error) {
		if from > 0 {
			// Poll the slots found held, and the slots removed since.
			c, err := a.max(ctx, name)
			if err != nil {
				return struct{}{}, err
			}
			held, err := a.heldOf(ctx, name, above(known, c))
			if err != nil {
				return struct{}{}, err
			}
			if c+1 < from {
				more, err := a.heldRange(ctx, name, c+1, from-1)
				if err != nil {
					return struct{}{}, err
				}
				held, from = append(held, more...), c+1
			}
			known = held
			if len(held) > 0 {
				last = &locks.HeldError{Name: name, Err: fmt.Errorf("removed slots %v still held", held)}
				return struct{}{}, last
			}
			// The slots an earlier check found held are not any more:
			// a ctx that ends during the check below must not report
			// them.
			last, clearAt = nil, time.Now()
		}
		// None found held (or the first check): check every slot number
		// above C, holding the mutex.
		c, held, err := a.heldAbove(ctx, name, &noticed)
		if err != nil {
			return struct{}{}, err
		}
		known, from = held, c+1
		if len(held) > 0 {
			last = &locks.HeldError{Name: name, Err: fmt.Errorf("removed slots %v still held", held)}
			return struct{}{}, last
		}
		return struct{}{}, nil
	}
	if _, err := try(ctx); err == nil || !errors.Is(err, locks.ErrNotAcquired) {
		return opError("waitreleased", name, err)
	}
	sub, unsubscribe := a.c.wakes.subscribe(ctx, name)
	defer unsubscribe()
	_, err = driver.Wait(ctx, sub.c, a.opts.backoff, try)
	if err != nil && ctx.Err() != nil {
		switch {
		case last != nil:
			err = errorf("%w (%w)", err, last)
		case !clearAt.IsZero():
			err = errorf("%w (no removed slot was held at the last poll, %v before; the check of every slot number that follows it did not finish)", err, time.Since(clearAt).Round(time.Millisecond))
		}
	}
	return opError("waitreleased", name, err)
}

// heldAbove takes name's administration mutex (see lockAdmin for
// noticed), reads C, and returns C and the
// slots from C+1 to the name's [Layout.SlotLimit] whose holder queue
// exists. When the mutex is lost before the check ends, C may have
// changed during it: it returns an error matching [locks.ErrNotAcquired],
// to check again. The mutex is held on the client's connection; the
// probes go over a connection of their own (see scanning), dialled before
// the mutex is taken.
func (a *Admin) heldAbove(ctx context.Context, name string, noticed *bool) (int, []int, error) {
	var (
		c    int
		held []int
	)
	err := a.scanning(ctx, func(ctx context.Context, a *Admin) error {
		lease, err := a.lockAdmin(ctx, name, noticed)
		if err != nil {
			return errorf("administration mutex: %w", err)
		}
		defer func() { _ = lease.Release(context.WithoutCancel(ctx)) }()
		if c, err = a.max(ctx, name); err != nil {
			return err
		}
		if held, err = a.heldBetween(ctx, name, c+1, a.opts.layout.SlotLimit(name)); err != nil {
			return err
		}
		if cause := context.Cause(lease.Context()); cause != nil {
			return &locks.HeldError{Name: name, Err: fmt.Errorf("administration mutex lost during the check of every slot: %w", cause)}
		}
		return nil
	})
	if err != nil {
		return 0, nil, err
	}
	return c, held, nil
}
