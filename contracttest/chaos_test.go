package contracttest

import (
	"strings"
	"testing"
	"time"

	"github.com/latchkey-go/latchkey/locks"
)

func TestChaosMemlock(t *testing.T) {
	s := RunChaos(t, newMemHarness, ChaosConfig{Duration: 2 * time.Second, FaultEvery: 100 * time.Millisecond})
	if s.Acquisitions == 0 || s.Faults[FaultCrash] == 0 {
		t.Errorf("the run did too little to mean anything: %v", s)
	}
}

// TestChaosCatchesBrokenBackends shows that each of the run's checks can
// fail: memlock broken on purpose must produce the violation named.
func TestChaosCatchesBrokenBackends(t *testing.T) {
	cases := []struct {
		name   string
		breaks func(h *memHarness)
		want   string
	}{{
		name: "double grant",
		breaks: func(h *memHarness) {
			h.breakClient = func(_ *memHarness, c *memClient) {
				wide, _ := c.c.Semaphore(100)
				c.locker = lockerFunc{lock: wide.Acquire, tryLock: wide.TryAcquire}
			}
		},
		want: "critical sections overlap",
	}, {
		name: "tokens repeat",
		breaks: func(h *memHarness) {
			h.breakClient = func(_ *memHarness, c *memClient) {
				c.locker = mapLeases(c.locker, func(l locks.Lease) locks.Lease {
					return &leaseOverride{Lease: l, token: func() uint64 { return 7 }}
				})
			}
		},
		want: "not linearizable",
	}, {
		name: "crash recovery slower than stated",
		breaks: func(h *memHarness) {
			h.ttl = 500 * time.Millisecond
			h.caps.CrashRecovery = 100 * time.Millisecond
		},
		want: "after its holder crashed",
	}}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r := newChaosRun(t, brokenHarness(tc.breaks), ChaosConfig{Duration: time.Second, FaultEvery: 100 * time.Millisecond, Names: 2})
			r.run()
			s := r.check()
			r.close()
			for _, v := range s.Violations {
				if strings.Contains(v, tc.want) {
					t.Logf("caught: %s", v)
					return
				}
			}
			t.Errorf("no violation mentioning %q; got %q", tc.want, s.Violations)
		})
	}
}
