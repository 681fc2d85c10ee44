package natsenv_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/goleak"

	"github.com/latchkey-go/latchkey/contracttest/testenv/natsenv"
)

// leakCheck fails t if goroutines outlive it. It registers itself first, so
// that it runs after every other cleanup of the test.
func leakCheck(t *testing.T) {
	t.Cleanup(func() { goleak.VerifyNone(t) })
}

func TestStartServer(t *testing.T) {
	leakCheck(t)
	s := natsenv.StartServer(t)
	url := s.URL()
	if !strings.HasPrefix(url, "nats://127.0.0.1:") {
		t.Fatalf("URL() = %q, want a loopback nats:// URL", url)
	}
	if !s.Running() {
		t.Fatalf("Running() = false after StartServer")
	}
	js := connect(t, url)
	ctx := testContext(t)
	kv, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: "single"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := kv.Put(ctx, "k", []byte("v1")); err != nil {
		t.Fatal(err)
	}

	if err := s.Restart(); err != nil {
		t.Fatal(err)
	}
	if s.URL() != url {
		t.Errorf("URL after Restart = %q, want %q", s.URL(), url)
	}
	// Same store directory: the bucket and its value survive.
	eventually(t, 10*time.Second, func(ctx context.Context) error { return expect(ctx, kv, "k", "v1") })

	s.Shutdown()
	s.Shutdown()
	if s.Running() {
		t.Errorf("Running() = true after Shutdown")
	}
	if nc, err := nats.Connect(url, nats.NoReconnect()); err == nil {
		nc.Close()
		t.Fatalf("connected to a server that was shut down")
	}
	if err := s.Restart(); err != nil {
		t.Fatalf("Restart after Shutdown: %v", err)
	}
	eventually(t, 10*time.Second, func(ctx context.Context) error { return expect(ctx, kv, "k", "v1") })
}

func TestURL(t *testing.T) {
	leakCheck(t)
	t.Setenv("LOCKS_NATS_URL", "")
	js := connect(t, natsenv.URL(t))
	if _, err := js.AccountInfo(testContext(t)); err != nil {
		t.Fatalf("JetStream on the embedded server: %v", err)
	}

	t.Setenv("LOCKS_NATS_URL", " nats://example.invalid:4222 ")
	if got := natsenv.URL(t); got != "nats://example.invalid:4222" {
		t.Errorf("URL with LOCKS_NATS_URL set = %q", got)
	}
}

