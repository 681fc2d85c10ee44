package tests

import (
	"context"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/latchkey-go/latchkey/contracttest"
	"github.com/latchkey-go/latchkey/contracttest/testenv"
)

// Chaos runs on real backends with their resource writes through a real
// guard: crashes, abandoned and closed clients, replies lost or late on a
// client's link (its lease then ends while it still writes); every write
// goes through the guard, also those made after the lease ended and the
// one a crashed holder had in flight. No stale write may land.

// NewChaosClient is a client behind a fault proxy (its Link).
func (h *natsHarness) NewChaosClient(ctx context.Context, _ *rand.Rand) (contracttest.ChaosClient, error) {
	c, link, err := h.NewFaultyClient(ctx)
	if err != nil {
		return contracttest.ChaosClient{}, err
	}
	return contracttest.ChaosClient{Client: c, Link: link}, nil
}

// NewChaosClient is a client behind fault proxies to every master (its
// Link).
func (h *redlockHarness) NewChaosClient(ctx context.Context, _ *rand.Rand) (contracttest.ChaosClient, error) {
	c, link, err := h.NewFaultyClient(ctx)
	if err != nil {
		return contracttest.ChaosClient{}, err
	}
	return contracttest.ChaosClient{Client: c, Link: link}, nil
}

var (
	_ contracttest.ChaosHarness = (*natsHarness)(nil)
	_ contracttest.ChaosHarness = (*redlockHarness)(nil)
)

// guardedChaos runs a short chaos run on nh writing through ns, and
// checks that writes went through the guard. (How many were late
// depends on which clients the faults hit: the summary says; the memlock
// run of contracttest, crashes only, proves that late writes are made
// and that a guard letting them land is caught.)
func guardedChaos(t *testing.T, nh contracttest.NewHarness, ns contracttest.NewGuardedStore) {
	if testing.Short() {
		t.Skip("the chaos run takes seconds")
	}
	s := contracttest.RunChaos(t, nh, contracttest.ChaosConfig{
		Duration: 4 * time.Second, FaultEvery: 150 * time.Millisecond, MaxHold: 500 * time.Millisecond, Guard: ns,
	})
	if s.StaleLanded != 0 {
		t.Errorf("%d stale writes landed through the guard", s.StaleLanded)
	}
	if s.GuardedWrites == 0 {
		t.Errorf("the run wrote too little through the guard to mean anything: %v", s)
	}
}

func TestChaosGuardedNatsputexPostgres(t *testing.T) {
	guardedChaos(t, newNatsputexHarness(t), newSQLStore(postgres, nil))
}

func TestChaosGuardedRedlockprioRedis(t *testing.T) {
	guardedChaos(t, newRedlockprioHarness(t, 3), newRedisStore(testenv.RedisAddr(t)))
}
