package redlockprio_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/latchkey-go/latchkey/contracttest/testenv"
	"github.com/latchkey-go/latchkey/redlockprio"
)

// TestAttack2SameLockerConcurrentLocks: "Lock is safe for concurrent use",
// "Each lease still gets its own id [...] so that two leases never pass for
// one another". Four goroutines share one Locker (priority 0, retrying
// clients) and loop Lock/work/Release on one name, with a second Locker
// (priority 1, MaxRetries -1, WithImmediateAck) stealing now and then;
// both Lockers' links to master 2 add 20ms each way, and the name's fence
// counter on one master is raised by 1000 every 150ms. 3s. Checked: no
// overlap, tokens increasing in grant order.
func TestAttack2SameLockerConcurrentLocks(t *testing.T) {
	addrs := addrsOf(testenv.StartRedis(t, 3))
	name := uniqueName(t)
	clk := newAtkClock()
	shared := newAtk2Locker(t, addrs, true, atkOpts(600*time.Millisecond, 0.01, 0)...)
	hi := newAtk2Locker(t, addrs, false, atkOpts(600*time.Millisecond, 0.01, 1, redlockprio.WithImmediateAck())...)
	warm(t, shared.l)
	warm(t, hi.l)
	shared.proxies[2].Latency(20 * time.Millisecond)
	hi.proxies[2].Latency(20 * time.Millisecond)
	setFence(t, addrs[0], name, 500)
	end := time.Now().Add(3 * time.Second)
	var wg sync.WaitGroup
	var mu sync.Mutex
	errs := map[string]int{}
	n := 0
	run := func(who string, l *redlockprio.Locker, work, pause time.Duration) {
		for time.Now().Before(end) {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			lease, err := l.Lock(ctx, name)
			cancel()
			if err != nil {
				mu.Lock()
				errs[fmt.Sprintf("%s: %v", who, shortErr(err))]++
				mu.Unlock()
				continue
			}
			s := clk.begin(who, lease)
			stop := make(chan struct{})
			tm := time.AfterFunc(work, func() { close(stop) })
			clk.workWhileLive(s, lease, stop)
			tm.Stop()
			clk.end(s, lease)
			_ = lease.Release(context.Background())
			mu.Lock()
			n++
			mu.Unlock()
			time.Sleep(pause)
		}
	}
	for i := range 4 {
		wg.Go(func() { run(fmt.Sprintf("g%d", i), shared.l, 5*time.Millisecond, time.Millisecond) })
	}
	wg.Go(func() { run("hi", hi.l, 3*time.Millisecond, 60*time.Millisecond) })
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
	t.Logf("%d grants; errors %v", n, errs)
	if clk.check(t) > 0 {
		clk.dump(t)
	}
}
