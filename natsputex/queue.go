package natsputex

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/latchkey-go/latchkey/locks"
	"github.com/latchkey-go/latchkey/locks/driver"
)

// This file holds the queue of a lock's waiting Locks: they wait in
// arrival order, and only the first, the head, watches the key and keeps
// its takeover clock; a release wakes the head alone (see
// docs/protocols/natsputex.md).
//
// The queue is a JetStream pull consumer of the bucket's stream, one per
// lock name (and T), filtered on the name's turn key: a key no lock can
// be named (its ':'), holding one message, the baton. The consumer hands
// the baton to the oldest pull request waiting (FIFO: the server keeps
// them in arrival order, and drops those whose reply subject lost its
// interest, a waiter that returned or whose connection closed). The
// waiter holding the baton is the head: it keeps the baton's AckWait
// (T) from running out, watches the key by a core subscription on its
// subject (no consumer: a write to a key is a message on its subject),
// and tries the key when it is left free, or when its takeover clock says
// so. Once it holds the key, or gives up, it passes the baton on (a NAK:
// redelivered at once to the next pull request). A head that dies passes
// it on after AckWait, T. The baton is never acknowledged, so it lives
// as long as the turn key's message does; a consumer made again starts
// from that last message.
//
// A lease won by the head leaves the key reserved on release (see
// [reservedValue]): free, but a Lock that is not the head (a releasing
// holder asking again, say) finds it held and joins the back of the
// queue, while the head, woken by the release's message, takes it.

// place is where an attempt stands in its key's queue.
type place int

const (
	unqueued place = iota // no queue: a TryLock, a semaphore's slots, a Lock without a queue
	outside               // a Lock's first attempt: a reserved key counts as held
	head                  // the head of the queue: a reserved key is its to take
)

// queueHolder stands for the holder of a reserved key in errors.
const queueHolder = "(reserved for the head of the queue)"

// turnKey returns the key holding the baton of name's queue: its ':'
// keeps it out of every lock's name.
func turnKey(name string) string { return "natsputex:turn." + name }

// Tuning of the queue.
const (
	// queueMaxWaiting is the consumer's MaxWaiting: how many Locks of one
	// name may wait in its queue at once. More fall back to a watch each.
	queueMaxWaiting = 16384
	// pullExpiry bounds one pull request: a waiter asks again after it,
	// at the back of the queue. It is a backstop only (a baton purged by
	// an administrator is seeded again then).
	pullExpiry = 30 * time.Second
	// rejoinPause is the first pause (then doubled, up to T) before a
	// waiter joins again after a failure to reach the queue's consumer.
	rejoinPause = 50 * time.Millisecond
)

// errNoQueue says that the server refuses the queue (too many waiters, no
// consumers): the call watches the key itself.
var errNoQueue = errors.New("natsputex: no queue")

// errRejoin says that a pull request ended without the baton (expired,
// its heartbeats stopped, the connection reconnected): the waiter joins
// again, at the back.
var errRejoin = errors.New("natsputex: join the queue again")

// errGone says that the queue's consumer is missing (deleted after its
// inactivity threshold, its server lost): it is made again.
var errGone = errors.New("natsputex: the queue's consumer is gone")

// queue is one waiting Lock's handle on its name's queue.
type queue struct {
	c      *Client
	name   string
	cons   string // the consumer's name
	stream string
	turn   string // the turn key's subject
	ttl    time.Duration
}

func (c *Client) queueOf(name string) *queue {
	sum := sha256.Sum256([]byte(name))
	T := c.o.ttl()
	return &queue{
		c:      c,
		name:   name,
		cons:   "natsputex_turn_" + hex.EncodeToString(sum[:16]) + "_" + strconv.FormatInt(int64(T), 10),
		stream: "KV_" + c.st.kv.Bucket(),
		turn:   c.st.prefix + turnKey(name),
		ttl:    T,
	}
}

// heartbeat is the idle heartbeat of a pull request: a waiter that misses
// three, and a second more, joins again (its consumer's server may be
// gone).
func (q *queue) heartbeat() time.Duration {
	return min(max(q.ttl, 250*time.Millisecond), 5*time.Second)
}

