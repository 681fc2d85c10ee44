package amqpsem_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"testing"
	"time"

	"github.com/latchkey-go/latchkey/amqpsem"
	"github.com/latchkey-go/latchkey/contracttest"
	"github.com/latchkey-go/latchkey/contracttest/testenv"
)

// The ranges the chaos clients' options are drawn from: the heartbeat in
// whole seconds, and the verify interval up to half of it.
const (
	chaosMaxHeartbeat = 3 * time.Second
	chaosMinVerify    = 100 * time.Millisecond
)

// TestChaosMutex runs the randomized fault run on the exclusive-queue
// mutex, each client with its own heartbeat and verify interval, behind a
// fault proxy of its own; crashes black-hole the client's link (so
// recovery takes the heartbeat bound), and replies are lost or late for a
// while. Every critical section is checked for overlap and every crashed
// holder for recovery. The broker is not restarted: the local one may be
// shared. `mage chaos` runs it for minutes; here it runs for seconds.
func TestChaosMutex(t *testing.T) {
	if testing.Short() {
		t.Skip("the chaos run takes seconds")
	}
	contracttest.RunChaos(t, newChaosHarness(blackHole, false), chaosConfig)
}

// TestChaosSemaphore is TestChaosMutex on a one-slot persistent semaphore,
// crashes closing the client's socket.
func TestChaosSemaphore(t *testing.T) {
	if testing.Short() {
		t.Skip("the chaos run takes seconds")
	}
	contracttest.RunChaos(t, newChaosHarness(closeSocket, true), chaosConfig)
}

var chaosConfig = contracttest.ChaosConfig{Duration: 5 * time.Second, MaxHold: 300 * time.Millisecond, MaxOutage: chaosMaxHeartbeat}

// chaosHarness is the suite's harness whose chaos clients differ.
type chaosHarness struct{ *harness }

var _ contracttest.ChaosHarness = chaosHarness{}

func newChaosHarness(kill killMode, semLocker bool) contracttest.NewHarness {
	return func(ctx context.Context, t testing.TB) (contracttest.Harness, error) {
		raw, host := amqpURL(t)
		return chaosHarness{&harness{t: t, url: raw, upstream: host, kill: kill, semLocker: semLocker, names: map[string]bool{}}}, nil
	}
}

// chaosRecovery bounds a crashed holder's hand-over with heartbeat hb.
func (h chaosHarness) chaosRecovery(hb time.Duration) time.Duration {
	if h.kill == blackHole {
		return 3*hb + 500*time.Millisecond // two or three missed heartbeats
	}
	return time.Second // the broker sees the socket close
}

// Capabilities are the suite's, with the bounds of the longest heartbeat
// drawn.
func (h chaosHarness) Capabilities() contracttest.Capabilities {
	caps := h.harness.Capabilities()
	caps.CrashRecovery = h.chaosRecovery(chaosMaxHeartbeat)
	return caps
}

// NewChaosClient makes a client as newClient does, always behind a proxy
// of its own, with the heartbeat and verify interval drawn.
func (h chaosHarness) NewChaosClient(ctx context.Context, rng *rand.Rand) (contracttest.ChaosClient, error) {
	hb := time.Duration(1+rng.IntN(int(chaosMaxHeartbeat/time.Second))) * time.Second
	verify := (chaosMinVerify + time.Duration(rng.Int64N(int64(hb/2-chaosMinVerify)+1))).Truncate(time.Millisecond)

	cl := &client{h: h.harness, proxy: testenv.NewProxy(h.t, h.upstream)}
	h.mu.Lock()
	h.proxies = append(h.proxies, cl.proxy)
	h.mu.Unlock()
	dial := func(ctx context.Context, network, _ string) (net.Conn, error) {
		var d net.Dialer
		conn, err := d.DialContext(ctx, network, cl.proxy.Addr())
		if err == nil {
			cl.mu.Lock()
			cl.conns = append(cl.conns, conn)
			cl.mu.Unlock()
		}
		return conn, err
	}
	opts := append(testOptions(), amqpsem.WithHeartbeat(hb), amqpsem.WithVerifyInterval(verify), amqpsem.WithDial(dial))
	c, err := amqpsem.Dial(ctx, h.url, opts...)
	if err != nil {
		return contracttest.ChaosClient{}, err
	}
	cl.c = c
	if h.semLocker {
		s, err := c.Semaphore(1)
		if err != nil {
			return contracttest.ChaosClient{}, errors.Join(err, c.Close(context.Background()))
		}
		cl.locker = semLocker{recSem{s, h.harness}}
	} else {
		m := c.Locker()
		cl.locker = m
	}
	return contracttest.ChaosClient{
		Client:        cl,
		Options:       fmt.Sprintf("heartbeat=%v verify=%v", hb, verify),
		CrashRecovery: h.chaosRecovery(hb),
		Link:          cl.proxy,
	}, nil
}
