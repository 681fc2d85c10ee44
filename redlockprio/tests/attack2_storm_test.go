package redlockprio_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/latchkey-go/latchkey/contracttest/testenv"
	"github.com/latchkey-go/latchkey/locks"
	"github.com/latchkey-go/latchkey/redlockprio"
)

// atk2Worker describes one contender of the storms.
type atk2Worker struct {
	name      string
	prio      int
	ttl       time.Duration
	retries   bool // go-redis default MaxRetries
	immediate bool // WithImmediateAck
	slow2     time.Duration
	delay2    bool // slow2 is DelayReplies (past the call timeout), else Latency
}

// TestAttack2FencingStormSlowWriteBack: 3 masters, five Lockers of
// priorities 0–3, TTLs 600ms–1s, some with go-redis's retrying clients and
// some with MaxRetries -1, some WithImmediateAck (their work stops the
// moment the context ends, as that option requires). Each Locker's link
// to master 2 is slow: 25ms each way (token write-backs and raises land
// late, under the call timeout) or replies delayed 300ms (past the 200ms
// call timeout: late grants). Every 150ms one master's fence counter is
// raised by 1000, so the token comes from one master and must be written
// back to the others ("When fewer than a quorum did [...] a second step
// raises the other masters' counters to T"). Thefts race those
// write-backs all the time. Checked on one clock: no holder writes (while
// its lease context is live) after a later holder was granted, and
// "Lease.Token is strictly greater for every later holder of a name".
// Variant "m2 refusing after first contact": every Locker's link to
// master 2 refuses connections from 0.5s to 2s (retrying clients then see
// unknown errors, the others refused dials).
// Variant "m1 restarted empty": master 1 is killed and restarted empty
// once, mid-run (a single master: inside the documented limits, since no
// holder crashes).
func TestAttack2FencingStormSlowWriteBack(t *testing.T) {
	for _, variant := range []string{"no restart", "m1 restarted empty", "m2 refusing after first contact"} {
		t.Run(variant, func(t *testing.T) {
			servers := testenv.StartRedis(t, 3)
			addrs := addrsOf(servers)
			workers := []atk2Worker{
				{"w0p0", 0, 600 * time.Millisecond, false, false, 25 * time.Millisecond, false},
				{"w1p0r", 0, time.Second, true, false, 300 * time.Millisecond, true},
				{"w2p1ri", 1, 600 * time.Millisecond, true, true, 25 * time.Millisecond, false},
				{"w3p2", 2, 800 * time.Millisecond, false, false, 300 * time.Millisecond, true},
				{"w4p3ri", 3, 600 * time.Millisecond, true, true, 25 * time.Millisecond, false},
			}
			name := uniqueName(t)
			clk := newAtkClock()
			var lockers []*atk2Locker
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
				lockers = append(lockers, a)
			}
			setFence(t, addrs[0], name, 500)
			runFor := 2500 * time.Millisecond
			end := time.Now().Add(runFor)
			var wg sync.WaitGroup
			var mu sync.Mutex
			errCount := map[string]int{}
			grants := map[string]int{}
			for i, w := range workers {
				wg.Go(func() {
					r := rand.New(rand.NewPCG(uint64(i), 7))
					for time.Now().Before(end) {
						ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
						l, err := lockers[i].l.Lock(ctx, name)
						cancel()
						if err != nil {
							mu.Lock()
							errCount[fmt.Sprintf("%s: %T %v", w.name, err, shortErr(err))]++
							mu.Unlock()
							time.Sleep(5 * time.Millisecond)
							continue
						}
						s := clk.begin(w.name, l)
						stop := make(chan struct{})
						tm := time.AfterFunc(time.Duration(3+r.IntN(20))*time.Millisecond, func() { close(stop) })
						clk.workWhileLive(s, l, stop)
						tm.Stop()
						clk.end(s, l)
						preempted := errors.Is(context.Cause(l.Context()), locks.ErrPreempted)
						_ = l.Release(context.Background())
						mu.Lock()
						if preempted {
							grants["preempted"]++
						}
						grants[w.name]++
						mu.Unlock()
						time.Sleep(time.Duration(r.IntN(8)) * time.Millisecond)
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
			if variant == "m1 restarted empty" {
				time.Sleep(1000 * time.Millisecond)
				if err := servers[1].Restart(); err != nil {
					t.Fatal(err)
				}
				t.Logf("master 1 restarted empty at %v", ms(clk.now()))
			}
			if variant == "m2 refusing after first contact" {
				time.Sleep(500 * time.Millisecond)
				for _, a := range lockers {
					a.proxies[2].Cut()
				}
				t.Logf("master 2 refusing from %v", ms(clk.now()))
				time.Sleep(1500 * time.Millisecond)
				for i, a := range lockers {
					a.proxies[2].Restore()
					if workers[i].delay2 { // the slow link again
						a.proxies[2].DelayReplies(workers[i].slow2)
					} else {
						a.proxies[2].Latency(workers[i].slow2)
					}
				}
				t.Logf("master 2 back at %v", ms(clk.now()))
			}
			wg.Wait()
			close(stopBump)
			<-bumped
			t.Logf("grants: %v", grants)
			t.Logf("errors: %v", errCount)
			if n := clk.check(t); n > 0 {
				clk.dump(t)
			}
			if c, at := clk.maxConcurrent(); c > 1 {
				t.Logf("max concurrent sections %d at %v", c, ms(at))
			}
		})
	}
}

func shortErr(err error) string {
	var qe *redlockprio.QuorumError
	if errors.As(err, &qe) {
		return fmt.Sprintf("quorum %d/%d", qe.Got, qe.Need)
	}
	return err.Error()
}
