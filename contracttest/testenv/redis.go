package testenv

import (
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/ory/dockertest/v3"
	dc "github.com/ory/dockertest/v3/docker"
)

const (
	localRedisAddr = "127.0.0.1:6379"

	redisRepo = "redis"
	redisTag  = "7-alpine"

	// redisReadyTimeout bounds how long a started redis-server may take to
	// answer PING.
	redisReadyTimeout = 10 * time.Second
	// redisStartAttempts is how many free ports StartRedis tries per server,
	// since a port chosen by FreePort may be taken before redis binds it.
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
	if env := os.Getenv("LOCKS_REDIS_ADDRS"); strings.TrimSpace(env) != "" {
		var addrs []string
		for a := range strings.SplitSeq(env, ",") {
			if a = strings.TrimSpace(a); a == "" {
				continue
			}
			if err := dialCheck(a); err != nil {
				t.Fatalf("testenv: LOCKS_REDIS_ADDRS=%q: %v", env, err)
			}
			addrs = append(addrs, a)
		}
		if len(addrs) == 0 {
			t.Fatalf("testenv: LOCKS_REDIS_ADDRS=%q lists no address", env)
		}
		return addrs
	}
	if redisPing(localRedisAddr, time.Second) == nil {
		return []string{localRedisAddr}
	}
	return []string{StartRedis(t, 1)[0].Addr()}
}

// A RedisServer is a Redis master started for one test by [StartRedis], which
// the test may kill, pause and restart to inject faults. Its methods are safe
// to call from several goroutines; each waits for the previous one to finish.
// The server is stopped at the end of the test that started it.
type RedisServer struct {
	addr    string
	tlsAddr string

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
	start() error
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
	if n < 1 {
		t.Fatalf("testenv: StartRedis(%d): n must be at least 1", n)
	}
	custom := cfg.TLS != nil || len(cfg.Args) > 0
	var newRunner func(port int) redisRunner
	if bin, err := exec.LookPath("redis-server"); err == nil {
		newRunner = func(port int) redisRunner {
			return &redisProc{bin: bin, dir: t.TempDir(), port: port, cfg: cfg}
		}
	} else if custom {
		Missing(t, "redis-server", "TLS and ACL tests run the local redis-server: install Redis (apt-get install redis-server, brew install redis)")
		return nil
	} else if pool, derr := dockerPool(); derr == nil {
		newRunner = func(port int) redisRunner {
			return &redisContainer{t: t, pool: pool, port: port}
		}
	} else {
		Missing(t, "redis-server",
			"install Redis so that redis-server is on the PATH (apt-get install redis-server, brew install redis), "+
				"or start a Docker engine ("+derr.Error()+")")
		return nil
	}
	servers := make([]*RedisServer, 0, n)
	for range n {
		var (
			s   *RedisServer
			err error
		)
		for range redisStartAttempts {
			port := FreePort(t)
			s = &RedisServer{addr: net.JoinHostPort("127.0.0.1", strconv.Itoa(port)), r: newRunner(port)}
			if cfg.TLS != nil {
				tp := FreePort(t)
				s.r.(*redisProc).tlsPort = tp
				s.tlsAddr = net.JoinHostPort("127.0.0.1", strconv.Itoa(tp))
			}
			if err = s.r.start(); err == nil {
				break
			}
		}
		if err != nil {
			t.Fatalf("testenv: start redis: %v", err)
		}
		s.running = true
		t.Cleanup(func() {
			if err := s.stop(); err != nil {
				t.Errorf("testenv: stop: %v", err)
			}
		})
		servers = append(servers, s)
	}
	return servers
}

// Addr returns the server's address, "127.0.0.1:port". It does not change
// across [RedisServer.Restart].
func (s *RedisServer) Addr() string { return s.addr }

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
	if err := waitFor(5*time.Second, nil, func() error { return portClosed(s.addr) }); err != nil {
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
	if err := s.r.start(); err != nil {
		return fmt.Errorf("testenv: redis %s: restart: %w", s.addr, err)
	}
	s.running = true
	return nil
}

// Stop kills the server for good and releases what it used; it is called at
// the end of the test (which fails if the server cannot be killed). Later
// calls to Stop, Kill and Resume return at once; Restart and Pause return an
// error.
func (s *RedisServer) Stop() { _ = s.stop() }

