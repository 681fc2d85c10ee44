package benchmarks

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/bsm/redislock"
	"github.com/go-redsync/redsync/v4"
	redsyncredis "github.com/go-redsync/redsync/v4/redis"
	redsyncgoredis "github.com/go-redsync/redsync/v4/redis/goredis/v9"
	"github.com/latchkey-go/latchkey/locks"
	"github.com/latchkey-go/latchkey/locks/driver"
	"github.com/redis/go-redis/v9"
)

// redisBase is what every Redis system shares: the masters it uses, the
// TTL, and a round-trip counter fed by a hook on every go-redis client it
// makes.
type redisBase struct {
	addrs []string
	ttl   time.Duration
	rt    atomic.Uint64
}

func newRedisBase(env Env, masters int) (*redisBase, error) {
	if err := env.need(Redis, masters); err != nil {
		return nil, err
	}
	return &redisBase{addrs: env.Redis[:masters], ttl: env.ttl()}, nil
}

// dial returns one go-redis client per master, counting round trips. The
// pool is sized for the contended and many scenarios' concurrency.
func (b *redisBase) dial(ctx context.Context) ([]*redis.Client, error) {
	cs := make([]*redis.Client, 0, len(b.addrs))
	for _, a := range b.addrs {
		c := redis.NewClient(&redis.Options{Addr: a, PoolSize: 16, MinIdleConns: 1, MaxRetries: -1, ContextTimeoutEnabled: true})
		c.AddHook(countHook{&b.rt})
		if err := c.Ping(ctx).Err(); err != nil {
			_ = c.Close()
			for _, c := range cs {
				_ = c.Close()
			}
			return nil, fmt.Errorf("redis %s: %w", a, err)
		}
		cs = append(cs, c)
	}
	b.rt.Add(^uint64(len(cs) - 1)) // the PINGs are not the system's
	return cs, nil
}

func closeRedis(cs []*redis.Client) error {
	var errs []error
	for _, c := range cs {
		errs = append(errs, c.Close())
	}
	return errors.Join(errs...)
}

func (b *redisBase) Close() error { return nil }

// redisTTL makes a Redis system [Renewing]; the floor is not.
type redisTTL struct{ *redisBase }

func (b redisTTL) RenewInterval() time.Duration { return b.ttl / 3 }
func (b redisTTL) Masters() int                 { return len(b.addrs) }
func (b redisTTL) RoundTrips() uint64           { return b.rt.Load() }

// countHook counts commands and pipelines sent, one round trip each.
type countHook struct{ n *atomic.Uint64 }

func (h countHook) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h countHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		h.n.Add(1)
		return next(ctx, cmd)
	}
}
func (h countHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		h.n.Add(1)
		return next(ctx, cmds)
	}
}

// --- peer: go-redsync/redsync ---

// redsyncSystem is redsync's Redlock on N masters through its go-redis v9
// pool, with its default retry policy (32 tries, 50–250 ms apart): Lock
// calls LockContext again after each ErrFailed until ctx ends, as a user
// who needs the lock must.
type redsyncSystem struct{ redisTTL }

func newRedsync(masters int) func(context.Context, Env) (System, error) {
	return func(_ context.Context, env Env) (System, error) {
		b, err := newRedisBase(env, masters)
		if err != nil {
			return nil, err
		}
		return &redsyncSystem{redisTTL{b}}, nil
	}
}

func (s *redsyncSystem) NewClient(ctx context.Context) (Client, error) {
	cs, err := s.dial(ctx)
	if err != nil {
		return nil, err
	}
	pools := make([]redsyncredis.Pool, len(cs))
	for i, c := range cs {
		pools[i] = redsyncgoredis.NewPool(c)
	}
	return &redsyncClient{rs: redsync.New(pools...), cs: cs, ttl: s.ttl}, nil
}

type redsyncClient struct {
	rs  *redsync.Redsync
	cs  []*redis.Client
	ttl time.Duration
}

