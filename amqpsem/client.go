package amqpsem

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/latchkey-go/latchkey/locks"
	"github.com/latchkey-go/latchkey/locks/driver"
)

// Client is a connection to RabbitMQ that its [Locker], [Semaphore]s and
// [Admin]s share. Every queue they declare exclusively belongs to the
// client's current AMQP connection, so every lease they hand out ends
// when that connection closes, cleanly ([Client.Close]) or not (the
// broker or the network going away): with [locks.ErrLost] and
// [ErrConnectionClosed].
//
// When its connection is lost, a Client dials again, with the back-off
// of [WithReconnect] (by default from 100ms up to 10s, jittered), until
// it connects or is closed; [WithConnectionNotice] reports each loss,
// failed attempt and recovery, and [Client.Connected] says whether it is
// connected now. Leases of the lost connection have ended and stay
// ended: a new connection holds nothing until it acquires again. Calls
// that start while the client is reconnecting wait for the new
// connection until their ctx ends (the error then matches ctx.Err());
// calls in flight when the connection is lost return errors matching
// [ErrConnectionClosed] (and [locks.ErrClosed]). With
// WithReconnect(false, ...), a Client whose connection is gone stays
// gone: every later call returns an error matching [locks.ErrClosed].
//
// A Client's leases are verified together: one pipelined probe of every
// live lease's queues per verify interval ([WithVerifyInterval]).
//
// A Client is safe for concurrent use.
type Client struct {
	url  string
	opts options
	reg  *driver.Registry // the client's leases, their verification, Close

	leaseMu sync.Mutex
	leases  map[*driver.Lease]*Lease // live leases, for the verification rounds

	qreg    *driver.Registry               // the leases of the quorum layout ([Quorum])
	qleases map[*driver.Lease]*QuorumLease // under leaseMu
	tpool   tokenPool                      // idle token channels

	mu      sync.Mutex
	cur     *session      // the live session; nil while reconnecting
	last    *session      // the latest session, for Heartbeat
	ready   chan struct{} // closed once cur is set; replaced when it is lost
	lostErr error         // why the last session ended, or the last dial failed
	closed  bool
	stop    chan struct{}  // closed by Close
	wg      sync.WaitGroup // reconnection, and draining lost sessions
}

// ConnectionEvent is a change of a [Client]'s connection, reported to the
// function given to [WithConnectionNotice].
type ConnectionEvent struct {
	// Up is true when the client has connected again.
	Up bool
	// Err, when Up is false, says why the connection was lost (Attempt
	// 0) or why reconnection attempt Attempt failed.
	Err error
	// Attempt counts the reconnection attempts since the loss, from 1; it
	// is 0 for the loss itself.
	Attempt int
}

// Dial connects to the RabbitMQ broker at url (amqp:// or amqps://, as
// [amqp.ParseURI] reads it) and returns a Client. Invalid options return an
// error matching [locks.ErrInvalidOption] before any I/O. ctx bounds the
// connection and its handshakes; when it ends first, the error matches
// ctx.Err(); [WithConnectTimeout] bounds them too. A refused connection
// or wrong credentials give the broker's error (for credentials, one
// matching [amqp.ErrCredentials]). Errors never show the URL's password.
// Dial does not retry: reconnection is for a connection lost later.
func Dial(ctx context.Context, url string, opts ...Option) (*Client, error) {
	if err := checkCtx(ctx, "dial", ""); err != nil {
		return nil, err
	}
	o := defaults()
	if err := driver.Apply(&o, opts); err != nil {
		return nil, opError("dial", "", err)
	}
	c := &Client{url: url, opts: o, ready: make(chan struct{}), stop: make(chan struct{}), leases: map[*driver.Lease]*Lease{}}
	s, err := dialSession(ctx, c)
	if err != nil {
		return nil, opError("dial", "", err)
	}
	c.reg, err = driver.NewRegistry(driver.Config{Backend: "amqpsem", RenewEvery: s.verify, Renew: c.verifyLeases})
	if err == nil {
		c.qleases = map[*driver.Lease]*QuorumLease{}
		c.qreg, err = driver.NewRegistry(driver.Config{Backend: "amqpsem", RenewEvery: s.verify, Renew: c.verifyQuorum})
	}
	if err != nil {
		s.start() // close waits for the watch
		return nil, opError("dial", "", errors.Join(err, s.close(ctx)))
	}
	c.install(s)
	return c, nil
}

