package redlockprio_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/latchkey-go/latchkey/contracttest/testenv"
	"github.com/latchkey-go/latchkey/locks"
	"github.com/latchkey-go/latchkey/redlockprio"
)

// TestAttack2LateGrantsPastCallTimeout: 3 masters; every Locker's replies
// from master 2 come 400ms late, past the 100ms call timeout ("A master
// that has not answered within the per-master call timeout [...] counts
// as failed for that step"), while its scripts run there at once: master
// 2 grants keys whose answers come after the step was decided. Four
// equal-priority Lockers (two with retrying clients, two with MaxRetries
// -1; TTL 2s) contend with Lock and TryLock for 3s. Checked: no overlap,
// tokens increasing in grant order, and then, with every Locker idle but
// open, no key of the name is left on any master 600ms after the last
// release ("their answers are seen to in the background (a grant deleted
// after a failed attempt [...])"; "Release [...] deletes its keys on every
// master where they are still its own") — not left to expire after the
// TTL, where a lower-priority key would block the name.
//
// Variant "priorities 0-3": the four Lockers have priorities 0 to 3, so
// late answers also report thefts the attempt learns of after its step.
func TestAttack2LateGrantsPastCallTimeout(t *testing.T) {
	for _, variant := range []string{"equal priorities", "priorities 0-3"} {
		t.Run(variant, func(t *testing.T) { lateGrants(t, variant == "priorities 0-3") })
	}
}

func lateGrants(t *testing.T, prios bool) {
	addrs := addrsOf(testenv.StartRedis(t, 3))
	name := uniqueName(t)
	clk := newAtkClock()
	const ttl = 2 * time.Second
	var ls []*atk2Locker
	for i := range 4 {
		p := 0
		if prios {
			p = i
		}
		a := newAtk2Locker(t, addrs, i%2 == 1, atkOpts(ttl, 0.01, p, redlockprio.WithCallTimeout(100*time.Millisecond))...)
		warm(t, a.l)
		a.proxies[2].DelayReplies(400 * time.Millisecond)
		ls = append(ls, a)
	}
	end := time.Now().Add(3 * time.Second)
	var wg sync.WaitGroup
	var mu sync.Mutex
	counts := map[string]int{}
	for i, a := range ls {
		wg.Go(func() {
			for k := 0; time.Now().Before(end); k++ {
				ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
				var l locks.Lease
				var err error
				if k%2 == 0 {
					l, err = a.l.TryLock(ctx, name)
				} else {
					l, err = a.l.Lock(ctx, name)
				}
				cancel()
				if err != nil {
					key := "other"
					var qe *redlockprio.QuorumError
					switch {
					case errors.Is(err, locks.ErrNotAcquired):
						key = "not acquired"
					case errors.As(err, &qe):
						key = "quorum"
					case errors.Is(err, context.DeadlineExceeded):
						key = "deadline"
					default:
						t.Logf("locker %d: %v", i, err)
					}
					mu.Lock()
					counts[key]++
					mu.Unlock()
					time.Sleep(3 * time.Millisecond)
					continue
				}
				s := clk.begin("L"+string(rune('0'+i)), l)
				stop := make(chan struct{})
				tm := time.AfterFunc(5*time.Millisecond, func() { close(stop) })
				clk.workWhileLive(s, l, stop)
				tm.Stop()
				clk.end(s, l)
				_ = l.Release(context.Background())
				mu.Lock()
				counts["granted"]++
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	lastRelease := clk.now()
	t.Logf("outcomes: %v", counts)
	if clk.check(t) > 0 {
		clk.dump(t)
	}
	time.Sleep(600 * time.Millisecond)
	for i, a := range addrs {
		if left := slotKeys(t, a, name, 1); len(left) > 0 {
			t.Errorf("master %d still has %v %v after the last release (PTTL %v)", i, left, ms(clk.now()-lastRelease), maxPTTL(t, []string{a}, name))
		}
	}
	// A fresh Locker must get the name at once.
	c := mustClient(t, addrs, atkOpts(ttl, 0.01, 0)...)
	start := time.Now()
	l, err := c.l.TryLock(ctxFor(t, 5*time.Second), name)
	if err != nil {
		t.Errorf("TryLock by a fresh Locker %v after every Locker let go: %v", time.Since(start), err)
	} else {
		_ = l.Release(context.Background())
	}
}
