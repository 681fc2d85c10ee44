package amqpsem_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/latchkey-go/latchkey/contracttest"
	"github.com/latchkey-go/latchkey/contracttest/testenv"

	"github.com/latchkey-go/latchkey/amqpsem"
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

	cl, err := h.newClient(ctx, amqpsem.WithHeartbeat(hb), amqpsem.WithVerifyInterval(verify))
	if err != nil {
		return contracttest.ChaosClient{}, err
	}
	return contracttest.ChaosClient{
		Client:        cl,
		Options:       fmt.Sprintf("heartbeat=%v verify=%v", hb, verify),
		CrashRecovery: h.chaosRecovery(hb),
		Link:          cl.proxy,
	}, nil
}

// TestChaosSemaphoreNeverMoreThanN: six reconnecting clients, each behind a
// fault proxy that is black-holed and restored at random, contend for a
// 2-slot semaphore. Every critical section (from Acquire's return to the
// first of Release's call and the lease's end) is recorded on one monotonic
// clock: never more than 2 at once, never two on one slot.
func TestChaosSemaphoreNeverMoreThanN(t *testing.T) {
	url, host := amqpURL(t)
	name := newName(t, url)
	const slots = 2
	ctx, cancel := context.WithTimeout(context.Background(), 40*time.Second)
	defer cancel()
	if err := admin(t, dial(t, url)).Create(ctx, name, slots); err != nil {
		t.Fatal(err)
	}
	rec := newLeaseHistory(slots)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var proxies testenv.Proxies
	for i := range 6 {
		p := testenv.NewProxy(t, host)
		proxies = append(proxies, p)
		c := dial(t, url, through(p), fastReconnect)
		s, _ := c.Semaphore(amqpsem.MaxSemaphoreSize)
		who := fmt.Sprintf("client %d", i)
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				actx, acancel := context.WithTimeout(ctx, 2*time.Second)
				l, err := s.Acquire(actx, name)
				acancel()
				if err != nil {
					time.Sleep(20 * time.Millisecond)
					continue
				}
				exit := rec.enter(who, l)
				select {
				case <-time.After(time.Duration(20+rand.IntN(150)) * time.Millisecond):
				case <-l.Context().Done():
				}
				exit()
				rctx, rcancel := context.WithTimeout(ctx, 3*time.Second)
				l.Release(rctx)
				rcancel()
			}
		})
	}
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		p := proxies[rand.IntN(len(proxies))]
		p.BlackHole()
		time.Sleep(time.Duration(500+rand.IntN(3000)) * time.Millisecond)
		p.Restore()
		time.Sleep(time.Duration(100+rand.IntN(500)) * time.Millisecond)
	}
	close(stop)
	wg.Wait()
	rec.check(t)
	most := rec.all.Peak()
	if most > slots {
		t.Errorf("%d critical sections at once on a %d-slot semaphore", most, slots)
	}
	t.Logf("%d critical sections, at most %d at once", rec.all.Len(), most)
}
