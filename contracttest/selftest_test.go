package contracttest

import (
	"context"
	"fmt"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/latchkey-go/latchkey/locks"
)

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
func runRecorded(t *testing.T, test func(testing.TB, NewHarness), nh NewHarness) *recorder {
	r := &recorder{TB: t}
	done := make(chan struct{})
	go func() {
		defer close(done)
		test(r, nh)
	}()
	<-done
	return r
}

// brokenHarness returns memlock with breakClient applied to every client.
func brokenHarness(adjust func(h *memHarness)) NewHarness {
	return func(ctx context.Context, t testing.TB) (Harness, error) {
		h, err := newMemHarness(ctx, t)
		if err != nil {
			return nil, err
		}
		adjust(h.(*memHarness))
		return h, nil
	}
}

func testByName(t *testing.T, name string) func(testing.TB, NewHarness) {
	for _, tc := range conformanceTests {
		if tc.name == name {
			return tc.run
		}
	}
	t.Fatalf("no conformance test %q", name)
	return nil
}

// lockerFunc and leaseOverride build broken lockers from memlock's.
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

// TestSuiteCatchesBrokenBackends runs the suite's checks against memlock
// broken on purpose, one way at a time, and asserts each named check fails.
func TestSuiteCatchesBrokenBackends(t *testing.T) {
	leaked := make(chan struct{})
	defer close(leaked)

	cases := []struct {
		name   string
		breaks func(h *memHarness)
		caught []string // conformance tests that must fail
	}{{
		name: "double grant",
		breaks: func(h *memHarness) {
			h.breakClient = func(_ *memHarness, c *memClient) {
				wide, _ := c.c.Semaphore(100)
				c.locker = lockerFunc{lock: wide.Acquire, tryLock: wide.TryAcquire}
			}
		},
		caught: []string{"MutualExclusion", "TryLockHeld", "LockWaitsForRelease", "StaleRelease"},
	}, {
		name: "stale fencing token",
		breaks: func(h *memHarness) {
			h.breakClient = func(_ *memHarness, c *memClient) {
				c.locker = mapLeases(c.locker, func(l locks.Lease) locks.Lease {
					return &leaseOverride{Lease: l, token: func() uint64 { return 7 }}
				})
			}
		},
		caught: []string{"Fencing"},
	}, {
		name: "cancelled Lock still takes the name",
		breaks: func(h *memHarness) {
			h.breakClient = func(_ *memHarness, c *memClient) {
				inner := c.locker
				c.locker = lockerFunc{tryLock: inner.TryLock, lock: func(ctx context.Context, name string) (locks.Lease, error) {
					if err := ctx.Err(); err != nil {
						_, _ = inner.TryLock(context.Background(), name) // held, and never returned
						return nil, err
					}
					return inner.Lock(ctx, name)
				}}
			}
		},
		caught: []string{"Cancellation"},
	}, {
		name: "goroutine outlives its lease",
		breaks: func(h *memHarness) {
			h.breakClient = func(_ *memHarness, c *memClient) {
				c.locker = mapLeases(c.locker, func(l locks.Lease) locks.Lease {
					go func() { <-leaked }()
					return l
				})
			}
		},
		caught: []string{"NoLeaks", "Release", "DistinctNames"},
	}, {
		name: "crash recovery slower than stated",
		breaks: func(h *memHarness) {
			h.ttl = time.Second
			h.caps.CrashRecovery = 100 * time.Millisecond
		},
		caught: []string{"CrashLiveness"},
	}, {
		name: "no loss signal",
		breaks: func(h *memHarness) {
			h.breakClient = func(_ *memHarness, c *memClient) {
				c.locker = mapLeases(c.locker, func(l locks.Lease) locks.Lease {
					return &leaseOverride{Lease: l, ctx: context.Background()}
				})
			}
		},
		caught: []string{"LossOnKill", "LossOnRevoke", "Release"},
	}, {
		name: "release frees whoever holds the name",
		breaks: func(h *memHarness) {
			h.breakClient = func(h *memHarness, c *memClient) {
				c.locker = mapLeases(c.locker, func(l locks.Lease) locks.Lease {
					return &leaseOverride{Lease: l, release: func(ctx context.Context) error {
						err := l.Release(ctx)
						h.store.Revoke(l.Name())
						return err
					}}
				})
			}
		},
		caught: []string{"StaleRelease", "Preemption"},
	}, {
		name: "thief acts before the victim knows",
		breaks: func(h *memHarness) {
			h.breakClient = func(_ *memHarness, c *memClient) {
				c.locker = mapLeases(c.locker, func(l locks.Lease) locks.Lease {
					late, cancel := context.WithCancelCause(context.Background())
					context.AfterFunc(l.Context(), func() {
						time.AfterFunc(100*time.Millisecond, func() { cancel(context.Cause(l.Context())) })
					})
					return &leaseOverride{Lease: l, ctx: late}
				})
			}
		},
		caught: []string{"Preemption"},
	}, {
		name: "semaphore admits one too many",
		breaks: func(h *memHarness) {
			h.breakClient = func(_ *memHarness, c *memClient) {
				c.semaphore = func(n int) (locks.Semaphore, error) { return c.c.Semaphore(n + 1) }
			}
		},
		caught: []string{"SemaphoreLimit"},
	}, {
		name: "empty name accepted",
		breaks: func(h *memHarness) {
			h.breakClient = func(_ *memHarness, c *memClient) {
				inner := c.locker
				fix := func(get func(context.Context, string) (locks.Lease, error)) func(context.Context, string) (locks.Lease, error) {
					return func(ctx context.Context, name string) (locks.Lease, error) {
						if name == "" {
							name = "empty"
						}
						return get(ctx, name)
					}
				}
				c.locker = lockerFunc{lock: fix(inner.Lock), tryLock: fix(inner.TryLock)}
			}
		},
		caught: []string{"InvalidNames"},
	}, {
		name: "options not validated",
		breaks: func(h *memHarness) {
			h.optionErrs = []error{nil, fmt.Errorf("some other error")}
		},
		caught: []string{"InvalidOptions"},
	}}
	for _, tc := range cases {
		t.Run(strings.ReplaceAll(tc.name, " ", "_"), func(t *testing.T) {
			for _, check := range tc.caught {
				r := runRecorded(t, testByName(t, check), brokenHarness(tc.breaks))
				if r.skipped != "" {
					t.Errorf("%s skipped instead of failing: %s", check, r.skipped)
				} else if !r.Failed() {
					t.Errorf("%s did not catch a backend with %s", check, tc.name)
				} else {
					t.Logf("%s caught it: %.200s", check, r.failures[0])
				}
			}
		})
	}
}
