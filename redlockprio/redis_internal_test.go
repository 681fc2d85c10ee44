package redlockprio

import (
	"context"
	"net"
	"os"
	"os/exec"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// testRedis is a redis-server process an internal test starts on a free
// loopback port, so that it can pause it. (The external tests, a module
// of their own, use contracttest/testenv, which this module does not
// require.)
type testRedis struct {
	cmd  *exec.Cmd
	addr string
}

// startRedis starts n redis-servers from the redis-server on PATH; none
// there skips the test, or fails it when CI is set.
func startRedis(t *testing.T, n int) []*testRedis {
	t.Helper()
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		if os.Getenv("CI") != "" {
			t.Fatalf("redis-server is not on PATH: %v", err)
		}
		t.Skipf("redis-server is not on PATH: %v", err)
	}
	var out []*testRedis
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		port := l.Addr().(*net.TCPAddr).Port
		_ = l.Close()
		r := &testRedis{addr: net.JoinHostPort("127.0.0.1", strconv.Itoa(port)),
			cmd: exec.Command(bin, "--port", strconv.Itoa(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no")}
		if err := r.cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			_ = r.cmd.Process.Signal(syscall.SIGCONT)
			_ = r.cmd.Process.Kill()
			_ = r.cmd.Wait()
		})
		c := redis.NewClient(&redis.Options{Addr: r.addr})
		deadline := time.Now().Add(10 * time.Second)
		for c.Ping(context.Background()).Err() != nil {
			if time.Now().After(deadline) {
				_ = c.Close()
				t.Fatalf("redis-server on %s did not answer", r.addr)
			}
			time.Sleep(20 * time.Millisecond)
		}
		_ = c.Close()
		out = append(out, r)
	}
	return out
}

func (r *testRedis) Addr() string  { return r.addr }
func (r *testRedis) Pause() error  { return r.cmd.Process.Signal(syscall.SIGSTOP) }
func (r *testRedis) Resume() error { return r.cmd.Process.Signal(syscall.SIGCONT) }
