package contracttest

import (
	"context"
	"errors"
	"fmt"
	"os"
	"runtime"
	"sync"
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
	// backend ended it: a holder goes on writing after it lost the name. PausedHolder and PartitionedHolder must catch it.
	LateLossSignal Defect = "late-loss-signal"

	// OverrunsContext makes Lock and TryLock ignore their context's
	// deadline: they retry failures until [overrun] past it (on ErrClosed
	// they stop, but still return late when already past the deadline).
	// AmbiguousAcquire must catch it.
	OverrunsContext Defect = "overruns-context"
)

// overrun is how far an [OverrunsContext] call outlives its context.
const overrun = 3 * time.Second

// lateBy is how late a [LateLossSignal] lease learns it ended.
const lateBy = 5 * time.Second

// defectEnv names the variable that passes a [Defect] to a holder process.
const defectEnv = "LOCKS_CONTRACTTEST_DEFECT"

// apply returns l with the defect put in. An empty Defect changes nothing.
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
		stretch := func(get func(context.Context, string) (locks.Lease, error)) func(context.Context, string) (locks.Lease, error) {
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
		return lockerFunc{lock: stretch(l.Lock), tryLock: stretch(l.TryLock)}
	}
	return l
}

// Defective returns nh with d put into every client's Locker, also in
// holder processes (the harness's [ProcessHarness.ChildEnv] carries d to
// [Main]). The harness keeps its [FaultHarness], [ProcessHarness] and
// [LeakFilter] abilities; it loses the others.
func Defective(nh NewHarness, d Defect) NewHarness {
	return func(ctx context.Context, t testing.TB) (Harness, error) {
		if d != LateLossSignal && d != OverrunsContext {
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
	defect Defect
}

func (h *defectiveHarness) NewClient(ctx context.Context) (Client, error) {
	c, err := h.Harness.NewClient(ctx)
	if err != nil {
		return nil, err
	}
	return &defectiveClient{Client: c, defect: h.defect}, nil
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
	return &defectiveClient{Client: c, defect: h.defect}, link, nil
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
}

func (c *defectiveClient) Locker() locks.Locker {
	if l := c.Client.Locker(); l != nil {
		return c.defect.apply(l)
	}
	return nil
}

// MustCatch runs each named conformance test (as listed by
// [RunConformanceTests], such as "PausedHolder") against nh, which should
// be a [Defective] harness, and fails t unless every one of them fails.
// A test that skips counts as not catching.
func MustCatch(t *testing.T, nh NewHarness, tests ...string) {
	t.Helper()
	for _, name := range tests {
		t.Run(name, func(t *testing.T) {
			run := findTest(name)
			if run == nil {
				t.Fatalf("no conformance test %q", name)
			}
			r := runRecorded(t, run, nh)
			switch {
			case r.skipped != "":
				t.Errorf("%s skipped instead of failing: %s", name, r.skipped)
			case !r.Failed():
				t.Errorf("%s passed: it did not catch the defect", name)
			default:
				t.Logf("%s caught it: %.300s", name, r.failures[0])
			}
		})
	}
}

// findTest returns the conformance test called name, or nil.
func findTest(name string) func(testing.TB, NewHarness) {
	for _, tc := range conformanceTests {
		if tc.name == name {
			return tc.run
		}
	}
	return nil
}

// recorder is a testing.TB that records failures instead of failing the
// real test, so the suite can be run against a broken backend and be seen
// to catch it. Fatal and Skip end the calling goroutine, as testing does.
type recorder struct {
	testing.TB // the real test: Name, Helper, Cleanup, TempDir...
	mu         sync.Mutex
	failures   []string
	skipped    string
}

func (r *recorder) Errorf(format string, args ...any) { r.record(fmt.Sprintf(format, args...)) }
func (r *recorder) Error(args ...any)                 { r.record(fmt.Sprint(args...)) }
func (r *recorder) Fatalf(format string, args ...any) { r.Errorf(format, args...); runtime.Goexit() }
func (r *recorder) Fatal(args ...any)                 { r.Error(args...); runtime.Goexit() }
func (r *recorder) Fail()                             { r.record("Fail") }
func (r *recorder) FailNow()                          { r.record("FailNow"); runtime.Goexit() }
func (r *recorder) Skipf(format string, args ...any)  { r.skip(fmt.Sprintf(format, args...)) }
func (r *recorder) Skip(args ...any)                  { r.skip(fmt.Sprint(args...)) }
func (r *recorder) SkipNow()                          { r.skip("SkipNow") }
func (r *recorder) Logf(format string, args ...any)   {}
func (r *recorder) Log(args ...any)                   {}
func (r *recorder) Failed() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.failures) > 0
}

func (r *recorder) record(msg string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.failures = append(r.failures, msg)
}

func (r *recorder) skip(msg string) {
	r.mu.Lock()
	r.skipped = msg
	r.mu.Unlock()
	runtime.Goexit()
}

// runRecorded runs one suite test against nh on a recorder and returns it.
func runRecorded(t testing.TB, test func(testing.TB, NewHarness), nh NewHarness) *recorder {
	r := &recorder{TB: t}
	done := make(chan struct{})
	go func() {
		defer close(done)
		test(r, nh)
	}()
	<-done
	return r
}

// lockerFunc and leaseOverride build broken lockers from working ones.
type lockerFunc struct {
	lock, tryLock func(context.Context, string) (locks.Lease, error)
}

func (l lockerFunc) Lock(ctx context.Context, n string) (locks.Lease, error) { return l.lock(ctx, n) }
func (l lockerFunc) TryLock(ctx context.Context, n string) (locks.Lease, error) {
	return l.tryLock(ctx, n)
}

type leaseOverride struct {
	locks.Lease
	ctx     context.Context
	token   func() uint64
	release func(context.Context) error
}

func (l *leaseOverride) Context() context.Context {
	if l.ctx != nil {
		return l.ctx
	}
	return l.Lease.Context()
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