// ensure makes the queue's consumer, and the baton, if this client has
// not made or found them yet. Every field of the consumer's
// configuration follows from the name and T, so that all clients with
// the same T ask for the same consumer. The baton is the turn key's
// message, written only where there is none.
func (q *queue) ensure(ctx context.Context) error {
	c := q.c
	c.mu.Lock()
	known := c.queues[q.cons]
	c.mu.Unlock()
	if known {
		return nil
	}
	octx, cancel := c.opContext(ctx)
	defer cancel()
	// Look first: updating a consumer that exists, even to the same
	// configuration, is a change the cluster applies, not a no-op.
	_, err := c.st.js.Consumer(octx, q.stream, q.cons)
	if errors.Is(err, jetstream.ErrConsumerNotFound) {
		err = q.create(octx)
	}
	if err != nil {
		var apiErr *jetstream.APIError
		if errors.As(err, &apiErr) && apiErr.Code >= 400 && apiErr.Code < 500 {
			return fmt.Errorf("%w: %w", errNoQueue, err)
		}
		return err
	}
	if err := q.seed(octx); err != nil {
		return err
	}
	c.mu.Lock()
	c.queues[q.cons] = true
	c.mu.Unlock()
	return nil
}

// create makes the queue's consumer.
func (q *queue) create(ctx context.Context) error {
	_, err := q.c.st.js.CreateOrUpdateConsumer(ctx, q.stream, jetstream.ConsumerConfig{
		Durable:           q.cons,
		Description:       "natsputex: the waiting queue of a lock",
		DeliverPolicy:     jetstream.DeliverLastPerSubjectPolicy,
		AckPolicy:         jetstream.AckExplicitPolicy,
		AckWait:           q.ttl,
		MaxDeliver:        -1,
		FilterSubject:     q.turn,
		MaxWaiting:        queueMaxWaiting,
		InactiveThreshold: max(10*q.ttl, time.Minute),
		Replicas:          1,
		MemoryStorage:     true,
	})
	return err
}

// seed writes the baton where the turn key has no message: the first
// time, or after the stream was purged. Of several racing, one wins.
func (q *queue) seed(ctx context.Context) error {
	_, err := q.c.st.js.Publish(ctx, q.turn, nil, jetstream.WithExpectLastSequencePerSubject(0))
	if err != nil && !isConflict(err) {
		return fmt.Errorf("seeding the baton: %w", err)
	}
	return nil
}

// hasBaton reports whether the turn key holds its message, the baton.
func (q *queue) hasBaton(ctx context.Context) (bool, error) {
	octx, cancel := q.c.opContext(ctx)
	defer cancel()
	r, err := q.c.st.read(octx, turnKey(q.name))
	return r.exists, err
}

// forget makes the next ensure make the consumer again.
func (q *queue) forget() {
	q.c.mu.Lock()
	delete(q.c.queues, q.cons)
	q.c.mu.Unlock()
}

// join waits in the queue until this call gets the baton, and returns
// it. On failure it returns an error matching ctx.Err() when ctx ended,
// or errNoQueue.
func (q *queue) join(ctx context.Context) (*nats.Msg, error) {
	for fails := 0; ; {
		err := q.ensure(ctx)
		if err == nil {
			// The baton is lost only with the turn key's message (the
			// stream purged): a waiter joining writes it again.
			var ok bool
			if ok, err = q.hasBaton(ctx); err == nil && !ok {
				octx, cancel := q.c.opContext(ctx)
				err = q.seed(octx)
				cancel()
			}
		}
		if err == nil {
			var b *nats.Msg
			if b, err = q.pull(ctx); err == nil {
				return b, nil
			}
		}
		switch {
		case ctx.Err() != nil:
			return nil, ctx.Err()
		case errors.Is(err, errNoQueue):
			return nil, err
		case errors.Is(err, errRejoin):
			fails = 0
			continue
		case errors.Is(err, errGone):
			// Look it up before the next pull, and make it if it is
			// missing: a pull on a consumer whose node died is not
			// answered, so pulling again first would cost another
			// three heartbeats. A lookup never changes a consumer, and
			// one just made that does not answer yet (a cluster's answers
			// 503 for a moment) is found, not made again.
			q.forget()
		}
		// Transient: the consumer's server is between leaders, restarting.
		// Or not: a client not allowed to use the consumer API. After a
		// few failures in a row the call waits by a watch of its own.
		fails++
		if fails > 4 {
			return nil, fmt.Errorf("%w: %w", errNoQueue, err)
		}
		if fails > 1 {
			// Pauses that grow towards T: a cluster that has just
			// started may take a moment to place the consumer.
			pause := min(rejoinPause<<(fails-1), max(q.ttl, rejoinPause))
			if err := driver.Sleep(ctx, pause); err != nil {
				return nil, err
			}
		}
	}
}

