package amqpsem

import (
	"context"
	"errors"
	"fmt"
	"strings"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/latchkey-go/latchkey/locks"
	"github.com/latchkey-go/latchkey/locks/driver"
)

var (
	// ErrInvalidSlots reports a slot count out of range: a semaphore
	// created with no slots, a change by zero or fewer, a removal of
	// more slots than there are. It matches [locks.ErrInvalidOption].
	ErrInvalidSlots = fmt.Errorf("%w: invalid slot count", locks.ErrInvalidOption)

	// ErrExists reports a [Admin.Create] of a semaphore that has slots.
	ErrExists = errors.New("amqpsem: semaphore exists")

	// ErrOtherLayout reports a create or resize refused because the name
	// has slot queues in another of this package's layouts ([DefaultLayout],
	// [PythonLayout]): a semaphore of the other layout exists, and creating
	// one beside it would let clients of each layout hold slots of the same
	// name, more than either's count.
	ErrOtherLayout = errors.New("amqpsem: the name is a semaphore of another layout")

	// ErrTransientRefused reports that the broker refused to declare a
	// queue that is neither durable nor exclusive: a slot queue of
	// [PythonLayout], which the Python client declares so, on a RabbitMQ 4
	// whose configuration does not permit the deprecated feature
	// transient_nonexcl_queues (denied by default from RabbitMQ 4.3).
	// Such queues are declared on a connection of their own, so the
	// refusal, which closes that connection, ends no lease.
	ErrTransientRefused = errors.New("amqpsem: the broker refuses transient non-exclusive queues")
)

// Admin administers persistent semaphores as the specification says:
// every change is made holding the semaphore's administration mutex (a
// [Mutex] on its name), after determining its current maximum C by
// probing A[1], A[2]... in order until one is missing. Slot queues are
// created in ascending order and deleted in descending order (ascending
// with [WithAscendingDelete]), each delete waiting for its delete-ok.
//
// Removing a slot does not take it from a client that holds it: the
// holder keeps B[L] until it lets go; its lease learns of the removal at
// its next verification and then lets go by itself. [Admin.WaitReleased]
// waits for that.
//
// An Admin is safe for concurrent use; changes to one semaphore are
// serialised at the broker by its mutex, across clients.
type Admin struct {
	cl    *Client
	c     *session // of one call; see bind
	opts  options
	mutex *Mutex
}

// bind returns a bound to the client's live session, for one call,
// waiting for a reconnection until ctx ends; a bound a is returned as it
// is.
func (a *Admin) bind(ctx context.Context) (*Admin, error) {
	if a.c != nil {
		return a, nil
	}
	s, err := a.cl.session(ctx)
	if err != nil {
		return nil, err
	}
	return a.on(s), nil
}

// on returns a copy of a bound to session s.
func (a *Admin) on(s *session) *Admin {
	b := *a
	b.c = s
	b.mutex = &Mutex{cl: a.cl, c: s, opts: a.opts}
	return &b
}

// Admin returns an Admin of the client, with opts on top of the client's
// options ([WithLayout], [WithOvershoot], [WithAscendingDelete]...).
// Invalid options, and connection options, return an error matching
// [locks.ErrInvalidOption].
func (c *Client) Admin(opts ...Option) (*Admin, error) {
	o, err := c.derive(opts)
	if err != nil {
		return nil, err
	}
	return &Admin{cl: c, opts: o, mutex: &Mutex{cl: c, opts: o}}, nil
}

// Max returns the number of slots of name, C: the A queues exist from A[1]
// to A[C] and A[C+1] does not. It does not take the mutex: the answer is
// a snapshot.
func (a *Admin) Max(ctx context.Context, name string) (int, error) {
	if err := a.opts.layout.checkSemName(name); err != nil {
		return 0, err
	}
	a, err := a.bind(ctx)
	if err != nil {
		return 0, errorf("amqpsem: maximum of %q: %w", name, err)
	}
	return a.max(ctx, name)
}

func (a *Admin) max(ctx context.Context, name string) (int, error) {
	lay := a.opts.layout
	n, err := a.firstMissing(ctx, 1, lay.SlotLimit(name), func(i int) string { return lay.Slot(name, i) })
	if err != nil {
		return 0, errorf("amqpsem: maximum of %q: %w", name, err)
	}
	return n - 1, nil
}

