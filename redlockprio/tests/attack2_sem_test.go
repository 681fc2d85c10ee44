package redlockprio_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/latchkey-go/latchkey/contracttest/testenv"
	"github.com/latchkey-go/latchkey/locks"
	"github.com/latchkey-go/latchkey/redlockprio"
)

// TestAttack2SemaphoreFencingPerSlot: a semaphore of 2 slots on 3
// masters, five Lockers (priorities 0, 0, 1, 2, 3; TTLs 600ms–1s; two with
// retrying clients; two WithImmediateAck), whose links to master 2 are
// slow (25ms each way, or replies 300ms late, past the call timeout), while
// the name's fence counter on one master is raised by 1000 every 150ms. The
// docs: a Semaphore has "the same guarantees as a lock: [...] fencing tokens
// per name", and "Lease.Token is strictly greater for every later holder of
// a name". Checked: per slot, no overlap and tokens increasing in grant
// order; at most 2 sections at once; and for any two leases where the
// second's Acquire was called after the first's returned, a greater token.
func TestAttack2SemaphoreFencingPerSlot(t *testing.T) {
	addrs := addrsOf(testenv.StartRedis(t, 3))
	name := uniqueName(t)
	workers := []atk2Worker{
		{"s0p0", 0, 600 * time.Millisecond, false, false, 25 * time.Millisecond, false},
		{"s1p0r", 0, time.Second, true, false, 300 * time.Millisecond, true},
		{"s2p1ri", 1, 600 * time.Millisecond, true, true, 25 * time.Millisecond, false},
		{"s3p2", 2, 800 * time.Millisecond, false, false, 300 * time.Millisecond, true},
		{"s4p3i", 3, 600 * time.Millisecond, false, true, 25 * time.Millisecond, false},
	}
	global := newAtkClock()
	slots := map[int]*atkClock{1: {base: global.base}, 2: {base: global.base}}
	type rec struct {
		who           string
		called, gotAt time.Duration
		token         uint64
		slot          int
	}
	var mu sync.Mutex
	var recs []rec
	var sems []*redlockprio.Semaphore
	for _, w := range workers {
		var more []redlockprio.Option
		if w.immediate {
			more = append(more, redlockprio.WithImmediateAck())
		}
		a := newAtk2Locker(t, addrs, w.retries, atkOpts(w.ttl, 0.01, w.prio, more...)...)
		warm(t, a.l)
		if w.delay2 {
			a.proxies[2].DelayReplies(w.slow2)
		} else {
			a.proxies[2].Latency(w.slow2)
		}
		s, err := a.c.Semaphore(2)
		if err != nil {
			t.Fatal(err)
		}
		sems = append(sems, s)
	}
	setFence(t, addrs[0], name, 500)
	end := time.Now().Add(5 * time.Second)
	var wg sync.WaitGroup
	errs := map[string]int{}
	for i, w := range workers {
		wg.Go(func() {
			r := rand.New(rand.NewPCG(uint64(i), 9))
			for time.Now().Before(end) {
				ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
				called := global.now()
				l, err := sems[i].Acquire(ctx, name)
				cancel()
				if err != nil {
					mu.Lock()
					errs[fmt.Sprintf("%s: %v", w.name, shortErr(err))]++
					mu.Unlock()
					time.Sleep(5 * time.Millisecond)
					continue
				}
				slot := l.(locks.SlotLease).Slot()
				s := slots[slot].begin(w.name, l)
				g := global.begin(w.name, l)
				mu.Lock()
				recs = append(recs, rec{w.name, called, s.granted, l.Token(), slot})
				mu.Unlock()
				stop := make(chan struct{})
				tm := time.AfterFunc(time.Duration(3+r.IntN(20))*time.Millisecond, func() { close(stop) })
				for {
					now := global.now()
					if l.Context().Err() != nil {
						break
					}
					select {
					case <-stop:
					default:
						slots[slot].write(s, now)
						global.write(g, now)
						time.Sleep(time.Millisecond)
						continue
					}
					break
				}
				tm.Stop()
				slots[slot].end(s, l)
				global.end(g, l)
				_ = l.Release(context.Background())
				time.Sleep(time.Duration(r.IntN(6)) * time.Millisecond)
			}
		})
	}
	stopBump := make(chan struct{})
	bumped := make(chan struct{})
	go func() {
		defer close(bumped)
		tk := time.NewTicker(150 * time.Millisecond)
		defer tk.Stop()
		for k := 1; ; k++ {
			select {
			case <-stopBump:
				return
			case <-tk.C:
				bumpFence(addrs[k%3], name, 1000)
			}
		}
	}()
	wg.Wait()
	close(stopBump)
	<-bumped
	t.Logf("%d grants; errors %v", len(recs), errs)
	for n, c := range slots {
		if c.check(t) > 0 {
			t.Logf("slot %d:", n)
			c.dump(t)
		}
	}
	if c, at := global.maxConcurrent(); c > 2 {
		t.Errorf("%d sections at once at %v on a semaphore of 2", c, ms(at))
	}
	sort.Slice(recs, func(i, j int) bool { return recs[i].gotAt < recs[j].gotAt })
	bad := 0
	for i, a := range recs {
		for _, b := range recs[i+1:] {
			if b.called > a.gotAt && b.token <= a.token {
				bad++
				if bad <= 10 {
					t.Errorf("TOKEN: %s (slot %d) called Acquire at %v, after %s's (slot %d, token %d) returned at %v, and got token %d",
						b.who, b.slot, ms(b.called), a.who, a.slot, a.token, ms(a.gotAt), b.token)
				}
			}
		}
	}
}
