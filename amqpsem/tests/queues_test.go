package amqpsem_test

import (
	"context"
	"encoding/json"
	"errors"
	"os/exec"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/latchkey-go/latchkey/locks"

	"github.com/latchkey-go/latchkey/amqpsem"
)

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
	// Other queues of the shared broker may say other things (a quorum
	// queue's exclusive is ""): the properties are read as they come, and
	// checked for the queues in want only.
	var listed []struct {
		Name               string
		Durable, Exclusive any
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
		durable, ok1 := q.Durable.(bool)
		exclusive, ok2 := q.Exclusive.(bool)
		if !ok1 || !ok2 {
			t.Errorf("queue %q: rabbitmqctl says durable %v, exclusive %v; want true or false", q.Name, q.Durable, q.Exclusive)
		}
		bq := brokerQueue{Durable: durable, Exclusive: exclusive, MaxLength: -1}
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
	name := newName(t, u)
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
	taken := newName(t, u)
	if err := r.declare(taken, true, false, nil); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.delete(taken) })
	if _, err := m.TryLock(ctx, taken); !errors.Is(err, locks.ErrNotAcquired) || !strings.Contains(err.Error(), "RESOURCE_LOCKED") {
		t.Errorf("TryLock over a stranger's queue: %v; want ErrNotAcquired with the broker's reason", err)
	}
	lease, err := m.TryLock(ctx, newName(t, u))
	if err != nil {
		t.Fatalf("the client after the refused declares: %v", err)
	}
	if err := lease.Release(ctx); err != nil {
		t.Fatal(err)
	}
}

// TestHolderQueueArguments: holder queues B[i] and the mutex queue of
// the default layout are exclusive: another connection's declare is
// refused (RESOURCE_LOCKED) whatever its arguments.
func TestHolderQueueArguments(t *testing.T) {
	u, _ := amqpURL(t)
	name := newName(t, u)
	ctx := tctx(t)
	c := dial(t, u, amqpsem.WithCreate(true))
	r := rawConn(t, u)
	l, err := semaphore(t, c, 1).TryAcquire(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	slot := l.(*amqpsem.Lease)
	m := c.Locker()
	mutexName := newName(t, u)
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
	// Their arguments are compared on c's own connection by the internal
	// TestHolderQueueArgumentsOnOwnConnection; here, another connection is
	// refused whatever it asks.
	for _, q := range []string{slot.Queue(), held.Queue()} {
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
	name := newName(t, u)
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
