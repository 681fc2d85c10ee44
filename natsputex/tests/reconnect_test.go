package natsputex_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/latchkey-go/latchkey/contracttest/testenv/natsenv"
	"github.com/latchkey-go/latchkey/locks"
	"github.com/latchkey-go/latchkey/natsputex"
)

// TestWatchAfterRestart: a waiting Lock's KV watch works again as soon as
// the client has reconnected after a server restart: the holder's release
// after the restart wakes the waiter within a second, though its polling
// and its takeover timer would not wake it for about 9 s. Before,
// the watch's consumer stayed silent for 5–10 s after a restart. On the
// embedded server and on the nats-server program (2.9 here).
func TestWatchAfterRestart(t *testing.T) {
	for _, tc := range []struct {
		name  string
		start func(t testing.TB) *natsenv.Server
	}{
		{"embedded", natsenv.StartServer},
		{"binary", natsenv.StartBinaryServer},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := tc.start(t)
			t.Logf("nats-server %s", s.Version())
			url, bucket := s.URL(), uniqueBucket("rewatch")
			prepareBucket(t, url, bucket)
			slow := []natsputex.Option{natsputex.WithRenewInterval(time.Second), natsputex.WithFailureThreshold(10)}
			holder := newTestClient(t, url, bucket, slow...).Locker()
			waiter := newTestClient(t, url, bucket, append(slow, natsputex.WithBackoff(locks.Backoff{Min: 20 * time.Second, Max: 20 * time.Second}))...).Locker()
			ctx, cancel := context.WithTimeout(context.Background(), 40*time.Second)
			defer cancel()
			lease, err := holder.TryLock(ctx, "job")
			if err != nil {
				t.Fatal(err)
			}
			got := lockBehind(ctx, waiter, "job", lease)
			time.Sleep(500 * time.Millisecond) // the waiter watches the key

			if err := s.Restart(); err != nil {
				t.Fatal(err)
			}
			time.Sleep(2 * time.Second) // both reconnect; the holder renews
			if err := lease.Context().Err(); err != nil {
				t.Fatalf("the holder lost its lease across the restart: %v", context.Cause(lease.Context()))
			}
			released := time.Now()
			if err := lease.Release(ctx); err != nil {
				t.Fatalf("Release after the restart: %v", err)
			}
			g := mustGrant(t, got)
			took := time.Since(released)
			t.Logf("the waiter got the key %v after the release that followed the restart", took.Round(time.Millisecond))
			if took > time.Second {
				t.Fatalf("the waiter got the key %v after the release: its watch did not come back with the connection", took.Round(time.Millisecond))
			}
			if g.otherLive {
				t.Error("double grant")
			}
		})
	}
}

// TestNewSaysWhatItWaitedFor: the stream leader of an R3 bucket is killed
// (SIGKILL: no leadership handed over) on a 3-node cluster of the
// nats-server program. New, called at once on a surviving node, gets no
// answer until the others elect a leader (4–9 s of election timeout):
// with a 2 s context its error says what it waited for (the bucket's
// stream), for how long, and matches ctx.Err(); with a longer one it
// waits out the election and succeeds. The program is 2.9 here, so the
// bucket needs WithUnsafeServer; the stall is the same on later releases.
func TestNewSaysWhatItWaitedFor(t *testing.T) {
	if testing.Short() {
		t.Skip("a 3-node cluster is slow to start")
	}
	c := natsenv.StartBinaryCluster(t, 3)
	t.Logf("nats-server %v", c.Versions())
	opts := []natsputex.Option{natsputex.WithReplicas(3), natsputex.WithUnsafeServer(func(error) {})}
	bucket := uniqueBucket("waitfor")
	prepareBucket(t, c.URLs(), bucket, opts...)
	nodes := c.Servers()
	leader := bucketLeader(t, c.URLs(), bucket, nodes, -1)
	other := nodes[(leader+1)%len(nodes)]
	nc, js, err := connect(other.URL(), nats.IgnoreDiscoveredServers())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	nodes[leader].Kill()
	killed := time.Now()
	t.Logf("killed the stream leader %s", nodes[leader].Name())

	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	cl, err := natsputex.New(ctx, js, bucket, opts...)
	took := time.Since(killed)
	if err == nil {
		_ = cl.Close(context.Background())
		t.Skipf("New succeeded %v after the kill: the stream elected a leader sooner than nats-server's election timeout allows", took.Round(time.Millisecond))
	}
	t.Logf("New returned %v after the kill: %v", took.Round(time.Millisecond), err)
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("New's error does not match context.DeadlineExceeded: %v", err)
	}
	for _, want := range []string{bucket, "waited", "KV_" + bucket} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("New's error does not say %q: %v", want, err)
		}
	}

	ctx2, cancel2 := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel2()
	cl, err = natsputex.New(ctx2, js, bucket, opts...)
	if err != nil {
		t.Fatalf("New after the kill, with 30 s: %v", err)
	}
	_ = cl.Close(context.Background())
	t.Logf("New succeeded %v after the stream leader was killed", time.Since(killed).Round(time.Millisecond))
}

