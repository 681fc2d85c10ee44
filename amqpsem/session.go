package amqpsem

import (
	"context"
	"errors"
	"io"
	"net"
	"sync"
	"syscall"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/latchkey-go/latchkey/locks/driver"
)

// ErrConnectionClosed is the reason a lease ends, wrapped in
// [locks.ErrLost], when its client's connection closes: its exclusive
// queues are gone at the broker, or will be within the heartbeat bound.
var ErrConnectionClosed = errors.New("amqpsem: connection closed")

// poolSize bounds the idle channels a client keeps for declares and
// deletes.
const poolSize = 8

// session is one AMQP connection of a [Client], with the channels,
// probers, wake-ups, holdings and leases that live on it. Everything
// declared exclusively on it, and every lease handed out on it, ends
// with it. A Client replaces a session whose connection was lost.
type session struct {
	client    *Client
	conn      *amqp.Connection
	sock      *silenceConn // conn's socket, closed to abort a close that outlives its ctx
	opts      options
	heartbeat time.Duration // negotiated, > 0
	verify    time.Duration

	pool     chan *amqp.Channel
	probes   *prober // acquires, scans and administration
	verifier *prober // lease verification, which a long scan must not delay
	wakes    *waker

	mu      sync.Mutex
	closed  bool
	closing bool                // closed by Client.Close, not lost
	cause   error               // why the connection ended, once closed
	held    map[string]*holding // exclusive queues this session holds or is declaring
	leases  map[*Lease]struct{} // live leases
	wg      sync.WaitGroup      // goroutines started by the session
	done    chan struct{}       // closed when the connection is gone
	closes  chan *amqp.Error    // the connection's close notice, for watch
}

// dialSession opens a session of client.
func dialSession(ctx context.Context, client *Client) (*session, error) {
	o := client.opts
	conn, watched, hb, err := dialConn(ctx, client.url, o)
	if err != nil {
		return nil, err
	}
	// The broker sends a frame at least every heartbeat interval: a
	// connection silent for three is dead, whatever amqp's own deadline
	// bookkeeping says, and every call waiting on it must fail.
	watched.arm(silenceLimit * hb)
	c := &session{
		client:    client,
		conn:      conn,
		sock:      watched,
		opts:      o,
		heartbeat: hb,
		pool:      make(chan *amqp.Channel, poolSize),
		held:      map[string]*holding{},
		leases:    map[*Lease]struct{}{},
		done:      make(chan struct{}),
	}
	c.verify = verifyInterval(o.verify, hb)
	c.probes = &prober{c: c, sem: make(chan struct{}, 1)}
	c.verifier = &prober{c: c, sem: make(chan struct{}, 1)}
	c.wakes = newWaker(c)
	c.closes = conn.NotifyClose(make(chan *amqp.Error, 1))
	return c, nil
}

// start starts watching the session's connection. Until then, a lost
// connection goes unnoticed and close would wait forever.
func (c *session) start() {
	c.wg.Add(1)
	go c.watch(c.closes)
}

func verifyInterval(opt, hb time.Duration) time.Duration {
	if opt <= 0 {
		return hb / 3
	}
	return min(opt, hb/2)
}

// watch ends every lease when the connection goes away, and tells the
// client, which replaces a lost session.
func (c *session) watch(closes chan *amqp.Error) {
	defer c.wg.Done()
	e, ok := <-closes
	var cause error = &closedError{}
	if ok && e != nil {
		cause = &closedError{cause: e}
	}
	c.mu.Lock()
	if c.cause == nil {
		c.cause = cause
	}
	c.closed = true
	cause = c.cause
	closing := c.closing
	leases := make([]*Lease, 0, len(c.leases))
	for l := range c.leases {
		leases = append(leases, l)
	}
	c.mu.Unlock()
	if !closing {
		c.client.lost(c, cause)
	}
	close(c.done)
	for _, l := range leases {
		l.base.End(driver.Lost(cause))
	}
}

// close closes the session's connection, which frees every exclusive
// queue it holds at the broker and ends its leases, and waits for its
// goroutines. Every wait is bounded by ctx: when ctx ends first, the
// socket is closed under the AMQP close, and close returns ctx's error
// while the goroutines finish in the background.
func (c *session) close(ctx context.Context) error {
	c.mu.Lock()
	if c.cause == nil {
		c.cause = &closedError{client: true}
	}
	already := c.closed
	c.closed, c.closing = true, true
	c.mu.Unlock()
	var err error
	if !already {
		closed := make(chan error, 1)
		go func() { closed <- c.conn.Close() }()
		select {
		case err = <-closed:
		case <-ctx.Done():
			_ = c.sock.Close()
			return ctx.Err()
		}
		if errors.Is(err, amqp.ErrClosed) {
			err = nil
		}
	}
	finished := make(chan struct{})
	go func() {
		<-c.done
		c.wg.Wait()
		close(finished)
	}()
	select {
	case <-finished:
		return err
	case <-ctx.Done():
		return errors.Join(err, ctx.Err())
	}
}