func (c *redsyncClient) Lock(ctx context.Context, name string) (Held, error) {
	m := c.rs.NewMutex(name, redsync.WithExpiry(c.ttl))
	for {
		err := m.LockContext(ctx)
		if err == nil {
			return redsyncHeld{m}, nil
		}
		if cerr := ctx.Err(); cerr != nil {
			return nil, fmt.Errorf("redsync: lock %q: %w: %w", name, cerr, err)
		}
		var taken *redsync.ErrTaken
		if !errors.Is(err, redsync.ErrFailed) && !errors.As(err, &taken) {
			return nil, fmt.Errorf("redsync: lock %q: %w", name, err)
		}
	}
}

func (c *redsyncClient) Close() error { return closeRedis(c.cs) }

type redsyncHeld struct{ m *redsync.Mutex }

func (h redsyncHeld) Release(ctx context.Context) error {
	ok, err := h.m.UnlockContext(ctx)
	if err == nil && !ok {
		err = fmt.Errorf("redsync: unlock %q: %w", h.m.Name(), locks.ErrLost)
	}
	return err
}

func (h redsyncHeld) Renew(ctx context.Context) error {
	ok, err := h.m.ExtendContext(ctx)
	if err == nil && !ok {
		err = fmt.Errorf("redsync: extend %q: %w", h.m.Name(), locks.ErrLost)
	}
	return err
}

// --- peer: bsm/redislock ---

// redislockSystem is bsm/redislock on one master. Its Obtain retries with
// ExponentialBackoff(16ms, 256ms) (its doc recommends a minimum of 16 ms);
// Lock calls Obtain again after ErrNotObtained until ctx ends.
type redislockSystem struct{ redisTTL }

func newRedislock(_ context.Context, env Env) (System, error) {
	b, err := newRedisBase(env, 1)
	if err != nil {
		return nil, err
	}
	return &redislockSystem{redisTTL{b}}, nil
}

func (s *redislockSystem) NewClient(ctx context.Context) (Client, error) {
	cs, err := s.dial(ctx)
	if err != nil {
		return nil, err
	}
	return &redislockClient{c: redislock.New(cs[0]), rc: cs[0], ttl: s.ttl}, nil
}

type redislockClient struct {
	c   *redislock.Client
	rc  *redis.Client
	ttl time.Duration
}

func (c *redislockClient) Lock(ctx context.Context, name string) (Held, error) {
	for {
		l, err := c.c.Obtain(ctx, name, c.ttl, &redislock.Options{
			RetryStrategy: redislock.ExponentialBackoff(16*time.Millisecond, 256*time.Millisecond),
		})
		if err == nil {
			return redislockHeld{l, c.ttl}, nil
		}
		if cerr := ctx.Err(); cerr != nil {
			return nil, fmt.Errorf("redislock: obtain %q: %w: %w", name, cerr, err)
		}
		if !errors.Is(err, redislock.ErrNotObtained) {
			return nil, fmt.Errorf("redislock: obtain %q: %w", name, err)
		}
	}
}

func (c *redislockClient) Close() error { return c.rc.Close() }

type redislockHeld struct {
	l   *redislock.Lock
	ttl time.Duration
}

func (h redislockHeld) Release(ctx context.Context) error { return h.l.Release(ctx) }
func (h redislockHeld) Renew(ctx context.Context) error   { return h.l.Refresh(ctx, h.ttl, nil) }

// --- floor: SET NX + DEL ---

// redisFloor is the least a Redis lock can cost: SET key val NX to take,
// DEL to free, one round trip each, with no TTL, no ownership check and no
// fairness. Waiting is plain polling with a short jittered back-off.
type redisFloor struct{ *redisBase }

func newRedisFloor(_ context.Context, env Env) (System, error) {
	b, err := newRedisBase(env, 1)
	if err != nil {
		return nil, err
	}
	return &redisFloor{b}, nil
}

