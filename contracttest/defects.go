package contracttest

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/latchkey-go/latchkey/locks"
)

// A Defect is a bug put into a working backend on purpose, so that a
// backend's tests can show that the suite's checks catch it on the real
// broker, where memlock (in-process, no network) cannot go: see
// [Defective] and [MustCatch].
type Defect string

const (
	// LateLossSignal makes a lease's context end [lateBy] after the
	// backend ended it: a holder goes on writing after it lost the name.
	// PausedHolder and PartitionedHolder must catch it.
	LateLossSignal Defect = "late-loss-signal"

	// OverrunsContext makes Lock and TryLock ignore their context's
	// deadline: they retry failures until [overrun] past it (on ErrClosed
	// they stop, but still return late when already past the deadline).
	// AmbiguousAcquire must catch it.
	OverrunsContext Defect = "overruns-context"

	// LeaksLateGrant makes a Lock with a deadline wait for the name up to
	// [overrun] past it and, when it gets the name after its deadline,
	// return the context's error but keep the name, held and renewed,
	// never returned to its caller: a grant that comes back after the
	// caller gave up, dropped instead of released. CancellationRace must
	// catch it.
	LeaksLateGrant Defect = "leaks-late-grant"

	// UnwrappedNameError makes Lock and TryLock refuse every name with a
	// byte outside printable ASCII with an error that does not match
	// [locks.ErrInvalidName], as a backend that passes its broker's
	// refusal of a key through unwrapped would. RandomNames must catch it.
	UnwrappedNameError Defect = "unwrapped-name-error"

	// SlotsPerClient makes each client's semaphores count their slots
	// apart from every other client's, as a backend that counted slots in
	// the client instead of at the broker would: each client gets up to
	// size slots of a name, so that clients together hold more than size
	// at once. SemaphoreExclusion must catch it.
	SlotsPerClient Defect = "slots-per-client"
)

// Defects returns every [Defect], in a fixed order.
func Defects() []Defect {
	return []Defect{LateLossSignal, OverrunsContext, LeaksLateGrant, UnwrappedNameError, SlotsPerClient}
}

// CaughtBy returns the conformance tests (as named by
// [RunConformanceTests]) that must fail on a backend with d put in, or
// nil for an unknown defect.
func (d Defect) CaughtBy() []string {
	switch d {
	case LateLossSignal:
		return []string{"PausedHolder", "PartitionedHolder"}
	case OverrunsContext:
		return []string{"AmbiguousAcquire"}
	case LeaksLateGrant:
		return []string{"CancellationRace"}
	case UnwrappedNameError:
		return []string{"RandomNames"}
	case SlotsPerClient:
		return []string{"SemaphoreExclusion"}
	}
	return nil
}

// overrun is how far an [OverrunsContext] call outlives its context, and
// how long a [LeaksLateGrant] Lock waits past its deadline.
const overrun = 3 * time.Second

// lateBy is how late a [LateLossSignal] lease learns it ended.
const lateBy = 5 * time.Second

// defectEnv names the variable that passes a [Defect] to a holder process.
const defectEnv = "LOCKS_CONTRACTTEST_DEFECT"

// apply returns l with the defect put in. An empty Defect, or one that
// is not a Locker's, changes nothing.
func (d Defect) apply(l locks.Locker) locks.Locker {
	switch d {
	case LateLossSignal:
		return mapLeases(l, func(lease locks.Lease) locks.Lease {
			late, cancel := context.WithCancelCause(context.Background())
			context.AfterFunc(lease.Context(), func() {
				time.AfterFunc(lateBy, func() { cancel(context.Cause(lease.Context())) })
			})
			return &leaseOverride{Lease: lease, ctx: late}
		})
	case OverrunsContext:
		return lockerFunc{lock: overrunContext(l.Lock), tryLock: overrunContext(l.TryLock)}
	case LeaksLateGrant:
		return lockerFunc{lock: leakLateGrant(l.Lock), tryLock: l.TryLock}
	case UnwrappedNameError:
		return lockerFunc{lock: refuseNonASCII(l.Lock), tryLock: refuseNonASCII(l.TryLock)}
	}
	return l
}

