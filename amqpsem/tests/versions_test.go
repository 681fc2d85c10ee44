package amqpsem_test

import (
	"context"
	"errors"
	"net"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/latchkey-go/latchkey/amqpsem"
)

// RabbitMQ 4 deprecates queues that are neither durable nor exclusive
// (transient_nonexcl_queues) and, from 4.3, refuses them by default by
// closing the connection that declares one. This broker is 3.x: these
// tests check what amqpsem declares, and the refusal's handling runs
// where the broker refuses (the docker-compose RabbitMQ 4 service, CI).

// transientPermitted reports whether the broker accepts a queue that is
// neither durable nor exclusive, declared on a connection of its own.
func transientPermitted(t *testing.T, u string) bool {
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
	q, err := ch.QueueDeclare("", false, true, false, false, nil)
	if err != nil {
		if strings.Contains(err.Error(), "transient_nonexcl_queues") {
			return false
		}
		t.Fatalf("declaring a transient non-exclusive queue: %v", err)
	}
	_, _ = ch.QueueDelete(q.Name, false, false, false)
	return true
}

// needTransient skips a test of the Python layout on a broker that
// refuses its transient slot queues.
func needTransient(t *testing.T, u string) {
	t.Helper()
	if !transientPermitted(t, u) {
		t.Skip("this broker refuses transient non-exclusive queues (RabbitMQ 4.3+ without deprecated_features.permit.transient_nonexcl_queues = true), which the Python layout's slot queues are; TestPythonLayoutRefusedClearly covers it")
	}
}

// The shared wake queue a waiting Lock consumes is durable, with
// x-expires: the kind of queue RabbitMQ 4 accepts. A durable declare
// with its arguments is equivalent; a transient one is refused.
func TestWakeQueuesDurable(t *testing.T) {
	u, _ := amqpURL(t)
	ctx := tctx(t)
	name := newName(t, u)
	holder := dial(t, u).Locker()
	l, err := holder.TryLock(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	waiter := dial(t, u).Locker()
	got := make(chan error, 1)
	go func() {
		l, err := waiter.Lock(ctx, name)
		if err == nil {
			_ = l.Release(ctx)
		}
		got <- err
	}()
	r := rawConn(t, u)
	q := "amqpsem.wake." + name
	r.waitConsumers(q, 1)
	args := amqp.Table{"x-max-length": int32(1), "x-message-ttl": int32(1000), "x-expires": int32(60000)}
	if err := r.declare(q, true, false, args); err != nil {
		t.Errorf("a durable declare of the wake queue %q with its arguments: %v; want it equivalent", q, err)
	}
	if err := r.declare(q, false, false, args); codeOf(err) != amqp.PreconditionFailed {
		t.Errorf("a transient declare of the wake queue %q = %v, want PRECONDITION_FAILED", q, err)
	}
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-got; err != nil {
		t.Fatalf("the waiter: %v", err)
	}
}

// The Python layout's transient slot queues are declared on a connection
// of their own: a broker refusing them closes that one, not the
// connection that holds the client's leases.
func TestTransientSlotQueuesOnSideConnection(t *testing.T) {
	u, host := amqpURL(t)
	ctx := tctx(t)
	needTransient(t, u)
	var dials atomic.Int32
	counting := amqpsem.WithDial(func(ctx context.Context, network, _ string) (net.Conn, error) {
		dials.Add(1)
		var d net.Dialer
		return d.DialContext(ctx, network, host)
	})
	c := dial(t, u, counting, amqpsem.WithLayout(amqpsem.PythonLayout))
	r := rawConn(t, u)
	held := pythonName(t, r, 0, 2)
	a := admin(t, c)
	if err := a.Create(ctx, held, 1); err != nil {
		t.Fatal(err)
	}
	l, err := semaphore(t, c, amqpsem.MaxSemaphoreSize).TryAcquire(ctx, held)
	if err != nil {
		t.Fatal(err)
	}
	before := dials.Load()
	name := pythonName(t, r, 0, 2)
	if err := a.Create(ctx, name, 2); err != nil {
		t.Fatal(err)
	}
	if n := dials.Load() - before; n != 1 {
		t.Errorf("creating a Python-layout semaphore dialled %d connections, want 1 of its own", n)
	}
	if err := l.(*amqpsem.Lease).Verify(ctx); err != nil {
		t.Errorf("the lease on the client's connection: %v", err)
	}
	if n, err := a.Max(ctx, name); err != nil || n != 2 {
		t.Errorf("Max = %d, %v; want 2", n, err)
	}
}

// On a broker that refuses transient non-exclusive queues, creating a
// Python-layout semaphore fails with ErrTransientRefused, naming the
// broker setting, and the client's leases live on.
func TestPythonLayoutRefusedClearly(t *testing.T) {
	u, _ := amqpURL(t)
	ctx := tctx(t)
	if transientPermitted(t, u) {
		t.Skip("this broker permits transient non-exclusive queues (RabbitMQ 3, or 4 before 4.3 or permitted): its refusal cannot be seen here")
	}
	c := dial(t, u)
	name := newName(t, u)
	if err := admin(t, c).Create(ctx, name, 1); err != nil {
		t.Fatal(err)
	}
	l, err := semaphore(t, c, amqpsem.MaxSemaphoreSize).TryAcquire(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	py := admin(t, c, amqpsem.WithLayout(amqpsem.PythonLayout))
	pyName := newName(t, u) + "-py"
	err = py.Create(ctx, pyName, 2)
	if !errors.Is(err, amqpsem.ErrTransientRefused) || !strings.Contains(err.Error(), "deprecated_features.permit.transient_nonexcl_queues = true") {
		t.Fatalf("Python-layout Create on a refusing broker = %v, want ErrTransientRefused naming the setting", err)
	}
	time.Sleep(200 * time.Millisecond)
	if err := l.(*amqpsem.Lease).Verify(ctx); err != nil {
		t.Fatalf("the client's lease after the refusal: %v", err)
	}
}
