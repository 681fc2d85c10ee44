package amqpsem_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"regexp"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

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