// pull makes one pull request for the baton, and waits for it.
func (q *queue) pull(ctx context.Context) (*nats.Msg, error) {
	nc := q.c.st.nc
	inbox := nc.NewInbox()
	ch := make(chan *nats.Msg, 16)
	sub, err := nc.ChanSubscribe(inbox, ch)
	if err != nil {
		return nil, err
	}
	reconnected := nc.StatusChanged(nats.CONNECTED)
	defer nc.RemoveStatusListener(reconnected)
	var got *nats.Msg
	defer func() {
		// The server drops the request once the inbox has no interest;
		// a baton already on its way is passed on at once.
		_ = sub.Unsubscribe()
		for {
			select {
			case m := <-ch:
				if m != got && isBaton(m) {
					_ = nc.Publish(m.Reply, ackNak)
				}
			default:
				return
			}
		}
	}()
	hb := q.heartbeat()
	req, _ := json.Marshal(struct {
		Batch     int           `json:"batch"`
		Expires   time.Duration `json:"expires"`
		Heartbeat time.Duration `json:"idle_heartbeat"`
	}{1, pullExpiry, hb})
	if err := nc.PublishRequest(q.c.st.api+"CONSUMER.MSG.NEXT."+q.stream+"."+q.cons, inbox, req); err != nil {
		return nil, err
	}
	quiet := time.NewTimer(3*hb + time.Second)
	defer quiet.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-reconnected:
			// The server dropped the request with the connection. It may
			// have restarted, losing the consumer (kept in memory), and a
			// pull on a missing consumer is not answered at all by NATS
			// 2.9: look the consumer up again before the next pull.
			q.forget()
			return nil, errRejoin
		case <-quiet.C:
			return nil, errGone
		case m := <-ch:
			if isBaton(m) {
				got = m
				return m, nil
			}
			switch code := m.Header.Get("Status"); code {
			case "100":
				quiet.Reset(3*hb + time.Second)
			case "404", "408":
				return nil, errRejoin
			case "409":
				if strings.Contains(strings.ToLower(m.Header.Get("Description")), "maxwaiting") {
					return nil, errNoQueue
				}
				return nil, errGone
			case "503":
				return nil, errGone
			default:
				return nil, fmt.Errorf("queue: unexpected answer %q %q", code, m.Header.Get("Description"))
			}
		}
	}
}

// The acknowledgements the head sends on the baton.
var (
	ackNak      = []byte("-NAK")
	ackProgress = []byte("+WPI")
)

// isBaton reports whether m is a message of the consumer (not a status).
func isBaton(m *nats.Msg) bool {
	return m.Header.Get("Status") == "" && strings.HasPrefix(m.Reply, "$JS.ACK.")
}

// lead is the head's part: it keeps the baton b, watches key by a core
// subscription on its subject and on its knock subject (the releases'
// word, see [Client.tellFreed]), and runs try (driver.Wait) until it
// returns a lease or an error; then it passes the baton on. seeFreed is told
// the revision of a release that the head has seen on the key's subject
// and its holder then named.
func (c *Client) lead(ctx context.Context, b *nats.Msg, key string, seeFreed func(rev uint64), try func(context.Context) (locks.Lease, error)) (locks.Lease, error) {
	nc := c.st.nc
	defer func() { _ = nc.Publish(b.Reply, ackNak) }()
	wake := make(chan struct{}, 1)
	poke := func() {
		select {
		case wake <- struct{}{}:
		default:
		}
	}
	reconnected := nc.StatusChanged(nats.CONNECTED)
	defer nc.RemoveStatusListener(reconnected)
	// One channel for both subscriptions keeps their messages in the
	// order the server sent them: a release's write before its word.
	heard := make(chan *nats.Msg, 64)
	subject := c.st.prefix + key
	for _, subj := range []string{subject, c.knockSubject(key)} {
		sub, err := nc.ChanSubscribe(subj, heard)
		if err != nil {
			return nil, err
		}
		defer func() { _ = sub.Unsubscribe() }()
	}
	quit := make(chan struct{})
	var wg sync.WaitGroup
	defer wg.Wait()
	defer close(quit)
	wg.Go(func() {
		t := time.NewTicker(min(c.o.renewEvery(), c.o.ttl()/3))
		defer t.Stop()
		// over is the revision the last write seen on the key's subject
		// was conditional on, if that write left the key free; else 0.
		var over uint64
		for {
			select {
			case <-quit:
				return
			case <-t.C:
				_ = nc.Publish(b.Reply, ackProgress)
			case m := <-heard:
				switch {
				case m.Subject == subject && freed(m):
					over, _ = strconv.ParseUint(m.Header.Get(jetstream.ExpectedLastSubjSeqHeader), 10, 64)
					poke()
				case m.Subject == subject:
					over = 0
				default:
					if prev, rev, ok := parseFreed(m.Data); ok && prev != 0 && prev == over {
						seeFreed(rev)
						poke()
					}
				}
			case _, ok := <-reconnected:
				if !ok {
					return
				}
				poke() // a release may have gone unseen meanwhile
			}
		}
	})
	var knocked string
	return driver.Wait(ctx, wake, c.o.backoff, func(ctx context.Context) (locks.Lease, error) {
		lease, err := try(ctx)
		var held *locks.HeldError
		// Once per holder seen; every time the key was found free and
		// the write lost to someone else (the holder is not known).
		if errors.As(err, &held) && held.Holder != queueHolder && (held.Holder == "" || held.Holder != knocked) {
			knocked = held.Holder
			_ = nc.Publish(c.knockSubject(key), nil)
		}
		return lease, err
	})
}

