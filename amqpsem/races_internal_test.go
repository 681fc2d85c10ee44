package amqpsem

import (
	"context"
	"errors"
	"github.com/latchkey-go/latchkey/locks/driver"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/latchkey-go/latchkey/locks"
)

// The specification's races, made to happen at the moment they matter
// (between a scan and its declare) by test hooks, with the real broker
// answering: a lost race for a slot (RESOURCE_LOCKED), its retry limit
// and random skew, and a slot removed while it is being acquired.

func withHooks(h testHooks) Option {
	return func(o *options) error {
		o.hooks = h
		return nil
	}
}

// rival is another client's connection, declaring and deleting holder
// queues as a racing client does.
type rival struct {
	t  *testing.T
	ch *amqp.Channel
}

func newRival(t *testing.T, u string) *rival {
	t.Helper()
	conn, err := amqp.Dial(u)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	return &rival{t: t, ch: ch}
}

func (r *rival) take(q string) {
	if _, err := r.ch.QueueDeclare(q, false, false, true, false, DefaultLayout.Args); err != nil {
		r.t.Errorf("rival declare %q: %v", q, err)
	}
}

func (r *rival) drop(q string) {
	if _, err := r.ch.QueueDelete(q, false, false, false); err != nil {
		r.t.Errorf("rival delete %q: %v", q, err)
	}
}

// internalSem creates name with slots slots (destroyed at cleanup) and
// returns a Semaphore of c with opts.
func internalSem(t *testing.T, c *Client, ctx context.Context, name string, slots int, opts ...Option) *Semaphore {
	t.Helper()
	a, err := c.Admin()
	if err != nil {
		t.Fatal(err)
	}
	if err := a.Create(ctx, name, slots); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = a.Destroy(context.Background(), name) })
	s, err := c.Semaphore(MaxSemaphoreSize)
	if err != nil {
		t.Fatal(err)
	}
	// Options of this Semaphore only (its test hooks), on top of the
	// client's.
	if err := driver.Apply(&s.opts, opts); err != nil {
		t.Fatal(err)
	}
	s.admin.opts = s.opts
	return s
}

// Every attempt loses the race for the free slot: a rival declares B[1]
// between the scan and the declare (the broker answers RESOURCE_LOCKED)
// and lets it go during the skew. TryAcquire gives up after
// WithMaxAttempts declares with ErrContention (an ErrNotAcquired),
// waiting a random skew below WithSkew between attempts, and holds
// nothing; its client works on.
func TestRaceRetryLimitAndSkew(t *testing.T) {
	c, u, ctx := internalClient(t)
	name := internalName(t)
	b1 := DefaultLayout.Holder(name, 1)
	r := newRival(t, u)
	const attempts, maxSkew = 4, 40 * time.Millisecond
	var (
		mu       sync.Mutex
		declares int
		skews    []time.Duration
	)
	s := internalSem(t, c, ctx, name, 1, WithMaxAttempts(attempts), WithSkew(maxSkew), withHooks(testHooks{
		beforeDeclare: func(slot int) {
			mu.Lock()
			declares++
			mu.Unlock()
			r.take(DefaultLayout.Holder(name, slot))
		},
		skew: func(d time.Duration, err error) {
			if amqpCode(err) != amqp.ResourceLocked {
				t.Errorf("a lost race that was not RESOURCE_LOCKED: %v", err)
			}
			mu.Lock()
			skews = append(skews, d)
			mu.Unlock()
			r.drop(b1)
		},
	}))
	var locked int
	stop := s.Observe(func(e driver.Event) {
		if e.Kind == driver.EventResourceLocked && e.Name == name && e.Backend == "amqpsem" {
			mu.Lock()
			locked++
			mu.Unlock()
		}
	})
	defer stop()
	start := time.Now()
	_, err := s.TryAcquire(ctx, name)
	took := time.Since(start)
	if !errors.Is(err, ErrContention) || !errors.Is(err, locks.ErrNotAcquired) {
		t.Fatalf("TryAcquire losing every race = %v, want ErrContention and ErrNotAcquired", err)
	}
	mu.Lock()
	defer mu.Unlock()
	if locked != attempts {
		t.Errorf("%d EventResourceLocked, want one per lost race: %d", locked, attempts)
	}
	if declares != attempts {
		t.Errorf("%d declares, want WithMaxAttempts = %d", declares, attempts)
	}
	if len(skews) != attempts-1 {
		t.Fatalf("%d skews, want one after each lost race but the last: %d", len(skews), attempts-1)
	}
	var sum time.Duration
	distinct := map[time.Duration]bool{}
	for _, d := range skews {
		if d < 0 || d >= maxSkew {
			t.Errorf("skew %v outside [0, %v)", d, maxSkew)
		}
		sum += d
		distinct[d] = true
	}
	if len(distinct) < 2 {
		t.Errorf("skews %v are all the same: not random", skews)
	}
	if took < sum {
		t.Errorf("TryAcquire took %v, less than its skews %v", took, sum)
	}
	t.Logf("skews %v, TryAcquire took %v", skews, took.Round(time.Millisecond))
	// The rival still holds B[1] from the last race: nothing of ours is.
	if c.sess().reserved(b1) {
		t.Errorf("the client still reserves %q after giving up", b1)
	}
	r.drop(b1)
	s.opts.hooks = testHooks{}
	l, err := s.TryAcquire(ctx, name)
	if err != nil {
		t.Fatalf("TryAcquire after the races: %v", err)
	}
	_ = l.Release(ctx)
}