// firstMissing probes queue(from), queue(from+1)... up to queue(limit) in
// pipelined windows and returns the first index whose queue does not
// exist, or limit+1.
func (a *Admin) firstMissing(ctx context.Context, from, limit int, queue func(int) string) (int, error) {
	size := 8
	for lo := from; lo <= limit; {
		hi := min(lo+size-1, limit)
		qs := make([]string, 0, hi-lo+1)
		for i := lo; i <= hi; i++ {
			qs = append(qs, queue(i))
		}
		got, _, err := a.c.probes.probe(ctx, qs...)
		if err != nil {
			return 0, err
		}
		for k, ok := range got {
			if !ok {
				return lo + k, nil
			}
		}
		lo, size = hi+1, min(size*4, maxBatch)
	}
	return limit + 1, nil
}

// Change is the outcome of an administrative change: the maximum found
// before it, and the maximum after it.
type Change struct {
	Before, After int
}

// OtherLayouts returns the names of this package's other layouts
// ([DefaultLayout], [PythonLayout]) in which name has a first slot queue:
// a semaphore of that layout exists. It does not take the mutex: the
// answer is a snapshot.
func (a *Admin) OtherLayouts(ctx context.Context, name string) ([]string, error) {
	if err := a.opts.layout.checkSemName(name); err != nil {
		return nil, err
	}
	a, err := a.bind(ctx)
	if err != nil {
		return nil, errorf("amqpsem: layouts of %q: %w", name, err)
	}
	found, err := a.otherLayouts(ctx, name)
	if err != nil {
		return nil, err
	}
	var names []string
	for _, f := range found {
		names = append(names, f.layout)
	}
	return names, nil
}

// otherLayout is a layout in which a name has slot queues.
type otherLayout struct{ layout, queue string }

func (o otherLayout) String() string {
	return fmt.Sprintf("the %s layout (slot queue %q exists)", o.layout, o.queue)
}

func describe(others []otherLayout) string {
	s := make([]string, len(others))
	for i, o := range others {
		s[i] = o.String()
	}
	return strings.Join(s, " and ")
}

func (a *Admin) otherLayouts(ctx context.Context, name string) ([]otherLayout, error) {
	own := a.opts.layout.Slot(name, 1)
	var cand []otherLayout
	var qs []string
	for _, l := range []Layout{DefaultLayout, PythonLayout} {
		q := l.Slot(name, 1)
		if q == own || queueName(q) != nil {
			continue
		}
		cand, qs = append(cand, otherLayout{l.name(), q}), append(qs, q)
	}
	if len(qs) == 0 {
		return nil, nil
	}
	got, _, err := a.c.probes.probe(ctx, qs...)
	if err != nil {
		return nil, errorf("amqpsem: layouts of %q: %w", name, err)
	}
	var found []otherLayout
	for i, ok := range got {
		if ok {
			found = append(found, cand[i])
		}
	}
	return found, nil
}

// lockAdmin takes name's administration mutex, waiting for it when
// another connection holds it; before waiting, it calls the mutex-wait
// notice ([WithMutexWaitNotice]) unless *noticed, and sets *noticed.
func (a *Admin) lockAdmin(ctx context.Context, name string, noticed *bool) (locks.Lease, error) {
	lease, err := a.mutex.TryLock(ctx, name)
	if errors.Is(err, locks.ErrNotAcquired) {
		if f := a.opts.mutexWait; f != nil && !*noticed {
			f(name)
		}
		*noticed = true
		lease, err = a.mutex.Lock(ctx, name)
	}
	return lease, err
}

