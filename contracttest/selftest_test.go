package contracttest

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/latchkey-go/latchkey/locks"
)

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
		name: "TryLock waits before it fails",
		breaks: func(h *memHarness) {
			h.breakClient = func(_ *memHarness, c *memClient) {
				try := c.locker.TryLock
				c.locker = lockerFunc{lock: c.locker.Lock, tryLock: func(ctx context.Context, name string) (locks.Lease, error) {
					l, err := try(ctx, name)
					if errors.Is(err, locks.ErrNotAcquired) {
						time.Sleep(tryLockAtOnce)
					}
					return l, err
				}}
			}
		},
		caught: []string{"TryLockHeld"},
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
				c.locker = lockerFunc{tryLock: c.locker.TryLock, lock: takesWhenCancelled(c.locker.TryLock, c.locker.Lock)}
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
		caught: []string{"LossOnKill", "LossOnRevoke", "Release", "CloseEndsLeases"},
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
	}, {
		name: "Context returns a new context each call",
		breaks: func(h *memHarness) {
			h.breakClient = func(_ *memHarness, c *memClient) {
				c.locker = mapLeases(c.locker, func(l locks.Lease) locks.Lease { return freshContextLease{l} })
			}
		},
		caught: []string{"Release"},
	}, {
		name: "Release with an ended context does nothing",
		breaks: func(h *memHarness) {
			h.breakClient = func(_ *memHarness, c *memClient) {
				c.locker = mapLeases(c.locker, func(l locks.Lease) locks.Lease {
					return &leaseOverride{Lease: l, release: func(ctx context.Context) error {
						if err := ctx.Err(); err != nil {
							return err // the lease stays live and renewed
						}
						return l.Release(ctx)
					}}
				})
			}
		},
		caught: []string{"ReleaseEndedContext"},
	}, {
		name: "Release with an ended context leaves the name held",
		breaks: func(h *memHarness) {
			h.breakClient = func(_ *memHarness, c *memClient) {
				hidden := c.c.Locker()
				c.locker = mapLeases(c.locker, func(l locks.Lease) locks.Lease {
					return &leaseOverride{Lease: l, release: func(ctx context.Context) error {
						err := l.Release(ctx)
						if ctx.Err() != nil {
							// Held, renewed, and never returned: as if the
							// broker went on renewing the released lease.
							_, _ = hidden.TryLock(context.Background(), l.Name())
						}
						return err
					}}
				})
			}
		},
		caught: []string{"ReleaseEndedContext"},
	}, {
		name: "cancelled Acquire still takes a slot",
		breaks: func(h *memHarness) {
			h.breakClient = func(_ *memHarness, c *memClient) {
				mapSemaphores(c, func(s locks.Semaphore) locks.Semaphore {
					return semaphoreFunc{tryAcquire: s.TryAcquire, acquire: takesWhenCancelled(s.TryAcquire, s.Acquire)}
				})
			}
		},
		caught: []string{"SemaphoreCancellation"},
	}, {
		name: "Acquire reports a deadline as not acquired",
		breaks: func(h *memHarness) {
			h.breakClient = func(_ *memHarness, c *memClient) {
				mapSemaphores(c, func(s locks.Semaphore) locks.Semaphore {
					return semaphoreFunc{tryAcquire: s.TryAcquire, acquire: func(ctx context.Context, name string) (locks.Lease, error) {
						lease, err := s.Acquire(ctx, name)
						if errors.Is(err, context.DeadlineExceeded) {
							err = fmt.Errorf("acquire %q: %w", name, locks.ErrNotAcquired)
						}
						return lease, err
					}}
				})
			}
		},
		caught: []string{"SemaphoreCancellation"},
	}, {
		name: "closed Locker does not say ErrClosed",
		breaks: func(h *memHarness) {
			h.breakClient = func(_ *memHarness, c *memClient) {
				c.locker = lockerFunc{lock: hideClosed(c.locker.Lock), tryLock: hideClosed(c.locker.TryLock)}
			}
		},
		caught: []string{"Closed"},
	}, {
		name: "closed Semaphore does not say ErrClosed",
		breaks: func(h *memHarness) {
			h.breakClient = func(_ *memHarness, c *memClient) {
				mapSemaphores(c, func(s locks.Semaphore) locks.Semaphore {
					return semaphoreFunc{acquire: hideClosed(s.Acquire), tryAcquire: hideClosed(s.TryAcquire)}
				})
			}
		},
		caught: []string{"Closed"},
	}, {
		name: "closing a client reports its leases released",
		breaks: func(h *memHarness) {
			h.breakClient = func(_ *memHarness, c *memClient) {
				c.locker = mapLeases(c.locker, func(l locks.Lease) locks.Lease {
					released, cancel := context.WithCancelCause(context.Background())
					context.AfterFunc(l.Context(), func() { cancel(locks.ErrReleased) })
					return &leaseOverride{Lease: l, ctx: released}
				})
			}
		},
		caught: []string{"CloseEndsLeases"},
	}, {
		name: "Close abandons leases instead of releasing them",
		breaks: func(h *memHarness) {
			h.ttl = 5 * time.Second
			h.caps.CrashRecovery = 100 * time.Millisecond
			h.breakClient = func(_ *memHarness, c *memClient) { c.close = c.c.Kill }
		},
		caught: []string{"CloseEndsLeases"},
	}}
	for _, tc := range cases {
		t.Run(strings.ReplaceAll(tc.name, " ", "_"), func(t *testing.T) {
			for _, check := range tc.caught {
				r := runRecorded(t, findTest(check), brokenHarness(tc.breaks))
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

// mapSemaphores makes every semaphore c gives out the one f makes of
// memlock's.
func mapSemaphores(c *memClient, f func(locks.Semaphore) locks.Semaphore) {
	c.semaphore = func(n int) (locks.Semaphore, error) {
		s, err := c.c.Semaphore(n)
		if err != nil {
			return nil, err
		}
		return f(s), nil
	}
}

// takesWhenCancelled returns get, broken: called with a context that has
// already ended, it returns the context's error but takes the name with
// try all the same, and never returns what it took.
func takesWhenCancelled(try, get func(context.Context, string) (locks.Lease, error)) func(context.Context, string) (locks.Lease, error) {
	return func(ctx context.Context, name string) (locks.Lease, error) {
		if err := ctx.Err(); err != nil {
			_, _ = try(context.Background(), name) // held, and never returned
			return nil, err
		}
		return get(ctx, name)
	}
}

// freshContextLease returns a new (if equivalent) context on every call
// of Context.
type freshContextLease struct{ locks.Lease }

func (l freshContextLease) Context() context.Context {
	return &wrappedContext{l.Lease.Context()}
}

type wrappedContext struct{ context.Context }

// hideClosed makes get's errors on a closed client stop matching
// locks.ErrClosed, keeping their text.
func hideClosed(get func(context.Context, string) (locks.Lease, error)) func(context.Context, string) (locks.Lease, error) {
	return func(ctx context.Context, name string) (locks.Lease, error) {
		lease, err := get(ctx, name)
		if errors.Is(err, locks.ErrClosed) {
			err = errors.New(err.Error())
		}
		return lease, err
	}
}

// TestDefectsCaughtOnMemlock shows each check that a planted Defect
// memlock can carry (no holder process, no fault proxy) failing on
// memlock with that defect put in.
func TestDefectsCaughtOnMemlock(t *testing.T) {
	for _, d := range []Defect{LeaksLateGrant, UnwrappedNameError, SlotsPerClient} {
		t.Run(string(d), func(t *testing.T) {
			MustCatch(t, Defective(newMemHarness, d), d.CaughtBy()...)
		})
	}
}

// TestRunDefectTestsMemlock runs RunDefectTests on memlock: the checks it
// can run must catch their defects, the others (which need a holder
// process or a fault proxy) skip.
func TestRunDefectTestsMemlock(t *testing.T) {
	RunDefectTests(t, newMemHarness)
}

// TestDefectsListed checks that every Defect names the checks that must
// catch it, and that Defective refuses an unknown one.
func TestDefectsListed(t *testing.T) {
	for _, d := range Defects() {
		if len(d.CaughtBy()) == 0 {
			t.Errorf("%s: CaughtBy is empty", d)
		}
		for _, name := range d.CaughtBy() {
			if findTest(name) == nil {
				t.Errorf("%s: CaughtBy names %q, which is no conformance test", d, name)
			}
		}
	}
	if _, err := Defective(newMemHarness, "no-such-defect")(t.Context(), t); err == nil {
		t.Errorf("Defective with an unknown defect made a harness; want an error")
	}
}
