package benchmarks

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/nats-io/nats.go"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/redis/go-redis/v9"
)

// BrokerRTT returns the median of n round trips to broker b of env with its
// cheapest request: PING to the first Redis master, a PING/PONG flush to
// NATS, basic.qos to RabbitMQ. It is the unit in which hand-off latency is
// judged ("within k round trips of its broker").
//
// With idle > 0 each round trip starts after the connection has been idle
// that long, as a hand-off's do (the releaser and the waiter were
// parked): it then includes waking the threads on both ends that a
// back-to-back round trip keeps running.
func BrokerRTT(ctx context.Context, env Env, b Broker, n int, idle time.Duration) (time.Duration, error) {
	if err := env.need(b, 1); err != nil {
		return 0, err
	}
	var once func() error
	switch b {
	case Redis:
		c := redis.NewClient(&redis.Options{Addr: env.Redis[0], PoolSize: 1})
		defer c.Close()
		once = func() error { return c.Ping(ctx).Err() }
	case NATS, NATSCluster:
		url := env.NATS
		if b == NATSCluster {
			url = env.NATSCluster
		}
		nc, err := nats.Connect(url)
		if err != nil {
			return 0, err
		}
		defer nc.Close()
		once = func() error { _, err := nc.RTT(); return err }
	case AMQP:
		conn, err := amqp.Dial(env.AMQP)
		if err != nil {
			return 0, err
		}
		defer conn.Close()
		ch, err := conn.Channel()
		if err != nil {
			return 0, err
		}
		once = func() error { return ch.Qos(0, 0, false) }
	default:
		return 0, fmt.Errorf("benchmarks: no round trip for %v", b)
	}
	ds := make([]time.Duration, 0, n)
	for range n + 5 {
		if idle > 0 {
			time.Sleep(idle)
		}
		t0 := time.Now()
		if err := once(); err != nil {
			return 0, fmt.Errorf("%v round trip: %w", b, err)
		}
		ds = append(ds, time.Since(t0))
	}
	ds = ds[5:] // warm-up
	slices.Sort(ds)
	return ds[len(ds)/2], nil
}