// locked runs change holding name's administration mutex, with the
// current maximum, after overshooting. With exclusive, it first refuses
// with [ErrOtherLayout] when name has slot queues of another layout.
func (a *Admin) locked(ctx context.Context, op, name string, exclusive bool, change func(ctx context.Context, a *Admin, max int) (int, error)) (Change, error) {
	if err := a.opts.layout.checkSemName(name); err != nil {
		return Change{}, err
	}
	a, err := a.bind(ctx)
	if err != nil {
		return Change{}, errorf("amqpsem: %s %q: %w", op, name, err)
	}
	var noticed bool
	lease, err := a.lockAdmin(ctx, name, &noticed)
	if err != nil {
		return Change{}, errorf("amqpsem: %s %q: administration mutex: %w", op, name, err)
	}
	defer func() { _ = lease.Release(context.WithoutCancel(ctx)) }()
	if exclusive {
		others, err := a.otherLayouts(ctx, name)
		if err != nil {
			return Change{}, err
		}
		if len(others) > 0 {
			return Change{}, fmt.Errorf("%w: %s %q in the %s layout refused: it is a semaphore of %s", ErrOtherLayout, op, name, a.opts.layout.name(), describe(others))
		}
	}
	before, err := a.max(ctx, name)
	if err != nil {
		return Change{}, err
	}
	if t := a.opts.overshoot; t > 0 {
		if err := a.deleteSlots(ctx, name, before+1, min(before+t, a.opts.layout.SlotLimit(name))); err != nil {
			return Change{Before: before, After: before}, errorf("amqpsem: %s %q: overshoot: %w", op, name, err)
		}
	}
	after, err := change(ctx, a, before)
	if err != nil {
		return Change{Before: before, After: after}, errorf("amqpsem: %s %q: %w", op, name, err)
	}
	if cause := context.Cause(lease.Context()); cause != nil {
		return Change{Before: before, After: after}, errorf("amqpsem: %s %q: administration mutex lost during the change: %w", op, name, cause)
	}
	return Change{Before: before, After: after}, nil
}

func checkCount(what string, n int) error {
	if n < 1 || n > MaxSlots {
		return fmt.Errorf("%w: %s must be in 1..%d, got %d", ErrInvalidSlots, what, MaxSlots, n)
	}
	return nil
}

// checkLimit refuses a semaphore of slots slots when name's queue names
// cannot go that high.
func (a *Admin) checkLimit(name string, slots int) error {
	if limit := a.opts.layout.SlotLimit(name); slots > limit {
		return fmt.Errorf("%w: %q can have at most %d slots (the queue names of slot %d would be longer than %d bytes)", ErrInvalidSlots, name, limit, limit+1, maxShortString)
	}
	return nil
}

