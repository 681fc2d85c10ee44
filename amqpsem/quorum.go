package amqpsem

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/latchkey-go/latchkey/locks"
)

// quorumSuffix ends the name of the token queue of a quorum lock or
// semaphore: the tokens of "jobs" are messages on the queue "jobs-Q".
const quorumSuffix = "-Q"

// Header names of a token message.
const (
	headerSlot = "latchkey-slot" // the slot the token stands for, from 1
	headerBase = "latchkey-base" // added to the broker's count to make the fencing token
)

// Quorum is the quorum-queue layout of a [Client]: a lock or semaphore
// named N is a durable quorum queue "N-Q" holding one token message per
// slot (one for a lock). Acquiring takes a token and holds it
// unacknowledged on a channel of its own; releasing rejects it with
// requeue; a lost channel or connection gives it back by itself. Nothing
// is declared per acquisition, a released token goes straight to the
// longest-waiting client, the broker's count of the token's deliveries
// is the fencing token, and the queue is replicated by Raft on a
// cluster. See docs/protocols/amqpsem.md for the protocol and its
// argument.
//
// A lock or semaphore must exist before it is acquired: [Quorum.Create]
// makes it, under the name's administration mutex, or a client dialed
// [WithCreate] makes it on first use. [Quorum.Destroy] deletes it, and
// with it the count its fencing tokens come from: a name made again
// starts its tokens from 1 (see [QuorumLease.Token]).
//
// A Quorum is safe for concurrent use.
type Quorum struct {
	cl *Client
}

// Quorum returns the client's quorum-queue layout.
func (c *Client) Quorum() *Quorum { return &Quorum{cl: c} }

// QuorumQueue returns the name of the token queue of name.
func QuorumQueue(name string) string { return name + quorumSuffix }

// checkQuorumName validates name for the quorum layout and returns its
// token queue. The name's administration mutex is the default layout's
// mutex queue, the name itself, so the default layout's rules apply too.
func checkQuorumName(name string) (string, error) {
	if _, err := DefaultLayout.checkMutexName(name); err != nil {
		return "", err
	}
	q := QuorumQueue(name)
	if err := queueName(q); err != nil {
		return "", fmt.Errorf("%w %q: %w", locks.ErrInvalidName, name, err)
	}
	return q, nil
}

// brokerVersion returns the major and minor version the broker of
// conn announces, or 0, 0 when it does not say.
func brokerVersion(conn *amqp.Connection) (major, minor int) {
	v, _ := conn.Properties["version"].(string)
	parts := strings.SplitN(v, ".", 3)
	if len(parts) < 2 {
		return 0, 0
	}
	major, _ = strconv.Atoi(parts[0])
	minor, _ = strconv.Atoi(parts[1])
	return major, minor
}

// quorumArgs returns the declare arguments of a token queue on a broker
// of version major.minor. RabbitMQ 4.0 gives quorum queues a default
// delivery limit of 20, after which a returned message is dropped: the
// token, after 20 hand-offs. From 4.0, x-delivery-limit -1 disables the
// limit. On 3.x there is no limit unless one is set, and -1 is not
// "unlimited" there: 3.10.8 dropped the token at its first return
// (measured), so the argument is left out.
func quorumArgs(major, _ int) amqp.Table {
	args := amqp.Table{"x-queue-type": "quorum"}
	if major >= 4 {
		args["x-delivery-limit"] = int64(-1)
	}
	return args
}

// errNoQueue is the cause of an acquire on a name that has no token
// queue.
var errNoQueue = fmt.Errorf("%w (no token queue)", ErrNoSlots)

// Create makes the quorum lock or semaphore name with slots tokens (1 for
// a lock), under the name's administration mutex. It returns an error
// matching [ErrExists] when the token queue exists, and one matching
// [ErrOtherLayout] when name is a semaphore of the default or Python
// layout. Invalid names match [locks.ErrInvalidName] and a slots count
// out of 1..[MaxSemaphoreSize] [ErrInvalidSlots], before any I/O.
func (q *Quorum) Create(ctx context.Context, name string, slots int) error {
	if err := checkCtx(ctx, "create", name); err != nil {
		return err
	}
	if err := q.create(ctx, name, slots); err != nil {
		return q.cl.fail(ctx, "create", name, err)
	}
	return nil
}

