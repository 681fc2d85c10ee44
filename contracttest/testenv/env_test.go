package testenv

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"slices"
	"strings"
	"testing"
	"time"
)

// TestEnvClose checks the order of an Env's clean-ups, the errors Close
// returns, and what happens after Close.
func TestEnvClose(t *testing.T) {
	var env Env
	var order []int
	for i := range 3 {
		if err := env.OnClose(func() error {
			order = append(order, i)
			if i == 1 {
				return errors.New("cleanup 1 failed")
			}
			return nil
		}); err != nil {
			t.Fatalf("OnClose #%d: %v", i, err)
		}
	}
	dir, err := env.TempDir()
	if err != nil {
		t.Fatal(err)
	}
	env.report(errors.New("reported"))
	err = env.Close()
	if !slices.Equal(order, []int{2, 1, 0}) {
		t.Errorf("clean-ups ran in the order %v, want the last registered first: [2 1 0]", order)
	}
	if err == nil || !strings.Contains(err.Error(), "cleanup 1 failed") || !strings.Contains(err.Error(), "reported") {
		t.Errorf("Close = %v, want the clean-up's error and the reported one", err)
	}
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Errorf("TempDir %s after Close: %v, want it removed", dir, err)
	}
	if err := env.Close(); err != nil {
		t.Errorf("second Close = %v, want nil", err)
	}
	ran := false
	if err := env.OnClose(func() error { ran = true; return nil }); !errors.Is(err, ErrClosed) || !ran {
		t.Errorf("OnClose after Close = %v (ran: %v), want ErrClosed, the function run at once", err, ran)
	}
	if _, err := env.TempDir(); !errors.Is(err, ErrClosed) {
		t.Errorf("TempDir after Close = %v, want ErrClosed", err)
	}
}

// TestEnvLogf checks that an Env passes logs to Logf until Close ends,
// then drops them.
func TestEnvLogf(t *testing.T) {
	var lines []string
	env := &Env{Logf: func(format string, args ...any) { lines = append(lines, fmt.Sprintf(format, args...)) }}
	log := env.LogFunc()
	_ = env.OnClose(func() error { log("while closing"); return nil })
	log("before")
	if err := env.Close(); err != nil {
		t.Fatal(err)
	}
	log("after")
	if want := []string{"before", "while closing"}; !slices.Equal(lines, want) {
		t.Errorf("logged %q, want %q", lines, want)
	}
	if (&Env{}).LogFunc() != nil {
		t.Errorf("LogFunc of an Env without Logf is not nil")
	}
}

// TestEnvStartRedis starts servers outside any test's cleanup and checks
// that Close stops them.
func TestEnvStartRedis(t *testing.T) {
	leakCheck(t)
	env := new(Env)
	servers, err := env.StartRedis(t.Context(), 2, RedisConfig{})
	if err != nil {
		var missing *MissingError
		if errors.As(err, &missing) {
			Missing(t, missing.What, missing.How)
		}
		t.Fatal(err)
	}
	for _, s := range servers {
		if err := redisPing(s.Addr(), time.Second); err != nil {
			t.Errorf("PING %s: %v", s.Addr(), err)
		}
		if s.Binary() == "" {
			t.Logf("%s runs in a container", s.Addr())
		}
	}
	if err := env.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	for _, s := range servers {
		if err := portClosed(s.Addr()); err != nil {
			t.Errorf("after Close: %v", err)
		}
		if err := s.Restart(); err == nil {
			t.Errorf("Restart of %s after Close succeeded; want an error", s.Addr())
		}
	}
}

// TestEnvStartRedisMissing checks that StartRedis reports a missing
// redis-server as a *MissingError, which Require turns into a skip.
func TestEnvStartRedisMissing(t *testing.T) {
	if _, err := dockerPool(); err == nil {
		t.Skip("a Docker engine answers: StartRedis would use it")
	}
	t.Setenv("CI", "")
	t.Setenv("PATH", t.TempDir())
	env := new(Env)
	defer env.Close()
	_, err := env.StartRedis(context.Background(), 1, RedisConfig{})
	var missing *MissingError
	if !errors.As(err, &missing) || missing.What != "redis-server" {
		t.Fatalf("StartRedis without redis-server = %v, want a *MissingError for redis-server", err)
	}
	var skipped, reached bool
	t.Run("sub", func(t *testing.T) {
		defer func() { skipped = t.Skipped() }()
		Require(t, err)
		reached = true
	})
	if !skipped || reached {
		t.Errorf("Require(missing): skipped=%v, returned=%v; want skipped", skipped, reached)
	}
}

// TestEnvStartRedisCancelled checks that a start whose context has ended
// returns its error.
func TestEnvStartRedisCancelled(t *testing.T) {
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	env := new(Env)
	defer env.Close()
	_, err := env.StartRedis(ctx, 1, RedisConfig{})
	if _, missing := errors.AsType[*MissingError](err); missing {
		t.Skip(err)
	}
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("StartRedis with a cancelled context = %v, want context.Canceled", err)
	}
}

// TestEnvProxyRestoreError checks that a Proxy of an Env without a test
// reports a failed Restore through Close.
func TestEnvProxyRestoreError(t *testing.T) {
	leakCheck(t)
	env := new(Env)
	p, err := env.NewProxy(echoServer(t))
	if err != nil {
		t.Fatal(err)
	}
	p.Cut()
	taken, err := net.Listen("tcp", p.Addr())
	if err != nil {
		t.Skipf("cannot take the proxy's port to make Restore fail: %v", err)
	}
	defer taken.Close()
	p.Restore()
	if err := env.Close(); err == nil || !strings.Contains(err.Error(), "restore proxy") {
		t.Errorf("Close after a failed Restore = %v, want the Restore's error", err)
	}
}
