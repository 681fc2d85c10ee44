package contracttest

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/latchkey-go/latchkey/contracttest/testenv"
	"github.com/latchkey-go/latchkey/locks"
	"github.com/latchkey-go/latchkey/locks/memlock"
)

func TestChaosMemlock(t *testing.T) {
	s := RunChaos(t, newMemHarness, ChaosConfig{Duration: 2 * time.Second, FaultEvery: 100 * time.Millisecond})
	if s.Acquisitions == 0 || s.Faults[FaultCrash] == 0 {
		t.Errorf("the run did too little to mean anything: %v", s)
	}
}

// memChaosHarness is memlock whose clients each get a TTL and renewal
// interval of their own, and, with priorities, a priority.
type memChaosHarness struct {
	*memHarness
	priorities bool
	// minTTL and maxTTL bound the TTLs drawn.
	minTTL, maxTTL time.Duration
	// claim, when set, is the CrashRecovery a client of that TTL states.
	claim func(ttl time.Duration) time.Duration
	// broken, when set, breaks the clients whose options it accepts.
	broken func(ttl time.Duration, priority int) bool
}

func (h *memChaosHarness) NewChaosClient(_ context.Context, rng *rand.Rand) (ChaosClient, error) {
	ttl := h.minTTL + time.Duration(rng.Int64N(int64(h.maxTTL-h.minTTL)+1)).Round(time.Millisecond)
	renew := ttl / time.Duration(2+rng.IntN(4))
	prio := 0
	if h.priorities {
		prio = rng.IntN(3)
	}
	c, err := h.store.NewClient(memlock.WithTTL(ttl), memlock.WithRenewInterval(renew), memlock.WithPriority(prio))
	if err != nil {
		return ChaosClient{}, err
	}
	mc := &memClient{c: c, locker: c.Locker(), semaphore: func(n int) (locks.Semaphore, error) { return c.Semaphore(n) }}
	if h.broken != nil && h.broken(ttl, prio) {
		wide, _ := c.Semaphore(100)
		mc.locker = lockerFunc{lock: wide.Acquire, tryLock: wide.TryAcquire}
	}
	recovery := ttl
	if h.claim != nil {
		recovery = h.claim(ttl)
	}
	return ChaosClient{
		Client:        mc,
		Options:       fmt.Sprintf("ttl=%v renew=%v priority=%d", ttl, renew, prio),
		CrashRecovery: recovery,
	}, nil
}

func memChaos(adjust func(h *memChaosHarness)) NewHarness {
	return func(ctx context.Context, t testing.TB) (Harness, error) {
		h, err := newMemHarness(ctx, t)
		if err != nil {
			return nil, err
		}
		ch := &memChaosHarness{memHarness: h.(*memHarness), minTTL: 100 * time.Millisecond, maxTTL: 400 * time.Millisecond}
		if adjust != nil {
			adjust(ch)
		}
		ch.caps.CrashRecovery = ch.maxTTL
		return ch, nil
	}
}

// TestChaosMixedMemlock runs memlock with clients of different TTLs,
// renewal intervals and priorities (a theft ends the victim's lease just
// before the thief's Lock returns): the run records each client's
// options, and finds nothing wrong.
func TestChaosMixedMemlock(t *testing.T) {
	s := RunChaos(t, memChaos(func(h *memChaosHarness) { h.priorities = true }), ChaosConfig{Duration: 2 * time.Second, FaultEvery: 100 * time.Millisecond})
	if s.Acquisitions == 0 || s.Faults[FaultCrash] == 0 {
		t.Errorf("the run did too little to mean anything: %v", s)
	}
	var distinct []string
	for _, o := range s.Clients {
		if o == "" {
			t.Errorf("a client of a ChaosHarness has no options in the summary: %v", s.Clients)
		}
		if !slices.Contains(distinct, o) {
			distinct = append(distinct, o)
		}
	}
	if len(distinct) < 2 {
		t.Errorf("the clients do not differ: %v", s.Clients)
	}
}

// TestChaosSeedReproduces shows that $CHAOS_SEED sets the seed, and that
// one seed gives the same options to the same clients and the same fault
// schedule.
func TestChaosSeedReproduces(t *testing.T) {
	t.Setenv(ChaosSeedEnv, "4242")
	mix := func(want uint64) ([]string, []time.Duration) {
		r := newChaosRun(t, memChaos(func(h *memChaosHarness) { h.priorities = true }), ChaosConfig{Duration: time.Second})
		defer r.close()
		if r.cfg.Seed != want {
			t.Errorf("seed %d, want %d from $%s", r.cfg.Seed, want, ChaosSeedEnv)
		}
		var opts []string
		for _, cl := range r.slots {
			opts = append(opts, cl.opts)
		}
		var gaps []time.Duration
		for range 5 {
			gaps = append(gaps, r.gap())
		}
		return opts, gaps
	}
	o1, g1 := mix(4242)
	o2, g2 := mix(4242)
	if !slices.Equal(o1, o2) || !slices.Equal(g1, g2) {
		t.Errorf("one seed, two runs: options %q and %q, fault gaps %v and %v", o1, o2, g1, g2)
	}
	t.Setenv(ChaosSeedEnv, "4243")
	if o3, _ := mix(4243); slices.Equal(o1, o3) {
		t.Errorf("two seeds gave the same options: %q", o1)
	}
}

