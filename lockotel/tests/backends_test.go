package tests

// Every call of a backend's own API (constructors, Close, the
// administrator's ways of taking a lease away) is in this file, so that
// a change of the backends' API touches only it.

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/redis/go-redis/v9"

	"github.com/latchkey-go/latchkey/amqpsem"
	"github.com/latchkey-go/latchkey/contracttest/testenv"
	"github.com/latchkey-go/latchkey/contracttest/testenv/natsenv"
	"github.com/latchkey-go/latchkey/locks"
	"github.com/latchkey-go/latchkey/natsputex"
	"github.com/latchkey-go/latchkey/redlockprio"
)

var seq atomic.Int64

// unique returns a name unique to this run.
func unique(prefix string) string {
	return fmt.Sprintf("%s-%d-%d", prefix, time.Now().UnixNano()%1e9, seq.Add(1))
}

func setupContext(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// natsEnv is an embedded NATS server and one bucket on it.
type natsEnv struct {
	url, bucket string
	kv          jetstream.KeyValue // the administrator's view of the bucket
}

// natsputex timings: silence of F·R = 300ms makes a holder replaceable.
var natsOpts = []natsputex.Option{
	natsputex.WithRenewInterval(100 * time.Millisecond),
	natsputex.WithFailureThreshold(3),
	natsputex.WithConfirmations(1),
}

func startNATS(t testing.TB) *natsEnv {
	e := &natsEnv{url: natsenv.StartServer(t).URL(), bucket: unique("lockotel")}
	e.locker(t, "admin") // creates the bucket
	nc, err := nats.Connect(e.url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	if e.kv, err = js.KeyValue(setupContext(t), e.bucket); err != nil {
		t.Fatal(err)
	}
	return e
}

// locker returns the Locker of a new client with holder id holder, and a
// function that kills the client (closes its connection abruptly).
func (e *natsEnv) locker(t testing.TB, holder string) (locks.Locker, func()) {
	t.Helper()
	nc, err := nats.Connect(e.url, natsputex.ConnectOptions()...)
	if err != nil {
		t.Fatal(err)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	c, err := natsputex.New(setupContext(t), js, e.bucket, append(natsOpts, natsputex.WithHolderID(holder))...)
	if err != nil {
		nc.Close()
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = c.Close(context.Background())
		nc.Close()
	})
	return c.Locker(), nc.Close
}

// revoke deletes name's key, as an administrator would.
func (e *natsEnv) revoke(t testing.TB, name string) {
	t.Helper()
	if err := e.kv.Delete(setupContext(t), name); err != nil {
		t.Fatal(err)
	}
}

// amqpEnv is a RabbitMQ broker.
type amqpEnv struct{ url string }

func startAMQP(t testing.TB) *amqpEnv { return &amqpEnv{url: testenv.AMQPURL(t)} }

func (e *amqpEnv) client(t testing.TB, more ...amqpsem.Option) *amqpsem.Client {
	t.Helper()
	opts := append([]amqpsem.Option{
		amqpsem.WithHeartbeat(time.Second),
		amqpsem.WithVerifyInterval(250 * time.Millisecond),
		amqpsem.WithBackoff(locks.Backoff{Min: 10 * time.Millisecond, Max: 200 * time.Millisecond}),
	}, more...)
	c, err := amqpsem.Dial(setupContext(t), e.url, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close(context.Background()) })
	return c
}

// locker returns the Locker (the exclusive-queue mutex) of a new client.
func (e *amqpEnv) locker(t testing.TB) locks.Locker {
	t.Helper()
	return e.client(t).Locker()
}

// semaphore returns a Semaphore of a new client that creates its names
// with size slots; the test destroys them at cleanup.
func (e *amqpEnv) semaphore(t testing.TB, size int) locks.Semaphore {
	t.Helper()
	s, err := e.client(t, amqpsem.WithCreate(true)).Semaphore(size)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// revoke destroys the semaphore name, as an administrator would: its
// holders' next verification finds their slot gone.
func (e *amqpEnv) revoke(t testing.TB, name string) {
	t.Helper()
	a, err := e.client(t).Admin()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := a.Destroy(setupContext(t), name); err != nil {
		t.Fatal(err)
	}
}

// destroyAtCleanup destroys the semaphore name at the end of the test.
func (e *amqpEnv) destroyAtCleanup(t testing.TB, name string) {
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		c, err := amqpsem.Dial(ctx, e.url)
		if err != nil {
			return
		}
		defer c.Close(ctx)
		if a, err := c.Admin(); err == nil {
			_, _ = a.Destroy(ctx, name)
		}
	})
}

// redisEnv is three Redis masters started for the test.
type redisEnv struct{ addrs []string }

func startRedis(t testing.TB) *redisEnv {
	e := &redisEnv{}
	for _, s := range testenv.StartRedis(t, 3) {
		e.addrs = append(e.addrs, s.Addr())
	}
	return e
}

// locker returns a new Locker on the masters with priority p.
func (e *redisEnv) locker(t testing.TB, p int) locks.Locker {
	t.Helper()
	var masters []redis.UniversalClient
	for _, a := range e.addrs {
		rc := redis.NewClient(&redis.Options{Addr: a})
		t.Cleanup(func() { _ = rc.Close() })
		masters = append(masters, rc)
	}
	c, err := redlockprio.New(masters, redlockprio.WithTTL(600*time.Millisecond),
		redlockprio.WithRenewInterval(190*time.Millisecond), redlockprio.WithPriority(p))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close(context.Background()) })
	return c.Locker()
}

// revoke deletes name's key on every master, as an administrator would.
func (e *redisEnv) revoke(t testing.TB, name string) {
	t.Helper()
	for _, a := range e.addrs {
		rc := redis.NewClient(&redis.Options{Addr: a})
		err := rc.Del(setupContext(t), "latchkey:{"+name+"}:1").Err()
		_ = rc.Close()
		if err != nil {
			t.Fatal(err)
		}
	}
}
