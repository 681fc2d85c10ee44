package natsputex

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/latchkey-go/latchkey/locks/driver"
)

// keyMaxLen bounds key names: a key becomes part of a NATS subject
// ($KV.<bucket>.<key>), and semaphore slots add a suffix.
const keyMaxLen = 512

// keys is the NATS KV key rule: letters, digits and -/_=. ; no empty
// dot-separated token, so no leading, trailing or double dot.
var keys = driver.NameRule{
	What:   "NATS KV key",
	MaxLen: keyMaxLen,
	Char: func(c rune) bool {
		return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || strings.ContainsRune("-/_=.", c)
	},
	Extra: func(s string) error {
		if s[0] == '.' || s[len(s)-1] == '.' || strings.Contains(s, "..") {
			return errors.New("must not begin or end with '.' nor contain '..'")
		}
		return nil
	},
}

// buckets is the NATS KV bucket name rule.
var buckets = driver.NameRule{
	What:   "NATS KV bucket",
	MaxLen: 255,
	Char: func(c rune) bool {
		return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_'
	},
}

// Client holds locks on one JetStream KV bucket. Its [Locker], its
// [Semaphore]s and its [Supervisor]s share its options, and their leases
// end when it is closed.
//
// A Client is safe for concurrent use. It does not own the NATS
// connection: make it with [ConnectOptions], and close it after the
// Client.
type Client struct {
	st     store
	bucket string
	o      options
	reg    *driver.Registry // the client's leases, their renewal, its goroutines

	mu     sync.Mutex
	leases map[*driver.Lease]*lease // the live leases of the Locker and the Semaphores
	blank  map[string]uint64        // keys this client left blank, at revision
	queues map[string]bool          // the queue consumers this client made or found (see queue.go)
}

// backend names natsputex in errors and events.
const backend = "natsputex"

// New returns a Client on bucket, creating the bucket if it does not exist
// (with [WithReplicas] and [WithStorage]; an existing bucket is used as it
// is, unless its stream drops a key's last write by itself: a TTL (max
// age) shorter than T + C·R, or limits that discard the oldest messages
// when the stream is full. Such a bucket is refused with an error
// matching [locks.ErrInvalidOption] that names it and its TTL or limits:
// it would free a quiet holder's key while it is held). The bucket name and every option are checked before any I/O: a
// bad bucket name gives an error matching [locks.ErrInvalidName], a bad
// option one matching [locks.ErrInvalidOption]. While JetStream cannot
// answer (a stream or meta leader being elected, a server restarting),
// New asks again, each request bounded by 2 s, until ctx ends; it then
// returns an error matching ctx.Err() that says what it waited for (the
// bucket's stream, by name), for how long, on which server, and the last
// answer it had.
//
// A replicated bucket (more than one replica) on a NATS server older than
// [MinClusterVersion] is refused with an error matching [ErrUnsafeServer]
// and naming the version, unless [WithUnsafeServer] allows it: the version
// checked is that of the server the connection is on, so every node of a
// cluster must run the same release. A single-replica bucket works on NATS
// 2.9 and later.
func New(ctx context.Context, js jetstream.JetStream, bucket string, opts ...Option) (*Client, error) {
	if err := driver.CheckContext(ctx, backend, "new", bucket); err != nil {
		return nil, err
	}
	o, err := newOptions(opts)
	if err != nil {
		return nil, driver.Errorf(backend, "new", bucket, err)
	}
	if o.holderID == "" {
		host, _ := os.Hostname()
		o.holderID = fmt.Sprintf("%s-%d", host, os.Getpid())
	}
	if err := buckets.Check(bucket); err != nil {
		return nil, driver.Errorf(backend, "new", "", err) // err names the bucket
	}
	if js == nil {
		return nil, driver.Errorf(backend, "new", bucket, driver.InvalidOption("nil JetStream"))
	}
	kv, err := openBucket(ctx, js, bucket, &o)
	if err != nil {
		return nil, err
	}
	c := &Client{
		st:     newStore(js, kv),
		bucket: bucket,
		o:      o,
		leases: make(map[*driver.Lease]*lease),
		blank:  make(map[string]uint64),
		queues: make(map[string]bool),
	}
	c.reg, err = driver.NewRegistry(driver.Config{Backend: backend, RenewEvery: o.renewEvery(), Renew: c.renewLeases})
	if err != nil {
		return nil, driver.Errorf(backend, "new", bucket, err)
	}
	return c, nil
}

// openAttempt bounds one request of New's to JetStream: a request sent
// while a stream has no leader may never be answered, even once one is
// elected, so New asks again.
const openAttempt = 2 * time.Second

