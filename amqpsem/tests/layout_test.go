package amqpsem_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
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
	name := "amqpsem-python-" + fmt.Sprintf("%08x", rand.Uint32())
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
	name := newName(t, u)
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
	name := newName(t, u)
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

// Names whose queue would be a shared wake queue are refused before any
// I/O: such a mutex would block another name's turns, and be reported
// held while nobody holds it.
func TestWakeQueueNamesRefused(t *testing.T) {
	for _, name := range []string{"amqpsem.wake.jobs", "amqpsem.wake-sha256.00"} {
		for _, l := range []amqpsem.Layout{amqpsem.DefaultLayout, amqpsem.PythonLayout} {
			if err := l.CheckName(name); !errors.Is(err, locks.ErrInvalidName) {
				t.Errorf("CheckName(%q) = %v, want ErrInvalidName", name, err)
			}
		}
	}
	if err := amqpsem.DefaultLayout.CheckName("amqpsem.wakeful"); err != nil {
		t.Errorf(`CheckName("amqpsem.wakeful") = %v, want nil`, err)
	}
}

// TestWakePrefixNamesRefused: names whose queues start with the wake prefixes
// are refused before any I/O.
func TestWakePrefixNamesRefused(t *testing.T) {
	url, _ := amqpURL(t)
	c := dial(t, url, amqpsem.WithCreate(true))
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	m := c.Locker()
	s, _ := c.Semaphore(1)
	ps, _ := dial(t, url, amqpsem.WithCreate(true), amqpsem.WithLayout(amqpsem.PythonLayout)).Semaphore(1)
	a := admin(t, c)
	for _, n := range []string{"amqpsem.wake.x", "amqpsem.wake-sha256.ab", "amqpsem.wake.", "amq.x"} {
		if l, err := m.TryLock(ctx, n); !errors.Is(err, locks.ErrInvalidName) {
			if err == nil {
				l.Release(ctx)
			}
			t.Errorf("TryLock(%q): %v", n, err)
		}
		for _, sem := range []*amqpsem.Semaphore{s, ps} {
			if l, err := sem.TryAcquire(ctx, n); !errors.Is(err, locks.ErrInvalidName) {
				if err == nil {
					l.Release(ctx)
				}
				a.Destroy(ctx, n)
				t.Errorf("TryAcquire(%q): %v", n, err)
			}
		}
		if err := a.Create(ctx, n, 1); !errors.Is(err, locks.ErrInvalidName) {
			a.Destroy(ctx, n)
			t.Errorf("Create(%q): %v", n, err)
		}
	}
}

