package amqpsem_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/latchkey-go/latchkey/locks"

	"github.com/latchkey-go/latchkey/amqpsem"
)

// quorumEnv is a quorum harness for one test, with helpers.
type quorumEnv struct {
	t *testing.T
	h *quorumHarness
}

func newQuorumEnv(t *testing.T) *quorumEnv {
	t.Helper()
	raw, _ := amqpURL(t)
	h := &quorumHarness{t: t, url: raw, names: map[string]bool{}}
	t.Cleanup(func() {
		if err := h.Close(); err != nil {
			t.Errorf("destroying the test's names: %v", err)
		}
	})
	return &quorumEnv{t: t, h: h}
}

func (e *quorumEnv) name() string {
	n := fmt.Sprintf("%s-%d", e.t.Name(), time.Now().UnixNano())
	e.h.record(n)
	return n
}

func (e *quorumEnv) client() *quorumClient {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cl, err := e.h.newClient(ctx)
	if err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(func() { _ = cl.Close(context.Background()) })
	return cl
}

// consumers returns the number of subscriptions waiting on queue, asked
// of the broker on a connection of the test's own.
func (e *quorumEnv) consumers(queue string) int {
	e.t.Helper()
	conn, err := amqp.Dial(e.h.url)
	if err != nil {
		e.t.Fatal(err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		e.t.Fatal(err)
	}
	q, err := ch.QueueDeclarePassive(queue, true, false, false, false, nil)
	if err != nil {
		e.t.Fatal(err)
	}
	return q.Consumers
}

// mustLease returns a function that fails t on an acquire's error and
// returns its lease: mustLease(t)(locker.Lock(ctx, name)).
func mustLease(t *testing.T) func(locks.Lease, error) *amqpsem.QuorumLease {
	return func(l locks.Lease, err error) *amqpsem.QuorumLease {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
		return l.(*amqpsem.QuorumLease)
	}
}

// TestQuorumHandoffOrder: waiting Locks get the token in the order they
// started waiting, and each holder's token is greater than the last.
func TestQuorumHandoffOrder(t *testing.T) {
	e := newQuorumEnv(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	name := e.name()
	holder := e.client().Locker()
	first := mustLease(t)(holder.Lock(ctx, name))
	const waiters = 4
	type got struct {
		i     int
		token uint64
		err   error
	}
	order := make(chan got, waiters)
	// A token taken with basic.get may count as a consumer: count the
	// waiters' subscriptions from here.
	base := e.consumers(amqpsem.QuorumQueue(name))
	for i := range waiters {
		lk := e.client().Locker()
		go func() {
			l, err := lk.Lock(ctx, name)
			if err != nil {
				order <- got{i, 0, err}
				return
			}
			order <- got{i, l.Token(), nil}
			_ = l.Release(context.Background())
		}()
		// The next waiter starts once this one is subscribed.
		waitFor(t, 10*time.Second, fmt.Sprintf("waiter %d subscribed", i), func() bool {
			select {
			case g := <-order:
				t.Fatalf("waiter %d returned early: token %d, %v", g.i, g.token, g.err)
			default:
			}
			return e.consumers(amqpsem.QuorumQueue(name)) == base+i+1
		})
	}
	last := first.Token()
	if err := first.Release(ctx); err != nil {
		t.Fatal(err)
	}
	for k := range waiters {
		g := <-order
		if g.err != nil {
			t.Fatalf("waiter %d: %v", g.i, g.err)
		}
		if g.i != k {
			t.Errorf("hand-off %d went to waiter %d, want %d (FIFO)", k, g.i, k)
		}
		if g.token <= last {
			t.Errorf("hand-off %d: token %d after %d, want strictly greater", k, g.token, last)
		}
		last = g.token
	}
}

// TestQuorumTokenAfterCrash: a holder whose connection is cut loses its
// lease with ErrLost, and the token goes to the next client with a
// greater fencing token.
func TestQuorumTokenAfterCrash(t *testing.T) {
	e := newQuorumEnv(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	name := e.name()
	victim := e.client()
	l := mustLease(t)(victim.Locker().Lock(ctx, name))
	if l.Token() == 0 {
		t.Fatal("token 0 on the quorum layout")
	}
	other := e.client().Locker()
	if _, err := other.TryLock(ctx, name); !errors.Is(err, locks.ErrNotAcquired) {
		t.Fatalf("TryLock on a held name: %v, want ErrNotAcquired", err)
	}
	start := time.Now()
	if err := e.h.Kill(ctx, victim); err != nil {
		t.Fatal(err)
	}
	next := mustLease(t)(other.Lock(ctx, name))
	took := time.Since(start)
	if next.Token() <= l.Token() {
		t.Errorf("token after the crash %d, holder's %d: want greater", next.Token(), l.Token())
	}
	select {
	case <-l.Context().Done():
		if !errors.Is(context.Cause(l.Context()), locks.ErrLost) {
			t.Errorf("crashed holder's lease ended with %v, want ErrLost", context.Cause(l.Context()))
		}
	case <-time.After(5 * time.Second):
		t.Error("the crashed holder's lease did not end")
	}
	t.Logf("token %d → %d after a crash, handed over in %v", l.Token(), next.Token(), took)
	_ = next.Release(ctx)
}

// TestQuorumDestroy: destroying a name ends its lease with ErrLost and
// ErrSlotRemoved, and a waiting Lock fails instead of waiting forever; a
// client without WithCreate does not make it again.
func TestQuorumDestroy(t *testing.T) {
	e := newQuorumEnv(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	name := e.name()
	cl := e.client()
	l := mustLease(t)(cl.c.Quorum().Locker().Lock(ctx, name))
	waiter := e.client().c.Quorum().Locker()
	waited := make(chan error, 1)
	base := e.consumers(amqpsem.QuorumQueue(name))
	go func() {
		l, err := waiter.Lock(ctx, name)
		if err == nil {
			_ = l.Release(ctx)
		}
		waited <- err
	}()
	waitFor(t, 10*time.Second, "waiter subscribed", func() bool { return e.consumers(amqpsem.QuorumQueue(name)) == base+1 })
	if err := cl.c.Quorum().Destroy(ctx, name); err != nil {
		t.Fatal(err)
	}
	bound := testVerify + testHeartbeat + time.Second
	select {
	case <-l.Context().Done():
		cause := context.Cause(l.Context())
		if !errors.Is(cause, locks.ErrLost) || !errors.Is(cause, amqpsem.ErrSlotRemoved) {
			t.Errorf("lease ended with %v, want ErrLost and ErrSlotRemoved", cause)
		}
	case <-time.After(bound):
		t.Errorf("lease still live %v after Destroy", bound)
	}
	select {
	case err := <-waited:
		if err == nil {
			t.Error("a waiting Lock got a destroyed name")
		}
	case <-time.After(bound):
		t.Errorf("a waiting Lock still waits %v after Destroy", bound)
	}
	c, err := amqpsem.Dial(ctx, e.h.url, testOptions()...)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close(context.Background())
	if _, err := c.Quorum().Locker().TryLock(ctx, name); !errors.Is(err, amqpsem.ErrNoSlots) {
		t.Errorf("TryLock of a destroyed name without WithCreate: %v, want ErrNoSlots", err)
	}
}

// TestQuorumCreate: Create refuses a name that exists, in this layout or
// as a semaphore of the default layout, and bad input before any I/O.
func TestQuorumCreate(t *testing.T) {
	e := newQuorumEnv(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c := e.client().c
	q := c.Quorum()
	name := e.name()
	if err := q.Create(ctx, name, 2); err != nil {
		t.Fatal(err)
	}
	if err := q.Create(ctx, name, 2); !errors.Is(err, amqpsem.ErrExists) {
		t.Errorf("second Create: %v, want ErrExists", err)
	}
	if err := q.Create(ctx, name, 0); !errors.Is(err, amqpsem.ErrInvalidSlots) {
		t.Errorf("Create with 0 slots: %v, want ErrInvalidSlots", err)
	}
	if err := q.Create(ctx, "", 1); !errors.Is(err, locks.ErrInvalidName) {
		t.Errorf("Create of an empty name: %v, want ErrInvalidName", err)
	}
	other := e.name()
	a, err := c.Admin()
	if err != nil {
		t.Fatal(err)
	}
	if err := a.Create(ctx, other, 1); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = a.Destroy(context.Background(), other) })
	if err := q.Create(ctx, other, 1); !errors.Is(err, amqpsem.ErrOtherLayout) {
		t.Errorf("Create of a default-layout semaphore's name: %v, want ErrOtherLayout", err)
	}
	// And the other way: the default layout's Admin refuses the quorum
	// layout's name.
	if err := a.Create(ctx, name, 1); !errors.Is(err, amqpsem.ErrOtherLayout) {
		t.Errorf("default-layout Create of a quorum name: %v, want ErrOtherLayout", err)
	}
	if _, err := a.Add(ctx, name, 1); !errors.Is(err, amqpsem.ErrOtherLayout) {
		t.Errorf("default-layout Add on a quorum name: %v, want ErrOtherLayout", err)
	}
}

// TestQuorumSemaphoreSlots: a semaphore of 3 tokens gives 3 leases with
// slots 1, 2 and 3, then refuses a fourth; a released slot is taken
// again with a greater token.
func TestQuorumSemaphoreSlots(t *testing.T) {
	e := newQuorumEnv(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	name := e.name()
	s, err := e.client().c.Quorum().Semaphore(3)
	if err != nil {
		t.Fatal(err)
	}
	seen := map[int]*amqpsem.QuorumLease{}
	for range 3 {
		l := mustLease(t)(s.Acquire(ctx, name))
		if seen[l.Slot()] != nil || l.Slot() < 1 || l.Slot() > 3 {
			t.Fatalf("slot %d twice or out of 1..3", l.Slot())
		}
		seen[l.Slot()] = l
	}
	s2, _ := e.client().c.Quorum().Semaphore(3)
	if _, err := s2.TryAcquire(ctx, name); !errors.Is(err, locks.ErrNotAcquired) {
		t.Fatalf("fourth TryAcquire: %v, want ErrNotAcquired", err)
	}
	old := seen[2]
	if err := old.Release(ctx); err != nil {
		t.Fatal(err)
	}
	l := mustLease(t)(s2.Acquire(ctx, name))
	if l.Slot() != 2 || l.Token() <= old.Token() {
		t.Errorf("after releasing slot 2 (token %d) got slot %d token %d, want slot 2 with a greater token", old.Token(), l.Slot(), l.Token())
	}
}

// TestQuorumConsumerTimeoutVersion: WithConsumerTimeout is refused
// before any declare on a broker older than 3.12 (the queue argument
// would be ignored), and taken on a newer one.
func TestQuorumConsumerTimeoutVersion(t *testing.T) {
	e := newQuorumEnv(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := amqpsem.Dial(ctx, e.h.url, amqpsem.WithConsumerTimeout(time.Millisecond)); !errors.Is(err, locks.ErrInvalidOption) {
		t.Fatalf("WithConsumerTimeout(1ms): %v, want ErrInvalidOption", err)
	}
	c, err := amqpsem.Dial(ctx, e.h.url, append(testOptions(), amqpsem.WithConsumerTimeout(time.Minute))...)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close(context.Background())
	name := e.name()
	err = c.Quorum().Create(ctx, name, 1)
	old := brokerBefore(t, e.h.url, 3, 12)
	switch {
	case old && !errors.Is(err, locks.ErrInvalidOption):
		t.Errorf("Create with a consumer timeout on a broker before 3.12: %v, want ErrInvalidOption", err)
	case !old && err != nil:
		t.Errorf("Create with a consumer timeout: %v", err)
	}
	if old {
		if _, err := c.Quorum().Locker().TryLock(ctx, name); !errors.Is(err, amqpsem.ErrNoSlots) {
			t.Errorf("after a refused Create, TryLock: %v, want ErrNoSlots (nothing made)", err)
		}
	}
}

// brokerBefore reports whether the broker at url is older than
// major.minor.
func brokerBefore(t *testing.T, url string, major, minor int) bool {
	t.Helper()
	conn, err := amqp.Dial(url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	v, _ := conn.Properties["version"].(string)
	var ma, mi int
	if _, err := fmt.Sscanf(v, "%d.%d", &ma, &mi); err != nil {
		t.Fatalf("broker version %q: %v", v, err)
	}
	return ma < major || ma == major && mi < minor
}

// publishForeign publishes a message that is not a token to queue, as
// another layout's existence probe or a stray publisher would.
func publishForeign(t *testing.T, url, queue string) {
	t.Helper()
	conn, err := amqp.Dial(url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	if err := ch.Confirm(false); err != nil {
		t.Fatal(err)
	}
	dc, err := ch.PublishWithDeferredConfirm("", queue, true, false, amqp.Publishing{Body: []byte("not a token")})
	if err != nil {
		t.Fatal(err)
	}
	if ok, err := dc.WaitContext(context.Background()); !ok || err != nil {
		t.Fatalf("publish to %q not confirmed: %v", queue, err)
	}
}

// TestQuorumForeignMessage: a message without a token's header in the
// token queue is dropped, never taken as a token: a waiter it reaches
// goes on waiting while the lock is held, and a free lock is still
// taken.
func TestQuorumForeignMessage(t *testing.T) {
	e := newQuorumEnv(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	name := e.name()
	queue := amqpsem.QuorumQueue(name)
	holder := mustLease(t)(e.client().Locker().Lock(ctx, name))
	base := e.consumers(queue)
	waiter := e.client().Locker()
	got := make(chan error, 1)
	var second locks.Lease
	go func() {
		l, err := waiter.Lock(ctx, name)
		second = l
		got <- err
	}()
	waitFor(t, 10*time.Second, "waiter subscribed", func() bool { return e.consumers(queue) == base+1 })
	publishForeign(t, e.h.url, queue)
	// The waiter drops it and subscribes on: its subscription is back.
	waitFor(t, 10*time.Second, "the waiter still waiting after the foreign message", func() bool {
		select {
		case err := <-got:
			t.Fatalf("the waiter returned while the lock was held: %v", err)
		default:
		}
		return e.consumers(queue) == base+1
	})
	if err := holder.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-got; err != nil {
		t.Fatal(err)
	}
	if second.Token() <= holder.Token() {
		t.Errorf("token %d after %d", second.Token(), holder.Token())
	}
	if err := second.Release(ctx); err != nil {
		t.Fatal(err)
	}
	publishForeign(t, e.h.url, queue)
	l := mustLease(t)(e.client().Locker().TryLock(ctx, name))
	if l.Token() == 0 {
		t.Error("token 0")
	}
	if _, err := e.client().Locker().TryLock(ctx, name); !errors.Is(err, locks.ErrNotAcquired) {
		t.Errorf("a second TryLock while held: %v, want ErrNotAcquired (a foreign message taken as a token?)", err)
	}
}
