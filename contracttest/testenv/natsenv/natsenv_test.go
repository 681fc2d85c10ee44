package natsenv_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
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

// TestStartServer: a plain server runs as a process of the linked
// version; an Embedded one in the test process, with the same version.
func TestStartServer(t *testing.T) {
	leakCheck(t)
	s := natsenv.StartServer(t)
	if s.Version() == "" || s.Binary() == "" {
		t.Errorf("server: Version() = %q, Binary() = %q, want a process of the linked version", s.Version(), s.Binary())
	}
	testServer(t, s)
	e := natsenv.StartServerWith(t, natsenv.ServerConfig{Embedded: true})
	if e.Version() != s.Version() || e.Binary() != "" {
		t.Errorf("embedded server: Version() = %q, Binary() = %q, want %q and none", e.Version(), e.Binary(), s.Version())
	}
	testServer(t, e)
}

// TestBinaryServer is TestStartServer on a server process of the
// nats-server program on PATH.
func TestBinaryServer(t *testing.T) {
	leakCheck(t)
	s := natsenv.StartBinaryServer(t)
	want, err := natsenv.BinaryVersion(s.Binary())
	if err != nil {
		t.Fatal(err)
	}
	if s.Version() != want {
		t.Errorf("Version() = %q, want %q (from %s --version)", s.Version(), want, s.Binary())
	}
	t.Logf("nats-server %s from %s", s.Version(), s.Binary())
	testServer(t, s)
	// Kill, unlike Shutdown, is a crash: the server restarts all the same.
	s.Kill()
	if s.Running() {
		t.Fatalf("Running() = true after Kill")
	}
	if err := s.Restart(); err != nil {
		t.Fatalf("Restart after Kill: %v", err)
	}
}

func testServer(t *testing.T, s *natsenv.Server) {
	t.Helper()
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
	for i, s := range c.Servers() {
		if s.Binary() == "" || s.Version() != server.VERSION {
			t.Errorf("node %d: binary %q, version %q; want a process of the linked nats-server %s", i, s.Binary(), s.Version(), server.VERSION)
		}
	}
	testCluster(t, c)
}

// TestEmbeddedCluster is TestCluster on nodes embedded in the test
// process.
func TestEmbeddedCluster(t *testing.T) {
	leakCheck(t)
	c := natsenv.StartClusterWith(t, 3, natsenv.ClusterConfig{Embedded: true})
	if s := c.Servers()[0]; s.Binary() != "" {
		t.Errorf("embedded node runs from %q", s.Binary())
	}
	testCluster(t, c)
}

// TestBinaryCluster is TestCluster on a cluster of nats-server processes
// of the program on PATH.
func TestBinaryCluster(t *testing.T) {
	leakCheck(t)
	c := natsenv.StartBinaryCluster(t, 3)
	for i, v := range c.Versions() {
		if v == "" {
			t.Errorf("node %d reports no version", i)
		}
	}
	t.Logf("nats-server versions %v from %s", c.Versions(), c.Servers()[0].Binary())
	testCluster(t, c)
}

func testCluster(t *testing.T, c *natsenv.Cluster) {
	t.Helper()
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
	// A read right after the write may reach a replica that has not
	// applied it yet (nats-server 2.9's direct gets): the test is about the
	// cluster, so it waits for the value rather than failing on the lag.
	eventually(t, 10*time.Second, func(ctx context.Context) error { return expect(ctx, kv, "k", "v1") })
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

// TestClusterIsolate cuts the meta leader of a cluster with proxied routes
// off the other nodes: they elect another without it and go on writing an
// R3 bucket, while it commits nothing; healed, it catches up and takes
// writes again. A route that bypassed the proxies would let it commit.
func TestClusterIsolate(t *testing.T) {
	leakCheck(t)
	c := natsenv.StartClusterWith(t, 3, natsenv.ClusterConfig{ProxyRoutes: true})
	js := connect(t, c.URLs())
	kv, err := js.CreateKeyValue(testContext(t), jetstream.KeyValueConfig{Bucket: "part", Replicas: 3})
	if err != nil {
		t.Fatal(err)
	}
	// A new R3 stream may still be electing its leader under load (seen
	// in a CI run: the first write timed out after 10s).
	eventually(t, 30*time.Second, func(ctx context.Context) error {
		_, err := kv.Put(ctx, "k", []byte("v1"))
		return err
	})
	x := c.MetaLeader()
	if x < 0 {
		t.Fatal("no meta leader after StartClusterWith")
	}
	var others []string
	for i, s := range c.Servers() {
		if i != x {
			others = append(others, s.URL())
		}
	}
	kvX := bucket(t, connectOnly(t, c.Servers()[x].URL()), "part")
	kvO := bucket(t, connectOnly(t, strings.Join(others, ",")), "part")

	c.Isolate(x)
	isolated := time.Now()
	if !c.Isolated(x) {
		t.Fatalf("Isolated(%d) = false after Isolate", x)
	}
	// The others elect a meta leader among themselves (MetaLeader ignores
	// the isolated node, which may still believe it leads).
	eventually(t, 30*time.Second, func(context.Context) error {
		if l := c.MetaLeader(); l < 0 {
			return errors.New("no meta leader among the other nodes")
		}
		return nil
	})
	t.Logf("node %d isolated; node %d is meta leader after %v", x, c.MetaLeader(), time.Since(isolated).Round(time.Millisecond))
	// The bucket goes on working on their side.
	eventually(t, 30*time.Second, func(ctx context.Context) error {
		if _, err := kvO.Put(ctx, "k", []byte("v2")); err != nil {
			return err
		}
		return expect(ctx, kvO, "k", "v2")
	})
	// The isolated node commits nothing: not as the bucket's leader, for
	// want of a quorum, nor as a follower, for want of a route to it.
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Second)
	_, err = kvX.Put(ctx, "k", []byte("from-x"))
	cancel()
	if err == nil {
		t.Fatal("a write through the isolated node succeeded: the partition leaks")
	}
	t.Logf("write through the isolated node: %v", err)

	if err := c.Heal(); err != nil {
		t.Fatal(err)
	}
	if c.Isolated(x) {
		t.Errorf("Isolated(%d) = true after Heal", x)
	}
	if c.MetaLeader() < 0 {
		t.Fatal("no meta leader after Heal")
	}
	// Healed, the node has the write it missed (its own was never
	// committed), and takes writes again.
	eventually(t, 30*time.Second, func(ctx context.Context) error { return expect(ctx, kvX, "k", "v2") })
	eventually(t, 30*time.Second, func(ctx context.Context) error {
		if _, err := kvX.Put(ctx, "k", []byte("v3")); err != nil {
			return err
		}
		return expect(ctx, kvO, "k", "v3")
	})
}

