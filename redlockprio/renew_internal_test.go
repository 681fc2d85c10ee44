package redlockprio

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/latchkey-go/latchkey/contracttest/testenv"
	"github.com/latchkey-go/latchkey/locks"
)

// TestRenewRoundEndsBeforeEarliestDeadline: a renewal round whose masters
// hang gives up before the earliest validity in its batch (less the drift
// allowance), even when that is closer than one renewal interval, so that
// the lease ends with ErrLost before its validity runs out rather than at
// it.
func TestRenewRoundEndsBeforeEarliestDeadline(t *testing.T) {
	servers := testenv.StartRedis(t, 1)
	rc := redis.NewClient(&redis.Options{Addr: servers[0].Addr(), ContextTimeoutEnabled: true, MaxRetries: -1})
	defer rc.Close()
	const ttl, renew = 600 * time.Millisecond, 190 * time.Millisecond
	l, err := New([]redis.UniversalClient{rc}, WithTTL(ttl), WithRenewInterval(renew))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	if err := rc.Ping(context.Background()).Err(); err != nil {
		t.Fatal(err)
	}
	if err := servers[0].Pause(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = servers[0].Resume() }()

	// A lease whose validity ends within one renewal interval: one whose
	// acquisition was slow, say.
	deadline := time.Now().Add(renew / 2)
	e := &Lease{l: l, name: "n", id: "id", key: l.key("n", 1), fence: l.fenceKey("n"), settled: make(chan struct{})}
	e.base = locks.NewBaseLease(context.Background(), locks.LeaseSpec{Name: "n", Deadline: deadline})
	l.renewBatch([]*Lease{e}, []uint64{1})
	returned := time.Now()

	if !returned.Before(deadline) {
		t.Errorf("the renewal round returned %v after the lease's validity ended", returned.Sub(deadline))
	}
	select {
	case <-e.base.Context().Done():
	default:
		t.Fatalf("the lease is live after a renewal round that reached no master, %v before its deadline", time.Until(deadline))
	}
	cause := context.Cause(e.base.Context())
	if !errors.Is(cause, locks.ErrLost) {
		t.Errorf("cause = %v, want ErrLost", cause)
	}
	var qe *QuorumError
	if !errors.As(cause, &qe) {
		t.Errorf("cause = %v: the lease ran into its deadline, not ended by the failed renewal", cause)
	}
}
