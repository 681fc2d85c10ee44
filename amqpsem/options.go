package amqpsem

import (
	"context"
	"crypto/tls"
	"net"
	"time"

	"github.com/latchkey-go/latchkey/locks"
	"github.com/latchkey-go/latchkey/locks/driver"
)

type options struct {
	// Connection options, used by Dial only.
	heartbeat        time.Duration
	tls              *tls.Config
	dial             func(ctx context.Context, network, addr string) (net.Conn, error)
	connectTimeout   time.Duration
	connName         string
	reconnect        bool
	reconnectBackoff locks.Backoff
	connNotice       func(ConnectionEvent)
	connSet          bool // a connection option was given

	layout       Layout
	verify       time.Duration // 0: a third of the heartbeat
	backoff      locks.Backoff
	maxAttempts  int
	skew         time.Duration
	create       bool
	overshoot    int
	ascending    bool
	wakeExchange string
	mutexWait    func(name string)
	holdTimeout  time.Duration // quorum layout: x-consumer-timeout; 0: the broker's

	hooks testHooks
}

// testHooks let this package's tests act at the moments the
// specification's races happen, against the real broker.
type testHooks struct {
	beforeDeclare func(slot int)                   // a scan found slot free; its B is declared next
	skew          func(d time.Duration, err error) // a lost race; the scan starts again after d
}

func defaults() options {
	return options{
		heartbeat:        10 * time.Second,
		connectTimeout:   30 * time.Second,
		reconnect:        true,
		reconnectBackoff: locks.Backoff{Min: 100 * time.Millisecond, Max: 10 * time.Second},
		layout:           DefaultLayout,
		backoff:          locks.DefaultBackoff,
		maxAttempts:      10,
		skew:             20 * time.Millisecond,
		wakeExchange:     "amq.direct",
	}
}

// Option configures a [Client] (given to [Dial]) and the [Locker] and
// [Semaphore]s made from it, or one [Admin] made from it, on top of the
// client's options. Options marked "connection option" are only accepted
// by Dial.
type Option func(*options) error

// WithHeartbeat sets the AMQP heartbeat interval the client asks for; the
// broker may lower it, and a heartbeat in the URL wins (heartbeat=0 there
// takes the broker's interval). It is whole
// seconds, at least 1s. A holder whose connection is silenced keeps its
// slot at the broker for two to three intervals (see the package
// documentation), and its own lease ends within one interval of its last
// successful verification. Connection option. The default is 10s.
func WithHeartbeat(d time.Duration) Option {
	return func(o *options) error {
		o.heartbeat, o.connSet = d, true
		if d < time.Second {
			return driver.InvalidOption("heartbeat must be at least 1s, got %v", d)
		}
		return nil
	}
}

// WithTLS sets the TLS configuration used for amqps:// URLs. Connection
// option. The default is the system's roots, with the server name taken
// from the URL.
func WithTLS(cfg *tls.Config) Option {
	return func(o *options) error {
		o.tls, o.connSet = cfg, true
		if cfg == nil {
			return driver.InvalidOption("TLS config must not be nil")
		}
		return nil
	}
}

// WithDial sets how the client opens its TCP connection (for a proxy, a
// custom dialer or tests). ctx ends when Dial's context ends or the connect
// timeout passes. Connection option. The default is a [net.Dialer].
func WithDial(dial func(ctx context.Context, network, addr string) (net.Conn, error)) Option {
	return func(o *options) error {
		o.dial, o.connSet = dial, true
		if dial == nil {
			return driver.InvalidOption("dial function must not be nil")
		}
		return nil
	}
}

// WithConnectTimeout bounds the TCP connection, the TLS and the AMQP
// handshakes of Dial, on top of its context. Connection option. The
// default is 30s.
func WithConnectTimeout(d time.Duration) Option {
	return func(o *options) error {
		o.connectTimeout, o.connSet = d, true
		return driver.Positive("connect timeout", d)
	}
}

// WithConnectionName sets the connection name the broker shows for the
// client (the connection_name client property). Connection option. The
// default is "amqpsem".
func WithConnectionName(name string) Option {
	return func(o *options) error {
		o.connName, o.connSet = name, true
		if len(name) > maxShortString {
			return driver.InvalidOption("connection name is %d bytes, longer than %d", len(name), maxShortString)
		}
		return nil
	}
}

// WithLayout sets how a semaphore's queues are named and declared; see
// [Layout]. All clients of one semaphore must use the same layout. The
// default is [DefaultLayout].
func WithLayout(l Layout) Option {
	return func(o *options) error {
		o.layout = l
		return l.validate()
	}
}

// WithVerifyInterval sets how often a held lease verifies itself at the
// broker: a semaphore lease checks that its slot queue A[L] and its holder
// queue B[L] still exist, a mutex lease that its queue does. A failed
// check ends the lease with [locks.ErrLost]; each success extends the
// lease's validity to one heartbeat interval after the check was sent. The
// interval is capped at half the negotiated heartbeat. The default is a
// third of the negotiated heartbeat.
func WithVerifyInterval(d time.Duration) Option {
	return func(o *options) error {
		o.verify = d
		return driver.Positive("verify interval", d)
	}
}

// WithBackoff sets the polling schedule of a waiting Lock or Acquire, the
// fallback when no release wakes it (a holder that crashed, slots added by
// an administrator of another implementation). The default is
// [locks.DefaultBackoff].
func WithBackoff(b locks.Backoff) Option {
	return func(o *options) error {
		o.backoff = b
		return b.Check()
	}
}