// TestOperator runs a server in operator mode: a user of the operator
// connects with its credentials file and has JetStream; no credentials, or
// another operator's, are refused, and neither secret of the file shows
// in the errors.
func TestOperator(t *testing.T) {
	leakCheck(t)
	op := natsenv.NewOperator(t)
	s := natsenv.StartServerWith(t, natsenv.ServerConfig{Operator: op})
	user := op.NewUser(t, "alice")
	fi, err := os.Stat(user.File)
	if err != nil {
		t.Fatal(err)
	}
	if perm := fi.Mode().Perm(); perm != 0o600 {
		t.Errorf("credentials file mode %v, want 0600", perm)
	}
	file, err := os.ReadFile(user.File)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(file), user.JWT) || !strings.Contains(string(file), user.Seed) || !strings.HasPrefix(user.Seed, "SU") {
		t.Fatalf("credentials file does not hold the user's JWT and seed:\n%s", file)
	}

	nc, err := nats.Connect(s.URL(), nats.UserCredentials(user.File), nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond))
	if err != nil {
		t.Fatalf("connect with the user's credentials: %v", err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx := testContext(t)
	kv, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: "op"})
	if err != nil {
		t.Fatalf("JetStream for the operator's user: %v", err)
	}
	if _, err := kv.Put(ctx, "k", []byte("v1")); err != nil {
		t.Fatal(err)
	}
	if err := expect(ctx, kv, "k", "v1"); err != nil {
		t.Fatal(err)
	}

	stranger := natsenv.NewOperator(t).NewUser(t, "mallory")
	for _, tc := range []struct {
		name string
		opts []nats.Option
	}{
		{"no credentials", nil},
		{"another operator's user", []nats.Option{nats.UserCredentials(stranger.File)}},
	} {
		nc, err := nats.Connect(s.URL(), append(tc.opts, nats.MaxReconnects(0))...)
		if err == nil {
			nc.Close()
			t.Errorf("%s: connected", tc.name)
			continue
		}
		if !errors.Is(err, nats.ErrAuthorization) {
			t.Errorf("%s: %v, want an authorization violation", tc.name, err)
		}
		for _, secret := range []string{user.JWT, user.Seed, stranger.JWT, stranger.Seed} {
			if strings.Contains(err.Error(), secret) {
				t.Errorf("%s: the error shows a secret: %v", tc.name, err)
			}
		}
	}

	// Operator mode survives a restart, with the account's streams.
	if err := s.Restart(); err != nil {
		t.Fatal(err)
	}
	eventually(t, 10*time.Second, func(ctx context.Context) error { return expect(ctx, kv, "k", "v1") })
}

// --- helpers ---

// testContext bounds one step of a test that should succeed at once.
func testContext(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// connect returns JetStream on a connection to urls that reconnects
// quickly, with more options if given, closed at cleanup.
func connect(t *testing.T, urls string, opts ...nats.Option) jetstream.JetStream {
	t.Helper()
	nc, err := nats.Connect(urls, append([]nats.Option{
		nats.ReconnectWait(50 * time.Millisecond),
		nats.MaxReconnects(-1),
		nats.Timeout(2 * time.Second),
	}, opts...)...)
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

// connectOnly is connect to urls only: it ignores the other nodes' URLs
// the servers announce.
func connectOnly(t *testing.T, urls string) jetstream.JetStream {
	t.Helper()
	return connect(t, urls, nats.IgnoreDiscoveredServers())
}

func bucket(t *testing.T, js jetstream.JetStream, name string) jetstream.KeyValue {
	t.Helper()
	kv, err := js.KeyValue(testContext(t), name)
	if err != nil {
		t.Fatal(err)
	}
	return kv
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