func (q *Quorum) create(ctx context.Context, name string, slots int) error {
	queue, err := checkQuorumName(name)
	if err != nil {
		return err
	}
	if err := checkCount("slots", slots); err != nil {
		return err
	}
	a, err := q.cl.Admin(WithLayout(DefaultLayout))
	if err != nil {
		return err
	}
	a, err = a.bind(ctx)
	if err != nil {
		return err
	}
	var noticed bool
	mutex, err := a.lockAdmin(ctx, name, &noticed)
	if err != nil {
		return errorf("amqpsem: administration mutex: %w", err)
	}
	defer func() { _ = mutex.Release(context.WithoutCancel(ctx)) }()
	var cand []otherLayout
	for _, l := range []Layout{DefaultLayout, PythonLayout} {
		if sq := l.Slot(name, 1); queueName(sq) == nil {
			cand = append(cand, otherLayout{l.name(), sq})
		}
	}
	others, err := existing(ctx, a.prober(), cand, func(o otherLayout) string { return o.queue })
	if err != nil {
		return err
	}
	if len(others) > 0 {
		return errorf("%w: refused in the quorum layout, as it is a semaphore of %s", ErrOtherLayout, describe(others))
	}
	s := a.c
	major, minor := brokerVersion(s.conn)
	args := quorumArgs(major, minor)
	if d := q.cl.opts.holdTimeout; d > 0 {
		if major < 3 || major == 3 && minor < 12 {
			return fmt.Errorf("%w: a consumer timeout per queue needs RabbitMQ 3.12 or later; the broker is %d.%d", locks.ErrInvalidOption, major, minor)
		}
		args["x-consumer-timeout"] = d.Milliseconds()
	}
	exists, err := s.queueExists(ctx, queue)
	if err != nil {
		return err
	}
	if exists {
		return fmt.Errorf("%w: token queue %q", ErrExists, queue)
	}
	err = s.call(ctx, func(ch *amqp.Channel) error {
		if _, err := ch.QueueDeclare(queue, true, false, false, false, args); err != nil {
			return err
		}
		if err := ch.Confirm(false); err != nil {
			return err
		}
		var confs []*amqp.DeferredConfirmation
		for i := 1; i <= slots; i++ {
			dc, err := ch.PublishWithDeferredConfirm("", queue, true, false, amqp.Publishing{
				DeliveryMode: amqp.Persistent,
				Headers:      amqp.Table{headerSlot: int64(i), headerBase: int64(0)},
				Body:         []byte(strconv.Itoa(i)),
			})
			if err != nil {
				return err
			}
			confs = append(confs, dc)
		}
		for _, dc := range confs {
			if ok, err := dc.WaitContext(context.WithoutCancel(ctx)); err != nil || !ok {
				return errors.Join(errors.New("amqpsem: the broker did not confirm a token"), err)
			}
		}
		// Last, the marker that the queue is up and holds its tokens:
		// acquires take nothing from a queue without it.
		if err := ch.ExchangeDeclare(queue, amqp.ExchangeFanout, true, false, false, false, nil); err != nil {
			return err
		}
		_ = ch.Close() // a channel in confirm mode goes back to no pool
		return nil
	}, nil)
	if err != nil {
		// Never leave a queue with fewer tokens than it was made with.
		_ = s.call(context.WithoutCancel(ctx), func(ch *amqp.Channel) error {
			return deleteTokenQueue(ch, queue)
		}, nil)
		return errorf("amqpsem: making token queue %q: %w", queue, err)
	}
	if cause := context.Cause(mutex.Context()); cause != nil {
		return errorf("amqpsem: administration mutex lost while making %q: %w", queue, cause)
	}
	return nil
}

