package amqpsem

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"os"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/latchkey-go/latchkey/locks"
)

// Tests of the client's internals (its channel pool and probers), on a
// real broker: they reach into the client to put it in a state that
// broker or network trouble would, reproducibly.

// internalClient dials the test broker with a 1s heartbeat and returns
// the client, its URL and a test context.
func internalClient(t *testing.T) (*Client, string, context.Context) {
	t.Helper()
	u := testURL(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	t.Cleanup(cancel)
	c, err := Dial(ctx, u, WithHeartbeat(time.Second), WithVerifyInterval(250*time.Millisecond))
	if err != nil {
		t.Fatalf("Dial: %v", err)
	}
	t.Cleanup(func() { _ = c.Close(context.Background()) })
	return c, u, ctx
}

// testURL is the broker of the internal tests: $LOCKS_AMQP_URL, else the
// local one. One that does not answer skips the test, or fails it when CI
// is set (the external tests find brokers with contracttest/testenv, which
// this module does not require).
func testURL(t *testing.T) string {
	t.Helper()
	u := os.Getenv("LOCKS_AMQP_URL")
	if u == "" {
		u = "amqp://guest:guest@127.0.0.1:5672/"
	}
	conn, err := amqp.Dial(u)
	if err != nil {
		if os.Getenv("CI") != "" {
			t.Fatalf("no RabbitMQ at %s: %v", RedactURL(u), err)
		}
		t.Skipf("no RabbitMQ at %s (set LOCKS_AMQP_URL): %v", RedactURL(u), err)
	}
	_ = conn.Close()
	return u
}

// TestHolderQueueArgumentsOnOwnConnection: holder queues B[i] and the
// mutex queue of the default layout are exclusive, with x-max-length 0
// and no other argument, so that probes never pile up in them. Only
// their owner's connection may declare them, so the arguments are
// compared there: a declare with x-max-length 0 alone is accepted, one
// with other arguments refused (PRECONDITION_FAILED, which closes only
// that channel). (Durability is not compared: RabbitMQ 3.10 accepts a
// durable redeclare of an exclusive queue.)
func TestHolderQueueArgumentsOnOwnConnection(t *testing.T) {
	c, _, ctx := internalClient(t)
	name := internalName(t)
	admin, err := c.Admin()
	if err != nil {
		t.Fatal(err)
	}
	if err := admin.Create(ctx, name, 1); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_, _ = admin.Destroy(cctx, name)
	})
	s, err := c.Semaphore(1)
	if err != nil {
		t.Fatal(err)
	}
	slot, err := s.TryAcquire(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	held, err := c.Locker().TryLock(ctx, name+"-mutex")
	if err != nil {
		t.Fatal(err)
	}
	maxLen0 := amqp.Table{"x-max-length": int32(0)}
	declare := func(q string, args amqp.Table) error {
		ch, err := c.sess().conn.Channel()
		if err != nil {
			t.Fatal(err)
		}
		defer ch.Close()
		_, err = ch.QueueDeclare(q, false, false, true, false, args)
		return err
	}
	for _, q := range []string{slot.(*Lease).Queue(), held.(*Lease).Queue()} {
		if err := declare(q, maxLen0); err != nil {
			t.Errorf("%q is not an exclusive queue with x-max-length 0 and no other argument: %v", q, err)
		}
		for what, args := range map[string]amqp.Table{
			"no arguments":   nil,
			"x-max-length 1": {"x-max-length": int32(1)},
			"x-expires too":  {"x-max-length": int32(0), "x-expires": int32(60000)},
		} {
			var e *amqp.Error
			if err := declare(q, args); !errors.As(err, &e) || e.Code != amqp.PreconditionFailed {
				t.Errorf("a declare of %q with %s gave %v, want PRECONDITION_FAILED", q, what, err)
			}
		}
	}
	// The refused declares broke only their own channels.
	for _, l := range []locks.Lease{slot, held} {
		if err := l.(*Lease).Verify(ctx); err != nil {
			t.Errorf("lease on %q after the test's declares: %v", l.(*Lease).Queue(), err)
		}
		if err := l.Release(ctx); err != nil {
			t.Errorf("release of %q: %v", l.(*Lease).Queue(), err)
		}
	}
}

// sess returns c's live session, for tests that reach into it.
func (c *Client) sess() *session {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.cur
}

func internalName(t *testing.T) string {
	var b [4]byte
	_, _ = rand.Read(b[:])
	return "amqpsem-internal-" + hex.EncodeToString(b[:])
}

// queueExists reports whether q exists, by a passive declare on a
// connection of its own.
func queueExists(t *testing.T, u, q string) bool {
	t.Helper()
	conn, err := amqp.Dial(u)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	_, err = ch.QueueDeclarePassive(q, false, false, false, false, nil)
	var e *amqp.Error
	switch {
	case err == nil:
		return true
	case errors.As(err, &e) && e.Code == amqp.ResourceLocked:
		return true // another connection's exclusive queue
	case errors.As(err, &e) && e.Code == amqp.NotFound:
		return false
	}
	t.Fatalf("passive declare %q: %v", q, err)
	return false
}

