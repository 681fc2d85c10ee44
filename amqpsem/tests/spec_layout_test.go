package amqpsem_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/latchkey-go/latchkey/locks"

	"github.com/latchkey-go/latchkey/amqpsem"
)

// The Python implementation's layout: its queue names and declare
// arguments, checked against declares of exactly what that
// implementation declares.
func TestPythonLayout(t *testing.T) {
	u, _ := amqpURL(t)
	needTransient(t, u)
	ctx := tctx(t)
	var b [4]byte
	_, _ = rand.Read(b[:])
	name := "amqpsem-python-" + hex.EncodeToString(b[:])
	c := dial(t, u, amqpsem.WithLayout(amqpsem.PythonLayout))
	a := admin(t, c)
	r := rawConn(t, u)
	t.Cleanup(func() {
		for i := 1; i <= 3; i++ {
			r.delete(name + "-A-" + string(rune('0'+i)))
		}
	})
	if err := a.Create(ctx, name, 2); err != nil {
		t.Fatal(err)
	}
	// What the Python implementation declares for A queues: not durable,
	// x-max-length 0 (sent as a 64-bit integer by its client library).
	pyArgs := amqp.Table{"x-max-length": int64(0)}
	for _, q := range []string{name + "-A-1", name + "-A-2"} {
		if err := r.declare(q, false, false, pyArgs); err != nil {
			t.Errorf("the Python declare of %q was refused: %v", q, err)
		}
		if err := r.declare(q, false, false, nil); codeOf(err) != amqp.PreconditionFailed {
			t.Errorf("a declare of %q without x-max-length gave %v, want PRECONDITION_FAILED", q, err)
		}
	}
	// Slots the Python administrator added are ours too.
	if err := r.declare(name+"-A-3", false, false, pyArgs); err != nil {
		t.Fatal(err)
	}
	if n, err := a.Max(ctx, name); err != nil || n != 3 {
		t.Fatalf("Max = %d, %v; want 3", n, err)
	}
	// A Python client holding slot 1: an exclusive N-B-1 with its
	// arguments. Ours takes slot 2, as N-B-2.
	py, err := r.conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := py.QueueDeclare(name+"-B-1", false, false, true, false, pyArgs); err != nil {
		t.Fatal(err)
	}
	l, err := semaphore(t, c, amqpsem.MaxSemaphoreSize).TryAcquire(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	lease := l.(*amqpsem.Lease)
	if lease.Slot() != 2 || lease.Queue() != name+"-B-2" {
		t.Fatalf("acquired slot %d (%q), want 2 (%q)", lease.Slot(), lease.Queue(), name+"-B-2")
	}
	// What the broker holds: our A queues as the Python implementation
	// declares them, our B queue exclusive, all with x-max-length 0.
	checkBrokerQueues(t, u, map[string]brokerQueue{
		name + "-A-1": {Durable: false, Exclusive: false, MaxLength: 0},
		name + "-A-2": {Durable: false, Exclusive: false, MaxLength: 0},
		name + "-B-2": {Durable: false, Exclusive: true, MaxLength: 0},
	})
	// A Python client trying our slot is refused as it expects.
	if err := r.declare(name+"-B-2", false, true, pyArgs); codeOf(err) != amqp.ResourceLocked {
		t.Errorf("the Python declare of our %q gave %v, want RESOURCE_LOCKED", lease.Queue(), err)
	}
	if err := lease.Release(ctx); err != nil {
		t.Fatal(err)
	}
	// Our B queues carry the same arguments: once free, the Python
	// client's declare on our connection's former queue name succeeds,
	// and ours succeeds on the Python client's former name.
	if _, err := py.QueueDelete(name+"-B-1", false, false, false); err != nil {
		t.Fatal(err)
	}
	if err := r.declare(name+"-B-2", false, true, pyArgs); err != nil {
		t.Errorf("Python declare of a freed holder queue: %v", err)
	}
	if n, err := a.Destroy(ctx, name); err != nil || n != 3 {
		t.Fatalf("Destroy = %d, %v", n, err)
	}
}

func TestBadInput(t *testing.T) {
	u, _ := amqpURL(t)
	ctx := tctx(t)
	c := dial(t, u)
	a := admin(t, c)
	s := semaphore(t, c, amqpsem.MaxSemaphoreSize)
	r := rawConn(t, u)
	for _, name := range []string{"", "amq.x", "bad\nname", "looks-like-a-slot-1-A", string(bytesOf('x', 252))} {
		if err := a.Create(ctx, name, 1); !errors.Is(err, locks.ErrInvalidName) {
			t.Errorf("Create(%q) = %v, want ErrInvalidName", name, err)
		}
		if _, err := s.TryAcquire(ctx, name); !errors.Is(err, locks.ErrInvalidName) {
			t.Errorf("TryAcquire(%q) = %v, want ErrInvalidName", name, err)
		}
	}
	name := uniqueName(t, u)
	for _, n := range []int{0, -1, amqpsem.MaxSemaphoreSize + 1} {
		if err := a.Create(ctx, name, n); !errors.Is(err, amqpsem.ErrInvalidSlots) || !errors.Is(err, locks.ErrInvalidOption) {
			t.Errorf("Create(%d slots) = %v, want ErrInvalidSlots", n, err)
		}
	}
	if _, err := a.Resize(ctx, name, -1); !errors.Is(err, amqpsem.ErrInvalidSlots) {
		t.Errorf("Resize(-1) = %v, want ErrInvalidSlots", err)
	}
	if _, err := a.Remove(ctx, name, 1); !errors.Is(err, amqpsem.ErrInvalidSlots) {
		t.Errorf("Remove from a semaphore without slots = %v, want ErrInvalidSlots", err)
	}
	if r.exists(amqpsem.DefaultLayout.Slot(name, 1)) {
		t.Fatal("bad input created a slot queue")
	}
	// A create that meets a queue of another kind in its way rolls back.
	in := amqpsem.DefaultLayout.Slot(name, 2)
	if err := r.declare(in, false, false, nil); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.delete(in) })
	if err := a.Create(ctx, name, 3); err == nil {
		t.Fatal("Create over a conflicting queue succeeded")
	}
	if r.exists(amqpsem.DefaultLayout.Slot(name, 1)) {
		t.Fatal("a failed Create left slot 1 behind")
	}

	dctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if _, err := amqpsem.Dial(dctx, "amqp://guest:guest@127.0.0.1:1/"); err == nil {
		t.Error("Dial of an unreachable broker succeeded")
	}
	_, err := amqpsem.Dial(dctx, "amqp://guest:wrong-password@"+hostOf(t, u)+"/")
	if err == nil || codeOf(err) != amqp.AccessRefused {
		t.Errorf("Dial with wrong credentials = %v, want ACCESS_REFUSED", err)
	}
	closed := dial(t, u)
	_ = closed.Close(context.Background())
	cs := semaphore(t, closed, amqpsem.MaxSemaphoreSize)
	if _, err := cs.TryAcquire(ctx, name); !errors.Is(err, locks.ErrClosed) {
		t.Errorf("TryAcquire on a closed client = %v, want ErrClosed", err)
	}
}

