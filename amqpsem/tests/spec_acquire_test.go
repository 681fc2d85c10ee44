package amqpsem_test

import (
	"context"
	"errors"
	"net"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/latchkey-go/latchkey/contracttest/testenv"
	"github.com/latchkey-go/latchkey/locks"

	"github.com/latchkey-go/latchkey/amqpsem"
)

func TestAcquireScansAndVerifies(t *testing.T) {
	u, _ := amqpURL(t)
	name := uniqueName(t, u)
	ctx := tctx(t)
	c := dial(t, u)
	if err := admin(t, c).Create(ctx, name, 3); err != nil {
		t.Fatal(err)
	}
	r := rawConn(t, u)
	s := semaphore(t, c, amqpsem.MaxSemaphoreSize)
	var leases []*amqpsem.Lease
	for want := 1; want <= 3; want++ {
		l, err := s.TryAcquire(ctx, name)
		if err != nil {
			t.Fatalf("TryAcquire #%d: %v", want, err)
		}
		lease := l.(*amqpsem.Lease)
		if lease.Slot() != want || lease.Queue() != amqpsem.DefaultLayout.Holder(name, want) {
			t.Errorf("lease #%d: slot %d queue %q", want, lease.Slot(), lease.Queue())
		}
		if err := r.declare(lease.Queue(), false, true, maxLen0); codeOf(err) != amqp.ResourceLocked {
			t.Errorf("declaring the held %q from another connection: %v, want RESOURCE_LOCKED", lease.Queue(), err)
		}
		if err := lease.Verify(ctx); err != nil {
			t.Errorf("Verify of a held slot: %v", err)
		}
		leases = append(leases, lease)
	}
	_, err := s.TryAcquire(ctx, name)
	if !errors.Is(err, locks.ErrNotAcquired) || !errors.Is(err, amqpsem.ErrAllHeld) {
		t.Fatalf("TryAcquire with all held = %v, want ErrNotAcquired and ErrAllHeld", err)
	}
	if err := leases[1].Release(ctx); err != nil {
		t.Fatal(err)
	}
	if r.exists(leases[1].Queue()) {
		t.Errorf("Release left %q", leases[1].Queue())
	}
	l, err := s.TryAcquire(ctx, name)
	if err != nil || l.(*amqpsem.Lease).Slot() != 2 {
		t.Fatalf("TryAcquire after releasing slot 2 = %v, %v; want slot 2", l, err)
	}
	_, err = s.TryAcquire(ctx, uniqueName(t, u))
	if !errors.Is(err, amqpsem.ErrNoSlots) {
		t.Errorf("TryAcquire of a semaphore without slots = %v, want ErrNoSlots", err)
	}
}

// The periodic verification ends a removed slot's lease by itself.
func TestPeriodicVerify(t *testing.T) {
	u, _ := amqpURL(t)
	name := uniqueName(t, u)
	ctx := tctx(t)
	a := admin(t, dial(t, u))
	if err := a.Create(ctx, name, 1); err != nil {
		t.Fatal(err)
	}
	l, err := semaphore(t, dial(t, u), amqpsem.MaxSemaphoreSize).TryAcquire(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := a.Destroy(ctx, name); err != nil {
		t.Fatal(err)
	}
	select {
	case <-l.Context().Done():
	case <-time.After(10 * testVerify):
		t.Fatalf("lease still live %v after its slot was removed", 10*testVerify)
	}
	if cause := context.Cause(l.Context()); !errors.Is(cause, amqpsem.ErrSlotRemoved) {
		t.Fatalf("cause = %v, want ErrSlotRemoved", cause)
	}
	if err := a.WaitReleased(ctx, name); err != nil {
		t.Fatal(err)
	}
}

// Many clients racing for few slots: the losers of each declare get
// RESOURCE_LOCKED, reopen their channel and scan again; in the end every
// slot is held exactly once and every client has its answer.
func TestResourceLockedRace(t *testing.T) {
	u, _ := amqpURL(t)
	name := uniqueName(t, u)
	ctx := tctx(t)
	const slots, clients = 3, 8
	if err := admin(t, dial(t, u)).Create(ctx, name, slots); err != nil {
		t.Fatal(err)
	}
	sems := make([]*amqpsem.Semaphore, clients)
	for i := range sems {
		sems[i] = semaphore(t, dial(t, u, amqpsem.WithSkew(0), amqpsem.WithMaxAttempts(slots+1)), amqpsem.MaxSemaphoreSize)
	}
	for round := range 3 {
		var (
			wg     sync.WaitGroup
			mu     sync.Mutex
			held   = map[int]int{}
			leases []locks.Lease
			start  = make(chan struct{})
		)
		for _, s := range sems {
			wg.Go(func() {
				<-start
				l, err := s.TryAcquire(ctx, name)
				mu.Lock()
				defer mu.Unlock()
				switch {
				case err == nil:
					held[l.(*amqpsem.Lease).Slot()]++
					leases = append(leases, l)
				case !errors.Is(err, locks.ErrNotAcquired):
					t.Errorf("round %d: TryAcquire: %v", round, err)
				}
			})
		}
		close(start)
		wg.Wait()
		if len(held) != slots || len(leases) != slots {
			t.Fatalf("round %d: slots held %v by %d leases; want each of %d slots once", round, held, len(leases), slots)
		}
		for slot, n := range held {
			if n != 1 {
				t.Fatalf("round %d: slot %d held %d times", round, slot, n)
			}
		}
		for _, l := range leases {
			if err := l.Release(ctx); err != nil {
				t.Fatal(err)
			}
		}
	}
}

// A client whose connection is cut by a fault proxy loses its slot at
// once on both sides, and another client gets it.
func TestProxyCut(t *testing.T) {
	u, host := amqpURL(t)
	name := uniqueName(t, u)
	ctx := tctx(t)
	if err := admin(t, dial(t, u)).Create(ctx, name, 1); err != nil {
		t.Fatal(err)
	}
	p := testenv.NewProxy(t, host)
	viaProxy := amqpsem.WithDial(func(ctx context.Context, network, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, network, p.Addr())
	})
	holder := semaphore(t, dial(t, u, viaProxy), amqpsem.MaxSemaphoreSize)
	l, err := holder.TryAcquire(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	other := semaphore(t, dial(t, u), amqpsem.MaxSemaphoreSize)
	if _, err := other.TryAcquire(ctx, name); !errors.Is(err, locks.ErrNotAcquired) {
		t.Fatalf("TryAcquire of the held slot = %v", err)
	}
	p.Cut()
	wctx, cancel := context.WithTimeout(ctx, 3*testHeartbeat)
	defer cancel()
	got, err := other.Acquire(wctx, name)
	if err != nil {
		t.Fatalf("Acquire after the holder was cut off: %v", err)
	}
	defer got.Release(ctx)
	select {
	case <-l.Context().Done():
	case <-time.After(2 * testHeartbeat):
		t.Fatal("the cut-off holder's lease is still live")
	}
	if cause := context.Cause(l.Context()); !errors.Is(cause, locks.ErrLost) {
		t.Fatalf("cut-off holder's cause = %v", cause)
	}
}