// WithMaxAttempts sets how many times one semaphore acquire attempt may
// lose the race for a free slot (the broker answering RESOURCE_LOCKED to
// its declare of the holder queue) before it gives up with
// [locks.ErrNotAcquired]. The default is 10.
func WithMaxAttempts(n int) Option {
	return func(o *options) error {
		o.maxAttempts = n
		if n < 1 {
			return driver.InvalidOption("max attempts must be >= 1, got %d", n)
		}
		return nil
	}
}

// WithSkew sets the upper bound of the random pause after a lost race for
// a slot, before the scan starts again from slot 1, so that racing clients
// spread out. Zero retries at once. The default is 20ms.
func WithSkew(d time.Duration) Option {
	return func(o *options) error {
		o.skew = d
		if d < 0 {
			return driver.InvalidOption("skew must be >= 0, got %v", d)
		}
		return nil
	}
}

// WithCreate makes the client's [Semaphore]s create a semaphore with
// their size slots, under the administration mutex, when an acquire
// finds it has none (no A[1]). A semaphore that exists is never resized.
// Without it, a semaphore without slots is not acquired until an
// administrator creates it ([ErrNoSlots]). The default is false.
func WithCreate(on bool) Option {
	return func(o *options) error {
		o.create = on
		return nil
	}
}

// WithOvershoot makes each administrative change first delete, in the
// change's order, the slot queues A[C+1]..A[C+t] above the maximum C it
// found: queues left there by failed administrators, other
// implementations or manual changes. Deleting a missing queue is a no-op.
// The default is 0.
func WithOvershoot(t int) Option {
	return func(o *options) error {
		o.overshoot = t
		if t < 0 || t > MaxSemaphoreSize {
			return driver.InvalidOption("overshoot must be in 0..%d, got %d", MaxSemaphoreSize, t)
		}
		return nil
	}
}

// WithAscendingDelete makes [Admin.Destroy] and [Admin.Remove] delete slot
// queues in ascending order (the specification's "Swiss cheese"
// semaphores): acquires fail sooner, but a delete that fails midway leaves
// slots above a gap that only overshooting prunes. The default is false:
// descending, each delete waiting for its delete-ok.
func WithAscendingDelete(on bool) Option {
	return func(o *options) error {
		o.ascending = on
		return nil
	}
}

// WithWakeExchange sets the exchange that releases publish to and waiters
// bind to (with the semaphore or mutex name as routing key), so that a
// clean release wakes waiting clients at once: for a mutex, one waiting
// client, through the shared queue the package documentation describes.
// It must be a direct exchange that exists; "" disables wake-ups and
// waiters poll. The default is "amq.direct", which every virtual host
// has.
func WithWakeExchange(name string) Option {
	return func(o *options) error {
		o.wakeExchange = name
		if len(name) > maxShortString {
			return driver.InvalidOption("wake exchange name is %d bytes, longer than %d", len(name), maxShortString)
		}
		return nil
	}
}

// WithMutexWaitNotice makes an [Admin] call f, with the semaphore's name,
// when a change, or a check of [Admin.WaitReleased], finds the
// semaphore's administration mutex held by another connection and starts
// waiting for it: a command can tell its operator why it waits. AMQP does
// not say which connection owns a queue (RabbitMQ's management UI and
// "rabbitmqctl list_queues name owner_pid" do). f runs on the calling
// goroutine, once per change or WaitReleased. The default is nil: no
// notice.
func WithMutexWaitNotice(f func(name string)) Option {
	return func(o *options) error {
		o.mutexWait = f
		return nil
	}
}

// WithReconnect sets whether a [Client] whose connection is lost dials
// again, and the back-off between attempts (see [locks.Backoff.Delay]:
// doubling from b.Min up to b.Max, jittered). The leases of the lost
// connection end all the same. Connection option. The default is on,
// from 100ms up to 10s.
func WithReconnect(on bool, b locks.Backoff) Option {
	return func(o *options) error {
		o.reconnect, o.connSet = on, true
		if !on {
			return nil
		}
		o.reconnectBackoff = b
		return b.Check()
	}
}

// WithConnectionNotice makes a [Client] call f when its connection is
// lost, when an attempt to reconnect fails, and when it has connected
// again (see [ConnectionEvent]): the health signal of a long-lived
// client. f runs on a goroutine of the client, in order, and must return
// promptly: [Client.Close] waits for it. Connection option. The default
// is nil.
func WithConnectionNotice(f func(ConnectionEvent)) Option {
	return func(o *options) error {
		o.connNotice, o.connSet = f, true
		return nil
	}
}

// WithConsumerTimeout sets the consumer timeout that the quorum layout's
// queues are made with ([Quorum.Create], or [WithCreate]): the
// x-consumer-timeout queue argument, which RabbitMQ honours from 3.12. A
// token held longer than it loses its channel: the broker closes it, the
// token goes to the next client and the lease ends with [locks.ErrLost].
// Creating on an older broker fails with an error saying so, before it
// declares anything. It must be at least 1s. The default, 0, leaves the
// broker's consumer_timeout (30 minutes unless configured).
func WithConsumerTimeout(d time.Duration) Option {
	return func(o *options) error {
		o.holdTimeout = d
		if d < time.Second {
			return driver.InvalidOption("consumer timeout must be at least 1s, got %v", d)
		}
		return nil
	}
}
