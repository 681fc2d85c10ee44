package amqpsem_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os/exec"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/latchkey-go/latchkey/contracttest/testenv"
	"github.com/latchkey-go/latchkey/locks"

	"github.com/latchkey-go/latchkey/amqpsem"
)

var unsafe = regexp.MustCompile(`[^a-zA-Z0-9]+`)

// uniqueName returns a semaphore name unique to the test and run, and
// destroys the semaphore (default layout) at cleanup.
func uniqueName(t *testing.T, rawURL string) string {
	t.Helper()
	var b [4]byte
	_, _ = rand.Read(b[:])
	name := "amqpsem-" + unsafe.ReplaceAllString(t.Name(), "-") + "-" + hex.EncodeToString(b[:])
	t.Cleanup(func() {
		if err := destroyAll(rawURL, map[string]bool{name: true}); err != nil {
			t.Errorf("cleanup: %v", err)
		}
	})
	return name
}

func dial(t *testing.T, rawURL string, opts ...amqpsem.Option) *amqpsem.Client {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := amqpsem.Dial(ctx, rawURL, append(testOptions(), opts...)...)
	if err != nil {
		t.Fatalf("Dial: %v", err)
	}
	t.Cleanup(func() { _ = c.Close(context.Background()) })
	return c
}

func admin(t *testing.T, c *amqpsem.Client, opts ...amqpsem.Option) *amqpsem.Admin {
	t.Helper()
	a, err := c.Admin(opts...)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

func semaphore(t *testing.T, c *amqpsem.Client, size int) *amqpsem.Semaphore {
	t.Helper()
	s, err := c.Semaphore(size)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func tctx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// raw is a plain AMQP connection for looking at the broker directly.
type raw struct {
	t    *testing.T
	conn *amqp.Connection
}

func rawConn(t *testing.T, rawURL string) *raw {
	t.Helper()
	conn, err := amqp.Dial(rawURL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return &raw{t: t, conn: conn}
}

// exists reports whether queue q exists, by a passive declare on a
// channel of its own (which a missing queue closes).
func (r *raw) exists(q string) bool {
	r.t.Helper()
	ch, err := r.conn.Channel()
	if err != nil {
		r.t.Fatal(err)
	}
	defer ch.Close()
	_, err = ch.QueueDeclarePassive(q, false, false, false, false, nil)
	switch code := codeOf(err); {
	case err == nil, code == amqp.ResourceLocked:
		return true
	case code == amqp.NotFound:
		return false
	}
	r.t.Fatalf("passive declare %q: %v", q, err)
	return false
}

// declare declares q with the given properties on a channel of its own and
// returns the broker's answer: nil when q is new or equivalent,
// PRECONDITION_FAILED when its properties differ, RESOURCE_LOCKED when it
// is another connection's exclusive queue.
func (r *raw) declare(q string, durable, exclusive bool, args amqp.Table) error {
	r.t.Helper()
	ch, err := r.conn.Channel()
	if err != nil {
		r.t.Fatal(err)
	}
	defer ch.Close()
	_, err = ch.QueueDeclare(q, durable, false, exclusive, false, args)
	return err
}

func (r *raw) delete(q string) {
	r.t.Helper()
	ch, err := r.conn.Channel()
	if err != nil {
		r.t.Fatal(err)
	}
	defer ch.Close()
	if _, err := ch.QueueDelete(q, false, false, false); err != nil {
		r.t.Errorf("delete %q: %v", q, err)
	}
}

func codeOf(err error) int {
	var e *amqp.Error
	if errors.As(err, &e) {
		return e.Code
	}
	return 0
}

var maxLen0 = amqp.Table{"x-max-length": int32(0)}

// checkSlots checks that A[1..n] of name exist, durable with x-max-length
// 0 (a declare with those properties is accepted, one not durable or
// without the argument refused), and that A[n+1] does not.
func checkSlots(t *testing.T, r *raw, name string, n int) {
	t.Helper()
	for i := 1; i <= n; i++ {
		q := amqpsem.DefaultLayout.Slot(name, i)
		if !r.exists(q) {
			t.Fatalf("slot queue %q does not exist", q)
		}
		if err := r.declare(q, true, false, maxLen0); err != nil {
			t.Errorf("%q is not a durable queue with x-max-length 0: %v", q, err)
		}
		if err := r.declare(q, false, false, maxLen0); codeOf(err) != amqp.PreconditionFailed {
			t.Errorf("a non-durable declare of %q gave %v, want PRECONDITION_FAILED", q, err)
		}
	}
	if q := amqpsem.DefaultLayout.Slot(name, n+1); r.exists(q) {
		t.Errorf("slot queue %q exists above the maximum %d", q, n)
	}
}

func TestAdminLifecycle(t *testing.T) {
	u, _ := amqpURL(t)
	name := uniqueName(t, u)
	ctx := tctx(t)
	c := dial(t, u)
	a := admin(t, c)
	r := rawConn(t, u)

	if err := a.Create(ctx, name, 3); err != nil {
		t.Fatalf("Create: %v", err)
	}
	checkSlots(t, r, name, 3)
	if n, err := a.Max(ctx, name); err != nil || n != 3 {
		t.Fatalf("Max = %d, %v; want 3", n, err)
	}
	if err := a.Create(ctx, name, 5); !errors.Is(err, amqpsem.ErrExists) {
		t.Errorf("Create of an existing semaphore = %v, want ErrExists", err)
	}
	if ch, err := a.Add(ctx, name, 2); err != nil || ch != (amqpsem.Change{Before: 3, After: 5}) {
		t.Fatalf("Add(2) = %+v, %v", ch, err)
	}
	checkSlots(t, r, name, 5)
	if ch, err := a.Remove(ctx, name, 1); err != nil || ch != (amqpsem.Change{Before: 5, After: 4}) {
		t.Fatalf("Remove(1) = %+v, %v", ch, err)
	}
	checkSlots(t, r, name, 4)
	if ch, err := a.Resize(ctx, name, 2); err != nil || ch.After != 2 {
		t.Fatalf("Resize(2) = %+v, %v", ch, err)
	}
	checkSlots(t, r, name, 2)
	if _, err := a.Remove(ctx, name, 3); !errors.Is(err, amqpsem.ErrInvalidSlots) {
		t.Errorf("Remove(3) of 2 slots = %v, want ErrInvalidSlots", err)
	}
	checkSlots(t, r, name, 2)
	if n, err := a.Destroy(ctx, name); err != nil || n != 2 {
		t.Fatalf("Destroy = %d, %v; want 2", n, err)
	}
	checkSlots(t, r, name, 0)
	if r.exists(name) {
		t.Errorf("the administration mutex %q outlived the change", name)
	}
}

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

// Removing a held slot leaves its holder in place until it lets go; its
// verification then fails, its lease ends with ErrLost, and it deletes its
// holder queue, which ends the administrator's wait.
func TestRemoveHeldSlot(t *testing.T) {
	u, _ := amqpURL(t)
	name := uniqueName(t, u)
	ctx := tctx(t)
	a := admin(t, dial(t, u))
	if err := a.Create(ctx, name, 2); err != nil {
		t.Fatal(err)
	}
	// A long heartbeat makes the holder's own verification rare, so the
	// test sees the removed slot still held.
	holder := dial(t, u, amqpsem.WithHeartbeat(20*time.Second), amqpsem.WithVerifyInterval(10*time.Second))
	s := semaphore(t, holder, amqpsem.MaxSemaphoreSize)
	l1, err := s.TryAcquire(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	l2, err := s.TryAcquire(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	if ch, err := a.Remove(ctx, name, 1); err != nil || ch.After != 1 {
		t.Fatalf("Remove(1) = %+v, %v", ch, err)
	}
	st, err := a.Status(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	if st.Slots != 1 || len(st.Held) != 1 || st.Held[0] != 1 || len(st.Removed) != 1 || st.Removed[0] != 2 {
		t.Fatalf("Status after removing held slot 2 = %+v", st)
	}
	if l2.Context().Err() != nil {
		t.Fatalf("the removed slot's lease ended before verifying: %v", context.Cause(l2.Context()))
	}
	short, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	err = a.WaitReleased(short, name)
	cancel()
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("WaitReleased while slot 2 is held = %v, want DeadlineExceeded", err)
	}
	err = l2.(*amqpsem.Lease).Verify(ctx)
	if !errors.Is(err, locks.ErrLost) || !errors.Is(err, amqpsem.ErrSlotRemoved) {
		t.Fatalf("Verify of a removed slot = %v, want ErrLost and ErrSlotRemoved", err)
	}
	if cause := context.Cause(l2.Context()); !errors.Is(cause, locks.ErrLost) {
		t.Fatalf("cause = %v, want ErrLost", cause)
	}
	if err := a.WaitReleased(ctx, name); err != nil {
		t.Fatalf("WaitReleased after the holder let go: %v", err)
	}
	if err := l2.Release(ctx); !errors.Is(err, locks.ErrLost) {
		t.Errorf("Release of the lost lease = %v, want ErrLost", err)
	}
	if err := l1.(*amqpsem.Lease).Verify(ctx); err != nil {
		t.Errorf("the other slot's lease: %v", err)
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

func TestOvershoot(t *testing.T) {
	u, _ := amqpURL(t)
	name := uniqueName(t, u)
	ctx := tctx(t)
	c := dial(t, u)
	r := rawConn(t, u)
	if err := admin(t, c).Create(ctx, name, 2); err != nil {
		t.Fatal(err)
	}
	// Strays above a gap, as a failed ascending delete or a manual change
	// leaves them: the maximum does not see them.
	for _, i := range []int{4, 6} {
		if err := r.declare(amqpsem.DefaultLayout.Slot(name, i), true, false, maxLen0); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() {
		for i := 1; i <= 6; i++ {
			r.delete(amqpsem.DefaultLayout.Slot(name, i))
		}
	})
	if n, _ := admin(t, c).Max(ctx, name); n != 2 {
		t.Fatalf("Max with strays above a gap = %d, want 2", n)
	}
	// Without overshoot, adding one slot joins the stray at 4.
	plain := admin(t, c)
	if ch, err := plain.Add(ctx, name, 1); err != nil || ch.After != 3 {
		t.Fatalf("Add = %+v, %v", ch, err)
	}
	if n, _ := plain.Max(ctx, name); n != 4 {
		t.Fatalf("Max after Add without overshoot = %d, want 4 (the stray joined)", n)
	}
	over := admin(t, c, amqpsem.WithOvershoot(4))
	if ch, err := over.Add(ctx, name, 1); err != nil || ch != (amqpsem.Change{Before: 4, After: 5}) {
		t.Fatalf("Add with overshoot = %+v, %v", ch, err)
	}
	if !r.exists(amqpsem.DefaultLayout.Slot(name, 5)) || r.exists(amqpsem.DefaultLayout.Slot(name, 6)) {
		t.Fatalf("overshoot did not prune the stray at 6, or lost slot 5")
	}
	checkSlots(t, r, name, 5)
}

func TestAscendingDelete(t *testing.T) {
	u, _ := amqpURL(t)
	name := uniqueName(t, u)
	ctx := tctx(t)
	c := dial(t, u)
	r := rawConn(t, u)
	a := admin(t, c, amqpsem.WithAscendingDelete(true))
	if err := a.Create(ctx, name, 5); err != nil {
		t.Fatal(err)
	}
	if ch, err := a.Remove(ctx, name, 2); err != nil || ch.After != 3 {
		t.Fatalf("Remove = %+v, %v", ch, err)
	}
	checkSlots(t, r, name, 3)
	if n, err := a.Destroy(ctx, name); err != nil || n != 3 {
		t.Fatalf("Destroy = %d, %v", n, err)
	}
	checkSlots(t, r, name, 0)
}

// Two administrators adding slots at once are serialised by the mutex:
// no addition is lost.
func TestAdminsSerialised(t *testing.T) {
	u, _ := amqpURL(t)
	name := uniqueName(t, u)
	ctx := tctx(t)
	const admins, adds = 3, 5
	var wg sync.WaitGroup
	for range admins {
		a := admin(t, dial(t, u))
		wg.Go(func() {
			for range adds {
				if _, err := a.Add(ctx, name, 1); err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	n, err := admin(t, dial(t, u)).Max(ctx, name)
	if err != nil || n != admins*adds {
		t.Fatalf("Max after %d concurrent additions = %d, %v", admins*adds, n, err)
	}
	checkSlots(t, rawConn(t, u), name, admins*adds)
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

// A release publishes its wake-up to the wake exchange; when that is
// missing, the broker closes the publishing channel, a moment later. That
// must not break the locks and releases that follow at once on the
// client's other channels.
func TestMissingWakeExchange(t *testing.T) {
	u, _ := amqpURL(t)
	ctx := tctx(t)
	base := uniqueName(t, u)
	c := dial(t, u, amqpsem.WithWakeExchange(base+"-no-such-exchange"))
	m := c.Locker()
	var queues []string
	for i := range 40 {
		l, err := m.TryLock(ctx, fmt.Sprintf("%s-%d", base, i))
		if err != nil {
			t.Fatalf("TryLock #%d, after a release: %v", i, err)
		}
		queues = append(queues, l.(*amqpsem.Lease).Queue())
		if err := l.Release(ctx); err != nil {
			t.Fatalf("Release #%d: %v", i, err)
		}
	}
	r := rawConn(t, u)
	for _, q := range queues {
		if r.exists(q) {
			t.Errorf("%q outlived its Release", q)
		}
	}
}

// hookConn calls onSet after each SetDeadline.
type hookConn struct {
	net.Conn
	onSet func(time.Time)
}

func (c *hookConn) SetDeadline(t time.Time) error {
	err := c.Conn.SetDeadline(t)
	c.onSet(t)
	return err
}

// Dial's context ending just after the handshakes, as the connection is
// handed over, interrupts the connection: Dial must then return the
// context's error, not a client whose connection dies at once.
func TestDialCancelledAfterHandshake(t *testing.T) {
	u, host := amqpURL(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	interrupted := make(chan struct{})
	var once sync.Once
	viaHook := amqpsem.WithDial(func(ctx context.Context, network, _ string) (net.Conn, error) {
		var d net.Dialer
		conn, err := d.DialContext(ctx, network, host)
		if err != nil {
			return nil, err
		}
		return &hookConn{Conn: conn, onSet: func(t time.Time) {
			switch {
			case t.IsZero():
				// The AMQP client clears the handshake deadline: the
				// connection is open. End Dial's context now, and wait
				// until Dial's interruption has set its past deadline.
				cancel()
				select {
				case <-interrupted:
				case <-time.After(5 * time.Second):
				}
			case t.Before(time.Unix(2, 0)):
				once.Do(func() { close(interrupted) })
			}
		}}, nil
	})
	c, err := amqpsem.Dial(ctx, u, append(testOptions(), viaHook)...)
	if err == nil {
		_ = c.Close(context.Background())
		t.Fatal("Dial returned a client after its context ended and interrupted the connection")
	}
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("Dial = %v, want context.Canceled", err)
	}
}

// brokerQueue is what the broker says of a queue.
type brokerQueue struct {
	Durable, Exclusive bool
	MaxLength          int // x-max-length; -1 when the argument is not set
}

// checkBrokerQueues checks the queues in want as the broker lists them
// (rabbitmqctl list_queues): durability, exclusivity and x-max-length,
// and that they have no other arguments. Where rabbitmqctl is missing,
// fails, or talks to another broker than the test's (none of the queues
// listed), it logs why and checks nothing.
func checkBrokerQueues(t *testing.T, rawURL string, want map[string]brokerQueue) {
	t.Helper()
	uri, err := amqp.ParseURI(rawURL)
	if err != nil {
		t.Fatal(err)
	}
	ctl, err := exec.LookPath("rabbitmqctl")
	if err != nil {
		t.Log("rabbitmqctl not found: queue properties not checked at the broker")
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, ctl, "list_queues", "-q", "-p", uri.Vhost, "--formatter", "json",
		"name", "durable", "exclusive", "arguments").Output()
	if err != nil {
		t.Logf("rabbitmqctl list_queues: %v: queue properties not checked at the broker", err)
		return
	}
	var listed []struct {
		Name               string
		Durable, Exclusive bool
		Arguments          [][]any // [name, type, value]
	}
	if err := json.Unmarshal(out, &listed); err != nil {
		t.Fatalf("rabbitmqctl list_queues output: %v\n%s", err, out)
	}
	got := map[string]brokerQueue{}
	for _, q := range listed {
		if _, ok := want[q.Name]; !ok {
			continue
		}
		bq := brokerQueue{Durable: q.Durable, Exclusive: q.Exclusive, MaxLength: -1}
		for _, a := range q.Arguments {
			if len(a) == 3 && a[0] == "x-max-length" {
				if v, ok := a[2].(float64); ok {
					bq.MaxLength = int(v)
				}
				continue
			}
			t.Errorf("queue %q has argument %v, want only x-max-length", q.Name, a)
		}
		got[q.Name] = bq
	}
	if len(got) == 0 {
		t.Logf("rabbitmqctl lists none of %d queues: it talks to another broker; queue properties not checked there", len(want))
		return
	}
	for name, w := range want {
		if g, ok := got[name]; !ok {
			t.Errorf("queue %q is not at the broker", name)
		} else if g != w {
			t.Errorf("queue %q at the broker: %+v, want %+v", name, g, w)
		}
	}
}

// TestUnexpectedQueueArguments: a slot queue that a stranger declared
// with other arguments makes Create fail with PRECONDITION_FAILED, roll
// back, and leave the client working; a mutex name taken by a stranger's
// queue is reported as held, with the broker's reason.
func TestUnexpectedQueueArguments(t *testing.T) {
	u, _ := amqpURL(t)
	ctx := tctx(t)
	c := dial(t, u)
	a := admin(t, c)
	r := rawConn(t, u)
	name := uniqueName(t, u)
	in := amqpsem.DefaultLayout.Slot(name, 2)
	if err := r.declare(in, true, false, amqp.Table{"x-max-length": int32(5)}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.delete(in) })
	err := a.Create(ctx, name, 3)
	if err == nil || codeOf(err) != amqp.PreconditionFailed {
		t.Fatalf("Create over a slot queue with other arguments: %v; want PRECONDITION_FAILED", err)
	}
	t.Logf("stranger's slot queue: %v", err)
	if r.exists(amqpsem.DefaultLayout.Slot(name, 1)) {
		t.Fatal("a failed Create left slot 1 behind")
	}

	m := c.Locker()
	taken := uniqueName(t, u)
	if err := r.declare(taken, true, false, nil); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.delete(taken) })
	if _, err := m.TryLock(ctx, taken); !errors.Is(err, locks.ErrNotAcquired) || !strings.Contains(err.Error(), "RESOURCE_LOCKED") {
		t.Errorf("TryLock over a stranger's queue: %v; want ErrNotAcquired with the broker's reason", err)
	}
	lease, err := m.TryLock(ctx, uniqueName(t, u))
	if err != nil {
		t.Fatalf("the client after the refused declares: %v", err)
	}
	if err := lease.Release(ctx); err != nil {
		t.Fatal(err)
	}
}

// withQuery returns rawURL with its query parameter key set to value, or
// without it when value is "".
func withQuery(t *testing.T, rawURL, key, value string) string {
	t.Helper()
	u, err := url.Parse(rawURL)
	if err != nil {
		t.Fatal(err)
	}
	q := u.Query()
	if value == "" {
		q.Del(key)
	} else {
		q.Set(key, value)
	}
	u.RawQuery = q.Encode()
	return u.String()
}

// brokerHeartbeat returns the heartbeat interval the broker proposes (0:
// none). A client asking for none (heartbeat=0 in the URL) gets the
// broker's.
func brokerHeartbeat(t *testing.T, rawURL string) time.Duration {
	t.Helper()
	conn, err := amqp.Dial(withQuery(t, rawURL, "heartbeat", "0"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	return conn.Config.Heartbeat
}

// TestHeartbeatNegotiated: the negotiated interval, Client.Heartbeat, is
// what WithHeartbeat asks for (10s when not given), unless the broker
// proposes a lower one, or the URL's heartbeat= replaces it, lower or
// higher.
func TestHeartbeatNegotiated(t *testing.T) {
	u, _ := amqpURL(t)
	broker := brokerHeartbeat(t, u)
	t.Logf("the broker proposes a heartbeat of %v", broker)
	// The AMQP rule: the lower of the two proposals, unless one is 0.
	negotiated := func(asked time.Duration) time.Duration {
		if broker == 0 {
			return asked
		}
		return min(asked, broker)
	}
	plain := withQuery(t, u, "heartbeat", "")
	for _, tc := range []struct {
		what  string
		url   string
		opts  []amqpsem.Option
		asked time.Duration
	}{
		{"default", plain, nil, 10 * time.Second},
		{"option", plain, []amqpsem.Option{amqpsem.WithHeartbeat(7 * time.Second)}, 7 * time.Second},
		{"URL lower than the option", withQuery(t, plain, "heartbeat", "2"), []amqpsem.Option{amqpsem.WithHeartbeat(10 * time.Second)}, 2 * time.Second},
		{"URL higher than the option", withQuery(t, plain, "heartbeat", "3"), []amqpsem.Option{amqpsem.WithHeartbeat(time.Second)}, 3 * time.Second},
	} {
		c, err := amqpsem.Dial(tctx(t), tc.url, tc.opts...)
		if err != nil {
			t.Fatalf("%s: Dial: %v", tc.what, err)
		}
		got := c.Heartbeat()
		_ = c.Close(context.Background())
		if want := negotiated(tc.asked); got != want {
			t.Errorf("%s: Heartbeat() = %v, want %v (asked for %v, the broker proposes %v)", tc.what, got, want, tc.asked, broker)
		}
	}
	if broker != 0 && broker < 10*time.Second {
		t.Logf("the broker's %v is below some of the intervals asked for: those cases only show that it lowers them", broker)
	}
}

// TestHolderQueueArguments: holder queues B[i] and the mutex queue of
// the default layout are exclusive, with x-max-length 0 and no other
// argument, so that probes never pile up in them. Another connection's
// declare is refused (RESOURCE_LOCKED) whatever its arguments, so they
// are compared on their owner's connection: a declare with x-max-length
// 0 alone is accepted, one with other arguments refused
// (PRECONDITION_FAILED, which closes only that channel). (Durability is
// not compared: RabbitMQ 3.10 accepts a durable redeclare of an
// exclusive queue.)
func TestHolderQueueArguments(t *testing.T) {
	u, _ := amqpURL(t)
	name := uniqueName(t, u)
	ctx := tctx(t)
	c := dial(t, u, amqpsem.WithCreate(true))
	r := rawConn(t, u)
	l, err := semaphore(t, c, 1).TryAcquire(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	slot := l.(*amqpsem.Lease)
	m := c.Locker()
	mutexName := uniqueName(t, u)
	ml, err := m.TryLock(ctx, mutexName)
	if err != nil {
		t.Fatal(err)
	}
	held := ml.(*amqpsem.Lease)
	if want := amqpsem.DefaultLayout.Holder(name, 1); slot.Queue() != want {
		t.Fatalf("holder queue %q, want %q", slot.Queue(), want)
	}
	if held.Queue() != mutexName {
		t.Fatalf("mutex queue %q, want %q", held.Queue(), mutexName)
	}
	own := &raw{t: t, conn: c.ConnForTest()} // closed with c
	for _, q := range []string{slot.Queue(), held.Queue()} {
		if err := own.declare(q, false, true, maxLen0); err != nil {
			t.Errorf("%q is not an exclusive queue with x-max-length 0 and no other argument: %v", q, err)
		}
		for what, args := range map[string]amqp.Table{
			"no arguments":   nil,
			"x-max-length 1": {"x-max-length": int32(1)},
			"x-expires too":  {"x-max-length": int32(0), "x-expires": int32(60000)},
		} {
			if err := own.declare(q, false, true, args); codeOf(err) != amqp.PreconditionFailed {
				t.Errorf("a declare of %q with %s gave %v, want PRECONDITION_FAILED", q, what, err)
			}
		}
		if err := r.declare(q, false, true, maxLen0); codeOf(err) != amqp.ResourceLocked {
			t.Errorf("a declare of %q from another connection gave %v, want RESOURCE_LOCKED (exclusive)", q, err)
		}
	}
	// The refused declares broke only their own channels.
	for _, l := range []*amqpsem.Lease{slot, held} {
		if err := l.Verify(ctx); err != nil {
			t.Errorf("lease on %q after the test's declares: %v", l.Queue(), err)
		}
		if err := l.Release(ctx); err != nil {
			t.Errorf("release of %q: %v", l.Queue(), err)
		}
	}
}

// TestProbesExpireAtOnce: the messages existence checks publish expire at
// once (Expiration "0"), so they do not pile up even in a queue that
// would keep them. The slot queue here is a stranger's, declared without
// x-max-length: an acquire (which probes it: it finds slot 1) and its
// verifications leave no message in it, while a message published to it
// without an expiration stays.
func TestProbesExpireAtOnce(t *testing.T) {
	u, _ := amqpURL(t)
	name := uniqueName(t, u)
	ctx := tctx(t)
	r := rawConn(t, u)
	a1 := amqpsem.DefaultLayout.Slot(name, 1)
	if err := r.declare(a1, true, false, nil); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.delete(a1) })
	ch, err := r.conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	defer ch.Close()
	messages := func() int {
		t.Helper()
		q, err := ch.QueueDeclarePassive(a1, true, false, false, false, nil)
		if err != nil {
			t.Fatal(err)
		}
		return q.Messages
	}
	// The control: this queue keeps what it is sent.
	if err := ch.Confirm(false); err != nil {
		t.Fatal(err)
	}
	dc, err := ch.PublishWithDeferredConfirm("", a1, true, false, amqp.Publishing{Body: []byte("stays")})
	if err != nil || !dc.Wait() {
		t.Fatalf("publish to %q: %v", a1, err)
	}
	if n := messages(); n != 1 {
		t.Fatalf("%q holds %d messages after one was published, want 1", a1, n)
	}
	if _, err := ch.QueuePurge(a1, false); err != nil {
		t.Fatal(err)
	}

	l, err := semaphore(t, dial(t, u), amqpsem.MaxSemaphoreSize).TryAcquire(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	if slot := l.(*amqpsem.Lease).Slot(); slot != 1 {
		t.Fatalf("acquired slot %d, want 1", slot)
	}
	time.Sleep(4 * testVerify) // a few verifications, which probe A[1] too
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if n := messages(); n != 0 {
		t.Errorf("%q holds %d messages after an acquire and its verifications: probes did not expire", a1, n)
	}
}

// TestWithCreate: a Semaphore made WithCreate(n) creates a missing
// semaphore of n slots on its first acquire (and takes slot 1); an
// existing semaphore keeps its size; without WithCreate an acquire of a
// missing semaphore fails with ErrNoSlots and creates nothing.
func TestWithCreate(t *testing.T) {
	u, _ := amqpURL(t)
	ctx := tctx(t)
	c := dial(t, u)
	r := rawConn(t, u)

	missing := uniqueName(t, u)
	if _, err := semaphore(t, c, amqpsem.MaxSemaphoreSize).TryAcquire(ctx, missing); !errors.Is(err, amqpsem.ErrNoSlots) {
		t.Fatalf("TryAcquire without WithCreate of a missing semaphore = %v, want ErrNoSlots", err)
	}
	checkSlots(t, r, missing, 0)

	name := uniqueName(t, u)
	s := semaphore(t, dial(t, u, amqpsem.WithCreate(true)), 2)
	l, err := s.TryAcquire(ctx, name)
	if err != nil {
		t.Fatalf("TryAcquire WithCreate(2) of a missing semaphore: %v", err)
	}
	if slot := l.(*amqpsem.Lease).Slot(); slot != 1 {
		t.Errorf("the creating acquire got slot %d, want 1", slot)
	}
	checkSlots(t, r, name, 2)
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}

	// Another client asking for 3 finds the semaphore and leaves its size.
	if l, err = semaphore(t, dial(t, u, amqpsem.WithCreate(true)), 3).TryAcquire(ctx, name); err != nil {
		t.Fatalf("TryAcquire WithCreate(3) of the 2-slot semaphore: %v", err)
	}
	checkSlots(t, r, name, 2)
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
}