// tellFreed says, on key's knock subject, that a release left the key
// free by its write at rev, conditional on the revision over: "over rev".
// The head of the key's queue, which saw that write on the key's subject
// (whose message carries over but not rev), writes at rev at once, with
// no read, which could come before the stream has stored the release
// (then the head would sleep on its back-off). Knocks are empty.
func (c *Client) tellFreed(key string, over, rev uint64) {
	_ = c.st.nc.Publish(c.knockSubject(key), fmt.Appendf(nil, "%d %d", over, rev))
}

// parseFreed decodes what tellFreed sends.
func parseFreed(data []byte) (over, rev uint64, ok bool) {
	a, b, found := strings.Cut(string(data), " ")
	if !found {
		return 0, 0, false
	}
	over, err1 := strconv.ParseUint(a, 10, 64)
	rev, err2 := strconv.ParseUint(b, 10, 64)
	return over, rev, err1 == nil && err2 == nil
}

// knockSubject is the core NATS subject on which the head of key's queue
// tells the key's holder that it waits (bucket names hold no '.').
func (c *Client) knockSubject(key string) string { return "natsputex.knock." + c.bucket + "." + key }

// knocks is a Lock's or a TryLock's subscription to the knocks on its
// key (see [Client.listenForKnocks]).
type knocks struct {
	sub     *nats.Subscription
	knocked atomic.Bool // a knock came
	adopted atomic.Bool // a lease owns the subscription
}

// listenForKnocks subscribes, before a Lock's or a TryLock's first
// attempt writes the key, to the knocks of the head of the key's queue,
// which it sends once it has read the key held by another; the lease the
// call wins keeps listening until it ends, and is then released to the
// head (the key left reserved). A knock aimed at an earlier holder only
// makes the release reserve the key with nobody waiting, which costs the
// next Lock a pass through the queue. A knock lost costs fairness only:
// the head races whoever comes for the blank key. It returns nil when
// the subscription fails.
func (c *Client) listenForKnocks(key string) *knocks {
	k := &knocks{}
	sub, err := c.st.nc.Subscribe(c.knockSubject(key), func(m *nats.Msg) {
		if len(m.Data) == 0 { // not a release's word (see tellFreed)
			k.knocked.Store(true)
		}
	})
	if err != nil {
		return nil
	}
	k.sub = sub
	return k
}

// adopt hands the subscription to a lease whose context is ctx: it ends
// with it.
func (k *knocks) adopt(ctx context.Context) {
	k.adopted.Store(true)
	context.AfterFunc(ctx, func() { _ = k.sub.Unsubscribe() })
}

// drop ends the subscription unless a lease adopted it. It may be called
// more than once.
func (k *knocks) drop() {
	if k != nil && !k.adopted.Load() {
		_ = k.sub.Unsubscribe()
	}
}

// freed reports whether m, a write to a key seen on its subject, left it
// free: blank, reserved or deleted. (It may be a write the stream
// refused: the head's attempt reads the key.)
func freed(m *nats.Msg) bool {
	if len(m.Data) == 0 || string(m.Data) == reservedValue {
		return true
	}
	op := m.Header.Get("KV-Operation")
	return op == "DEL" || op == "PURGE"
}

// waitTurn makes a Lock that found its key held wait in the key's queue,
// then lead it with try; seeFreed is told the revisions of the releases
// the head hears of (see [Client.lead]). queued is false when there is no queue (the
// server refuses it): the call then waits as before it, by a watch.
func (c *Client) waitTurn(ctx context.Context, op, name, key string, seeFreed func(rev uint64), try func(context.Context) (locks.Lease, error)) (_ locks.Lease, _ error, queued bool) {
	q := c.queueOf(name)
	b, err := q.join(ctx)
	switch {
	case err == nil:
	case ctx.Err() != nil:
		return nil, driver.Errorf(backend, op, name, ctx.Err()), true
	default:
		return nil, &locks.HeldError{Name: name, Err: err}, false
	}
	lease, err := c.lead(ctx, b, key, seeFreed, try)
	return lease, err, true
}