// floorBackoff is the polling schedule of the floors' blocking Lock.
var floorBackoff = locks.Backoff{Min: 200 * time.Microsecond, Max: 5 * time.Millisecond}

func (s *redisFloor) NewClient(ctx context.Context) (Client, error) {
	cs, err := s.dial(ctx)
	if err != nil {
		return nil, err
	}
	return &redisFloorClient{c: cs[0]}, nil
}

type redisFloorClient struct{ c *redis.Client }

func (c *redisFloorClient) Lock(ctx context.Context, name string) (Held, error) {
	return driver.Wait(ctx, nil, floorBackoff, func(ctx context.Context) (Held, error) {
		ok, err := c.c.SetNX(ctx, name, "1", 0).Result()
		switch {
		case err != nil:
			return nil, err
		case !ok:
			return nil, locks.ErrNotAcquired
		}
		return redisFloorHeld{c.c, name}, nil
	})
}

func (c *redisFloorClient) Close() error { return c.c.Close() }

type redisFloorHeld struct {
	c    *redis.Client
	name string
}

func (h redisFloorHeld) Release(ctx context.Context) error { return h.c.Del(ctx, h.name).Err() }

// brokerOps sums the calls of every command in INFO commandstats on each
// master the system uses (commands run by scripts included, INFO itself
// not): the masters' own count, every process's clients together. It asks
// over a bare connection, so that no handshake of a client library is
// counted.
func (b *redisBase) brokerOps(ctx context.Context) (brokerOps, error) {
	var o brokerOps
	for _, a := range b.addrs {
		n, err := redisCommandCalls(ctx, a)
		if err != nil {
			return brokerOps{}, err
		}
		o.Ops += n
	}
	return o, nil
}

func (b *redisBase) wideOps() bool { return true }

// redisCommandCalls returns the sum of calls in addr's INFO commandstats,
// but INFO's.
func redisCommandCalls(ctx context.Context, addr string) (uint64, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	var d net.Dialer
	conn, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return 0, fmt.Errorf("redis %s: info commandstats: %w", addr, err)
	}
	defer conn.Close()
	if dl, ok := ctx.Deadline(); ok {
		_ = conn.SetDeadline(dl)
	}
	if _, err := io.WriteString(conn, "*2\r\n$4\r\nINFO\r\n$12\r\ncommandstats\r\n"); err != nil {
		return 0, fmt.Errorf("redis %s: info commandstats: %w", addr, err)
	}
	br := bufio.NewReader(conn)
	head, err := br.ReadString('\n')
	if err != nil {
		return 0, fmt.Errorf("redis %s: info commandstats: %w", addr, err)
	}
	size, err := strconv.Atoi(strings.TrimSpace(strings.TrimPrefix(head, "$")))
	if !strings.HasPrefix(head, "$") || err != nil || size < 0 {
		return 0, fmt.Errorf("redis %s: info commandstats: unexpected reply %q", addr, strings.TrimSpace(head))
	}
	body := make([]byte, size)
	if _, err := io.ReadFull(br, body); err != nil {
		return 0, fmt.Errorf("redis %s: info commandstats: %w", addr, err)
	}
	return sumCommandCalls(string(body))
}

// sumCommandCalls sums calls= over the cmdstat_ lines of an INFO
// commandstats reply, but INFO's.
func sumCommandCalls(info string) (uint64, error) {
	var n uint64
	for line := range strings.SplitSeq(info, "\n") {
		name, stats, ok := strings.Cut(strings.TrimSpace(line), ":")
		if !ok || !strings.HasPrefix(name, "cmdstat_") || name == "cmdstat_info" {
			continue
		}
		for field := range strings.SplitSeq(stats, ",") {
			if v, ok := strings.CutPrefix(field, "calls="); ok {
				c, err := strconv.ParseUint(v, 10, 64)
				if err != nil {
					return 0, fmt.Errorf("commandstats: bad line %q", line)
				}
				n += c
			}
		}
	}
	return n, nil
}
