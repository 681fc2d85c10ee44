package testenv

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"
)

// leakCheck fails t if goroutines outlive it. It registers itself first, so
// that it runs after every other cleanup of the test.
func leakCheck(t *testing.T) {
	t.Cleanup(func() { goleak.VerifyNone(t) })
}

func TestRequireCI(t *testing.T) {
	for _, tc := range []struct {
		v    string
		want bool
	}{
		{"", false},
		{"0", false},
		{"false", false},
		{"FALSE", false},
		{" ", false},
		{"true", true},
		{"1", true},
		{"yes", true},
	} {
		t.Setenv("CI", tc.v)
		if got := RequireCI(); got != tc.want {
			t.Errorf("CI=%q: RequireCI() = %v, want %v", tc.v, got, tc.want)
		}
	}
}

func TestMissingRule(t *testing.T) {
	for _, tc := range []struct {
		ci        string
		wantFatal bool
	}{
		{"", false},
		{"false", false},
		{"0", false},
		{"true", true},
		{"1", true},
	} {
		t.Setenv("CI", tc.ci)
		var skipped, fatal []string
		missing(
			func(args ...any) { skipped = append(skipped, fmt.Sprint(args...)) },
			func(args ...any) { fatal = append(fatal, fmt.Sprint(args...)) },
			"FooMQ", "set LOCKS_FOO_URL")
		got := skipped
		if tc.wantFatal {
			got = fatal
			if len(skipped) != 0 {
				t.Errorf("CI=%q: skipped %q, want fatal only", tc.ci, skipped)
			}
		} else if len(fatal) != 0 {
			t.Errorf("CI=%q: fatal %q, want skip only", tc.ci, fatal)
		}
		if len(got) != 1 || !strings.Contains(got[0], "FooMQ") || !strings.Contains(got[0], "set LOCKS_FOO_URL") {
			t.Errorf("CI=%q: got %q, want one message naming what is missing and how to provide it", tc.ci, got)
		}
	}
}

// TestMissingSkips checks that Missing stops a real test by skipping it when
// CI is not set.
func TestMissingSkips(t *testing.T) {
	t.Setenv("CI", "")
	var skipped, reached bool
	t.Run("sub", func(t *testing.T) {
		defer func() { skipped = t.Skipped() }()
		Missing(t, "FooMQ", "set LOCKS_FOO_URL")
		reached = true
	})
	if !skipped || reached {
		t.Errorf("Missing without CI: skipped=%v, returned=%v; want skipped and not returned", skipped, reached)
	}
}