// One name, one layout: a create, add, resize or WithCreate of a name
// that has slot queues in the other layout is refused with
// ErrOtherLayout and creates nothing, both ways; Status says which
// layout a name is in.
func TestOneLayoutPerName(t *testing.T) {
	u, _ := amqpURL(t)
	needTransient(t, u)
	ctx := longCtx(t)
	c := dial(t, u)
	r := rawConn(t, u)
	def := admin(t, c)
	py := admin(t, c, amqpsem.WithLayout(amqpsem.PythonLayout))

	name := pythonName(t, r, 0, 3)
	if err := py.Create(ctx, name, 2); err != nil {
		t.Fatal(err)
	}
	refused := func(what string, err error) {
		t.Helper()
		if !errors.Is(err, amqpsem.ErrOtherLayout) {
			t.Errorf("%s of a Python-layout semaphore in the default layout = %v, want ErrOtherLayout", what, err)
		}
	}
	refused("Create", def.Create(ctx, name, 3))
	_, err := def.Add(ctx, name, 1)
	refused("Add", err)
	_, err = def.Resize(ctx, name, 3)
	refused("Resize", err)
	_, err = semaphore(t, dial(t, u, amqpsem.WithCreate(true)), 3).TryAcquire(ctx, name)
	refused("TryAcquire WithCreate", err)
	if q := amqpsem.DefaultLayout.Slot(name, 1); r.exists(q) {
		t.Fatalf("a refused change created %q", q)
	}
	_, err = semaphore(t, c, amqpsem.MaxSemaphoreSize).TryAcquire(ctx, name)
	if !errors.Is(err, amqpsem.ErrNoSlots) || !strings.Contains(err.Error(), "python") {
		t.Errorf("TryAcquire in the default layout of a Python-layout semaphore = %v, want ErrNoSlots naming the python layout", err)
	}
	st, err := def.Status(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	if st.Layout != "default" || st.Slots != 0 || len(st.OtherLayouts) != 1 || !strings.HasPrefix(st.OtherLayouts[0], "python") {
		t.Errorf("default-layout Status of a Python-layout semaphore = %+v", st)
	}
	if st, err := py.Status(ctx, name); err != nil || st.Layout != "python" || st.Slots != 2 || len(st.OtherLayouts) != 0 {
		t.Errorf("python-layout Status = %+v, %v", st, err)
	}
	// Destroying in the wrong layout removes nothing.
	if n, err := def.Destroy(ctx, name); err != nil || n != 0 {
		t.Errorf("default-layout Destroy of a Python-layout semaphore = %d, %v", n, err)
	}

	// And the other way round.
	other := newName(t, u)
	if err := def.Create(ctx, other, 2); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		for i := 1; i <= 3; i++ {
			if q := amqpsem.PythonLayout.Slot(other, i); r.exists(q) {
				r.delete(q)
			}
		}
	})
	if err := py.Create(ctx, other, 3); !errors.Is(err, amqpsem.ErrOtherLayout) {
		t.Errorf("Python-layout Create of a default-layout semaphore = %v, want ErrOtherLayout", err)
	}
	if q := amqpsem.PythonLayout.Slot(other, 1); r.exists(q) {
		t.Fatalf("a refused change created %q", q)
	}
	// Resizing within its own layout goes on.
	if ch, err := def.Resize(ctx, other, 3); err != nil || ch.After != 3 {
		t.Errorf("Resize in the semaphore's own layout = %+v, %v", ch, err)
	}
}

// pythonName returns a unique name for a Python-layout semaphore of at
// most n slots, padded to length bytes when length > 0, whose queues are
// deleted at cleanup.
func pythonName(t *testing.T, r *raw, length, n int) string {
	t.Helper()
	name := "amqpsem-py-" + fmt.Sprintf("%08x", rand.Uint32())
	if length > 0 {
		name += strings.Repeat("p", length-len(name))
	}
	t.Cleanup(func() {
		for i := 1; i <= n; i++ {
			if q := amqpsem.PythonLayout.Slot(name, i); len(q) <= 255 {
				r.delete(q)
			}
		}
	})
	return name
}

// Names of 248 to 251 bytes in the Python layout, which the Python client
// uses, are accepted with as many slots as their queue names allow; a
// name whose first slot queue would be too long is refused.
func TestLongPythonNames(t *testing.T) {
	u, _ := amqpURL(t)
	needTransient(t, u)
	ctx := longCtx(t)
	r := rawConn(t, u)
	c := dial(t, u, amqpsem.WithLayout(amqpsem.PythonLayout))
	py := admin(t, c)
	for _, tc := range []struct{ length, limit int }{{248, 9999}, {249, 999}, {250, 99}, {251, 9}} {
		name := pythonName(t, r, tc.length, 3)
		if got := amqpsem.PythonLayout.SlotLimit(name); got != tc.limit {
			t.Errorf("SlotLimit of a %d-byte name = %d, want %d", tc.length, got, tc.limit)
		}
		if err := py.Create(ctx, name, 3); err != nil {
			t.Errorf("Create of a %d-byte Python-layout name: %v", tc.length, err)
			continue
		}
		l, err := semaphore(t, c, amqpsem.MaxSemaphoreSize).TryAcquire(ctx, name)
		if err != nil {
			t.Errorf("TryAcquire of a %d-byte name: %v", tc.length, err)
			continue
		}
		if st, err := py.Status(ctx, name); err != nil || st.Slots != 3 || !slices.Equal(st.Held, []int{1}) {
			t.Errorf("Status of a %d-byte name = %+v, %v", tc.length, st, err)
		}
		_ = l.Release(ctx)
	}
	long := pythonName(t, r, 251, 10)
	if _, err := py.Resize(ctx, long, 10); !errors.Is(err, amqpsem.ErrInvalidSlots) {
		t.Errorf("10 slots on a 251-byte Python-layout name = %v, want ErrInvalidSlots", err)
	}
	if q := amqpsem.PythonLayout.Slot(long, 1); r.exists(q) {
		t.Errorf("a refused resize created %q", q)
	}
	tooLong := strings.Repeat("p", 252)
	if err := py.Create(ctx, tooLong, 1); !errors.Is(err, locks.ErrInvalidName) {
		t.Errorf("Create of a 252-byte Python-layout name (its slot queue would be 256 bytes) = %v, want ErrInvalidName", err)
	}
}

