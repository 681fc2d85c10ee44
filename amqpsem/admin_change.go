package amqpsem

import (
	"context"
	"errors"
	"fmt"

	amqp "github.com/rabbitmq/amqp091-go"
)

// Create creates name with slots slots: A[1] to A[slots], in order. When
// name already has slots it returns an error matching [ErrExists] and
// changes nothing. When a declare fails (for example a queue of another
// layout in the way), the slot queues it created are deleted again.
func (a *Admin) Create(ctx context.Context, name string, slots int) error {
	if err := checkCtx(ctx, "create", name); err != nil {
		return err
	}
	if err := checkCount("slots", slots); err != nil {
		return opError("create", name, err)
	}
	_, err := a.locked(ctx, "create", name, true, func(ctx context.Context, a *Admin, max int) (int, error) {
		if max > 0 {
			return max, fmt.Errorf("%w with %d %s", ErrExists, max, plural(max, "slot"))
		}
		if err := a.checkLimit(name, slots); err != nil {
			return 0, err
		}
		return a.addSlots(ctx, name, 0, slots)
	})
	return err
}

// ensure creates name with slots slots unless it has some.
func (a *Admin) ensure(ctx context.Context, name string, slots int) error {
	_, err := a.locked(ctx, "create", name, true, func(ctx context.Context, a *Admin, max int) (int, error) {
		if max > 0 {
			return max, nil
		}
		if err := a.checkLimit(name, slots); err != nil {
			return 0, err
		}
		return a.addSlots(ctx, name, 0, slots)
	})
	return err
}

// Add adds n slots to name, declaring A[C+1] to A[C+n] in order, and
// returns the change. (The specification's text declares only A[C+n];
// declaring the queues between keeps the slots contiguous, which the
// maximum's definition needs.)
func (a *Admin) Add(ctx context.Context, name string, n int) (Change, error) {
	if err := checkCtx(ctx, "add", name); err != nil {
		return Change{}, err
	}
	if err := checkCount("slots to add", n); err != nil {
		return Change{}, opError("add", name, err)
	}
	return a.locked(ctx, "add", name, true, func(ctx context.Context, a *Admin, max int) (int, error) {
		if max+n > MaxSemaphoreSize {
			return max, fmt.Errorf("%w: %d + %d slots is more than %d", ErrInvalidSlots, max, n, MaxSemaphoreSize)
		}
		if err := a.checkLimit(name, max+n); err != nil {
			return max, err
		}
		return a.addSlots(ctx, name, max, max+n)
	})
}

// Remove removes n slots from name, deleting A[C] down to A[C-n+1] (or up,
// with [WithAscendingDelete]), and returns the change. Removing more slots
// than there are returns an error matching [ErrInvalidSlots] and changes
// nothing; use [Admin.Destroy] to remove them all. Holders of removed
// slots keep them until they let go; see [Admin.WaitReleased].
func (a *Admin) Remove(ctx context.Context, name string, n int) (Change, error) {
	if err := checkCtx(ctx, "remove", name); err != nil {
		return Change{}, err
	}
	if err := checkCount("slots to remove", n); err != nil {
		return Change{}, opError("remove", name, err)
	}
	return a.locked(ctx, "remove", name, false, func(ctx context.Context, a *Admin, max int) (int, error) {
		if n > max {
			return max, fmt.Errorf("%w: cannot remove %d slots of %d", ErrInvalidSlots, n, max)
		}
		return a.removeSlots(ctx, name, max, max-n)
	})
}

// Resize sets the number of slots of name to slots (0 removes them all),
// adding or removing slots as [Admin.Add] and [Admin.Remove] do, under one
// hold of the mutex.
func (a *Admin) Resize(ctx context.Context, name string, slots int) (Change, error) {
	if err := checkCtx(ctx, "resize", name); err != nil {
		return Change{}, err
	}
	if slots < 0 || slots > MaxSemaphoreSize {
		return Change{}, opError("resize", name, fmt.Errorf("%w: slots must be in 0..%d, got %d", ErrInvalidSlots, MaxSemaphoreSize, slots))
	}
	return a.locked(ctx, "resize", name, slots > 0, func(ctx context.Context, a *Admin, max int) (int, error) {
		switch {
		case slots > max:
			if err := a.checkLimit(name, slots); err != nil {
				return max, err
			}
			return a.addSlots(ctx, name, max, slots)
		case slots < max:
			return a.removeSlots(ctx, name, max, slots)
		}
		return max, nil
	})
}