// Locker returns the client's exclusive-queue mutex, with the client's
// options. Every call returns a Locker that shares the client's
// connection and leases.
func (c *Client) Locker() *Locker {
	return &Locker{cl: c, opts: c.opts}
}

// track records l for the verification rounds; untrack forgets it once
// it has ended.
func (c *Client) track(l *Lease) {
	c.leaseMu.Lock()
	c.leases[l.base] = l
	c.leaseMu.Unlock()
}

func (c *Client) untrack(l *Lease) {
	c.leaseMu.Lock()
	delete(c.leases, l.base)
	c.leaseMu.Unlock()
}

// verifyLeases is the registry's renewal: it verifies the batch's leases
// with one pipelined probe per session (see session.verifyLeases). A lease
// found gone ends with [locks.ErrLost] and [ErrSlotRemoved], then its
// queue is deleted in the background.
func (c *Client) verifyLeases(ctx context.Context, batch []*driver.Lease) []driver.Renewal {
	out := make([]driver.Renewal, len(batch))
	leases := make([]*Lease, len(batch))
	bySession := map[*session][]int{}
	c.leaseMu.Lock()
	for i, b := range batch {
		if l := c.leases[b]; l != nil {
			leases[i] = l
			bySession[l.c] = append(bySession[l.c], i)
		}
	}
	c.leaseMu.Unlock()
	for s, idx := range bySession {
		ls := make([]*Lease, len(idx))
		for k, i := range idx {
			ls[k] = leases[i]
		}
		for k, r := range s.verifyLeases(ctx, ls) {
			if errors.Is(r.Err, locks.ErrLost) {
				r.Then = ls[k].deleteQueueIfLost
			}
			out[idx[k]] = r
		}
	}
	return out
}

// Observe implements [driver.Observable] for the client's events: the
// verification rounds, [driver.EventVerifyFailed] and
// [driver.EventResourceLocked].
func (c *Client) Observe(fn func(driver.Event)) (stop func()) { return c.reg.Observe(fn) }

// install makes s the client's session and starts watching it; it
// reports false, and closes s, when the client was closed meanwhile.
func (c *Client) install(s *session) bool {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		s.start()
		_ = s.close(context.Background()) // a fresh connection: quick
		return false
	}
	c.cur, c.last, c.lostErr = s, s, nil
	close(c.ready)
	c.mu.Unlock()
	s.start()
	return true
}

// Heartbeat returns the heartbeat interval negotiated with the broker on
// the latest connection.
func (c *Client) Heartbeat() time.Duration {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.last.heartbeat
}

// Connected reports whether the client has a connection now: false while
// it reconnects, and once it is closed.
func (c *Client) Connected() bool {
	c.mu.Lock()
	s := c.cur
	c.mu.Unlock()
	return s != nil && !s.conn.IsClosed()
}

// session returns the client's live session, waiting for a reconnection
// until ctx ends.
func (c *Client) session(ctx context.Context) (*session, error) {
	for {
		c.mu.Lock()
		s, ready, lostErr, closed := c.cur, c.ready, c.lostErr, c.closed
		c.mu.Unlock()
		switch {
		case closed:
			return nil, &closedError{client: true}
		case s != nil:
			return s, nil // if it is dying, its calls say so
		case !c.opts.reconnect:
			return nil, asClosed(lostErr)
		}
		select {
		case <-ready:
		case <-c.stop:
		case <-ctx.Done():
			return nil, fmt.Errorf("amqpsem: waiting for the connection to the broker (%v): %w", trimPrefix(lostErr), ctx.Err())
		}
	}
}