func TestCluster(t *testing.T) {
	leakCheck(t)
	c := natsenv.StartCluster(t, 3)
	if n := len(c.Servers()); n != 3 {
		t.Fatalf("Servers() has %d nodes, want 3", n)
	}
	urls := strings.Split(c.URLs(), ",")
	if len(urls) != 3 {
		t.Fatalf("URLs() = %q, want 3 URLs", c.URLs())
	}
	for i, s := range c.Servers() {
		if urls[i] != s.URL() || !strings.HasPrefix(s.URL(), "nats://127.0.0.1:") {
			t.Errorf("node %d: URL %q, in URLs() %q", i, s.URL(), urls[i])
		}
	}
	if c.MetaLeader() < 0 {
		t.Fatalf("no meta leader after StartCluster")
	}

	js := connect(t, c.URLs())
	ctx := testContext(t)
	kv, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: "cluster", Replicas: 3})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := kv.Put(ctx, "k", []byte("v1")); err != nil {
		t.Fatal(err)
	}
	if err := expect(ctx, kv, "k", "v1"); err != nil {
		t.Fatal(err)
	}
	info := streamInfo(t, js, "KV_cluster")
	if n := len(info.Cluster.Replicas) + 1; n != 3 {
		t.Fatalf("bucket has %d replicas, want 3", n)
	}

	// Stop the bucket's leader: the others elect a new one and the bucket
	// keeps working.
	leader := index(t, c, info.Cluster.Leader)
	c.Stop(leader)
	if c.Servers()[leader].Running() {
		t.Fatalf("node %d still running after Stop", leader)
	}
	eventually(t, 30*time.Second, func(ctx context.Context) error {
		if _, err := kv.Put(ctx, "k", []byte("v2")); err != nil {
			return err
		}
		return expect(ctx, kv, "k", "v2")
	})
	if l := streamInfo(t, js, "KV_cluster").Cluster.Leader; l == info.Cluster.Leader {
		t.Errorf("stopped node %s is still the bucket's leader", l)
	}

	// Restart it: it catches up, with the write it missed.
	if err := c.Restart(leader); err != nil {
		t.Fatal(err)
	}
	eventually(t, 30*time.Second, func(context.Context) error {
		info := streamInfo(t, js, "KV_cluster")
		for _, p := range info.Cluster.Replicas {
			if !p.Current || p.Offline {
				return fmt.Errorf("replica %s: current=%v offline=%v", p.Name, p.Current, p.Offline)
			}
		}
		if n := len(info.Cluster.Replicas); n != 2 {
			return fmt.Errorf("%d followers, want 2", n)
		}
		return nil
	})

	// Stop the meta leader: another node takes over.
	meta := c.MetaLeader()
	if meta < 0 {
		t.Fatalf("no meta leader after Restart")
	}
	c.Stop(meta)
	eventually(t, 30*time.Second, func(context.Context) error {
		if l := c.MetaLeader(); l < 0 || l == meta {
			return fmt.Errorf("meta leader: %d", l)
		}
		return nil
	})
	eventually(t, 30*time.Second, func(ctx context.Context) error {
		if _, err := kv.Put(ctx, "k", []byte("v3")); err != nil {
			return err
		}
		return expect(ctx, kv, "k", "v3")
	})
	if err := c.Restart(meta); err != nil {
		t.Fatal(err)
	}
}

// --- helpers ---

// testContext bounds one step of a test that should succeed at once.
func testContext(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// connect returns JetStream on a connection to urls that reconnects quickly,
// closed at cleanup.
func connect(t *testing.T, urls string) jetstream.JetStream {
	t.Helper()
	nc, err := nats.Connect(urls,
		nats.ReconnectWait(50*time.Millisecond),
		nats.MaxReconnects(-1),
		nats.Timeout(2*time.Second),
	)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc, jetstream.WithDefaultTimeout(2*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	return js
}

func expect(ctx context.Context, kv jetstream.KeyValue, key, want string) error {
	e, err := kv.Get(ctx, key)
	if err != nil {
		return err
	}
	if got := string(e.Value()); got != want {
		return fmt.Errorf("%s = %q, want %q", key, got, want)
	}
	return nil
}

func streamInfo(t *testing.T, js jetstream.JetStream, name string) *jetstream.StreamInfo {
	t.Helper()
	var info *jetstream.StreamInfo
	eventually(t, 30*time.Second, func(ctx context.Context) error {
		s, err := js.Stream(ctx, name)
		if err != nil {
			return err
		}
		if info, err = s.Info(ctx); err != nil {
			return err
		}
		if info.Cluster == nil || info.Cluster.Leader == "" {
			return errors.New("no stream leader")
		}
		return nil
	})
	return info
}

func index(t *testing.T, c *natsenv.Cluster, name string) int {
	t.Helper()
	for i, s := range c.Servers() {
		if s.Name() == name {
			return i
		}
	}
	t.Fatalf("no node named %q", name)
	return -1
}

// eventually calls f until it returns nil, failing t if it still fails after
// timeout. Each attempt gets its own short context, so that a request lost
// with a node that stopped does not use up the time.
func eventually(t *testing.T, timeout time.Duration, f func(ctx context.Context) error) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		ctx, cancel := context.WithTimeout(t.Context(), 2*time.Second)
		err := f(ctx)
		cancel()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("still failing after %v: %v", timeout, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