// Create creates name with slots slots: A[1] to A[slots], in order. When
// name already has slots it returns an error matching [ErrExists] and
// changes nothing. When a declare fails (for example a queue of another
// layout in the way), the slot queues it created are deleted again.
func (a *Admin) Create(ctx context.Context, name string, slots int) error {
	if err := checkCount("slots", slots); err != nil {
		return err
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
	if err := checkCount("slots to add", n); err != nil {
		return Change{}, err
	}
	return a.locked(ctx, "add", name, true, func(ctx context.Context, a *Admin, max int) (int, error) {
		if max+n > MaxSlots {
			return max, fmt.Errorf("%w: %d + %d slots is more than %d", ErrInvalidSlots, max, n, MaxSlots)
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
	if err := checkCount("slots to remove", n); err != nil {
		return Change{}, err
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
	if slots < 0 || slots > MaxSlots {
		return Change{}, fmt.Errorf("%w: slots must be in 0..%d, got %d", ErrInvalidSlots, MaxSlots, slots)
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
// broker). It does not take the mutex.
func (a *Admin) Status(ctx context.Context, name string) (Status, error) {
	lay := a.opts.layout
	if err := lay.checkSemName(name); err != nil {
		return Status{}, err
	}
	a, err := a.bind(ctx)
	if err != nil {
		return Status{}, errorf("amqpsem: status of %q: %w", name, err)
	}
	others, err := a.otherLayouts(ctx, name)
	if err != nil {
		return Status{}, err
	}
	c, err := a.max(ctx, name)
	if err != nil {
		return Status{}, err
	}
	st := Status{Layout: lay.name(), Slots: c}
	for _, o := range others {
		st.OtherLayouts = append(st.OtherLayouts, o.layout)
	}
	held, err := a.heldBetween(ctx, name, 1, lay.SlotLimit(name))
	if err != nil {
		return Status{}, err
	}
	for _, i := range held {
		if i <= c {
			st.Held = append(st.Held, i)
		} else {
			st.Removed = append(st.Removed, i)
		}
	}
	return st, nil
}

// heldBetween returns the slots in lo..hi whose B queue exists.
func (a *Admin) heldBetween(ctx context.Context, name string, lo, hi int) ([]int, error) {
	if hi < lo {
		return nil, nil
	}
	qs := make([]string, 0, hi-lo+1)
	for i := lo; i <= hi; i++ {
		qs = append(qs, a.opts.layout.Holder(name, i))
	}
	got, _, err := a.c.probes.probe(ctx, qs...)
	if err != nil {
		return nil, errorf("amqpsem: holders of %q: %w", name, err)
	}
	var held []int
	for k, ok := range got {
		if ok {
			held = append(held, lo+k)
		}
	}
	return held, nil
}

// heldOf returns the slots of slots above c whose B queue exists.
func (a *Admin) heldOf(ctx context.Context, name string, c int, slots []int) ([]int, error) {
	var qs []string
	var idx []int
	for _, i := range slots {
		if i > c {
			qs, idx = append(qs, a.opts.layout.Holder(name, i)), append(idx, i)
		}
	}
	if len(qs) == 0 {
		return nil, nil
	}
	got, _, err := a.c.probes.probe(ctx, qs...)
	if err != nil {
		return nil, errorf("amqpsem: holders of %q: %w", name, err)
	}
	var held []int
	for k, ok := range got {
		if ok {
			held = append(held, idx[k])
		}
	}
	return held, nil
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
// name's administration mutex (a [Mutex] lease on name), which would make
// it wait until ctx ends.
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
// ctx.Err() (and, inside a [locks.HeldError], says which slots were still
// held at the last check).
func (a *Admin) WaitReleased(ctx context.Context, name string) error {
	lay := a.opts.layout
	if err := lay.checkSemName(name); err != nil {
		return err
	}
	a, err := a.bind(ctx)
	if err != nil {
		return errorf("amqpsem: wait for %q: %w", name, err)
	}
	var (
		last    error
		known   []int // removed slots found held at the last check
		from    = 0   // slots from here up were all checked (0: none yet)
		noticed bool  // the mutex-wait notice was given
	)
	try := func(ctx context.Context) (struct{}, error) {
		if from > 0 {
			// Poll the slots found held, and the slots removed since.
			c, err := a.max(ctx, name)
			if err != nil {
				return struct{}{}, err
			}
			held, err := a.heldOf(ctx, name, c, known)
			if err != nil {
				return struct{}{}, err
			}
			if c+1 < from {
				more, err := a.heldBetween(ctx, name, c+1, from-1)
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
		return err
	}
	sub, unsubscribe := a.c.wakes.subscribe(ctx, name)
	defer unsubscribe()
	_, err = driver.Wait(ctx, sub.c, a.opts.backoff, try)
	if err != nil && ctx.Err() != nil && last != nil {
		return errorf("amqpsem: wait for %q: %w (%w)", name, err, last)
	}
	return err
}

// heldAbove takes name's administration mutex (see lockAdmin for
// noticed), reads C, and returns C and the
// slots from C+1 to the name's [Layout.SlotLimit] whose holder queue
// exists. When the mutex is lost before the check ends, C may have
// changed during it: it returns an error matching [locks.ErrNotAcquired],
// to check again.
func (a *Admin) heldAbove(ctx context.Context, name string, noticed *bool) (int, []int, error) {
	lease, err := a.lockAdmin(ctx, name, noticed)
	if err != nil {
		return 0, nil, errorf("amqpsem: wait for %q: administration mutex: %w", name, err)
	}
	defer func() { _ = lease.Release(context.WithoutCancel(ctx)) }()
	c, err := a.max(ctx, name)
	if err != nil {
		return 0, nil, err
	}
	held, err := a.heldBetween(ctx, name, c+1, a.opts.layout.SlotLimit(name))
	if err != nil {
		return 0, nil, err
	}
	if cause := context.Cause(lease.Context()); cause != nil {
		return 0, nil, &locks.HeldError{Name: name, Err: fmt.Errorf("administration mutex lost during the check of every slot: %w", cause)}
	}
	return c, held, nil
}

// plural returns "1 slot" or "n slots".
func plural(n int, word string) string {
	if n == 1 {
		return word
	}
	return word + "s"
}