// lost is called by s's watch when s's connection was lost, not closed
// by the client: s's leases are ending; the client reports the loss and
// reconnects.
func (c *Client) lost(s *session, cause error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed || c.cur != s {
		return
	}
	c.cur, c.lostErr = nil, cause
	c.ready = make(chan struct{})
	c.wg.Add(2)
	go func() { // Close waits for the lost session's goroutines
		defer c.wg.Done()
		<-s.done
		s.wg.Wait()
	}()
	go c.reconnect(cause)
}

// reconnect reports the loss, then dials with the back-off until it
// connects or the client is closed.
func (c *Client) reconnect(cause error) {
	defer c.wg.Done()
	c.notify(ConnectionEvent{Err: cause})
	if !c.opts.reconnect {
		return
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		select {
		case <-c.stop:
			cancel()
		case <-ctx.Done():
		}
	}()
	for attempt := 1; ; attempt++ {
		t := time.NewTimer(c.opts.reconnectBackoff.Delay(attempt - 1))
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
		s, err := dialSession(ctx, c)
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			c.mu.Lock()
			c.lostErr = err
			c.mu.Unlock()
			c.notify(ConnectionEvent{Err: err, Attempt: attempt})
			continue
		}
		if c.install(s) {
			c.notify(ConnectionEvent{Up: true, Attempt: attempt})
		}
		return
	}
}

func (c *Client) notify(e ConnectionEvent) {
	if f := c.opts.connNotice; f != nil {
		f(e)
	}
}

// Close ends every lease of the client with [locks.ErrLost] and
// [locks.ErrClosed], deletes their queues, closes its connection (which
// frees whatever else it held at the broker) and stops reconnecting.
// Calls waiting for a lease return, and later calls on the client and
// its Locker, Semaphores and Admins return errors matching
// [locks.ErrClosed]. Close waits for the client's goroutines; every wait
// is bounded by ctx: when ctx ends first, the connection's socket is
// closed (the broker then frees its queues), Close returns an error
// matching ctx.Err(), and the rest finishes in the background. It returns
// the errors of deleting queues and closing the connection, if any. A
// broker that does not answer holds Close at most two heartbeat intervals
// ([Client.Heartbeat], at least 1s each): the deletes wait up to one, and
// the connection's close is cut short by then too, its socket closed. It
// is idempotent: later calls return nil at once.
func (c *Client) Close(ctx context.Context) error {
	if err := checkCtx(ctx, "close", ""); err != nil {
		return err
	}
	c.mu.Lock()
	already := c.closed
	s := c.cur
	if !already {
		c.closed, c.cur = true, nil
		close(c.stop)
	}
	c.mu.Unlock()
	if already {
		return nil
	}
	// Release at the broker first, while the connection is open: a clean
	// delete wakes the waiters of other clients at once. Both layouts'
	// leases are released side by side. A broker that does not answer
	// holds Close one heartbeat interval, not one for the deletes and
	// another for the connection's close: the socket is closed then (the
	// broker frees the queues when it notices).
	start := time.Now()
	cause := driver.Lost(&closedError{client: true})
	var qerr error
	qdone := make(chan struct{})
	go func() {
		defer close(qdone)
		qerr = c.qreg.Close(ctx, cause)
	}()
	err := c.reg.Close(ctx, cause)
	<-qdone
	err = errors.Join(err, qerr)
	if s != nil {
		sctx, cancel := context.WithDeadline(ctx, start.Add(max(c.Heartbeat(), time.Second)))
		serr := s.close(sctx)
		cancel()
		if ctx.Err() == nil && errors.Is(serr, context.DeadlineExceeded) {
			serr = errors.New("the broker did not answer the connection's close within a heartbeat interval: its socket was closed")
		}
		err = errors.Join(err, serr)
	}
	drained := make(chan struct{})
	go func() {
		c.wg.Wait()
		close(drained)
	}()
	select {
	case <-drained:
	case <-ctx.Done():
		if err == nil || !errors.Is(err, ctx.Err()) {
			err = errors.Join(err, ctx.Err())
		}
	}
	if err != nil {
		return driver.Errorf(backend, "close", "", unprefixed{err})
	}
	return nil
}