// A release whose pooled channel the broker closes under it (for an
// earlier error on that channel) must not report success while its queue
// stays: the connection is open, so the queue is there; the delete is
// retried on a fresh channel.
func TestFreeOnBrokenChannel(t *testing.T) {
	c, u, ctx := internalClient(t)
	m := c.Locker()
	missing := internalName(t) + "-no-such-exchange"
	for i := range 10 {
		name := internalName(t)
		l, err := m.TryLock(ctx, name)
		if err != nil {
			t.Fatal(err)
		}
		// Leave only a poisoned channel in the pool: its publish to a
		// missing exchange makes the broker close it, a moment later.
		for len(c.sess().pool) > 0 {
			_ = (<-c.sess().pool).Close()
		}
		ch, err := c.sess().conn.Channel()
		if err != nil {
			t.Fatal(err)
		}
		if err := ch.Publish(missing, "k", false, false, amqp.Publishing{}); err != nil {
			t.Fatal(err)
		}
		c.sess().putChannel(ch)
		if err := l.Release(ctx); err != nil {
			t.Errorf("round %d: Release on a broken channel: %v", i, err)
		}
		if queueExists(t, u, name) {
			t.Errorf("round %d: the mutex queue %q outlived its Release", i, name)
		}
	}
}

// A lease whose verifications time out while its connection stays open
// ends with ErrLost, and the client deletes its queue by itself: the
// holder no longer believes it holds the name, so nobody may.
func TestLostLeaseLetsGo(t *testing.T) {
	c, u, ctx := internalClient(t)
	m := c.Locker()
	name := internalName(t)
	l, err := m.TryLock(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	// Stall verification, as a broker too slow to answer would.
	c.sess().verifier.sem <- struct{}{}
	t.Cleanup(func() { <-c.sess().verifier.sem })
	select {
	case <-l.Context().Done():
	case <-time.After(5 * c.sess().heartbeat):
		t.Fatalf("lease still live %v after its verifications stalled", 5*c.sess().heartbeat)
	}
	if cause := context.Cause(l.Context()); !errors.Is(cause, locks.ErrLost) {
		t.Fatalf("cause = %v, want ErrLost", cause)
	}
	deadline := time.Now().Add(5 * c.sess().heartbeat)
	for queueExists(t, u, name) {
		if time.Now().After(deadline) {
			t.Fatalf("the lost lease's queue %q is still there %v after the lease ended", name, 5*c.sess().heartbeat)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err := l.Release(ctx); !errors.Is(err, locks.ErrLost) {
		t.Errorf("Release of the lost lease = %v, want ErrLost", err)
	}
}

// Lease verification has a prober of its own: a long scan holding the
// client's prober (a Status of many slots, an acquire on a big
// semaphore) must not delay it into a false ErrLost.
func TestVerifyNotStarvedByScans(t *testing.T) {
	c, _, ctx := internalClient(t)
	m := c.Locker()
	l, err := m.TryLock(ctx, internalName(t))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Release(ctx)
	c.sess().probes.sem <- struct{}{} // a long scan in progress
	defer func() { <-c.sess().probes.sem }()
	select {
	case <-l.Context().Done():
		t.Fatalf("lease ended while the prober was busy: %v", context.Cause(l.Context()))
	case <-time.After(3 * c.sess().heartbeat):
	}
	if err := l.(*Lease).Verify(ctx); err != nil {
		t.Fatalf("Verify while the prober is busy: %v", err)
	}
}

// Each release wakes one waiting client, not all of them; a waiter that
// leaves without using its wake-up passes it on.
func TestTurnsWakeOne(t *testing.T) {
	c, u, ctx := internalClient(t)
	key := internalName(t)
	var subs []*wakeSub
	var leaves []func(bool)
	for range 3 {
		w, err := Dial(ctx, u, WithHeartbeat(time.Second))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = w.Close(context.Background()) })
		sub, leave := w.sess().wakes.takeTurns(ctx, key)
		if !sub.turns {
			t.Fatal("takeTurns fell back to fan-out")
		}
		subs, leaves = append(subs, sub), append(leaves, leave)
	}
	woken := func() (n, first int) {
		first = -1
		for i, s := range subs {
			if s.pending.Load() {
				n++
				if first < 0 {
					first = i
				}
			}
		}
		return n, first
	}
	settle := func(want int) int {
		deadline := time.Now().Add(5 * time.Second)
		for {
			n, first := woken()
			if n >= want {
				time.Sleep(300 * time.Millisecond) // any more?
				if n, _ := woken(); n != want {
					t.Fatalf("%d waiting clients woken, want %d", n, want)
				}
				return first
			}
			if time.Now().After(deadline) {
				t.Fatalf("%d waiting clients woken after 5s, want %d", n, want)
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	c.sess().wakes.publish(key, "")
	first := settle(1)
	leaves[first](false) // leaves with its wake-up unused
	settle(2)
	for i, leave := range leaves {
		if i != first {
			leave(true)
		}
	}
}

func TestTurnQueueNames(t *testing.T) {
	short := turnQueue("jobs")
	if short != "amqpsem.wake.jobs" {
		t.Errorf(`turnQueue("jobs") = %q`, short)
	}
	long := make([]byte, maxShortString)
	for i := range long {
		long[i] = 'x'
	}
	a, b := turnQueue(string(long)), turnQueue(string(long[1:]))
	if len(a) > maxShortString || len(b) > maxShortString || a == b {
		t.Errorf("long names: %q, %q", a, b)
	}
	if queueName(a) != nil || queueName(short) != nil {
		t.Errorf("not legal queue names: %q, %q", a, short)
	}
}
