package testenv

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

const (
	localRedisAddr = "127.0.0.1:6379"

	redisRepo = "redis"
	redisTag  = "7-alpine"

	// redisReadyTimeout bounds how long a started redis-server may take to
	// answer PING.
	redisReadyTimeout = 10 * time.Second
	// redisStartAttempts is how many free ports StartRedis tries per server,
	// since another program may bind a port FreePort chose before redis does.
	redisStartAttempts = 3
)

// RedisAddr returns the address (host:port) of a Redis server the test can
// use, looking in this order: the first address in the LOCKS_REDIS_ADDRS
// environment variable; a server answering PING on 127.0.0.1:6379; a
// redis-server from the PATH or a container, started as by [StartRedis].
// Otherwise it calls [Missing].
//
// The server may be shared with other tests and other packages, so tests use
// unique key names. RedisAddr must be called from the goroutine running the
// test.
func RedisAddr(t testing.TB) string {
	t.Helper()
	return RedisAddrs(t)[0]
}

// RedisAddrs is like [RedisAddr] but returns every address listed in
// LOCKS_REDIS_ADDRS when it is set (for example the independent masters of a
// Redlock setup). Otherwise it returns the single address RedisAddr finds.
// The test fails if an address from the environment does not accept a TCP
// connection.
func RedisAddrs(t testing.TB) []string {
	t.Helper()
	addrs, err := ForTest(t).RedisAddrs(t.Context())
	Require(t, err)
	return addrs
}

// RedisAddrs is [RedisAddrs] returning an error: a [*MissingError] when
// there is no server and no way to start one. A server it starts is
// stopped at [Env.Close].
func (e *Env) RedisAddrs(ctx context.Context) ([]string, error) {
	if addrs, err := RedisAddrsFromEnv(); addrs != nil || err != nil {
		return addrs, err
	}
	if redisPing(localRedisAddr, time.Second) == nil {
		return []string{localRedisAddr}, nil
	}
	servers, err := e.StartRedis(ctx, 1, RedisConfig{})
	if err != nil {
		return nil, err
	}
	return []string{servers[0].Addr()}, nil
}

// RedisAddrsFromEnv returns the addresses listed, comma-separated, in the
// LOCKS_REDIS_ADDRS environment variable, or nil when it is unset or
// blank. It returns an error if one of them does not accept a TCP
// connection, or if the variable lists no address.
func RedisAddrsFromEnv() ([]string, error) {
	env := os.Getenv("LOCKS_REDIS_ADDRS")
	if strings.TrimSpace(env) == "" {
		return nil, nil
	}
	var addrs []string
	for a := range strings.SplitSeq(env, ",") {
		if a = strings.TrimSpace(a); a == "" {
			continue
		}
		if err := dialCheck(a); err != nil {
			return nil, fmt.Errorf("testenv: LOCKS_REDIS_ADDRS=%q: %w", env, err)
		}
		addrs = append(addrs, a)
	}
	if len(addrs) == 0 {
		return nil, fmt.Errorf("testenv: LOCKS_REDIS_ADDRS=%q lists no address", env)
	}
	return addrs, nil
}

// A RedisServer is a Redis master started for one test by [StartRedis], which
// the test may kill, pause and restart to inject faults. Its methods are safe
// to call from several goroutines; each waits for the previous one to finish.
// The server is stopped at the end of the test that started it (or at the
// [Env.Close] of the Env that started it).
type RedisServer struct {
	addr    string
	tlsAddr string
	bin     string // the redis-server program, "" in a container

	mu      sync.Mutex
	r       redisRunner
	running bool // started and not killed
	paused  bool
	stopped bool
}

// redisRunner is one way to run a Redis server on a fixed port: a local
// process or a container. Its methods are called with RedisServer.mu held.
type redisRunner interface {
	// start starts the server and waits until it answers PING.
	start(ctx context.Context) error
	// kill kills the server abruptly and waits until it is gone.
	kill() error
	pause() error
	resume() error
}