func (s *RedisServer) stop() error {
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

// redisProc runs redis-server as a child process.
type redisProc struct {
	bin     string
	dir     string
	port    int
	tlsPort int // 0 for none
	cfg     RedisConfig

	cmd  *exec.Cmd
	done chan struct{} // closed once cmd has been waited for
	out  *tailBuffer
}

func (p *redisProc) start() error {
	p.out = &tailBuffer{max: 4096}
	p.cmd = exec.Command(p.bin,
		"--port", strconv.Itoa(p.port),
		"--bind", "127.0.0.1",
		"--save", "",
		"--appendonly", "no",
		"--daemonize", "no",
		"--dir", p.dir,
		"--logfile", "",
	)
	if p.tlsPort != 0 {
		p.cmd.Args = append(p.cmd.Args,
			"--tls-port", strconv.Itoa(p.tlsPort),
			"--tls-cert-file", p.cfg.TLS.CertFile,
			"--tls-key-file", p.cfg.TLS.KeyFile,
			"--tls-ca-cert-file", p.cfg.TLS.CAFile,
			"--tls-auth-clients", "optional",
		)
	}
	p.cmd.Args = append(p.cmd.Args, p.cfg.Args...)
	p.cmd.Stdout = p.out
	p.cmd.Stderr = p.out
	// Its own process group, so that a ^C on the test does not reach it
	// before cleanup does.
	p.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := p.cmd.Start(); err != nil {
		return err
	}
	done := make(chan struct{})
	p.done = done
	cmd := p.cmd
	go func() {
		_ = cmd.Wait()
		close(done)
	}()
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(p.port))
	exited := func() error {
		select {
		case <-done:
			return fmt.Errorf("redis-server on port %d exited: %s; output:\n%s", p.port, cmd.ProcessState, p.out)
		default:
			return nil
		}
	}
	err := waitFor(redisReadyTimeout, exited, func() error { return redisPing(addr, 500*time.Millisecond) })
	if err != nil {
		_ = p.kill()
		return err
	}
	return nil
}

func (p *redisProc) kill() error {
	if p.cmd == nil {
		return nil
	}
	if err := p.cmd.Process.Kill(); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return err
	}
	select {
	case <-p.done:
	case <-time.After(10 * time.Second):
		return fmt.Errorf("redis-server pid %d did not exit after SIGKILL", p.cmd.Process.Pid)
	}
	p.cmd = nil
	return nil
}

func (p *redisProc) pause() error  { return p.cmd.Process.Signal(syscall.SIGSTOP) }
func (p *redisProc) resume() error { return p.cmd.Process.Signal(syscall.SIGCONT) }

// redisContainer runs Redis in a Docker container whose port 6379 is
// published on 127.0.0.1:port, so that it keeps its address across restarts.
type redisContainer struct {
	t    testing.TB
	pool *dockertest.Pool
	port int
	res  *dockertest.Resource
}

func (c *redisContainer) start() error {
	if c.res == nil {
		res, err := runContainer(c.t, c.pool, &dockertest.RunOptions{
			Repository: redisRepo,
			Tag:        redisTag,
			Cmd:        []string{"redis-server", "--save", "", "--appendonly", "no", "--protected-mode", "no"},
		}, map[string]string{"6379/tcp": strconv.Itoa(c.port)})
		if err != nil {
			return err
		}
		c.res = res
	} else if err := c.pool.Client.StartContainer(c.res.Container.ID, nil); err != nil {
		return err
	}
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(c.port))
	return waitFor(containerReadyTimeout, nil, func() error { return redisPing(addr, time.Second) })
}

func (c *redisContainer) kill() error {
	if err := c.pool.Client.KillContainer(dc.KillContainerOptions{ID: c.res.Container.ID, Signal: dc.SIGKILL}); err != nil {
		return err
	}
	return waitFor(30*time.Second, nil, func() error {
		ctr, err := c.pool.Client.InspectContainer(c.res.Container.ID)
		if err != nil {
			return err
		}
		if ctr.State.Running {
			return errors.New("container still running")
		}
		return nil
	})
}

func (c *redisContainer) pause() error  { return c.pool.Client.PauseContainer(c.res.Container.ID) }
func (c *redisContainer) resume() error { return c.pool.Client.UnpauseContainer(c.res.Container.ID) }

// tailBuffer is an io.Writer keeping the last max bytes written, safe for
// concurrent use.
type tailBuffer struct {
	mu  sync.Mutex
	max int
	b   []byte
}

func (b *tailBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.b = append(b.b, p...)
	if over := len(b.b) - b.max; over > 0 {
		b.b = append(b.b[:0], b.b[over:]...)
	}
	return len(p), nil
}

func (b *tailBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return string(b.b)
}