func bytesOf(b byte, n int) []byte {
	s := make([]byte, n)
	for i := range s {
		s[i] = b
	}
	return s
}

func hostOf(t *testing.T, _ string) string {
	_, host := amqpURL(t)
	return host
}

// A mutex name that ends like a slot or holder queue is refused before
// any I/O: its queue would be that slot or holder queue of another
// semaphore (for the default layout, a mutex on "jobs-3-A" would create
// slot 3 of jobs).
func TestMutexReservedNames(t *testing.T) {
	u, _ := amqpURL(t)
	name := uniqueName(t, u)
	ctx := tctx(t)
	r := rawConn(t, u)
	for _, lay := range []amqpsem.Layout{amqpsem.DefaultLayout, amqpsem.PythonLayout} {
		m := dial(t, u, amqpsem.WithLayout(lay)).Locker()
		for _, q := range []string{lay.Slot(name, 3), lay.Holder(name, 3)} {
			if l, err := m.TryLock(ctx, q); !errors.Is(err, locks.ErrInvalidName) {
				if err == nil {
					t.Errorf("TryLock(%q) = held (queue exists: %v), want ErrInvalidName", q, r.exists(q))
					_ = l.Release(ctx)
					continue
				}
				t.Errorf("TryLock(%q) = %v, want ErrInvalidName", q, err)
			}
			if l, err := m.Lock(ctx, q); !errors.Is(err, locks.ErrInvalidName) {
				if err == nil {
					_ = l.Release(ctx)
				}
				t.Errorf("Lock(%q) = %v, want ErrInvalidName", q, err)
			}
			if r.exists(q) {
				t.Errorf("a refused mutex created %q", q)
			}
		}
	}
}