// StartRedis starts n independent Redis masters, each on its own free port on
// 127.0.0.1, for fault-injection tests (Redlock). Each runs the redis-server
// found on the PATH with no persistence (--save "" --appendonly no) and its
// own temporary directory; if there is no redis-server, each runs in a Docker
// container published on 127.0.0.1. StartRedis returns once every server
// answers PING. If neither way is available it calls [Missing]; if a server
// fails to start, the test fails. The servers are stopped at cleanup.
// StartRedis ignores LOCKS_REDIS_ADDRS: its servers are the test's own to
// kill. StartRedis must be called from the goroutine running the test.
func StartRedis(t testing.TB, n int) []*RedisServer {
	t.Helper()
	return StartRedisWith(t, n, RedisConfig{})
}

// RedisConfig is what [StartRedisWith] adds to the servers it starts.
type RedisConfig struct {
	// TLS, if set, makes each server also listen with TLS, on
	// [RedisServer.TLSAddr], presenting TLS's certificate and accepting
	// clients with or without one.
	TLS *TLS
	// Args are more redis-server arguments, such as an ACL user:
	// "--user", "alice", "on", ">secret", "~*", "&*", "+@all".
	Args []string
}

// StartRedisWith is [StartRedis] with cfg. With TLS or Args it needs the
// local redis-server: it calls [Missing] rather than use Docker.
func StartRedisWith(t testing.TB, n int, cfg RedisConfig) []*RedisServer {
	t.Helper()
	servers, err := ForTest(t).StartRedis(t.Context(), n, cfg)
	Require(t, err)
	return servers
}

// StartRedis is [StartRedisWith] returning an error: a [*MissingError]
// when there is neither a redis-server nor a Docker engine (nor a
// redis-server, with cfg's TLS or Args). The servers are stopped at
// [Env.Close], also those started before an error. ctx bounds the
// servers' start, not their life.
func (e *Env) StartRedis(ctx context.Context, n int, cfg RedisConfig) ([]*RedisServer, error) {
	if n < 1 {
		return nil, fmt.Errorf("testenv: StartRedis(%d): n must be at least 1", n)
	}
	newRunner, bin, err := e.redisRunners(cfg)
	if err != nil {
		return nil, err
	}
	servers := make([]*RedisServer, 0, n)
	for range n {
		var s *RedisServer
		for range redisStartAttempts {
			if s, err = e.startRedisServer(ctx, newRunner, cfg); err == nil || ctx.Err() != nil {
				break
			}
		}
		if err != nil {
			return nil, fmt.Errorf("testenv: start redis: %w", err)
		}
		s.bin = bin
		if err := e.OnClose(s.stopErr); err != nil {
			return nil, err
		}
		servers = append(servers, s)
	}
	return servers, nil
}

// redisRunners returns how to run a server on a given port: the local
// redis-server (whose path it also returns), or else Docker.
func (e *Env) redisRunners(cfg RedisConfig) (newRunner func(port int) (redisRunner, error), bin string, err error) {
	if bin, err := exec.LookPath("redis-server"); err == nil {
		return func(port int) (redisRunner, error) {
			dir, err := e.TempDir()
			if err != nil {
				return nil, err
			}
			return &redisProc{bin: bin, dir: dir, port: port, cfg: cfg}, nil
		}, bin, nil
	}
	if cfg.TLS != nil || len(cfg.Args) > 0 {
		return nil, "", &MissingError{What: "redis-server",
			How: "TLS and ACL tests run the local redis-server: install Redis (apt-get install redis-server, brew install redis)"}
	}
	pool, derr := dockerPool()
	if derr != nil {
		return nil, "", &MissingError{What: "redis-server",
			How: "install Redis so that redis-server is on the PATH (apt-get install redis-server, brew install redis), " +
				"or start a Docker engine (" + derr.Error() + ")"}
	}
	return func(port int) (redisRunner, error) {
		return &redisContainer{env: e, pool: pool, port: port}, nil
	}, "", nil
}