// openBucket looks bucket up, or creates it, asking again while JetStream
// cannot answer, until ctx ends; it checks the server's version for a
// replicated bucket.
func openBucket(ctx context.Context, js jetstream.JetStream, bucket string, o *options) (jetstream.KeyValue, error) {
	start := time.Now()
	stream := "KV_" + bucket
	pause := 50 * time.Millisecond
	var last error
	for {
		kv, what, err := openOnce(ctx, js, bucket, o)
		if err == nil {
			return kv, nil
		}
		if errors.Is(err, ErrUnsafeServer) {
			return nil, err
		}
		cerr := ctx.Err()
		if cerr == nil && !transient(err) {
			return nil, driver.Errorf(backend, "new", bucket, fmt.Errorf("%s: %w", what, err))
		}
		if cerr == nil || last == nil || !errors.Is(err, cerr) {
			last = err
		}
		if cerr == nil {
			cerr = driver.Sleep(ctx, pause)
			pause = min(2*pause, time.Second)
		}
		if cerr != nil {
			answer := "no answer"
			if last != nil && !errors.Is(last, context.DeadlineExceeded) {
				answer = "last answer: " + last.Error()
			}
			return nil, driver.Errorf(backend, "new", bucket, fmt.Errorf("waited %v for %s (stream %s) on %s: %s: %w",
				time.Since(start).Round(time.Millisecond), what, stream, js.Conn().ConnectedUrlRedacted(), answer, cerr))
		}
	}
}

// openOnce makes one attempt of openBucket, and says what it was doing
// when it failed.
func openOnce(ctx context.Context, js jetstream.JetStream, bucket string, o *options) (jetstream.KeyValue, string, error) {
	ctx, cancel := context.WithTimeout(ctx, openAttempt)
	defer cancel()
	version := js.Conn().ConnectedServerVersion()
	what := "the lookup of the bucket"
	kv, err := js.KeyValue(ctx, bucket)
	switch {
	case err == nil:
		// An existing bucket, of the replicas it was made with.
		what = "the status of the bucket"
		st, err := kv.Status(ctx)
		if err != nil {
			return nil, what, err
		}
		replicas := 1
		if bs, ok := st.(*jetstream.KeyValueBucketStatus); ok && bs.StreamInfo() != nil {
			cfg := bs.StreamInfo().Config
			replicas = cfg.Replicas
			if err := o.checkBucket(bucket, cfg); err != nil {
				return nil, what, err
			}
		}
		return kv, what, o.checkServer(bucket, version, replicas)
	case errors.Is(err, jetstream.ErrBucketNotFound):
		// Refuse before making a bucket that cannot be used.
		if err := o.checkServer(bucket, version, o.replicas); err != nil {
			return nil, what, err
		}
		what = fmt.Sprintf("the creation of the bucket (%d replicas)", o.replicas)
		kv, err = js.CreateOrUpdateKeyValue(ctx, jetstream.KeyValueConfig{
			Bucket:      bucket,
			Description: "latchkey natsputex locks",
			History:     1,
			Storage:     o.storage,
			Replicas:    o.replicas,
		})
		return kv, what, err
	}
	return nil, what, err
}

// checkBucket refuses an existing bucket whose stream drops a key's
// last write by itself: a holder's key would vanish between two of its
// renewals, or while it is cut off, and look free to a client that has
// not seen it before, which takes it at once. A TTL (MaxAge) drops a
// quiet key MaxAge after its last write: the bucket is refused unless
// that is at least T + C·R after it, when a holder's hold has ended and a
// Supervisor's Stop has had its time (see the package doc). Limits on
// the stream's messages or bytes that discard the oldest messages drop a
// quiet key as others are written: refused whatever their size.
func (o *options) checkBucket(bucket string, cfg jetstream.StreamConfig) error {
	need := o.ttl() + time.Duration(o.confirm)*o.renew
	if cfg.MaxAge > 0 && cfg.MaxAge < need {
		return driver.InvalidOption("bucket %q has a TTL (max age) of %v, shorter than this client's T + C·R = %v: a holder's key could vanish, and be taken, while its hold or its service's stop is still under way; use a bucket without a TTL, or one of at least %v", bucket, cfg.MaxAge, need, need)
	}
	if cfg.Discard == jetstream.DiscardOld && (cfg.MaxMsgs > 0 || cfg.MaxBytes > 0) {
		return driver.InvalidOption("bucket %q discards its oldest messages when full (max messages %d, max bytes %d): a quiet holder's key could vanish, and be taken, while it is held; use a bucket that refuses new writes when full (discard new, as KV buckets are made)", bucket, cfg.MaxMsgs, cfg.MaxBytes)
	}
	return nil
}

