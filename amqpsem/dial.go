package amqpsem

import (
	"context"
	"errors"
	"net"
	neturl "net/url"
	"strings"
	"sync/atomic"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/latchkey-go/latchkey/locks/driver"
)

// dialConn opens an AMQP connection to url with o's connection options,
// and returns it, its socket and its negotiated heartbeat.
func dialConn(ctx context.Context, url string, o options) (*amqp.Connection, *silenceConn, time.Duration, error) {
	uri, err := amqp.ParseURI(url)
	if err != nil {
		return nil, nil, 0, errorf("amqpsem: dial: %w", driver.InvalidOption("URL %s: %s", RedactURL(url), RedactURLsIn(err.Error(), url)))
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
		// amqp091 reports a handshake read that timed out as a frame
		// error (501) without the net.Error, and the socket's deadline,
		// set to the connect timeout's, fires a moment before dctx's own
		// timer: past that deadline, the timeout it is.
		dialDeadline, _ := dctx.Deadline()
		if dctx.Err() != nil || isTimeout(err) || !dialDeadline.IsZero() && !time.Now().Before(dialDeadline) {
			return nil, nil, 0, errorf("amqpsem: dial %s: no connection within the connect timeout %v: %w", redact(uri), o.connectTimeout, err)
		}
		return nil, nil, 0, errorf("amqpsem: dial %s: %w", redact(uri), err)
	}
	hb := conn.Config.Heartbeat
	if hb <= 0 {
		_ = conn.Close()
		return nil, nil, 0, errorf("amqpsem: dial: %w", driver.InvalidOption("heartbeats are disabled (heartbeat=0 in the URL and at the broker): amqpsem needs them to bound how long a dead holder keeps its slot"))
	}
	return conn, watched, hb, nil
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