// applySemaphore returns s, a semaphore of the client numbered client,
// with the defect put in. A defect that is not a Semaphore's changes
// nothing.
func (d Defect) applySemaphore(s locks.Semaphore, client uint64) locks.Semaphore {
	if d != SlotsPerClient {
		return s
	}
	own := func(get func(context.Context, string) (locks.Lease, error)) func(context.Context, string) (locks.Lease, error) {
		return func(ctx context.Context, name string) (locks.Lease, error) {
			lease, err := get(ctx, fmt.Sprintf("%s-c%d", name, client))
			if err != nil {
				return nil, err
			}
			return &leaseOverride{Lease: lease, name: name}, nil
		}
	}
	return semaphoreFunc{acquire: own(s.Acquire), tryAcquire: own(s.TryAcquire)}
}

// overrunContext returns get, retrying its failures until [overrun] past
// its context's deadline; see [OverrunsContext].
func overrunContext(get func(context.Context, string) (locks.Lease, error)) func(context.Context, string) (locks.Lease, error) {
	return func(ctx context.Context, name string) (locks.Lease, error) {
		d, ok := ctx.Deadline()
		if !ok {
			return get(ctx, name)
		}
		ctx, cancel := context.WithDeadline(context.WithoutCancel(ctx), d.Add(overrun))
		defer cancel()
		for {
			lease, err := get(ctx, name)
			if err == nil || ctx.Err() != nil {
				return lease, err
			}
			if errors.Is(err, locks.ErrClosed) {
				// No retry can succeed; a call already past its
				// deadline still returns late.
				if time.Now().After(d) {
					<-ctx.Done()
				}
				return lease, err
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
}

// leakLateGrant returns lock, waiting up to [overrun] past its context's
// deadline and dropping a lease it gets after it; see [LeaksLateGrant].
func leakLateGrant(lock func(context.Context, string) (locks.Lease, error)) func(context.Context, string) (locks.Lease, error) {
	return func(ctx context.Context, name string) (locks.Lease, error) {
		d, ok := ctx.Deadline()
		if !ok {
			return lock(ctx, name)
		}
		late, cancel := context.WithDeadline(context.WithoutCancel(ctx), d.Add(overrun))
		defer cancel()
		lease, err := lock(late, name)
		if cerr := ctx.Err(); cerr != nil {
			// Held, renewed, and never returned: the caller only hears
			// that its context ended.
			return nil, cerr
		}
		return lease, err
	}
}

// refuseNonASCII returns get, refusing names with a byte outside
// printable ASCII with a plain error; see [UnwrappedNameError].
func refuseNonASCII(get func(context.Context, string) (locks.Lease, error)) func(context.Context, string) (locks.Lease, error) {
	return func(ctx context.Context, name string) (locks.Lease, error) {
		for i := range len(name) {
			if name[i] < 0x21 || name[i] > 0x7e {
				return nil, fmt.Errorf("broker: invalid key %q", name)
			}
		}
		return get(ctx, name)
	}
}

// Defective returns nh with d put into every client's Locker (or
// Semaphores, for [SlotsPerClient]), also in holder processes (the
// harness's [ProcessHarness.ChildEnv] carries d to [Main]). The harness
// keeps its [FaultHarness], [ProcessHarness] and [LeakFilter] abilities;
// it loses the others.
func Defective(nh NewHarness, d Defect) NewHarness {
	return func(ctx context.Context, t testing.TB) (Harness, error) {
		if d.CaughtBy() == nil {
			return nil, fmt.Errorf("contracttest: unknown defect %q", d)
		}
		h, err := nh(ctx, t)
		if err != nil {
			return nil, err
		}
		dh := &defectiveHarness{Harness: h, defect: d}
		if ph, ok := h.(ProcessHarness); ok {
			return &defectiveProcessHarness{defectiveHarness: dh, inner: ph}, nil
		}
		return dh, nil
	}
}

type defectiveHarness struct {
	Harness
	defect  Defect
	clients atomic.Uint64 // numbers the clients
}

func (h *defectiveHarness) NewClient(ctx context.Context) (Client, error) {
	c, err := h.Harness.NewClient(ctx)
	if err != nil {
		return nil, err
	}
	return h.wrap(c), nil
}

// wrap puts the defect into c.
func (h *defectiveHarness) wrap(c Client) *defectiveClient {
	return &defectiveClient{Client: c, defect: h.defect, id: h.clients.Add(1)}
}

// NewFaultyClient is the inner harness's, or [errors.ErrUnsupported],
// which makes the fault tests skip as they do without a FaultHarness.
func (h *defectiveHarness) NewFaultyClient(ctx context.Context) (Client, Link, error) {
	fh, ok := h.Harness.(FaultHarness)
	if !ok {
		return nil, nil, errors.ErrUnsupported
	}
	c, link, err := fh.NewFaultyClient(ctx)
	if err != nil {
		return nil, nil, err
	}
	return h.wrap(c), link, nil
}

// Kill kills the inner client.
func (h *defectiveHarness) Kill(ctx context.Context, c Client) error {
	if dc, ok := c.(*defectiveClient); ok {
		c = dc.Client
	}
	return h.Harness.Kill(ctx, c)
}

func (h *defectiveHarness) IgnoreLeaks() []goleak.Option {
	if f, ok := h.Harness.(LeakFilter); ok {
		return f.IgnoreLeaks()
	}
	return nil
}

type defectiveProcessHarness struct {
	*defectiveHarness
	inner ProcessHarness
}

func (h *defectiveProcessHarness) ChildEnv() []string {
	return append(h.inner.ChildEnv(), defectEnv+"="+string(h.defect))
}

type defectiveClient struct {
	Client
	defect Defect
	id     uint64
}

func (c *defectiveClient) Locker() locks.Locker {
	if l := c.Client.Locker(); l != nil {
		return c.defect.apply(l)
	}
	return nil
}

func (c *defectiveClient) Semaphore(ctx context.Context, size int) (locks.Semaphore, error) {
	s, err := c.Client.Semaphore(ctx, size)
	if err != nil {
		return nil, err
	}
	return c.defect.applySemaphore(s, c.id), nil
}

// lockerFunc, semaphoreFunc and leaseOverride build broken lockers and
// semaphores from working ones.
type lockerFunc struct {
	lock, tryLock func(context.Context, string) (locks.Lease, error)
}

func (l lockerFunc) Lock(ctx context.Context, n string) (locks.Lease, error) { return l.lock(ctx, n) }
func (l lockerFunc) TryLock(ctx context.Context, n string) (locks.Lease, error) {
	return l.tryLock(ctx, n)
}

// semaphoreFunc builds a broken semaphore from a working one's calls.
type semaphoreFunc struct {
	acquire, tryAcquire func(context.Context, string) (locks.Lease, error)
}

func (s semaphoreFunc) Acquire(ctx context.Context, n string) (locks.Lease, error) {
	return s.acquire(ctx, n)
}

func (s semaphoreFunc) TryAcquire(ctx context.Context, n string) (locks.Lease, error) {
	return s.tryAcquire(ctx, n)
}

type leaseOverride struct {
	locks.Lease
	name    string
	ctx     context.Context
	token   func() uint64
	release func(context.Context) error
}

// Slot is the overridden lease's.
func (l leaseOverride) Slot() int {
	if sl, ok := l.Lease.(locks.SlotLease); ok {
		return sl.Slot()
	}
	return 0
}

func (l *leaseOverride) Context() context.Context {
	if l.ctx != nil {
		return l.ctx
	}
	return l.Lease.Context()
}

func (l *leaseOverride) Name() string {
	if l.name != "" {
		return l.name
	}
	return l.Lease.Name()
}

func (l *leaseOverride) Token() uint64 {
	if l.token != nil {
		return l.token()
	}
	return l.Lease.Token()
}

func (l *leaseOverride) Release(ctx context.Context) error {
	if l.release != nil {
		return l.release(ctx)
	}
	return l.Lease.Release(ctx)
}

// mapLeases wraps both calls of a locker so that f rewrites every lease.
func mapLeases(l locks.Locker, f func(locks.Lease) locks.Lease) locks.Locker {
	wrap := func(get func(context.Context, string) (locks.Lease, error)) func(context.Context, string) (locks.Lease, error) {
		return func(ctx context.Context, name string) (locks.Lease, error) {
			lease, err := get(ctx, name)
			if err != nil {
				return nil, err
			}
			return f(lease), nil
		}
	}
	return lockerFunc{lock: wrap(l.Lock), tryLock: wrap(l.TryLock)}
}

// childDefect is the defect a holder process was started with.
func childDefect() Defect { return Defect(os.Getenv(defectEnv)) }