// A lost race with WithSkew(0) retries at once, and one lost race then a
// win returns the lease.
func TestRaceLostOnceThenWon(t *testing.T) {
	c, u, ctx := internalClient(t)
	name := internalName(t)
	r := newRival(t, u)
	declares := 0
	s := internalSem(t, c, ctx, name, 2, WithSkew(0), withHooks(testHooks{
		beforeDeclare: func(slot int) {
			declares++
			if declares == 1 {
				r.take(DefaultLayout.Holder(name, slot)) // the rival wins slot 1
			}
		},
	}))
	l, err := s.TryAcquire(ctx, name)
	if err != nil {
		t.Fatalf("TryAcquire after one lost race: %v", err)
	}
	defer l.Release(ctx)
	if slot := l.(*Lease).Slot(); slot != 2 || declares != 2 {
		t.Fatalf("got slot %d after %d declares; want slot 2 after 2 (the rival kept slot 1)", slot, declares)
	}
}

// A slot removed between the scan and the declare: the declare of B[L]
// succeeds, the verification the specification recommends finds A[L]
// gone, the client deletes B[L] and scans again, and returns what that
// scan finds (here: the other slot is held, so every slot is held; or no
// slots at all) without a lease and without keeping B[L].
func TestSlotRemovedWhileAcquiring(t *testing.T) {
	c, u, ctx := internalClient(t)
	admin, err := Dial(ctx, u, WithHeartbeat(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = admin.Close(context.Background()) })
	a, err := admin.Admin()
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		slots   int
		holdOne bool
		want    error
	}{
		{2, true, ErrAllHeld},  // slot 1 held by a rival; slot 2 removed under us
		{1, false, ErrNoSlots}, // the only slot removed under us
	} {
		name := internalName(t)
		r := newRival(t, u)
		declares := 0
		s := internalSem(t, c, ctx, name, tc.slots, WithSkew(time.Millisecond), withHooks(testHooks{
			beforeDeclare: func(slot int) {
				declares++
				if ch, err := a.Remove(ctx, name, 1); err != nil || ch.After != tc.slots-1 {
					t.Errorf("Remove under the acquire = %+v, %v", ch, err)
				}
			},
		}))
		if tc.holdOne {
			r.take(DefaultLayout.Holder(name, 1))
		}
		l, err := s.TryAcquire(ctx, name)
		if err == nil {
			_ = l.Release(ctx)
			t.Fatalf("%d slots: TryAcquire returned slot %d, removed while it was acquired", tc.slots, l.(*Lease).Slot())
		}
		if !errors.Is(err, tc.want) {
			t.Errorf("%d slots: TryAcquire of a slot removed under it = %v, want %v", tc.slots, err, tc.want)
		}
		if declares != 1 {
			t.Errorf("%d slots: %d declares, want 1", tc.slots, declares)
		}
		if q := DefaultLayout.Holder(name, tc.slots); queueExists(t, u, q) || c.sess().reserved(q) {
			t.Errorf("%d slots: %q of the removed slot is still there", tc.slots, q)
		}
	}
}