// errClosed returns the error for a call on a closed session, or nil.
func (c *session) errClosed() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.closed {
		return nil
	}
	return asClosed(c.cause)
}

// goTracked runs f in a goroutine that Close waits for, unless the client
// is closed.
func (c *session) goTracked(f func()) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return false
	}
	c.wg.Add(1)
	go func() {
		defer c.wg.Done()
		f()
	}()
	return true
}

// channel returns an open channel from the pool, or a new one.
func (c *session) channel() (*amqp.Channel, error) {
	for {
		select {
		case ch := <-c.pool:
			if !ch.IsClosed() {
				return ch, nil
			}
			continue
		default:
		}
		ch, err := c.conn.Channel()
		if err != nil {
			return nil, c.connErr(err)
		}
		return ch, nil
	}
}

// putChannel gives ch back to the pool; a broken channel is dropped.
func (c *session) putChannel(ch *amqp.Channel) {
	if ch.IsClosed() {
		return
	}
	select {
	case c.pool <- ch:
	default:
		_ = ch.Close()
	}
}

// connErr wraps err with locks.ErrClosed when the connection is gone. A
// channel-level error, amqp.ErrClosed from a channel the broker closed
// included, leaves the connection and its exclusive queues in place: it is
// returned as it is.
func (c *session) connErr(err error) error {
	if err == nil {
		return nil
	}
	if c.conn.IsClosed() || socketLost(err) {
		if cerr := c.errClosed(); cerr != nil {
			return cerr
		}
		return &closedError{cause: err}
	}
	return err
}

// socketLost reports whether err is the connection's socket failing (a
// write on a broken pipe, a reset, an EOF): amqp091 closes the connection
// for it, but a call may see the error before the connection says it is
// closed, so a "write: broken pipe" would otherwise reach the caller
// matching neither ErrConnectionClosed nor ErrClosed.
func socketLost(err error) bool {
	var ne *net.OpError
	return errors.As(err, &ne) || errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, syscall.EPIPE) || errors.Is(err, syscall.ECONNRESET)
}

// call runs fn on a pooled channel. AMQP calls cannot be interrupted: when
// ctx ends first, fn goes on, and if it succeeds undo runs (to delete what
// fn declared); call waits for that, up to one heartbeat interval (a
// connection silent for longer is going away with its queues), so that a
// cancelled call leaves nothing held when it returns ctx's error.
func (c *session) call(ctx context.Context, fn func(ch *amqp.Channel) error, undo func()) error {
	return c.run(ctx, c.heartbeat, func() error {
		ch, err := c.channel()
		if err == nil {
			err = fn(ch)
			c.putChannel(ch)
		}
		return err
	}, undo)
}

// run is call without a pooled channel (fn takes what it needs), and
// with grace instead of one heartbeat interval as the longest wait for fn
// after ctx ends (0: no wait).
func (c *session) run(ctx context.Context, grace time.Duration, fn func() error, undo func()) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	var (
		mu        sync.Mutex
		finished  bool
		abandoned bool
		res       error
	)
	done := make(chan struct{})
	undone := make(chan struct{})
	ok := c.goTracked(func() {
		defer close(undone)
		err := fn()
		mu.Lock()
		finished, res = true, err
		gone := abandoned
		mu.Unlock()
		close(done)
		if gone && err == nil && undo != nil {
			undo()
		}
	})
	if !ok {
		return c.errClosed()
	}
	select {
	case <-done:
		return c.connErr(res)
	case <-ctx.Done():
		mu.Lock()
		defer mu.Unlock()
		if finished {
			return c.connErr(res)
		}
		abandoned = true
		mu.Unlock()
		if grace > 0 {
			t := time.NewTimer(grace)
			select {
			case <-undone:
			case <-t.C:
			}
			t.Stop()
		}
		mu.Lock()
		return ctx.Err()
	}
}

// amqpCode returns the AMQP reply code in err, or 0.
func amqpCode(err error) int {
	var e *amqp.Error
	if errors.As(err, &e) {
		return e.Code
	}
	return 0
}