// TestMissingFailsInCI runs TestMissingSkips's subtest in a child process with
// CI set, and checks that it fails there instead of skipping.
func TestMissingFailsInCI(t *testing.T) {
	if os.Getenv("TESTENV_CHILD") == "1" {
		Missing(t, "FooMQ", "set LOCKS_FOO_URL")
		return
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestMissingFailsInCI$", "-test.v")
	cmd.Env = append(os.Environ(), "TESTENV_CHILD=1", "CI=true")
	out, err := cmd.CombinedOutput()
	var exit *exec.ExitError
	if !errors.As(err, &exit) || !strings.Contains(string(out), "--- FAIL") || !strings.Contains(string(out), "FooMQ") {
		t.Fatalf("child with CI=true: err=%v, output:\n%s\nwant a failure naming FooMQ", err, out)
	}
}

func TestFreePort(t *testing.T) {
	p := FreePort(t)
	l, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", p))
	if err != nil {
		t.Fatalf("listen on FreePort %d: %v", p, err)
	}
	l.Close()
}

// TestDockerProbeFast checks that looking for a Docker engine gives up fast,
// both when nothing listens and when something accepts but never answers.
func TestDockerProbeFast(t *testing.T) {
	leakCheck(t)
	start := time.Now()
	_, err := probeDocker()
	t.Logf("default engine: %v (in %v)", err, time.Since(start))
	if d := time.Since(start); d > 2*time.Second {
		t.Errorf("probing the default Docker engine took %v", d)
	}

	hung := listen(t, func(c net.Conn) { io.Copy(io.Discard, c) })
	t.Setenv("DOCKER_HOST", "tcp://"+hung)
	t.Setenv("DOCKER_CERT_PATH", "")
	t.Setenv("DOCKER_MACHINE_NAME", "")
	start = time.Now()
	if _, err := probeDocker(); err == nil {
		t.Errorf("probeDocker on a silent server: no error")
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Errorf("probing a silent Docker endpoint took %v, want about %v", d, dockerPingTimeout)
	}
}

func TestProbeAMQP(t *testing.T) {
	leakCheck(t)
	// A real connection.start frame header: method frame, channel 0, size,
	// class 10 method 10.
	good := listen(t, func(c net.Conn) {
		io.ReadFull(c, make([]byte, len(amqpHeader)))
		c.Write([]byte{1, 0, 0, 0, 0, 0, 4, 0, 10, 0, 10, 0xce})
	})
	if err := probeAMQP(good, time.Second); err != nil {
		t.Errorf("probeAMQP on a broker: %v", err)
	}
	// A broker that does not speak 0-9-1 answers with its own header.
	version := listen(t, func(c net.Conn) {
		io.ReadFull(c, make([]byte, len(amqpHeader)))
		c.Write([]byte("AMQP\x00\x01\x00\x00"))
	})
	silent := listen(t, func(c net.Conn) { io.Copy(io.Discard, c) })
	other := listen(t, func(c net.Conn) { c.Write([]byte("-ERR unknown command 'AMQP'\r\n")) })
	for name, addr := range map[string]string{
		"version mismatch": version,
		"silent":           silent,
		"other protocol":   other,
		"closed port":      closedAddr(t),
	} {
		if err := probeAMQP(addr, 300*time.Millisecond); err == nil {
			t.Errorf("probeAMQP on %s server: no error", name)
		}
	}
}

func TestAMQPAddr(t *testing.T) {
	for in, want := range map[string]string{
		"amqp://guest:guest@127.0.0.1:5672/":   "127.0.0.1:5672",
		"amqp://h/vhost":                       "h:5672",
		"amqps://h":                            "h:5671",
		"amqp://u:p@[::1]:5673/":               "[::1]:5673",
		"http://h:5672/":                       "",
		"amqp:///":                             "",
		"amqp://bad host:5672/":                "",
		"amqp://guest:guest@localhost:15672/x": "localhost:15672",
	} {
		got, err := amqpAddr(in)
		if want == "" {
			if err == nil {
				t.Errorf("amqpAddr(%q) = %q, want an error", in, got)
			}
			continue
		}
		if err != nil || got != want {
			t.Errorf("amqpAddr(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
}

func TestAMQPURL(t *testing.T) {
	leakCheck(t)
	t.Setenv("LOCKS_AMQP_URL", "")
	u := AMQPURL(t)
	addr, err := amqpAddr(u)
	if err != nil {
		t.Fatalf("AMQPURL = %q: %v", u, err)
	}
	if err := probeAMQP(addr, 2*time.Second); err != nil {
		t.Fatalf("AMQPURL = %q does not answer the AMQP header: %v", u, err)
	}

	t.Run("env", func(t *testing.T) {
		want := strings.Replace(u, "guest:guest", "guest:other", 1)
		t.Setenv("LOCKS_AMQP_URL", want)
		if got := AMQPURL(t); got != want {
			t.Errorf("AMQPURL with LOCKS_AMQP_URL=%q = %q", want, got)
		}
	})
}

func TestRedisAddr(t *testing.T) {
	leakCheck(t)
	t.Setenv("LOCKS_REDIS_ADDRS", "")
	addr := RedisAddr(t)
	if err := redisPing(addr, 2*time.Second); err != nil {
		t.Fatalf("RedisAddr = %q: %v", addr, err)
	}

	t.Run("env", func(t *testing.T) {
		s := StartRedis(t, 2)
		t.Setenv("LOCKS_REDIS_ADDRS", " "+s[0].Addr()+", ,"+s[1].Addr()+" ")
		if got := RedisAddr(t); got != s[0].Addr() {
			t.Errorf("RedisAddr = %q, want the first of LOCKS_REDIS_ADDRS, %q", got, s[0].Addr())
		}
		if got, want := RedisAddrs(t), []string{s[0].Addr(), s[1].Addr()}; !slices.Equal(got, want) {
			t.Errorf("RedisAddrs = %q, want %q", got, want)
		}
	})
}

// TestStartRedisMissing checks that StartRedis skips when there is neither a
// redis-server nor a Docker engine (and CI is not set).
func TestStartRedisMissing(t *testing.T) {
	if _, err := dockerPool(); err == nil {
		t.Skip("a Docker engine answers: StartRedis would use it")
	}
	t.Setenv("CI", "")
	t.Setenv("PATH", t.TempDir())
	var skipped, reached bool
	t.Run("sub", func(t *testing.T) {
		defer func() { skipped = t.Skipped() }()
		StartRedis(t, 1)
		reached = true
	})
	if !skipped || reached {
		t.Errorf("StartRedis without redis-server: skipped=%v, returned=%v; want skipped", skipped, reached)
	}
}

func TestStartRedis(t *testing.T) {
	leakCheck(t)
	servers := StartRedis(t, 3)
	if len(servers) != 3 {
		t.Fatalf("StartRedis(t, 3) returned %d servers", len(servers))
	}
	seen := map[string]bool{}
	for _, s := range servers {
		if seen[s.Addr()] {
			t.Errorf("address %s returned twice", s.Addr())
		}
		seen[s.Addr()] = true
		if !strings.HasPrefix(s.Addr(), "127.0.0.1:") {
			t.Errorf("Addr() = %q, want loopback", s.Addr())
		}
		if err := redisPing(s.Addr(), time.Second); err != nil {
			t.Errorf("PING %s: %v", s.Addr(), err)
		}
		c := dialRedis(t, s.Addr())
		if got := c.do(t, "CONFIG", "GET", "save"); got != "*2 $save $" {
			t.Errorf("%s: CONFIG GET save = %q, want no snapshots", s.Addr(), got)
		}
		if got := c.do(t, "CONFIG", "GET", "appendonly"); got != "*2 $appendonly $no" {
			t.Errorf("%s: CONFIG GET appendonly = %q, want no", s.Addr(), got)
		}
		if got := c.do(t, "CONFIG", "GET", "bind"); got != "*2 $bind $127.0.0.1" {
			t.Errorf("%s: CONFIG GET bind = %q, want loopback only", s.Addr(), got)
		}
	}
	// The masters are independent.
	a, b := dialRedis(t, servers[0].Addr()), dialRedis(t, servers[1].Addr())
	a.do(t, "SET", "k", "1")
	if got := b.do(t, "GET", "k"); got != "$-1" {
		t.Errorf("GET on another master = %q, want nil", got)
	}
}

func TestRedisPauseResume(t *testing.T) {
	leakCheck(t)
	s := StartRedis(t, 1)[0]
	c := dialRedis(t, s.Addr())
	if err := s.Pause(); err != nil {
		t.Fatal(err)
	}
	if err := s.Pause(); err != nil {
		t.Fatalf("second Pause: %v", err)
	}
	err := redisPing(s.Addr(), 300*time.Millisecond)
	if ne, ok := errors.AsType[net.Error](err); !ok || !ne.Timeout() {
		t.Fatalf("PING while paused: %v, want a timeout", err)
	}
	// A connection opened before gets no reply either, until Resume.
	c.send(t, "PING")
	c.conn.SetReadDeadline(time.Now().Add(300 * time.Millisecond))
	if _, err := c.r.ReadString('\n'); err == nil {
		t.Fatalf("reply while paused")
	}
	if err := s.Resume(); err != nil {
		t.Fatal(err)
	}
	if err := redisPing(s.Addr(), 2*time.Second); err != nil {
		t.Fatalf("PING after Resume: %v", err)
	}
	if err := s.Resume(); err != nil {
		t.Fatalf("second Resume: %v", err)
	}
}

func TestRedisKillRestart(t *testing.T) {
	leakCheck(t)
	s := StartRedis(t, 1)[0]
	c := dialRedis(t, s.Addr())
	if got := c.do(t, "SET", "testenv:key", "v"); got != "+OK" {
		t.Fatalf("SET = %q", got)
	}
	if got := c.do(t, "GET", "testenv:key"); got != "$v" {
		t.Fatalf("GET = %q", got)
	}
	if err := s.Kill(); err != nil {
		t.Fatal(err)
	}
	if _, err := net.DialTimeout("tcp", s.Addr(), time.Second); err == nil {
		t.Fatalf("%s accepts connections after Kill", s.Addr())
	}
	c.conn.SetReadDeadline(time.Now().Add(2 * time.Second))
	if _, err := c.r.ReadByte(); err == nil || isTimeout(err) {
		t.Fatalf("open connection after Kill: read gave %v, want EOF or reset", err)
	}
	if err := s.Kill(); err != nil {
		t.Fatalf("second Kill: %v", err)
	}
	if err := s.Pause(); err == nil {
		t.Errorf("Pause of a killed server: no error")
	}

	addr := s.Addr()
	if err := s.Restart(); err != nil {
		t.Fatal(err)
	}
	if s.Addr() != addr {
		t.Errorf("Addr after Restart = %q, want %q", s.Addr(), addr)
	}
	c = dialRedis(t, s.Addr())
	if got := c.do(t, "GET", "testenv:key"); got != "$-1" {
		t.Fatalf("GET after Restart = %q, want nil: the server must restart empty", got)
	}

	// Restart of a running server kills it first.
	c.do(t, "SET", "testenv:key", "v")
	if err := s.Restart(); err != nil {
		t.Fatal(err)
	}
	if got := dialRedis(t, s.Addr()).do(t, "GET", "testenv:key"); got != "$-1" {
		t.Fatalf("GET after second Restart = %q, want nil", got)
	}

	s.Stop()
	if _, err := net.DialTimeout("tcp", s.Addr(), time.Second); err == nil {
		t.Errorf("%s accepts connections after Stop", s.Addr())
	}
	if err := s.Restart(); err == nil {
		t.Errorf("Restart after Stop: no error")
	}
	s.Stop()
}

// TestRedisKillPaused checks that a paused server can be killed, at once.
func TestRedisKillPaused(t *testing.T) {
	leakCheck(t)
	s := StartRedis(t, 2)
	for _, s := range s {
		if err := s.Pause(); err != nil {
			t.Fatal(err)
		}
	}
	if err := s[0].Kill(); err != nil {
		t.Fatal(err)
	}
	if err := portClosed(s[0].Addr()); err != nil {
		t.Fatal(err)
	}
	// s[1] is left paused for cleanup to resume and kill.
}

// TestRedisConcurrentFaults drives faults on several servers from several
// goroutines at once, for the race detector.
func TestRedisConcurrentFaults(t *testing.T) {
	leakCheck(t)
	servers := StartRedis(t, 3)
	var wg sync.WaitGroup
	errs := make(chan error, 100)
	for _, s := range servers {
		for g := range 3 {
			wg.Go(func() {
				for range 3 {
					var err error
					switch g {
					case 0:
						if err = s.Pause(); err == nil {
							err = s.Resume()
						}
					case 1:
						err = s.Restart()
					case 2:
						err = s.Kill()
					}
					// Pause fails when another goroutine killed the server.
					if err != nil && !strings.Contains(err.Error(), "not running") {
						errs <- err
					}
				}
			})
		}
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	for _, s := range servers {
		if err := s.Restart(); err != nil {
			t.Fatal(err)
		}
		if err := redisPing(s.Addr(), 2*time.Second); err != nil {
			t.Errorf("PING %s after the storm: %v", s.Addr(), err)
		}
	}
}

func TestProxyEcho(t *testing.T) {
	leakCheck(t)
	p := NewProxy(t, echoServer(t))
	if !strings.HasPrefix(p.Addr(), "127.0.0.1:") {
		t.Fatalf("Addr() = %q, want loopback", p.Addr())
	}
	c := dial(t, p.Addr())
	echo(t, c)
	p.Restore() // healthy: nothing to do
	echo(t, c)
}

func TestProxyCut(t *testing.T) {
	leakCheck(t)
	p := NewProxy(t, echoServer(t))
	addr := p.Addr()
	c := dial(t, addr)
	echo(t, c)

	p.Cut()
	p.Cut()
	c.SetReadDeadline(time.Now().Add(2 * time.Second))
	if _, err := c.Read(make([]byte, 1)); err == nil || isTimeout(err) {
		t.Fatalf("read on a cut connection: %v, want EOF or reset", err)
	}
	if c, err := net.DialTimeout("tcp", addr, time.Second); err == nil {
		c.Close()
		t.Fatalf("dial to a cut proxy succeeded")
	}

	p.Restore()
	if p.Addr() != addr {
		t.Errorf("Addr after Restore = %q, want %q", p.Addr(), addr)
	}
	echo(t, dial(t, addr))
}

func TestProxyBlackHole(t *testing.T) {
	leakCheck(t)
	p := NewProxy(t, echoServer(t))
	old := dial(t, p.Addr())
	echo(t, old)

	p.BlackHole()
	p.BlackHole()
	for name, c := range map[string]net.Conn{"open": old, "new": dial(t, p.Addr())} {
		if _, err := c.Write([]byte("ping\n")); err != nil {
			t.Fatalf("%s connection: write into the black hole: %v", name, err)
		}
		c.SetReadDeadline(time.Now().Add(300 * time.Millisecond))
		if n, err := c.Read(make([]byte, 16)); !isTimeout(err) {
			t.Fatalf("%s connection: read from the black hole = %d, %v; want a timeout", name, n, err)
		}
	}

	p.Restore()
	echo(t, dial(t, p.Addr()))
	wantClosed(t, old, "black-holed connection after Restore")
}

// TestProxyDropReplies: requests reach the upstream, replies are lost.
func TestProxyDropReplies(t *testing.T) {
	leakCheck(t)
	upstream, got := countingEcho(t)
	p := NewProxy(t, upstream)
	c := dial(t, p.Addr())
	echo(t, c)
	before := got.Load()

	p.DropReplies()
	if _, err := c.Write([]byte("ping\n")); err != nil {
		t.Fatalf("write with replies dropped: %v", err)
	}
	c.SetReadDeadline(time.Now().Add(300 * time.Millisecond))
	if n, err := c.Read(make([]byte, 16)); !isTimeout(err) {
		t.Fatalf("read with replies dropped = %d, %v; want a timeout", n, err)
	}
	if n := got.Load() - before; n != 5 {
		t.Errorf("the upstream received %d bytes of the request, want 5", n)
	}

	p.Restore()
	echo(t, dial(t, p.Addr()))
	wantClosed(t, c, "a connection that lost a reply, after Restore")
}

func TestProxyLatency(t *testing.T) {
	leakCheck(t)
	const d = 50 * time.Millisecond
	p := NewProxy(t, echoServer(t))
	c := dial(t, p.Addr())
	echo(t, c)

	p.Latency(d)
	for range 3 {
		start := time.Now()
		echo(t, c)
		if rtt := time.Since(start); rtt < 2*d {
			t.Fatalf("round trip with latency %v each way took %v, want at least %v", d, rtt, 2*d)
		}
	}
	p.Latency(2 * d) // replaces
	start := time.Now()
	echo(t, dial(t, p.Addr()))
	if rtt := time.Since(start); rtt < 4*d {
		t.Fatalf("round trip with latency %v each way took %v, want at least %v", 2*d, rtt, 4*d)
	}
	p.Restore()
	echo(t, c)
}

func TestProxyResetPeer(t *testing.T) {
	leakCheck(t)
	p := NewProxy(t, echoServer(t))
	old := dial(t, p.Addr())
	echo(t, old)

	p.ResetPeer()
	for name, c := range map[string]net.Conn{"open": old, "new": dial(t, p.Addr())} {
		c.Write([]byte("ping\n"))
		c.SetReadDeadline(time.Now().Add(2 * time.Second))
		if _, err := c.Read(make([]byte, 16)); !errors.Is(err, syscall.ECONNRESET) {
			t.Errorf("%s connection after ResetPeer: read %v, want ECONNRESET", name, err)
		}
	}

	p.Restore()
	echo(t, dial(t, p.Addr()))
}

// TestProxyBlackHoleIdle checks that a connection that carried nothing during
// a black hole survives it.
func TestProxyBlackHoleIdle(t *testing.T) {
	leakCheck(t)
	p := NewProxy(t, echoServer(t))
	c := dial(t, p.Addr())
	echo(t, c)
	p.BlackHole()
	p.Restore()
	echo(t, c)
}

// TestProxyRestoreWakesLatency checks that data held back by a long latency
// is delivered once the latency is removed.
func TestProxyRestoreWakesLatency(t *testing.T) {
	leakCheck(t)
	p := NewProxy(t, echoServer(t))
	c := dial(t, p.Addr())
	p.Latency(time.Hour)
	done := make(chan struct{})
	go func() {
		defer close(done)
		time.Sleep(100 * time.Millisecond)
		p.Restore()
	}()
	echo(t, c) // fails after 5s if the data stays held
	<-done
}

// TestProxyHalfClose checks that a client's half-close reaches the server and
// the server's reply and close come back.
func TestProxyHalfClose(t *testing.T) {
	leakCheck(t)
	p := NewProxy(t, echoServer(t))
	c := dial(t, p.Addr())
	if _, err := c.Write([]byte("last words")); err != nil {
		t.Fatal(err)
	}
	if err := c.(*net.TCPConn).CloseWrite(); err != nil {
		t.Fatal(err)
	}
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	got, err := io.ReadAll(c)
	if err != nil || string(got) != "last words" {
		t.Fatalf("after half-close: read %q, %v; want the echo then EOF", got, err)
	}
}

// TestProxyUpstreamDown checks that a client is disconnected when the
// upstream cannot be reached.
func TestProxyUpstreamDown(t *testing.T) {
	leakCheck(t)
	p := NewProxy(t, closedAddr(t))
	c := dial(t, p.Addr())
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := c.Read(make([]byte, 1)); err == nil || isTimeout(err) {
		t.Fatalf("read through a proxy to nowhere: %v, want EOF", err)
	}
}

// TestProxyUpstreamDies checks that nothing leaks when the upstream resets
// connections while clients are still sending (toxiproxy 2.5 leaks two
// goroutines per connection here).
func TestProxyUpstreamDies(t *testing.T) {
	leakCheck(t)
	up := listen(t, func(c net.Conn) {
		time.Sleep(10 * time.Millisecond)
		c.(*net.TCPConn).SetLinger(0)
		c.Close()
	})
	p := NewProxy(t, up)
	p.Latency(time.Millisecond)
	for range 10 {
		c, err := net.Dial("tcp", p.Addr())
		if err != nil {
			t.Fatal(err)
		}
		deadline := time.Now().Add(50 * time.Millisecond)
		for time.Now().Before(deadline) {
			if _, err := c.Write(make([]byte, 64<<10)); err != nil {
				break
			}
		}
		c.Close()
	}
}

// TestProxyCleanupWithFaults checks that a proxy left with faults on, and
// connections open through it, stops without leaking at cleanup.
func TestProxyCleanupWithFaults(t *testing.T) {
	leakCheck(t)
	up := echoServer(t)
	t.Run("blackhole", func(t *testing.T) {
		p := NewProxy(t, up)
		c := dial(t, p.Addr())
		echo(t, c)
		p.BlackHole()
		p.Latency(time.Second)
		c.Write([]byte("lost\n"))
		dial(t, p.Addr())
	})
	t.Run("cut", func(t *testing.T) {
		p := NewProxy(t, up)
		echo(t, dial(t, p.Addr()))
		p.ResetPeer()
		p.Cut()
	})
	t.Run("latency", func(t *testing.T) {
		p := NewProxy(t, up)
		c := dial(t, p.Addr())
		p.Latency(time.Second)
		c.Write([]byte("delayed\n"))
	})
}

func TestProxyRedis(t *testing.T) {
	leakCheck(t)
	p := NewProxy(t, StartRedis(t, 1)[0].Addr())
	if err := redisPing(p.Addr(), 2*time.Second); err != nil {
		t.Fatalf("PING through the proxy: %v", err)
	}
	p.Cut()
	if err := redisPing(p.Addr(), 300*time.Millisecond); err == nil {
		t.Fatalf("PING through a cut proxy succeeded")
	}
	p.Restore()
	if err := redisPing(p.Addr(), 2*time.Second); err != nil {
		t.Fatalf("PING after Restore: %v", err)
	}
}

// --- helpers ---

func isTimeout(err error) bool {
	ne, ok := errors.AsType[net.Error](err)
	return ok && ne.Timeout()
}

// listen serves each connection to a loopback listener with handle, and
// returns its address. Everything is closed at cleanup.
func listen(t *testing.T, handle func(net.Conn)) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		conns []net.Conn
	)
	wg.Go(func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
			wg.Go(func() {
				defer c.Close()
				handle(c)
			})
		}
	})
	t.Cleanup(func() {
		l.Close()
		mu.Lock()
		for _, c := range conns {
			c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	return l.Addr().String()
}

func echoServer(t *testing.T) string {
	return listen(t, func(c net.Conn) { io.Copy(c, c) })
}

// closedAddr returns a loopback address nothing listens on.
func closedAddr(t *testing.T) string {
	return fmt.Sprintf("127.0.0.1:%d", FreePort(t))
}

func dial(t *testing.T, addr string) net.Conn {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// echo checks that a line sent on c comes back.
func echo(t *testing.T, c net.Conn) {
	t.Helper()
	c.SetDeadline(time.Now().Add(5 * time.Second))
	defer c.SetDeadline(time.Time{})
	msg := fmt.Sprintf("hello %d\n", time.Now().UnixNano())
	if _, err := c.Write([]byte(msg)); err != nil {
		t.Fatalf("echo write: %v", err)
	}
	got := make([]byte, len(msg))
	if _, err := io.ReadFull(c, got); err != nil || string(got) != msg {
		t.Fatalf("echo read: %q, %v; want %q", got, err, msg)
	}
}

// redisConn speaks just enough RESP for the tests.
type redisConn struct {
	conn net.Conn
	r    *bufio.Reader
}

func dialRedis(t *testing.T, addr string) *redisConn {
	t.Helper()
	c := dial(t, addr)
	return &redisConn{conn: c, r: bufio.NewReader(c)}
}

func (c *redisConn) send(t *testing.T, args ...string) {
	t.Helper()
	var b strings.Builder
	fmt.Fprintf(&b, "*%d\r\n", len(args))
	for _, a := range args {
		fmt.Fprintf(&b, "$%d\r\n%s\r\n", len(a), a)
	}
	if _, err := c.conn.Write([]byte(b.String())); err != nil {
		t.Fatalf("redis %s: %v", args[0], err)
	}
}

// do sends a command and returns its reply flattened: "+OK", "$value",
// "$-1" for nil, "*2 $a $b" for arrays.
func (c *redisConn) do(t *testing.T, args ...string) string {
	t.Helper()
	c.send(t, args...)
	c.conn.SetReadDeadline(time.Now().Add(5 * time.Second))
	defer c.conn.SetReadDeadline(time.Time{})
	s, err := c.reply()
	if err != nil {
		t.Fatalf("redis %s: %v", args[0], err)
	}
	return s
}

func (c *redisConn) reply() (string, error) {
	line, err := c.r.ReadString('\n')
	if err != nil {
		return "", err
	}
	line = strings.TrimSuffix(line, "\r\n")
	if line == "" {
		return "", errors.New("empty reply")
	}
	var n int
	switch line[0] {
	case '$':
		if _, err := fmt.Sscan(line[1:], &n); err != nil || n < 0 {
			return line, err
		}
		b := make([]byte, n+2)
		if _, err := io.ReadFull(c.r, b); err != nil {
			return "", err
		}
		return "$" + string(b[:n]), nil
	case '*':
		if _, err := fmt.Sscan(line[1:], &n); err != nil || n < 0 {
			return line, err
		}
		parts := []string{line}
		for range n {
			p, err := c.reply()
			if err != nil {
				return "", err
			}
			parts = append(parts, p)
		}
		return strings.Join(parts, " "), nil
	}
	return line, nil
}
