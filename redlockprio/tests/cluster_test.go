package redlockprio_test

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/latchkey-go/latchkey/contracttest/testenv"
	"github.com/latchkey-go/latchkey/locks"
	"github.com/latchkey-go/latchkey/redlockprio"
)

// startClusters starts n independent one-node Redis Clusters, each with
// every hash slot on its one node, and returns their addresses once each
// reports cluster_state:ok (a master turns ok no sooner than 2s after it
// started: the servers start first, then are waited for together). It
// needs the local redis-server (testenv skips the test without it).
func startClusters(t testing.TB, n int) []string {
	t.Helper()
	var addrs []string
	for range n {
		s := testenv.StartRedisWith(t, 1, testenv.RedisConfig{Args: []string{
			"--cluster-enabled", "yes",
			"--cluster-config-file", filepath.Join(t.TempDir(), "nodes.conf"),
		}})[0]
		addrs = append(addrs, s.Addr())
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for _, addr := range addrs {
		rc := newRedis(addr)
		err := rc.Do(ctx, "CLUSTER", "ADDSLOTSRANGE", 0, 16383).Err()
		_ = rc.Close()
		if err != nil {
			t.Fatalf("CLUSTER ADDSLOTSRANGE 0 16383 on %s: %v", addr, err)
		}
	}
	for _, addr := range addrs {
		rc := newRedis(addr)
		for {
			info, err := rc.ClusterInfo(ctx).Result()
			if err == nil && strings.Contains(info, "cluster_state:ok") {
				break
			}
			if err == nil {
				err = ctx.Err()
			}
			if err != nil {
				_ = rc.Close()
				t.Fatalf("one-node cluster on %s not ok: %v", addr, err)
			}
			time.Sleep(10 * time.Millisecond)
		}
		_ = rc.Close()
	}
	return addrs
}

// newClusterClient returns a go-redis cluster client for the cluster whose
// node is at addr, configured as newRedis configures single clients.
func newClusterClient(addr string) *redis.ClusterClient {
	return redis.NewClusterClient(clientOptions(addr).Cluster())
}

// clusterClient makes a Client over its own cluster clients, one per
// cluster; the Client is closed, then the clients, at the end of the test.
func clusterClient(t testing.TB, addrs []string, opts ...redlockprio.Option) (*redlockprio.Client, []*redis.ClusterClient) {
	t.Helper()
	var ccs []*redis.ClusterClient
	var ms []redis.UniversalClient
	for _, a := range addrs {
		cc := newClusterClient(a)
		t.Cleanup(func() { _ = cc.Close() })
		ccs = append(ccs, cc)
		ms = append(ms, cc)
	}
	lc, err := redlockprio.New(ms, append([]redlockprio.Option{
		redlockprio.WithTTL(testTTL), redlockprio.WithRenewInterval(testRenew),
	}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = lc.Close(context.Background()) })
	return lc, ccs
}

// TestClusterClientMasters: masters may be *redis.ClusterClient's. On
// one and on three one-node Redis Clusters: a lease is granted, renewed
// (through the cluster clients' pipelines) and released, leaving no key;
// a second Locker is refused the held name, is woken by the release
// notice (pub/sub through the cluster clients: without it, the waiter's
// backoff of 5s and the holder's TTL of 10s would keep it waiting
// seconds) and gets a higher token; contending Lockers never hold a name
// together and their tokens increase; a Semaphore of size 2 grants two
// slots and no third until one is released; and closing the Lockers
// leaves the cluster clients open.
func TestClusterClientMasters(t *testing.T) {
	all := startClusters(t, 3)
	for _, n := range []int{1, 3} { // one master: its calls run inline
		t.Run(fmt.Sprintf("%d master(s)", n), func(t *testing.T) { testClusterClientMasters(t, all[:n]) })
	}
}

func testClusterClientMasters(t *testing.T, addrs []string) {
	slow := locks.Backoff{Min: 5 * time.Second, Max: 5 * time.Second}
	ac, accs := clusterClient(t, addrs)
	bc, bccs := clusterClient(t, addrs, redlockprio.WithBackoff(slow))
	a, b := ac.Locker(), bc.Locker()
	ctx := ctxFor(t, 20*time.Second)

	t.Run("lock, renew, release", func(t *testing.T) {
		name := uniqueName(t)
		lease, err := a.Lock(ctx, name)
		if err != nil {
			t.Fatal(err)
		}
		first := lease.(*redlockprio.Lease).Deadline()
		time.Sleep(3 * testRenew)
		if err := context.Cause(lease.Context()); err != nil {
			t.Fatalf("the lease ended within %v: %v", 3*testRenew, err)
		}
		if moved := lease.(*redlockprio.Lease).Deadline().Sub(first); moved <= 0 {
			t.Errorf("the deadline did not move in %v of renewals every %v", 3*testRenew, testRenew)
		}
		if err := lease.Release(ctx); err != nil {
			t.Fatal(err)
		}
		// The masters not needed for the quorum are answered in the
		// background: wait for them.
		for i, addr := range addrs {
			for deadline := time.Now().Add(2 * time.Second); keyExists(t, addr, "latchkey:{"+name+"}:1"); time.Sleep(10 * time.Millisecond) {
				if time.Now().After(deadline) {
					t.Fatalf("the released lease's key is still on cluster %d", i)
				}
			}
		}
	})

	t.Run("contention", func(t *testing.T) {
		// A holder with a long TTL: a waiter polls no later than when the
		// holder's keys expire, and must not get the name that way.
		holderC, _ := clusterClient(t, addrs, redlockprio.WithTTL(10*time.Second), redlockprio.WithRenewInterval(3*time.Second))
		holder := holderC.Locker()
		name := uniqueName(t)
		first, err := holder.TryLock(ctx, name)
		if err != nil {
			t.Fatal(err)
		}
		if lease, err := b.TryLock(ctx, name); !errors.Is(err, locks.ErrNotAcquired) {
			if err == nil {
				_ = lease.Release(ctx)
			}
			t.Fatalf("TryLock of a held name = %v, want ErrNotAcquired", err)
		}
		got := make(chan locks.Lease, 1)
		errc := make(chan error, 1)
		go func() {
			lease, err := b.Lock(ctx, name)
			if err != nil {
				errc <- err
				return
			}
			got <- lease
		}()
		time.Sleep(300 * time.Millisecond) // b has tried once and listens
		select {
		case lease := <-got:
			_ = lease.Release(ctx)
			t.Fatal("a second Locker got a held name")
		case err := <-errc:
			t.Fatal(err)
		default:
		}
		released := time.Now()
		if err := first.Release(ctx); err != nil {
			t.Fatal(err)
		}
		select {
		case second := <-got:
			took := time.Since(released)
			t.Logf("the waiter got the name %v after the release (backoff %v); tokens %d then %d",
				took.Round(time.Millisecond), slow.Min, first.Token(), second.Token())
			if took > time.Second {
				t.Errorf("the waiter got the name %v after the release: not woken by the release notice", took)
			}
			if second.Token() <= first.Token() {
				t.Errorf("token %d after %d", second.Token(), first.Token())
			}
			_ = second.Release(ctx)
		case err := <-errc:
			t.Fatal(err)
		case <-time.After(5 * time.Second):
			t.Fatal("the waiter did not get the name within 5s of its release")
		}
	})

	t.Run("mutual exclusion and fencing", func(t *testing.T) {
		name := uniqueName(t)
		var (
			mu      sync.Mutex
			holders int
			last    uint64
		)
		var wg sync.WaitGroup
		errs := make(chan error, 100)
		for w := range 4 {
			l := a
			if w%2 == 1 {
				l = b
			}
			wg.Go(func() {
				for range 5 {
					lease, err := l.Lock(ctx, name)
					if err != nil {
						errs <- err
						return
					}
					mu.Lock()
					holders++
					if holders > 1 {
						errs <- fmt.Errorf("%d holders at once", holders)
					}
					if lease.Token() <= last {
						errs <- fmt.Errorf("token %d after %d", lease.Token(), last)
					}
					last = lease.Token()
					mu.Unlock()
					time.Sleep(5 * time.Millisecond)
					mu.Lock()
					holders--
					mu.Unlock()
					if err := lease.Release(ctx); err != nil {
						errs <- err
						return
					}
				}
			})
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Error(err)
		}
	})

	t.Run("semaphore of 2", func(t *testing.T) {
		name := uniqueName(t)
		sa, err := ac.Semaphore(2)
		if err != nil {
			t.Fatal(err)
		}
		sb, err := bc.Semaphore(2)
		if err != nil {
			t.Fatal(err)
		}
		one, err := sa.TryAcquire(ctx, name)
		if err != nil {
			t.Fatal(err)
		}
		two, err := sa.TryAcquire(ctx, name)
		if err != nil {
			t.Fatal(err)
		}
		s1, s2 := one.(locks.SlotLease).Slot(), two.(locks.SlotLease).Slot()
		if s1 == s2 || min(s1, s2) != 1 || max(s1, s2) != 2 {
			t.Fatalf("slots %d and %d, want 1 and 2", s1, s2)
		}
		if lease, err := sb.TryAcquire(ctx, name); !errors.Is(err, locks.ErrNotAcquired) {
			if err == nil {
				_ = lease.Release(ctx)
			}
			t.Fatalf("a third TryAcquire of a semaphore of 2 = %v, want ErrNotAcquired", err)
		}
		if err := one.Release(ctx); err != nil {
			t.Fatal(err)
		}
		three, err := sb.Acquire(ctx, name)
		if err != nil {
			t.Fatal(err)
		}
		if s := three.(locks.SlotLease).Slot(); s != s1 {
			t.Errorf("the third holder got slot %d, want the freed slot %d", s, s1)
		}
		_ = three.Release(ctx)
		_ = two.Release(ctx)
	})

	// The Lockers never close the clients they were given.
	_ = ac.Close(context.Background())
	_ = bc.Close(context.Background())
	for i, cc := range append(accs, bccs...) {
		if err := cc.Ping(ctx).Err(); err != nil {
			t.Errorf("cluster client %d after Locker.Close: PING = %v", i, err)
		}
	}
}