// TestChaosCatchesBrokenBackends shows that each of the run's checks can
// fail: memlock broken on purpose must produce the violation named.
func TestChaosCatchesBrokenBackends(t *testing.T) {
	cases := []struct {
		name string
		nh   NewHarness
		want []string // each must be in one violation
	}{{
		name: "double grant",
		nh: brokenHarness(func(h *memHarness) {
			h.breakClient = func(_ *memHarness, c *memClient) {
				wide, _ := c.c.Semaphore(100)
				c.locker = lockerFunc{lock: wide.Acquire, tryLock: wide.TryAcquire}
			}
		}),
		want: []string{"critical sections overlap"},
	}, {
		name: "tokens repeat",
		nh: brokenHarness(func(h *memHarness) {
			h.breakClient = func(_ *memHarness, c *memClient) {
				c.locker = mapLeases(c.locker, func(l locks.Lease) locks.Lease {
					return &leaseOverride{Lease: l, token: func() uint64 { return 7 }}
				})
			}
		}),
		want: []string{"not linearizable"},
	}, {
		// Each holder's token is below the one before: the order of the
		// holders shows it, and names both.
		name: "tokens go down",
		nh: brokenHarness(func(h *memHarness) {
			h.breakClient = func(_ *memHarness, c *memClient) {
				c.locker = mapLeases(c.locker, func(l locks.Lease) locks.Lease {
					return &leaseOverride{Lease: l, token: func() uint64 { return 1<<32 - l.Token() }}
				})
			}
		}),
		want: []string{"holders had a token no greater than the holder before them", "with token"},
	}, {
		name: "crash recovery slower than stated",
		nh: brokenHarness(func(h *memHarness) {
			h.ttl = 500 * time.Millisecond
			h.caps.CrashRecovery = 100 * time.Millisecond
		}),
		want: []string{"after its holder"},
	}, {
		// Only the mix breaks it: clients of priority 2 grant to
		// themselves without looking. The violation names their options.
		name: "one option of the mix grants twice",
		nh: memChaos(func(h *memChaosHarness) {
			h.priorities = true
			h.broken = func(_ time.Duration, prio int) bool { return prio == 2 }
		}),
		want: []string{"critical sections overlap", "priority=2"},
	}, {
		// A client's stated crash bound is checked, as its own: the
		// violation names the crashed client's options.
		name: "a client recovers slower than its own bound",
		nh: memChaos(func(h *memChaosHarness) {
			h.minTTL, h.maxTTL = 600*time.Millisecond, 800*time.Millisecond
			h.claim = func(ttl time.Duration) time.Duration { return ttl / 10 }
		}),
		want: []string{"after its holder", "ttl="},
	}}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			// A one-second run under load may draw no fault that shows
			// the defect (no crash of a holder with a waiter behind it):
			// each run draws anew, and one of a few must catch it.
			var violations []string
			for run := 1; run <= catchRuns; run++ {
				r := newChaosRun(t, tc.nh, ChaosConfig{Duration: time.Second, FaultEvery: 100 * time.Millisecond, Names: 2})
				r.run()
				s := r.check()
				r.close()
				for _, v := range s.Violations {
					if containsAll(v, tc.want) {
						t.Logf("caught in run %d of at most %d: %.300s", run, catchRuns, v)
						return
					}
				}
				violations = s.Violations
			}
			t.Errorf("no violation mentioning %q in %d runs; the last run's: %q", tc.want, catchRuns, violations)
		})
	}
}

// catchRuns is how many chaos runs of a broken backend
// TestChaosCatchesBrokenBackends allows to catch its defect: one run
// alone missed a crash recovery slower than stated on a machine at load 15.
const catchRuns = 3

func containsAll(s string, subs []string) bool {
	for _, sub := range subs {
		if !strings.Contains(s, sub) {
			return false
		}
	}
	return true
}

// TestProxyDelayReplies: with DelayReplies, a request reaches the
// upstream at once and its reply comes back late; Restore delivers what
// is held at once. (The chaos runs use it for FaultLateReplies.)
func TestProxyDelayReplies(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	got := make(chan time.Time, 4)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		buf := make([]byte, 1)
		for {
			if _, err := c.Read(buf); err != nil {
				return
			}
			got <- time.Now()
			if _, err := c.Write(buf); err != nil {
				return
			}
		}
	}()
	p := testenv.NewProxy(t, ln.Addr().String())
	c, err := net.Dial("tcp", p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	roundTrip := func() (reached, replied time.Duration) {
		start := time.Now()
		if _, err := c.Write([]byte{1}); err != nil {
			t.Fatal(err)
		}
		at := <-got
		if _, err := c.Read(make([]byte, 1)); err != nil {
			t.Fatal(err)
		}
		return at.Sub(start), time.Since(start)
	}
	const d = 300 * time.Millisecond
	p.DelayReplies(d)
	reached, replied := roundTrip()
	if reached >= d || replied < d {
		t.Errorf("with replies delayed by %v: the request reached the upstream after %v, the reply came after %v", d, reached, replied)
	}
	p.DelayReplies(time.Hour)
	go func() {
		time.Sleep(100 * time.Millisecond)
		p.Restore()
	}()
	if _, replied := roundTrip(); replied > 10*time.Second {
		t.Errorf("Restore did not deliver the held reply: it came after %v", replied)
	}
}
