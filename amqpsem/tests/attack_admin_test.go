package amqpsem_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/latchkey-go/latchkey/locks"

	"github.com/latchkey-go/latchkey/amqpsem"
)

// TestAttackConcurrentRelativeResize: two library administrators and the
// command change one semaphore by relative amounts at once. Changes are
// "serialised at the broker by its mutex, across clients": the result must
// be the initial size plus every change, with no slot queue left above it.
func TestAttackConcurrentRelativeResize(t *testing.T) {
	url, _ := amqpURL(t)
	name := atkName("relres")
	atkCleanup(t, url, name)
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Second)
	defer cancel()
	a1 := atkAdmin(t, atkDial(t, url, ""))
	a2 := atkAdmin(t, atkDial(t, url, ""), amqpsem.WithAscendingDelete(true))
	if err := a1.Create(ctx, name, 20); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	total := 20
	var errs []error
	note := func(d int, err error) {
		mu.Lock()
		defer mu.Unlock()
		if err != nil {
			errs = append(errs, err)
			return
		}
		total += d
	}
	for i := range 6 {
		wg.Go(func() {
			_, err := a1.Add(ctx, name, 3)
			note(3, err)
		})
		wg.Go(func() {
			_, err := a2.Remove(ctx, name, 2)
			note(-2, err)
		})
		if i%2 == 0 {
			wg.Go(func() {
				out, code := atkRun(t, 30*time.Second, []string{"AMQPSEM_URL=" + url}, "resize", name, "-1")
				if code != 0 {
					note(0, fmt.Errorf("command: %d %s", code, out))
				} else {
					note(-1, nil)
				}
			})
		}
	}
	wg.Wait()
	if len(errs) > 0 {
		t.Fatalf("changes failed: %v", errs)
	}
	got, err := a1.Max(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	if got != total {
		t.Errorf("after concurrent relative changes Max = %d, want %d", got, total)
	}
	raw := atkRaw(t, url)
	for i := got + 1; i <= got+25; i++ {
		if st := raw.state(fmt.Sprintf("%s-%d-A", name, i)); st != "absent" {
			t.Errorf("slot queue %d above the maximum %d is %s", i, got, st)
		}
	}
}

// TestAttackRemoveRaceAcquire: clients acquire and release a semaphore while
// an administrator removes most of its slots and waits. When WaitReleased
// returns nil, no live lease may hold a slot above the maximum; no two
// leases may ever hold one slot at once.
func TestAttackRemoveRaceAcquire(t *testing.T) {
	url, _ := amqpURL(t)
	name := atkName("rmrace")
	atkCleanup(t, url, name)
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	admin := atkAdmin(t, atkDial(t, url, ""))
	if err := admin.Create(ctx, name, 8); err != nil {
		t.Fatal(err)
	}
	type span struct {
		slot       int
		start, end time.Time
		lost       error
	}
	var (
		mu    sync.Mutex
		live  = map[*amqpsem.Lease]bool{}
		spans []span
	)
	base := time.Now() // monotonic clock
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for w := range 6 {
		c := atkDial(t, url, "")
		s, _ := c.Semaphore(amqpsem.MaxSemaphoreSize)
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				l, err := s.TryAcquire(ctx, name)
				if err != nil {
					time.Sleep(time.Duration(5+rand.IntN(20)) * time.Millisecond)
					continue
				}
				start := time.Now()
				lease := l.(*amqpsem.Lease)
				lostAt := make(chan time.Time, 1)
				context.AfterFunc(l.Context(), func() { lostAt <- time.Now() })
				mu.Lock()
				live[lease] = true
				mu.Unlock()
				time.Sleep(time.Duration(10+rand.IntN(300)) * time.Millisecond)
				end := time.Now()
				mu.Lock()
				delete(live, lease)
				mu.Unlock()
				l.Release(ctx)
				var lost error
				select {
				case at := <-lostAt:
					if at.Before(end) {
						end = at
						lost = context.Cause(l.Context())
					}
				case <-time.After(time.Second):
				}
				mu.Lock()
				spans = append(spans, span{lease.Slot(), start, end, lost})
				mu.Unlock()
				_ = w
			}
		})
	}
	for round := range 1 {
		time.Sleep(600 * time.Millisecond)
		if _, err := admin.Remove(ctx, name, 6); err != nil {
			t.Fatal(err)
		}
		// A generous bound: a wait that found a holder returns only after
		// a second check of every slot number, each 4–5 s under -race.
		wctx, wcancel := context.WithTimeout(ctx, 30*time.Second)
		err := admin.WaitReleased(wctx, name)
		wcancel()
		c, _ := admin.Max(ctx, name)
		mu.Lock()
		for l := range live {
			if l.Slot() > c && l.Context().Err() == nil {
				t.Errorf("round %d: WaitReleased returned %v while a live lease holds removed slot %d (max %d)", round, err, l.Slot(), c)
			}
		}
		mu.Unlock()
		if err != nil {
			t.Errorf("round %d: WaitReleased: %v", round, err)
		}
		if _, err := admin.Resize(ctx, name, 8); err != nil {
			t.Fatal(err)
		}
	}
	close(stop)
	wg.Wait()
	mu.Lock()
	defer mu.Unlock()
	sort.Slice(spans, func(i, j int) bool { return spans[i].start.Before(spans[j].start) })
	byslot := map[int][]span{}
	for _, s := range spans {
		byslot[s.slot] = append(byslot[s.slot], s)
	}
	lostN := 0
	for slot, ss := range byslot {
		for i := 1; i < len(ss); i++ {
			for j := 0; j < i; j++ {
				if ss[i].start.Before(ss[j].end) {
					t.Errorf("slot %d held twice: [%v, %v] (lost %v) and [%v, %v]", slot,
						ss[j].start.Sub(base), ss[j].end.Sub(base), ss[j].lost, ss[i].start.Sub(base), ss[i].end.Sub(base))
				}
			}
		}
		for _, s := range ss {
			if s.lost != nil {
				lostN++
			}
		}
	}
	t.Logf("%d critical sections, %d ended by the lease ending first", len(spans), lostN)
	var _ locks.Lease
}
