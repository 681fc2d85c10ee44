package amqpsem

import (
	"context"
	"strings"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// sideConn is a short-lived connection of its own, for declares that a
// broker may answer by closing the connection: RabbitMQ 4 refuses queues
// that are neither durable nor exclusive (the deprecated feature
// transient_nonexcl_queues) with a connection error, which on the
// session's connection would end every lease on it.
type sideConn struct {
	s    *session
	conn *amqp.Connection
	ch   *amqp.Channel
}

// dialSide opens a side connection with the client's connection options.
func (c *session) dialSide(ctx context.Context) (*sideConn, error) {
	o := c.opts
	o.connName = sideName(o.connName)
	conn, _, _, err := dialConn(ctx, c.client.url, o)
	if err != nil {
		return nil, err
	}
	return &sideConn{s: c, conn: conn}, nil
}

func sideName(name string) string {
	if name == "" {
		name = "amqpsem"
	}
	name += " (transient queues)"
	if len(name) > maxShortString {
		name = name[:maxShortString]
	}
	return name
}

// declare declares the non-exclusive queue q. ctx bounds the wait; when
// it ends first, the connection is closed under the declare.
func (sc *sideConn) declare(ctx context.Context, q string, durable bool, args amqp.Table) error {
	return sc.s.run(ctx, 0, func() error {
		if sc.ch == nil || sc.ch.IsClosed() {
			ch, err := sc.conn.Channel()
			if err != nil {
				return err
			}
			sc.ch = ch
		}
		_, err := sc.ch.QueueDeclare(q, durable, false, false, false, args)
		return err
	}, nil)
}

func (sc *sideConn) close() {
	_ = sc.conn.CloseDeadline(time.Now().Add(2 * time.Second))
}

// transientRefused reports whether err is the broker's refusal of a
// queue that is neither durable nor exclusive: RabbitMQ 4 closes the
// connection with INTERNAL_ERROR (541), "Feature `transient_nonexcl_queues`
// is deprecated".
func transientRefused(err error) bool {
	return err != nil && strings.Contains(err.Error(), "transient_nonexcl_queues")
}
