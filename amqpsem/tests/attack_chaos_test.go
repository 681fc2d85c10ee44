package amqpsem_test

import (
	"context"
	"math/rand/v2"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/latchkey-go/latchkey/contracttest/testenv"

	"github.com/latchkey-go/latchkey/amqpsem"
)

// TestAttackChaosNeverMoreThanN: six reconnecting clients, each behind a
// fault proxy that is black-holed and restored at random, contend for a
// 2-slot semaphore. Every critical section (from Acquire's return to the
// first of Release's call and the lease's end) is recorded on one monotonic
// clock: never more than 2 at once, never two on one slot.
func TestAttackChaosNeverMoreThanN(t *testing.T) {
	url, host := amqpURL(t)
	name := atkName("chaos")
	atkCleanup(t, url, name)
	const slots = 2
	ctx, cancel := context.WithTimeout(context.Background(), 40*time.Second)
	defer cancel()
	if err := atkAdmin(t, atkDial(t, url, "")).Create(ctx, name, slots); err != nil {
		t.Fatal(err)
	}
	type span struct {
		slot       int
		start, end time.Time
	}
	var (
		mu    sync.Mutex
		spans []span
	)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var proxies []*testenv.Proxy
	for range 6 {
		p := testenv.NewProxy(t, host)
		proxies = append(proxies, p)
		c := atkDial(t, url, p.Addr(), atkReconnect)
		s, _ := c.Semaphore(amqpsem.MaxSemaphoreSize)
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				actx, acancel := context.WithTimeout(ctx, 2*time.Second)
				l, err := s.Acquire(actx, name)
				acancel()
				if err != nil {
					time.Sleep(20 * time.Millisecond)
					continue
				}
				start := time.Now()
				var endMu sync.Mutex
				end := time.Time{}
				setEnd := func(at time.Time) {
					endMu.Lock()
					if end.IsZero() || at.Before(end) {
						end = at
					}
					endMu.Unlock()
				}
				stopAF := context.AfterFunc(l.Context(), func() { setEnd(time.Now()) })
				select {
				case <-time.After(time.Duration(20+rand.IntN(150)) * time.Millisecond):
				case <-l.Context().Done():
				}
				setEnd(time.Now())
				stopAF()
				rctx, rcancel := context.WithTimeout(ctx, 3*time.Second)
				l.Release(rctx)
				rcancel()
				endMu.Lock()
				mu.Lock()
				spans = append(spans, span{l.(*amqpsem.Lease).Slot(), start, end})
				mu.Unlock()
				endMu.Unlock()
			}
		})
	}
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		p := proxies[rand.IntN(len(proxies))]
		p.BlackHole()
		time.Sleep(time.Duration(500+rand.IntN(3000)) * time.Millisecond)
		p.Restore()
		time.Sleep(time.Duration(100+rand.IntN(500)) * time.Millisecond)
	}
	close(stop)
	wg.Wait()
	mu.Lock()
	defer mu.Unlock()
	type ev struct {
		at    time.Time
		delta int
	}
	var evs []ev
	byslot := map[int][]span{}
	for _, s := range spans {
		evs = append(evs, ev{s.start, 1}, ev{s.end, -1})
		byslot[s.slot] = append(byslot[s.slot], s)
	}
	sort.Slice(evs, func(i, j int) bool {
		if evs[i].at.Equal(evs[j].at) {
			return evs[i].delta < evs[j].delta
		}
		return evs[i].at.Before(evs[j].at)
	})
	n, most := 0, 0
	for _, e := range evs {
		n += e.delta
		most = max(most, n)
	}
	if most > slots {
		t.Errorf("%d critical sections at once on a %d-slot semaphore", most, slots)
	}
	for slot, ss := range byslot {
		sort.Slice(ss, func(i, j int) bool { return ss[i].start.Before(ss[j].start) })
		for i := 1; i < len(ss); i++ {
			if ss[i].start.Before(ss[i-1].end) {
				t.Errorf("slot %d held twice: %v overlaps %v", slot, ss[i].start.Sub(ss[i-1].start), ss[i-1].end.Sub(ss[i-1].start))
			}
		}
	}
	t.Logf("%d critical sections, at most %d at once", len(spans), most)
}