// Destroy deletes the quorum lock or semaphore name, under its
// administration mutex: every lease on it ends with [locks.ErrLost] and
// [ErrSlotRemoved] (at its next verification, or at once when the broker
// cancels its consumer), and waiting calls fail. The fencing count goes
// with the queue: a name made again starts its tokens from 1. Deleting a
// name that does not exist is not an error.
func (q *Quorum) Destroy(ctx context.Context, name string) error {
	if err := checkCtx(ctx, "destroy", name); err != nil {
		return err
	}
	queue, err := checkQuorumName(name)
	if err != nil {
		return opError("destroy", name, err)
	}
	err = func() error {
		a, err := q.cl.Admin(WithLayout(DefaultLayout))
		if err != nil {
			return err
		}
		a, err = a.bind(ctx)
		if err != nil {
			return err
		}
		var noticed bool
		mutex, err := a.lockAdmin(ctx, name, &noticed)
		if err != nil {
			return errorf("amqpsem: administration mutex: %w", err)
		}
		defer func() { _ = mutex.Release(context.WithoutCancel(ctx)) }()
		a.c.setMarker(queue, false)
		return a.c.call(ctx, func(ch *amqp.Channel) error {
			return deleteTokenQueue(ch, queue)
		}, nil)
	}()
	return q.cl.fail(ctx, "destroy", name, err)
}

// refuseQuorum returns an error matching [ErrOtherLayout] when name is a
// lock or semaphore of the quorum layout (its token queue exists): the
// one-layout-per-name guard of the specification's layouts. The check is
// a passive declare, never a probe message, which would land in the
// token queue.
func (a *Admin) refuseQuorum(ctx context.Context, name string) error {
	queue := QuorumQueue(name)
	if queueName(queue) != nil {
		return nil // too long to be one
	}
	exists, err := a.c.queueExists(ctx, queue)
	if err != nil {
		return errorf("amqpsem: other layouts: %w", err)
	}
	if exists {
		return errorf("%w: refused in the %s layout, as it is a lock or semaphore of the quorum layout (queue %q)", ErrOtherLayout, a.opts.layout.name(), queue)
	}
	return nil
}

// deleteTokenQueue deletes the marker exchange of queue, so that no
// acquire starts on it, then queue. Both deletes succeed when there is
// nothing to delete.
func deleteTokenQueue(ch *amqp.Channel, queue string) error {
	if err := ch.ExchangeDelete(queue, false, false); err != nil {
		return err
	}
	_, err := ch.QueueDelete(queue, false, false, false)
	return err
}

// queueExists reports whether queue exists, with a passive declare on a
// channel of its own (a passive declare of a missing queue closes its
// channel; a probe message would be a token on a token queue).
func (c *session) queueExists(ctx context.Context, queue string) (bool, error) {
	var exists bool
	err := c.run(ctx, c.heartbeat, func() error {
		ch, err := c.conn.Channel()
		if err != nil {
			return err
		}
		_, err = ch.QueueDeclarePassive(queue, true, false, false, false, nil)
		if amqpCode(err) == amqp.NotFound {
			return nil
		}
		if err != nil {
			return err
		}
		exists = true
		c.putChannel(ch)
		return nil
	}, nil)
	return exists, err
}

// tokenOf returns the fencing token of a delivered token: its base plus
// one more than the broker's count of its earlier acquisitions. RabbitMQ
// 4.3 counts acquisitions in x-acquired-count (its x-delivery-count no
// longer counts every return); earlier versions count every return of a
// quorum queue's message in x-delivery-count.
func tokenOf(d amqp.Delivery) uint64 {
	n, ok := intHeader(d.Headers, "x-acquired-count")
	if !ok {
		n, _ = intHeader(d.Headers, "x-delivery-count")
	}
	base, _ := intHeader(d.Headers, headerBase)
	return uint64(max(base, 0)) + uint64(max(n, 0)) + 1
}

// slotOf returns the slot a delivered token stands for (1 when it does
// not say).
func slotOf(d amqp.Delivery) int {
	if n, ok := intHeader(d.Headers, headerSlot); ok && n >= 1 && n <= MaxSemaphoreSize {
		return int(n)
	}
	return 1
}

func intHeader(h amqp.Table, key string) (int64, bool) {
	switch v := h[key].(type) {
	case int64:
		return v, true
	case int32:
		return int64(v), true
	case int16:
		return int64(v), true
	case int8:
		return int64(v), true
	case uint8:
		return int64(v), true
	case uint16:
		return int64(v), true
	case uint32:
		return int64(v), true
	case int:
		return int64(v), true
	}
	return 0, false
}