// fail returns err, the error of operation op on name, in the one shape
// of errors (see opError). When ctx (bound to the client's registry)
// ended because the client closed, the error matches [locks.ErrClosed].
func (c *Client) fail(ctx context.Context, op, name string, err error) error {
	if err == nil {
		return nil
	}
	if c.reg.Closed() && errors.Is(context.Cause(ctx), locks.ErrClosed) && !errors.Is(err, locks.ErrClosed) {
		err = fmt.Errorf("%w: %w", &closedError{client: true}, err)
	}
	return opError(op, name, err)
}

// backend names the package in errors.
const backend = "amqpsem"

// opError returns err, the error of operation op on name, in the one
// shape of errors ([driver.Errorf]): "amqpsem: lock \"jobs\": <cause>",
// "amqpsem: " once. The name is left out when the cause names it: an
// invalid name's error, a [locks.HeldError] of name. An error in that
// shape already is returned as it is ("amqpsem: dial amqp://host/: ..."
// for an op without a name); nil gives nil.
func opError(op, name string, err error) error {
	if err == nil {
		return nil
	}
	if errors.Is(err, locks.ErrInvalidName) {
		name = ""
	}
	msg := err.Error()
	if name == "" && (strings.HasPrefix(msg, backend+": "+op+": ") || strings.HasPrefix(msg, backend+": "+op+" ")) ||
		name != "" && strings.HasPrefix(msg, backend+": "+op+" "+driver.ShownName(name)+": ") {
		return err
	}
	return driver.Errorf(backend, op, name, unprefixed{err})
}

// closedError is the error of a call on a connection that is gone: lost
// ([ErrConnectionClosed]) or closed by [Client.Close]. Both match
// [locks.ErrClosed].
type closedError struct {
	client bool  // closed by Client.Close
	cause  error // the broker's or the network's reason, if known
}

func (e *closedError) Error() string {
	switch {
	case e.client:
		return "amqpsem: client closed"
	case e.cause == nil:
		return "amqpsem: connection closed"
	}
	return "amqpsem: connection closed: " + trimPrefix(e.cause)
}

func (e *closedError) Is(target error) bool {
	return target == locks.ErrClosed || target == ErrConnectionClosed && !e.client
}

func (e *closedError) Unwrap() error { return e.cause }

// asClosed returns cause as a closedError.
func asClosed(cause error) error {
	if ce, ok := cause.(*closedError); ok {
		return ce
	}
	return &closedError{cause: cause}
}

// trimPrefix returns err's text without a leading "amqpsem: ", to wrap it
// in a message of this package ("" for nil).
func trimPrefix(err error) string {
	if err == nil {
		return ""
	}
	return strings.TrimPrefix(err.Error(), "amqpsem: ")
}

// unprefixed is an error whose text drops a leading "amqpsem: ".
type unprefixed struct{ error }

func (u unprefixed) Error() string { return trimPrefix(u.error) }
func (u unprefixed) Unwrap() error { return u.error }

// errorf is [fmt.Errorf] for messages that start with "amqpsem: ": the
// errors it wraps lose their own "amqpsem: " prefix, so that none is
// repeated.
func errorf(format string, a ...any) error {
	for i, v := range a {
		if e, ok := v.(error); ok && e != nil {
			a[i] = unprefixed{e}
		}
	}
	return fmt.Errorf(format, a...)
}