// TestStreamLeaderKillStall measures how long an R3 bucket takes no lock
// after its stream leader is killed (SIGKILL, no leadership handed over)
// on a 3-node cluster of the nats-server program, with a client connected
// to every node: the stall the package doc bounds by nats-server's
// election timeout (at most 9 s) plus one request's timeout and the
// client's reconnect wait. The bound checked is that, plus 5 s for a
// loaded machine.
func TestStreamLeaderKillStall(t *testing.T) {
	if testing.Short() {
		t.Skip("a 3-node cluster and up to 20 s of stall")
	}
	c := natsenv.StartBinaryCluster(t, 3)
	t.Logf("nats-server %v", c.Versions())
	opts := []natsputex.Option{natsputex.WithReplicas(3), natsputex.WithUnsafeServer(func(error) {})}
	bucket := uniqueBucket("stall")
	prepareBucket(t, c.URLs(), bucket, opts...)
	nodes := c.Servers()
	leader := bucketLeader(t, c.URLs(), bucket, nodes, -1)
	l := newTestClient(t, c.URLs(), bucket, opts...).Locker()
	ctx, cancel := context.WithTimeout(context.Background(), 40*time.Second)
	defer cancel()
	if lease, err := l.TryLock(ctx, "warm"); err != nil {
		t.Fatal(err)
	} else {
		_ = lease.Release(ctx)
	}
	nodes[leader].Kill()
	killed := time.Now()
	const request = time.Second // natsputex bounds a request by max(T, 1s); T = 300ms here
	bound := 9*time.Second + request + 50*time.Millisecond + 5*time.Second
	for i := 0; ; i++ {
		octx, ocancel := context.WithTimeout(ctx, 2*time.Second)
		lease, err := l.TryLock(octx, fmt.Sprintf("n%d", i))
		ocancel()
		if err == nil {
			_ = lease.Release(ctx)
			took := time.Since(killed)
			t.Logf("the bucket took a lock again %v after its stream leader %s was killed (%d tries)", took.Round(time.Millisecond), nodes[leader].Name(), i+1)
			if took > bound {
				t.Errorf("stalled %v, beyond %v", took.Round(time.Millisecond), bound)
			}
			return
		}
		if time.Since(killed) > bound {
			t.Fatalf("no lock %v after the stream leader was killed: %v", time.Since(killed).Round(time.Millisecond), err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestConnectOptions: a connection made with ConnectOptions reconnects
// forever, quickly, and buffers no write while it reconnects.
func TestConnectOptions(t *testing.T) {
	url := natsenv.StartServer(t).URL()
	nc, err := nats.Connect(url, natsputex.ConnectOptions()...)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	o := nc.Opts
	if o.MaxReconnect != -1 || o.ReconnectWait > 100*time.Millisecond || o.ReconnectBufSize != -1 {
		t.Fatalf("MaxReconnect %d, ReconnectWait %v, ReconnectBufSize %d; want -1, <= 100ms, -1", o.MaxReconnect, o.ReconnectWait, o.ReconnectBufSize)
	}
}