// TestWithCreateNeverMakesOtherLayout: a semaphore of one layout exists; a Semaphore
// of the other layout made WithCreate acquires the name. "A name is one
// layout's semaphore ... so that a mistake cannot make two semaphores of one
// name": it must not create the other layout's slot queues beside it.
func TestWithCreateNeverMakesOtherLayout(t *testing.T) {
	url, _ := amqpURL(t)
	for _, first := range []amqpsem.Layout{amqpsem.PythonLayout, amqpsem.DefaultLayout} {
		other := amqpsem.DefaultLayout
		if first.Name == "default" {
			other = amqpsem.PythonLayout
		}
		t.Run(first.Name+"-then-"+other.Name, func(t *testing.T) {
			name := newName(t, url)
			c := dial(t, url)
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			if err := admin(t, c, amqpsem.WithLayout(first)).Create(ctx, name, 2); err != nil {
				t.Fatal(err)
			}
			s, err := dial(t, url, amqpsem.WithLayout(other), amqpsem.WithCreate(true)).Semaphore(3)
			if err != nil {
				t.Fatal(err)
			}
			var leases int
			for range 4 {
				l, err := s.TryAcquire(ctx, name)
				t.Logf("%s WithCreate(3) TryAcquire: %v", other.Name, err)
				if err == nil {
					leases++
					defer l.Release(context.Background())
				}
			}
			n, err := admin(t, c, amqpsem.WithLayout(other)).Max(ctx, name)
			if err != nil {
				t.Fatal(err)
			}
			if n != 0 || leases != 0 {
				t.Errorf("%s semaphore %q exists: WithCreate made %d %s slots beside it, %d leases taken", first.Name, name, n, other.Name, leases)
			}
		})
	}
}

// TestConcurrentCreateOfBothLayouts: two administrators of different layouts
// create the same name at once; at most one may succeed.
func TestConcurrentCreateOfBothLayouts(t *testing.T) {
	url, _ := amqpURL(t)
	cp := dial(t, url)
	cd := dial(t, url)
	ap := admin(t, cp, amqpsem.WithLayout(amqpsem.PythonLayout))
	ad := admin(t, cd)
	for round := range 8 {
		name := newName(t, url)
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		var wg sync.WaitGroup
		var ep, ed error
		wg.Go(func() { ep = ap.Create(ctx, name, 2) })
		wg.Go(func() { ed = ad.Create(ctx, name, 3) })
		wg.Wait()
		np, _ := ap.Max(ctx, name)
		nd, _ := ad.Max(ctx, name)
		cancel()
		if np > 0 && nd > 0 {
			t.Fatalf("round %d: both layouts created: python %d slots (err %v), default %d slots (err %v)", round, np, ep, nd, ed)
		}
		if (ep == nil) == (ed == nil) {
			t.Errorf("round %d: python err %v, default err %v", round, ep, ed)
		}
		if ep != nil && !errors.Is(ep, amqpsem.ErrOtherLayout) || ed != nil && !errors.Is(ed, amqpsem.ErrOtherLayout) {
			t.Errorf("round %d: refusal not ErrOtherLayout: python %v, default %v", round, ep, ed)
		}
	}
}

