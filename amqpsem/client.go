package amqpsem

import (
	"context"
	"errors"
	"net"
	neturl "net/url"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/latchkey-go/latchkey/locks"
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

// dialConn opens an AMQP connection to url with o's connection options,
// and returns it, its socket and its negotiated heartbeat.
func dialConn(ctx context.Context, url string, o options) (*amqp.Connection, *silenceConn, time.Duration, error) {
	uri, err := amqp.ParseURI(url)
	if err != nil {
		return nil, nil, 0, errorf("amqpsem: %w", driver.InvalidOption("URL %s: %s", RedactURL(url), RedactURLsIn(err.Error(), url)))
	}
	if err := ctx.Err(); err != nil {
		return nil, nil, 0, err
	}
	dial := o.dial
	if dial == nil {
		var d net.Dialer
		dial = d.DialContext
	}
	dctx, cancel := context.WithTimeout(ctx, o.connectTimeout)
	defer cancel()
	props := amqp.NewConnectionProperties()
	props.SetClientConnectionName("amqpsem")
	if o.connName != "" {
		props.SetClientConnectionName(o.connName)
	}
	var (
		stopDeadline func() bool
		watched      *silenceConn
	)
	cfg := amqp.Config{
		Heartbeat:       o.heartbeat,
		TLSClientConfig: o.tls,
		Properties:      props,
		Dial: func(network, addr string) (net.Conn, error) {
			conn, err := dial(dctx, network, addr)
			if err != nil {
				return nil, err
			}
			// Bound the TLS and AMQP handshakes; amqp clears the deadline
			// once the connection is open.
			dl, _ := dctx.Deadline()
			if err := conn.SetDeadline(dl); err != nil {
				conn.Close()
				return nil, err
			}
			// Dial's context ending interrupts the handshakes.
			stopDeadline = context.AfterFunc(dctx, func() { _ = conn.SetDeadline(time.Unix(1, 0)) })
			watched = &silenceConn{Conn: conn}
			return watched, nil
		},
	}
	conn, err := amqp.DialConfig(url, cfg)
	if stopDeadline != nil && !stopDeadline() && err == nil {
		// Dial's context ended after the handshakes but before the
		// deadline could be disarmed: the connection's deadline is (being)
		// set in the past, and the connection dies with it.
		_ = conn.CloseDeadline(time.Now().Add(time.Second))
		cerr := ctx.Err()
		if cerr == nil {
			cerr = dctx.Err() // the connect timeout
		}
		return nil, nil, 0, errorf("amqpsem: dial %s: %w", redact(uri), cerr)
	}
	if err != nil {
		cerr := ctx.Err()
		if dl, ok := ctx.Deadline(); ok && cerr == nil && !time.Now().Before(dl) {
			// The socket's deadline, set to ctx's, fired a moment
			// before ctx's own timer.
			cerr = context.DeadlineExceeded
		}
		if cerr != nil {
			return nil, nil, 0, errorf("amqpsem: dial %s: %w (%w)", redact(uri), cerr, err)
		}
		if dctx.Err() != nil || isTimeout(err) {
			return nil, nil, 0, errorf("amqpsem: dial %s: no connection within the connect timeout %v: %w", redact(uri), o.connectTimeout, err)
		}
		return nil, nil, 0, errorf("amqpsem: dial %s: %w", redact(uri), err)
	}
	hb := conn.Config.Heartbeat
	if hb <= 0 {
		_ = conn.Close()
		return nil, nil, 0, errorf("amqpsem: %w", driver.InvalidOption("heartbeats are disabled (heartbeat=0 in the URL and at the broker): amqpsem needs them to bound how long a dead holder keeps its slot"))
	}
	return conn, watched, hb, nil
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

func redact(u amqp.URI) string {
	if u.Password != "" {
		u.Password = "xxxxx"
	}
	return u.String()
}

// RedactURL returns raw with the password of its user information, if
// any, replaced by "xxxxx", for messages. It works on URLs that do not
// parse too: everything between "://" and the last "@" after it but the
// user name is replaced.
func RedactURL(raw string) string {
	i := strings.Index(raw, "://")
	if i < 0 {
		return raw
	}
	rest := raw[i+3:]
	at := strings.LastIndex(rest, "@")
	if at < 0 {
		return raw
	}
	user, _, hasPw := strings.Cut(rest[:at], ":")
	if !hasPw {
		return raw
	}
	return raw[:i+3] + user + ":xxxxx" + rest[at:]
}

// RedactURLsIn returns msg with every occurrence of raw replaced by
// [RedactURL](raw), and its password, if any, by "xxxxx".
func RedactURLsIn(msg, raw string) string {
	msg = strings.ReplaceAll(msg, raw, RedactURL(raw))
	var pws []string
	if i := strings.Index(raw, "://"); i >= 0 {
		rest := raw[i+3:]
		if at := strings.LastIndex(rest, "@"); at >= 0 {
			if _, pw, ok := strings.Cut(rest[:at], ":"); ok {
				pws = append(pws, pw)
			}
		}
	}
	if u, err := neturl.Parse(raw); err == nil && u.User != nil {
		if pw, ok := u.User.Password(); ok {
			pws = append(pws, pw)
		}
	}
	for _, pw := range pws {
		if pw != "" {
			msg = strings.ReplaceAll(msg, pw, "xxxxx")
		}
	}
	return msg
}

// isTimeout reports whether err is a network timeout.
func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
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

// close ends every lease of the session with [locks.ErrLost] and closes
// its connection, and waits for its goroutines.
func (c *session) close() error {
	c.mu.Lock()
	if c.cause == nil {
		c.cause = &closedError{client: true}
	}
	already := c.closed
	c.closed, c.closing = true, true
	c.mu.Unlock()
	var err error
	if !already {
		err = c.conn.CloseDeadline(time.Now().Add(2 * time.Second))
		if errors.Is(err, amqp.ErrClosed) {
			err = nil
		}
	}
	<-c.done
	c.wg.Wait()
	return err
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
	if c.conn.IsClosed() {
		if cerr := c.errClosed(); cerr != nil {
			return cerr
		}
		return &closedError{cause: err}
	}
	return err
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

// holding is one exclusive queue this client declared or is declaring.
type holding struct {
	queue   string
	wakeKey string

	mu      sync.Mutex
	freeing bool          // a free has started
	freed   chan struct{} // closed when it is over; err is then set
	err     error
}

// reserve claims queue for this client, so that two of its own calls never
// both "win" a queue (a connection may redeclare its own exclusive queue).
func (c *session) reserve(queue, wakeKey string) (*holding, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return nil, asClosed(c.cause)
	}
	if c.held[queue] != nil {
		return nil, nil
	}
	h := &holding{queue: queue, wakeKey: wakeKey, freed: make(chan struct{})}
	c.held[queue] = h
	return h, nil
}

func (c *session) unreserve(h *holding) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.held[h.queue] == h {
		delete(c.held, h.queue)
	}
}

func (c *session) reserved(queue string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.held[queue] != nil
}

// declareExclusive declares h's queue, exclusive to this connection. When
// it fails, h is no longer reserved; when ctx ends first and the declare
// then succeeds, the queue is deleted.
func (c *session) declareExclusive(ctx context.Context, h *holding, args amqp.Table) error {
	return c.call(ctx, func(ch *amqp.Channel) error {
		_, err := ch.QueueDeclare(h.queue, false, false, true, false, args)
		if err != nil {
			c.unreserve(h) // nothing was declared
		}
		return err
	}, func() { _ = c.free(context.Background(), h) })
}

// freeAttempts bounds the deletes of one free on fresh channels after the
// first one's channel broke.
const freeAttempts = 3

// free deletes h's queue, once, and then wakes the waiters of its key.
// The delete waits for the broker's answer before the queue may be
// declared again by this client (a no-wait delete sent with the wake-up,
// one round trip less, let two holders in at once in the chaos runs). When the connection is gone, the
// queue is gone with it (or will be soon) and free reports no error. When
// the delete fails while the connection lives (its channel was closed by
// the broker for an earlier error on it), the queue is still there: free
// tries again on a fresh channel. When ctx ends during the delete, free
// waits up to a heartbeat interval more (see [Client.call]), then returns
// ctx's error while the delete goes on. A ctx that has ended already does
// not stop the delete: free waits up to a heartbeat interval for it, and
// returns ctx's error only if it is not done by then. Later calls return
// the first one's result, waiting for it until their ctx ends.
func (c *session) free(ctx context.Context, h *holding) error {
	h.mu.Lock()
	first := !h.freeing
	h.freeing = true
	h.mu.Unlock()
	if !first {
		select {
		case <-h.freed:
			return h.err
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	defer close(h.freed)
	runCtx, grace, cancel := ctx, c.heartbeat, context.CancelFunc(func() {})
	if ctx.Err() != nil {
		// ctx ended before the release: delete all the same, waiting for
		// up to a heartbeat interval in all (no grace on top).
		runCtx, cancel = context.WithTimeout(context.WithoutCancel(ctx), c.heartbeat)
		grace = 0
	}
	defer cancel()
	err := c.run(runCtx, grace, func() error {
		ch, err := c.channel()
		if err != nil {
			return err
		}
		err = deleteOwn(ch, h.queue)
		c.putChannel(ch)
		for try := 1; err != nil && !c.conn.IsClosed() && try < freeAttempts; try++ {
			var fresh *amqp.Channel
			if fresh, err = c.conn.Channel(); err == nil {
				err = deleteOwn(fresh, h.queue)
				c.putChannel(fresh)
			}
		}
		if err == nil || c.conn.IsClosed() {
			c.unreserve(h)
		}
		if err == nil {
			c.wakes.publish(h.wakeKey, h.queue)
		}
		return err
	}, nil)
	if err != nil && runCtx != ctx && runCtx.Err() != nil {
		err = ctx.Err() // still deleting, in the background
	}
	if errors.Is(err, locks.ErrClosed) {
		// Only when the connection is gone, and its exclusive queues
		// with it.
		c.unreserve(h)
		err = nil
	}
	if err != nil {
		err = errorf("amqpsem: delete queue %q: %w", h.queue, err)
	}
	h.err = err
	return err
}

// deleteOwn deletes queue q, which this connection declared exclusive.
// Deleting a missing queue succeeds; RESOURCE_LOCKED means that q is now
// another connection's (ours was deleted already, by a delete whose
// answer was lost with its channel), which is success too.
func deleteOwn(ch *amqp.Channel, q string) error {
	_, err := ch.QueueDelete(q, false, false, false)
	if amqpCode(err) == amqp.ResourceLocked {
		return nil
	}
	return err
}

// silenceLimit is how many heartbeat intervals without a byte from the
// broker end a connection.
const silenceLimit = 3

// silenceConn is the client's socket, whose reads fail once the broker has
// been silent for the armed limit. amqp's heartbeater sets the same kind of
// deadline, but only after a frame arrives and only if its goroutine is
// ready for it, so a reply lost in the network could leave a call (a
// channel open, which takes no context) waiting forever.
type silenceConn struct {
	net.Conn
	limit atomic.Int64 // nanoseconds; 0 until armed, after the handshakes
}

func (c *silenceConn) arm(limit time.Duration) { c.limit.Store(int64(limit)) }

func (c *silenceConn) Read(b []byte) (int, error) {
	if d := time.Duration(c.limit.Load()); d > 0 {
		if err := c.Conn.SetReadDeadline(time.Now().Add(d)); err != nil {
			return 0, err
		}
	}
	return c.Conn.Read(b)
}
