package benchmarks

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/latchkey-go/latchkey/locks"
	"github.com/latchkey-go/latchkey/locks/driver"
	amqp "github.com/rabbitmq/amqp091-go"
)

// --- floor: exclusive queue declare + delete ---

// amqpFloor is the least a RabbitMQ lock can cost: declaring an exclusive
// queue named after the lock takes it (another connection's declare fails
// with RESOURCE_LOCKED, which closes that channel), deleting the queue frees
// it: one round trip each. Waiting is plain polling with a short jittered
// back-off, reopening the channel after each refusal.
type amqpFloor struct{ url string }

func newAMQPFloor(_ context.Context, env Env) (System, error) {
	if err := env.need(AMQP, 0); err != nil {
		return nil, err
	}
	return &amqpFloor{url: env.AMQP}, nil
}

func (s *amqpFloor) NewClient(context.Context) (Client, error) {
	conn, err := amqp.Dial(s.url)
	if err != nil {
		return nil, fmt.Errorf("amqp: dial: %w", err)
	}
	ch, err := conn.Channel()
	if err != nil {
		_ = conn.Close()
		return nil, err
	}
	return &amqpFloorClient{conn: conn, ch: ch}, nil
}

func (s *amqpFloor) Close() error { return nil }

func (s *amqpFloor) amqpConnections() {}

type amqpFloorClient struct {
	conn *amqp.Connection
	mu   sync.Mutex
	ch   *amqp.Channel
}

func (c *amqpFloorClient) channel() (*amqp.Channel, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.ch.IsClosed() {
		ch, err := c.conn.Channel()
		if err != nil {
			return nil, err
		}
		c.ch = ch
	}
	return c.ch, nil
}

func (c *amqpFloorClient) Lock(ctx context.Context, name string) (Held, error) {
	return driver.Wait(ctx, nil, floorBackoff, func(ctx context.Context) (Held, error) {
		ch, err := c.channel()
		if err != nil {
			return nil, err
		}
		_, err = ch.QueueDeclare(name, false, false, true, false, nil)
		var aerr *amqp.Error
		switch {
		case errors.As(err, &aerr) && aerr.Code == amqp.ResourceLocked:
			return nil, fmt.Errorf("amqp: %q: %w: %w", name, locks.ErrNotAcquired, err)
		case err != nil:
			return nil, err
		}
		return amqpFloorHeld{c, name}, nil
	})
}

func (c *amqpFloorClient) Close() error { return c.conn.Close() }

type amqpFloorHeld struct {
	c    *amqpFloorClient
	name string
}

func (h amqpFloorHeld) Release(context.Context) error {
	ch, err := h.c.channel()
	if err != nil {
		return err
	}
	_, err = ch.QueueDelete(h.name, false, false, false)
	return err
}