// TestCommandLayoutFromEnvAndFlag: the command's layout from AMQPSEM_LAYOUT and
// --layout, against the library's.
func TestCommandLayoutFromEnvAndFlag(t *testing.T) {
	url, _ := amqpURL(t)
	name := newName(t, url)
	env := []string{"AMQPSEM_URL=" + url}
	py := append(env, "AMQPSEM_LAYOUT=python")
	out, code := runCommand(t, 15*time.Second, py, "create", name, "2")
	if code != 0 {
		t.Fatalf("create via env python: %d %s", code, out)
	}
	out, code = runCommand(t, 15*time.Second, env, "create", name, "3")
	t.Logf("create default beside python: %d %s", code, out)
	if code != 1 {
		t.Errorf("create default beside python: exit %d: %s", code, out)
	}
	out, code = runCommand(t, 15*time.Second, py, "--layout", "default", "resize", name, "+1")
	t.Logf("resize --layout default with env python: %d %s", code, out)
	if code != 1 {
		t.Errorf("resize --layout default (env python) of a python semaphore: exit %d: %s", code, out)
	}
	out, code = runCommand(t, 15*time.Second, env, "resize", name, "5")
	if code != 1 {
		t.Errorf("resize default of a python semaphore: exit %d: %s", code, out)
	}
	c := dial(t, url)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := admin(t, c).Add(ctx, name, 1); !errors.Is(err, amqpsem.ErrOtherLayout) {
		t.Errorf("library default Add on python semaphore: %v", err)
	}
	if n, _ := admin(t, c).Max(ctx, name); n != 0 {
		t.Errorf("default layout slots of %q: %d", name, n)
	}
	if n, _ := admin(t, c, amqpsem.WithLayout(amqpsem.PythonLayout)).Max(ctx, name); n != 2 {
		t.Errorf("python layout slots of %q: %d, want 2", name, n)
	}
	out, code = runCommand(t, 15*time.Second, env, "status", name)
	t.Logf("status (default) of a python semaphore: %d %s", code, out)
	if !strings.Contains(out, "python") {
		t.Errorf("status in the default layout of a python semaphore does not say so: exit %d: %s", code, out)
	}
	out, code = runCommand(t, 15*time.Second, py, "--layout", "bogus", "status", name)
	if code != 64 {
		t.Errorf("--layout bogus: exit %d, want 64 (usage): %s", code, out)
	}
	out, code = runCommand(t, 15*time.Second, append(env, "AMQPSEM_LAYOUT=Python "), "create", name+"z", "1")
	t.Logf("AMQPSEM_LAYOUT='Python ': %d %s", code, out)
	if code == 0 && !strings.Contains(out, "python") {
		destroyAtCleanup(t, url, name+"z")
	}
}

// FuzzLayoutNames: for both layouts, a name is accepted or refused with
// ErrInvalidName, never a panic; an accepted name's queues are legal
// RabbitMQ queue names for every slot up to its SlotLimit and never collide with another
// accepted name's mutex.
func FuzzLayoutNames(f *testing.F) {
	for _, s := range []string{"jobs", "jobs-3-A", "jobs-A-3", "amq.x", "", "a\x00b", strings.Repeat("x", 250), "ünï", "\xff"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, name string) {
		for _, l := range []amqpsem.Layout{amqpsem.DefaultLayout, amqpsem.PythonLayout} {
			err := l.CheckName(name)
			if err != nil {
				if !errors.Is(err, locks.ErrInvalidName) {
					t.Fatalf("CheckName(%q) = %v, want ErrInvalidName", name, err)
				}
				continue
			}
			limit := l.SlotLimit(name)
			if limit < 1 {
				t.Fatalf("accepted %q, which has no slot: SlotLimit = %d", name, limit)
			}
			for _, i := range []int{1, min(2, limit), limit} {
				for _, q := range []string{l.Slot(name, i), l.Holder(name, i)} {
					if len(q) > 255 || strings.HasPrefix(q, "amq.") {
						t.Fatalf("accepted %q, but its queue %q is not a legal queue name", name, q)
					}
					// A slot or holder queue must not be the mutex of
					// another accepted name.
					if l.CheckName(q) == nil && l.Mutex(q) == q {
						t.Fatalf("accepted %q, and also %q, the name of its queue %d", name, q, i)
					}
				}
			}
		}
	})
}