// startRedisServer starts one server on a free port (and a free TLS port
// with cfg.TLS).
func (e *Env) startRedisServer(ctx context.Context, newRunner func(port int) (redisRunner, error), cfg RedisConfig) (*RedisServer, error) {
	port, err := e.FreePort()
	if err != nil {
		return nil, err
	}
	r, err := newRunner(port)
	if err != nil {
		return nil, err
	}
	s := &RedisServer{addr: net.JoinHostPort("127.0.0.1", strconv.Itoa(port)), r: r}
	if cfg.TLS != nil {
		tp, err := e.FreePort()
		if err != nil {
			return nil, err
		}
		s.r.(*redisProc).tlsPort = tp
		s.tlsAddr = net.JoinHostPort("127.0.0.1", strconv.Itoa(tp))
	}
	if err := s.r.start(ctx); err != nil {
		return nil, err
	}
	s.running = true
	return s, nil
}

// Addr returns the server's address, "127.0.0.1:port". It does not change
// across [RedisServer.Restart].
func (s *RedisServer) Addr() string { return s.addr }

// Binary returns the path of the redis-server program the server runs,
// or "" when it runs in a container.
func (s *RedisServer) Binary() string { return s.bin }

// TLSAddr returns the server's TLS address, "127.0.0.1:port", or "" when
// it was started without [RedisConfig.TLS].
func (s *RedisServer) TLSAddr() string { return s.tlsAddr }

// Kill kills the server abruptly (SIGKILL, as a crash would), resuming it
// first if it is paused, and returns once the process is gone and its port
// closed. Killing a server that is not running returns nil.
func (s *RedisServer) Kill() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.killLocked()
}

func (s *RedisServer) killLocked() error {
	if !s.running {
		return nil
	}
	if s.paused {
		if err := s.r.resume(); err != nil {
			return fmt.Errorf("testenv: redis %s: resume before kill: %w", s.addr, err)
		}
		s.paused = false
	}
	if err := s.r.kill(); err != nil {
		return fmt.Errorf("testenv: redis %s: kill: %w", s.addr, err)
	}
	s.running = false
	if err := waitFor(context.Background(), 5*time.Second, nil, func() error { return portClosed(s.addr) }); err != nil {
		return fmt.Errorf("testenv: redis %s: after kill: %w", s.addr, err)
	}
	return nil
}

// Pause stops the server (SIGSTOP) without closing its connections: clients
// stay connected but get no reply, as with a hung process or a partition. It
// returns an error if the server is not running. Pausing a paused server
// returns nil.
func (s *RedisServer) Pause() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.running {
		return fmt.Errorf("testenv: redis %s: pause: not running", s.addr)
	}
	if s.paused {
		return nil
	}
	if err := s.r.pause(); err != nil {
		return fmt.Errorf("testenv: redis %s: pause: %w", s.addr, err)
	}
	s.paused = true
	return nil
}

// Resume continues a server stopped by [RedisServer.Pause] (SIGCONT).
// Resuming a server that is not paused returns nil.
func (s *RedisServer) Resume() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.running || !s.paused {
		return nil
	}
	if err := s.r.resume(); err != nil {
		return fmt.Errorf("testenv: redis %s: resume: %w", s.addr, err)
	}
	s.paused = false
	return nil
}

// Restart kills the server if it is running, then starts it again on the same
// port with no data (nothing is persisted), and returns once it answers PING.
// It returns an error after [RedisServer.Stop], or if the port was taken in
// the meantime.
func (s *RedisServer) Restart() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.stopped {
		return fmt.Errorf("testenv: redis %s: restart: stopped", s.addr)
	}
	if err := s.killLocked(); err != nil {
		return err
	}
	if err := s.r.start(context.Background()); err != nil {
		return fmt.Errorf("testenv: redis %s: restart: %w", s.addr, err)
	}
	s.running = true
	return nil
}

// Stop kills the server for good and releases what it used; it is called at
// the end of the test (which fails if the server cannot be killed). Later
// calls to Stop, Kill and Resume return at once; Restart and Pause return an
// error.
func (s *RedisServer) Stop() { _ = s.stopErr() }

// stopErr is Stop, returning why the server could not be killed.
func (s *RedisServer) stopErr() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.stopped {
		return nil
	}
	s.stopped = true
	return s.killLocked()
}

// portClosed reports nil once nothing accepts connections on addr.
func portClosed(addr string) error {
	c, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		return nil
	}
	c.Close()
	return fmt.Errorf("port %s still accepts connections", addr)
}
