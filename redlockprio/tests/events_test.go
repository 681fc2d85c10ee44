package redlockprio_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/latchkey-go/latchkey/contracttest/testenv"
	"github.com/latchkey-go/latchkey/locks"
	"github.com/latchkey-go/latchkey/locks/driver"
	"github.com/latchkey-go/latchkey/redlockprio"
)

// events records what an Observable reports.
type events struct {
	mu  sync.Mutex
	evs []driver.Event
}

func observe(t testing.TB, o driver.Observable) *events {
	e := &events{}
	stop := o.Observe(func(ev driver.Event) {
		e.mu.Lock()
		e.evs = append(e.evs, ev)
		e.mu.Unlock()
	})
	t.Cleanup(stop)
	return e
}

func (e *events) of(kind driver.EventKind) []driver.Event {
	e.mu.Lock()
	defer e.mu.Unlock()
	var out []driver.Event
	for _, ev := range e.evs {
		if ev.Kind == kind {
			out = append(out, ev)
		}
	}
	return out
}

// TestEventsQuorumTheftAckWait: a step that reaches fewer than a quorum
// reports one EventQuorumError per failing master, naming its address;
// a theft reports EventTheft, and the thief's wait for the victim's
// acknowledgement EventAckWait with its duration; the Locker and a
// Semaphore report the Client's events.
func TestEventsQuorumTheftAckWait(t *testing.T) {
	addrs := addrsOf(testenv.StartRedis(t, 1))
	dead1, dead2 := deadAddr(t), deadAddr(t)
	ctx := ctxFor(t, 10*time.Second)

	broken := mustClient(t, []string{addrs[0], dead1, dead2})
	sem, err := broken.c.Semaphore(2)
	if err != nil {
		t.Fatal(err)
	}
	evs, semEvs := observe(t, broken.l), observe(t, sem)
	name := uniqueName(t)
	var qe *redlockprio.QuorumError
	if _, err := broken.l.TryLock(ctx, name); !errors.As(err, &qe) {
		t.Fatalf("TryLock with 2 of 3 masters down = %v, want a *QuorumError", err)
	}
	var masters []string
	for _, ev := range evs.of(driver.EventQuorumError) {
		if ev.Name != name || ev.Backend != "redlockprio" || ev.Err == nil {
			t.Errorf("quorum event %+v: want name %q, backend redlockprio and an error", ev, name)
		}
		masters = append(masters, ev.Master)
	}
	slices.Sort(masters)
	want := []string{dead1, dead2}
	slices.Sort(want)
	if !slices.Equal(masters, want) {
		t.Errorf("quorum events name masters %q, want one per failing master %q", masters, want)
	}
	if n := len(semEvs.of(driver.EventQuorumError)); n != len(masters) {
		t.Errorf("the Semaphore saw %d quorum events, the Locker %d: both observe the Client", n, len(masters))
	}

	low := mustClient(t, addrs, withPriority(1))
	high := mustClient(t, addrs, withPriority(2))
	highEvs := observe(t, high.l)
	victim, err := low.l.TryLock(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	const hold = 100 * time.Millisecond
	go func() {
		<-victim.Context().Done()
		time.Sleep(hold) // the victim's code lets go a little later
		_ = victim.Release(context.Background())
	}()
	thief, err := high.l.TryLock(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	defer thief.Release(ctx)
	thefts := highEvs.of(driver.EventTheft)
	if len(thefts) != 1 || thefts[0].Name != name || thefts[0].Token != thief.Token() {
		t.Errorf("theft events %+v, want one for %q with token %d", thefts, name, thief.Token())
	}
	var waits []driver.Event
	for start := time.Now(); len(waits) == 0 && time.Since(start) < time.Second; time.Sleep(5 * time.Millisecond) {
		waits = highEvs.of(driver.EventAckWait) // reported as the wait ends, just before TryLock returns
	}
	if len(waits) != 1 || waits[0].Name != name || waits[0].Duration < hold/2 {
		t.Errorf("ack-wait events %+v, want one for %q lasting about %v", waits, name, hold)
	}
}

// TestErrorShape: errors have the one shape of driver.Errorf, the name
// once; a closed Client's calls fail with ErrClosed; New accepts a
// []*redis.Client as it is.
func TestErrorShape(t *testing.T) {
	addrs := addrsOf(testenv.StartRedis(t, 1))
	rc := newRedis(addrs[0])
	defer rc.Close()
	c, err := redlockprio.New([]*redis.Client{rc}, redlockprio.WithTTL(testTTL), redlockprio.WithRenewInterval(testRenew))
	if err != nil {
		t.Fatal(err)
	}
	ctx := ctxFor(t, 10*time.Second)
	name := uniqueName(t)
	held, err := c.Locker().TryLock(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	if s := held.(locks.SlotLease).Slot(); s != 0 {
		t.Errorf("a Locker's lease has slot %d, want 0", s)
	}
	short, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancel()
	_, err = c.Locker().Lock(short, name)
	if want := fmt.Sprintf("redlockprio: lock %q: ", name); !errors.Is(err, context.DeadlineExceeded) || err.Error()[:min(len(want), len(err.Error()))] != want {
		t.Errorf("Lock past its deadline = %v, want %q… matching DeadlineExceeded", err, want)
	}
	_, err = c.Locker().TryLock(ctx, name)
	if !errors.Is(err, locks.ErrNotAcquired) || err.Error()[:len("redlockprio: trylock: locks: not acquired")] != "redlockprio: trylock: locks: not acquired" {
		t.Errorf("TryLock of a held name = %v, want redlockprio: trylock: locks: not acquired…", err)
	}
	if _, err := c.Semaphore(redlockprio.MaxSemaphoreSize + 1); !errors.Is(err, locks.ErrInvalidOption) {
		t.Errorf("Semaphore(MaxSemaphoreSize+1) = %v, want ErrInvalidOption", err)
	}
	if err := c.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if cause := context.Cause(held.Context()); !errors.Is(cause, locks.ErrLost) || !errors.Is(cause, locks.ErrClosed) {
		t.Errorf("a lease ended by Close: cause %v, want ErrLost and ErrClosed", cause)
	}
	if _, err := c.Locker().TryLock(ctx, name); !errors.Is(err, locks.ErrClosed) {
		t.Errorf("TryLock after Close = %v, want ErrClosed", err)
	}
	if err := c.Close(ctx); err != nil {
		t.Errorf("a second Close = %v, want nil", err)
	}
}