// CheckSupervisor reports, without any I/O, whether [New] would accept
// bucket and opts and [Client.Supervisor] key and token: it returns the
// error they would return (matching [locks.ErrInvalidName] or
// [locks.ErrInvalidOption]), or nil. Commands use it to reject bad input
// before they connect.
func CheckSupervisor(bucket, key, token string, opts ...Option) error {
	if _, err := newOptions(opts); err != nil {
		return driver.Errorf(backend, "new", bucket, err)
	}
	if err := buckets.Check(bucket); err != nil {
		return driver.Errorf(backend, "new", "", err) // err names the bucket
	}
	_, err := (&Client{}).Supervisor(key, token, Service{})
	return err
}

// Bucket returns the name of the client's bucket.
func (c *Client) Bucket() string { return c.bucket }

// HolderID returns the identity the client writes in the keys it holds,
// before each lease's random suffix and the client's T (see
// [WithHolderID]).
func (c *Client) HolderID() string { return c.o.holderID }

// TTL returns T = F·R: how long a key must go without any write before a
// waiter takes it over.
func (c *Client) TTL() time.Duration { return c.o.ttl() }

// Close ends every lease of the client with a cause matching
// [locks.ErrLost] and [locks.ErrClosed], then blanks their keys (in
// parallel, each conditional on its lease's last write), makes waiting
// calls and running Supervisors return, waits for those calls (a Lock at
// the head of a key's queue hands its turn on before Close returns, so
// closing the connection next costs the other waiters nothing), and makes
// later calls fail with an error matching [locks.ErrClosed]. It does not
// close the NATS connection. Every wait is bounded by ctx: when ctx ends
// first, Close returns an error matching ctx.Err() and the rest finishes
// in the background. Close is idempotent (later calls return nil at once)
// and safe for concurrent use; it returns the errors of the blanks that
// failed, if any. A server that does not answer holds Close at most
// max(T, 1s), the bound of one request: the blanks and the calls' last
// requests run in parallel.
//
// A running Supervisor's hold is one of those leases: Close runs its
// [Service.Stop] and blanks its key only once Stop has returned (not at
// all when Stop fails, which Close returns; and not when a standby took
// the key over while a long Stop ran: see docs/protocols/natsputex.md),
// and Run returns an error matching [locks.ErrClosed]. Close does not
// wait for Run itself, nor for a Stop of an agent that did not hold the
// key.
func (c *Client) Close(ctx context.Context) error {
	if err := driver.CheckContext(ctx, backend, "close", ""); err != nil {
		return err
	}
	return driver.Errorf(backend, "close", "", c.reg.Close(ctx, nil))
}

// knownBlank returns the revision at which this client left key blank, if
// it did last, and forgets it (the next write makes it stale either way).
func (c *Client) knownBlank(key string) (uint64, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	rev, ok := c.blank[key]
	delete(c.blank, key)
	return rev, ok
}

func (c *Client) rememberBlank(key string, rev uint64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.blank) >= 1024 {
		clear(c.blank)
	}
	c.blank[key] = rev
}

// opContext bounds one request to the broker: a request whose answer is
// lost (a stream leader dying) must not hang a call for its whole context.
func (c *Client) opContext(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, max(c.o.ttl(), time.Second))
}

// writeContext bounds a write that takes a key like opContext, but is
// not cancelled with ctx: a write cancelled in flight may still land, and
// leave the key to a token no lease owns until T has passed. A call whose
// ctx ends meanwhile waits for the answer (at most max(T, 1s)) and, if
// the key is won, returns the lease.
func (c *Client) writeContext(ctx context.Context) (context.Context, context.CancelFunc) {
	return c.opContext(context.WithoutCancel(ctx))
}

// healthCheck runs the client's health check, if any, bounded by T.
func (c *Client) healthCheck(ctx context.Context, s State) error {
	if c.o.health == nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, c.o.ttl())
	defer cancel()
	errc := make(chan error, 1)
	go func() {
		defer func() {
			if p := recover(); p != nil {
				errc <- fmt.Errorf("health check panicked: %v", p)
			}
		}()
		errc <- c.o.health(ctx, s)
	}()
	select {
	case err := <-errc:
		if err != nil {
			return fmt.Errorf("health check (%s): %w", s, err)
		}
		return nil
	case <-ctx.Done():
		// A check that ignores its context is abandoned, not waited for:
		// the lease must end in time regardless.
		return fmt.Errorf("health check (%s): %w", s, context.Cause(ctx))
	}
}
