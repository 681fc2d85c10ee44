package amqpsem_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/latchkey-go/latchkey/amqpsem"
)

// A release publishes its wake-up to the wake exchange; when that is
// missing, the broker closes the publishing channel, a moment later. That
// must not break the locks and releases that follow at once on the
// client's other channels.
func TestMissingWakeExchange(t *testing.T) {
	u, _ := amqpURL(t)
	ctx := tctx(t)
	base := uniqueName(t, u)
	c := dial(t, u, amqpsem.WithWakeExchange(base+"-no-such-exchange"))
	m := c.Locker()
	var queues []string
	for i := range 40 {
		l, err := m.TryLock(ctx, fmt.Sprintf("%s-%d", base, i))
		if err != nil {
			t.Fatalf("TryLock #%d, after a release: %v", i, err)
		}
		queues = append(queues, l.(*amqpsem.Lease).Queue())
		if err := l.Release(ctx); err != nil {
			t.Fatalf("Release #%d: %v", i, err)
		}
	}
	r := rawConn(t, u)
	for _, q := range queues {
		if r.exists(q) {
			t.Errorf("%q outlived its Release", q)
		}
	}
}

// hookConn calls onSet after each SetDeadline.
type hookConn struct {
	net.Conn
	onSet func(time.Time)
}

func (c *hookConn) SetDeadline(t time.Time) error {
	err := c.Conn.SetDeadline(t)
	c.onSet(t)
	return err
}

// Dial's context ending just after the handshakes, as the connection is
// handed over, interrupts the connection: Dial must then return the
// context's error, not a client whose connection dies at once.
func TestDialCancelledAfterHandshake(t *testing.T) {
	u, host := amqpURL(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	interrupted := make(chan struct{})
	var once sync.Once
	viaHook := amqpsem.WithDial(func(ctx context.Context, network, _ string) (net.Conn, error) {
		var d net.Dialer
		conn, err := d.DialContext(ctx, network, host)
		if err != nil {
			return nil, err
		}
		return &hookConn{Conn: conn, onSet: func(t time.Time) {
			switch {
			case t.IsZero():
				// The AMQP client clears the handshake deadline: the
				// connection is open. End Dial's context now, and wait
				// until Dial's interruption has set its past deadline.
				cancel()
				select {
				case <-interrupted:
				case <-time.After(5 * time.Second):
				}
			case t.Before(time.Unix(2, 0)):
				once.Do(func() { close(interrupted) })
			}
		}}, nil
	})
	c, err := amqpsem.Dial(ctx, u, append(testOptions(), viaHook)...)
	if err == nil {
		_ = c.Close(context.Background())
		t.Fatal("Dial returned a client after its context ended and interrupted the connection")
	}
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("Dial = %v, want context.Canceled", err)
	}
}

// withQuery returns rawURL with its query parameter key set to value, or
// without it when value is "".
func withQuery(t *testing.T, rawURL, key, value string) string {
	t.Helper()
	u, err := url.Parse(rawURL)
	if err != nil {
		t.Fatal(err)
	}
	q := u.Query()
	if value == "" {
		q.Del(key)
	} else {
		q.Set(key, value)
	}
	u.RawQuery = q.Encode()
	return u.String()
}

// brokerHeartbeat returns the heartbeat interval the broker proposes (0:
// none). A client asking for none (heartbeat=0 in the URL) gets the
// broker's.
func brokerHeartbeat(t *testing.T, rawURL string) time.Duration {
	t.Helper()
	conn, err := amqp.Dial(withQuery(t, rawURL, "heartbeat", "0"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	return conn.Config.Heartbeat
}

// TestHeartbeatNegotiated: the negotiated interval, Client.Heartbeat, is
// what WithHeartbeat asks for (10s when not given), unless the broker
// proposes a lower one, or the URL's heartbeat= replaces it, lower or
// higher.
func TestHeartbeatNegotiated(t *testing.T) {
	u, _ := amqpURL(t)
	broker := brokerHeartbeat(t, u)
	t.Logf("the broker proposes a heartbeat of %v", broker)
	// The AMQP rule: the lower of the two proposals, unless one is 0.
	negotiated := func(asked time.Duration) time.Duration {
		if broker == 0 {
			return asked
		}
		return min(asked, broker)
	}
	plain := withQuery(t, u, "heartbeat", "")
	for _, tc := range []struct {
		what  string
		url   string
		opts  []amqpsem.Option
		asked time.Duration
	}{
		{"default", plain, nil, 10 * time.Second},
		{"option", plain, []amqpsem.Option{amqpsem.WithHeartbeat(7 * time.Second)}, 7 * time.Second},
		{"URL lower than the option", withQuery(t, plain, "heartbeat", "2"), []amqpsem.Option{amqpsem.WithHeartbeat(10 * time.Second)}, 2 * time.Second},
		{"URL higher than the option", withQuery(t, plain, "heartbeat", "3"), []amqpsem.Option{amqpsem.WithHeartbeat(time.Second)}, 3 * time.Second},
	} {
		c, err := amqpsem.Dial(tctx(t), tc.url, tc.opts...)
		if err != nil {
			t.Fatalf("%s: Dial: %v", tc.what, err)
		}
		got := c.Heartbeat()
		_ = c.Close(context.Background())
		if want := negotiated(tc.asked); got != want {
			t.Errorf("%s: Heartbeat() = %v, want %v (asked for %v, the broker proposes %v)", tc.what, got, want, tc.asked, broker)
		}
	}
	if broker != 0 && broker < 10*time.Second {
		t.Logf("the broker's %v is below some of the intervals asked for: those cases only show that it lowers them", broker)
	}
}
