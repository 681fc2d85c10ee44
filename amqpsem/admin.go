package amqpsem

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/latchkey-go/latchkey/locks"
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
// [Locker] lock on its name), after determining its current maximum C by
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
	mutex *Locker
	scan  *prober // a scan's probes on a connection of its own; see scanning
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
	b.mutex = &Locker{cl: a.cl, c: s, opts: a.opts}
	return &b
}

// Admin returns an Admin of the client, with opts on top of the client's
// options ([WithLayout], [WithOvershoot], [WithAscendingDelete]...).
// Invalid options, and connection options, return an error matching
// [locks.ErrInvalidOption].
func (c *Client) Admin(opts ...Option) (*Admin, error) {
	o, err := c.derive(opts)
	if err != nil {
		return nil, opError("admin", "", err)
	}
	return &Admin{cl: c, opts: o, mutex: &Locker{cl: c, opts: o}}, nil
}

// Max returns the number of slots of name, C: the A queues exist from A[1]
// to A[C] and A[C+1] does not. It does not take the mutex: the answer is
// a snapshot.
func (a *Admin) Max(ctx context.Context, name string) (int, error) {
	if err := checkCtx(ctx, "max", name); err != nil {
		return 0, err
	}
	if err := a.opts.layout.checkSemName(name); err != nil {
		return 0, opError("max", name, err)
	}
	a, err := a.bind(ctx)
	if err != nil {
		return 0, opError("max", name, err)
	}
	n, err := a.max(ctx, name)
	return n, opError("max", name, err)
}

func (a *Admin) max(ctx context.Context, name string) (int, error) {
	lay := a.opts.layout
	n, err := a.firstMissing(ctx, 1, lay.SlotLimit(name), func(i int) string { return lay.Slot(name, i) })
	if err != nil {
		return 0, errorf("amqpsem: slot count: %w", err)
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
		got, _, err := a.prober().probe(ctx, qs...)
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
	if err := checkCtx(ctx, "otherlayouts", name); err != nil {
		return nil, err
	}
	if err := a.opts.layout.checkSemName(name); err != nil {
		return nil, opError("otherlayouts", name, err)
	}
	a, err := a.bind(ctx)
	if err != nil {
		return nil, opError("otherlayouts", name, err)
	}
	found, err := a.otherLayouts(ctx, name)
	if err != nil {
		return nil, opError("otherlayouts", name, err)
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
	for _, l := range []Layout{DefaultLayout, PythonLayout} {
		if q := l.Slot(name, 1); q != own && queueName(q) == nil {
			cand = append(cand, otherLayout{l.name(), q})
		}
	}
	found, err := existing(ctx, a.prober(), cand, func(o otherLayout) string { return o.queue })
	if err != nil {
		return nil, errorf("amqpsem: other layouts: %w", err)
	}
	return found, nil
}

// existing returns the candidates whose queue exists, in their order,
// checked with one pipelined probe.
func existing[T any](ctx context.Context, p *prober, cand []T, queue func(T) string) ([]T, error) {
	if len(cand) == 0 {
		return nil, nil
	}
	qs := make([]string, len(cand))
	for i, c := range cand {
		qs[i] = queue(c)
	}
	got, _, err := p.probe(ctx, qs...)
	if err != nil {
		return nil, err
	}
	var found []T
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
func (a *Admin) lockAdmin(ctx context.Context, name string, noticed *bool) (*Lease, error) {
	m, err := a.mutex.bind(ctx)
	if err != nil {
		return nil, err
	}
	q, err := m.opts.layout.checkMutexName(name)
	if err != nil {
		return nil, err
	}
	lease, err := m.try(ctx, name, false)
	if errors.Is(err, locks.ErrNotAcquired) {
		if f := a.opts.mutexWait; f != nil && !*noticed {
			f(name)
		}
		*noticed = true
		lease, err = m.lock(ctx, name, q)
	}
	return lease, err
}

// locked runs change holding name's administration mutex, with the
// current maximum, after overshooting. With exclusive, it first refuses
// with [ErrOtherLayout] when name has slot queues of another layout. Its
// errors are those of op on name (opError).
func (a *Admin) locked(ctx context.Context, op, name string, exclusive bool, change func(ctx context.Context, a *Admin, max int) (int, error)) (Change, error) {
	ch, err := a.lockedChange(ctx, name, exclusive, change)
	return ch, opError(op, name, err)
}

func (a *Admin) lockedChange(ctx context.Context, name string, exclusive bool, change func(ctx context.Context, a *Admin, max int) (int, error)) (Change, error) {
	if err := a.opts.layout.checkSemName(name); err != nil {
		return Change{}, err
	}
	a, err := a.bind(ctx)
	if err != nil {
		return Change{}, err
	}
	var noticed bool
	lease, err := a.lockAdmin(ctx, name, &noticed)
	if err != nil {
		return Change{}, errorf("administration mutex: %w", err)
	}
	defer func() { _ = lease.Release(context.WithoutCancel(ctx)) }()
	if exclusive {
		others, err := a.otherLayouts(ctx, name)
		if err != nil {
			return Change{}, err
		}
		if len(others) > 0 {
			return Change{}, errorf("%w: refused in the %s layout, as it is a semaphore of %s", ErrOtherLayout, a.opts.layout.name(), describe(others))
		}
		if err := a.refuseQuorum(ctx, name); err != nil {
			return Change{}, err
		}
	}
	before, err := a.max(ctx, name)
	if err != nil {
		return Change{}, err
	}
	if t := a.opts.overshoot; t > 0 {
		if err := a.deleteSlots(ctx, name, before+1, min(before+t, a.opts.layout.SlotLimit(name))); err != nil {
			return Change{Before: before, After: before}, errorf("overshoot: %w", err)
		}
	}
	after, err := change(ctx, a, before)
	if err != nil {
		return Change{Before: before, After: after}, err
	}
	if cause := context.Cause(lease.Context()); cause != nil {
		return Change{Before: before, After: after}, errorf("administration mutex lost during the change: %w", cause)
	}
	return Change{Before: before, After: after}, nil
}

func checkCount(what string, n int) error {
	if n < 1 || n > MaxSemaphoreSize {
		return fmt.Errorf("%w: %s must be in 1..%d, got %d", ErrInvalidSlots, what, MaxSemaphoreSize, n)
	}
	return nil
}

// checkLimit refuses a semaphore of slots slots when name's queue names
// cannot go that high.
func (a *Admin) checkLimit(name string, slots int) error {
	if limit := a.opts.layout.SlotLimit(name); slots > limit {
		return fmt.Errorf("%w: the name can have at most %d slots (the queue names of slot %d would be longer than %d bytes)", ErrInvalidSlots, limit, limit+1, maxShortString)
	}
	return nil
}