// Destroy removes every slot of name, deleting A[C] down to A[1] (or up,
// with [WithAscendingDelete]), and returns how many it removed. Holders
// keep their slots until they let go, as with [Admin.Remove]. Destroying
// a semaphore without slots does nothing. The shared wake queue of the
// administration mutex, if Locks waited for it, is not deleted: the
// broker deletes it a minute after its last waiter left (see the package
// documentation).
func (a *Admin) Destroy(ctx context.Context, name string) (int, error) {
	if err := checkCtx(ctx, "destroy", name); err != nil {
		return 0, err
	}
	ch, err := a.locked(ctx, "destroy", name, false, func(ctx context.Context, a *Admin, max int) (int, error) {
		return a.removeSlots(ctx, name, max, 0)
	})
	return ch.Before - ch.After, err
}

// addSlots declares A[from+1..to] and returns the new maximum. When a
// declare fails, it deletes the queues it declared and returns from.
func (a *Admin) addSlots(ctx context.Context, name string, from, to int) (int, error) {
	lay := a.opts.layout
	var side *sideConn
	if !lay.SlotDurable {
		// Transient, non-exclusive queues: a broker that refuses them
		// closes the connection that asks, so ask on another one.
		var err error
		if side, err = a.c.dialSide(ctx); err != nil {
			return from, fmt.Errorf("connection for the %s layout's transient slot queues: %w", lay.name(), err)
		}
		defer side.close()
	}
	for i := from + 1; i <= to; i++ {
		q := lay.Slot(name, i)
		var err error
		if side != nil {
			err = side.declare(ctx, q, lay.SlotDurable, lay.Args)
		} else {
			err = a.c.call(ctx, func(ch *amqp.Channel) error {
				_, err := ch.QueueDeclare(q, lay.SlotDurable, false, false, false, lay.Args)
				return err
			}, nil)
		}
		if err != nil {
			switch {
			case transientRefused(err):
				err = fmt.Errorf("%w: declaring slot queue %q of the %s layout, which is neither durable nor exclusive: RabbitMQ 4 refuses such queues unless its configuration has \"deprecated_features.permit.transient_nonexcl_queues = true\" (the default layout's slot queues are durable): %w", ErrTransientRefused, q, lay.name(), err)
			case amqpCode(err) == 406:
				err = fmt.Errorf("slot queue %q exists with other properties (another layout?): %w", q, err)
			default:
				err = fmt.Errorf("declare slot queue %q: %w", q, err)
			}
			if rerr := a.deleteSlots(context.WithoutCancel(ctx), name, from+1, i-1); rerr != nil {
				err = errors.Join(err, fmt.Errorf("rolling back: %w", rerr))
				return i - 1, err
			}
			return from, err
		}
	}
	return to, nil
}

// removeSlots deletes A[to+1..from] and returns the new maximum.
func (a *Admin) removeSlots(ctx context.Context, name string, from, to int) (int, error) {
	if err := a.deleteSlots(ctx, name, to+1, from); err != nil {
		n, merr := a.max(context.WithoutCancel(ctx), name)
		if merr != nil {
			n = from
		}
		return n, err
	}
	return to, nil
}

// deleteSlots deletes A[lo..hi] in the configured order, each delete
// waiting for its delete-ok. Deleting a missing queue succeeds.
func (a *Admin) deleteSlots(ctx context.Context, name string, lo, hi int) error {
	for k := range max(hi-lo+1, 0) {
		i := hi - k
		if a.opts.ascending {
			i = lo + k
		}
		q := a.opts.layout.Slot(name, i)
		err := a.c.call(ctx, func(ch *amqp.Channel) error {
			_, err := ch.QueueDelete(q, false, false, false)
			return err
		}, nil)
		if err != nil {
			return fmt.Errorf("delete slot queue %q: %w", q, err)
		}
	}
	return nil
}

// plural returns "1 slot" or "n slots".
func plural(n int, word string) string {
	if n == 1 {
		return word
	}
	return word + "s"
}
