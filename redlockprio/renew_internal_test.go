package redlockprio

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/latchkey-go/latchkey/locks"
	"github.com/latchkey-go/latchkey/locks/driver"
)

// TestRenewRoundEndsBeforeEarliestDeadline: a renewal round whose masters
// hang gives up before the earliest validity in its batch (less the drift
// allowance), even when that is closer than one renewal interval, so that
// the lease ends with ErrLost before its validity runs out rather than at
// it.
func TestRenewRoundEndsBeforeEarliestDeadline(t *testing.T) {
	servers := startRedis(t, 1)
	rc := redis.NewClient(&redis.Options{Addr: servers[0].Addr(), ContextTimeoutEnabled: true, MaxRetries: -1})
	defer rc.Close()
	const ttl, renew = 600 * time.Millisecond, 190 * time.Millisecond
	c, err := New([]*redis.Client{rc}, WithTTL(ttl), WithRenewInterval(renew))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close(context.Background())
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
	lease := driver.NewLease(context.Background(), driver.Spec{Name: "n", Token: 1, Deadline: deadline})
	cl := &claim{c: c, name: "n", id: "id", key: c.key("n", 1), fence: c.fenceKey("n"), ackable: make(chan struct{}), lease: lease}
	c.mu.Lock()
	c.byLease[lease] = cl
	c.mu.Unlock()
	// The registry's round context ends at the earliest deadline.
	round, cancel := context.WithDeadline(context.Background(), deadline)
	defer cancel()
	// A timer set for the round's own limit says how late the scheduler
	// runs a timer now: the round cannot return sooner after its limit
	// (a CI run: 10.7ms past the deadline, against 8ms of drift).
	limit := deadline.Add(-c.drift)
	fired := make(chan time.Time, 1)
	time.AfterFunc(time.Until(limit), func() { fired <- time.Now() })
	answers := c.renew(round, []*driver.Lease{lease})
	returned := time.Now()
	late := max((<-fired).Sub(limit), 0)

	if !returned.Before(deadline.Add(late)) {
		t.Errorf("the renewal round returned %v after the lease's validity ended (its limit %v before it; a timer for that limit fired %v late)",
			returned.Sub(deadline), deadline.Sub(limit), late)
	}
	if len(answers) != 1 {
		t.Fatalf("the renewal round gave %d answers for a batch of 1", len(answers))
	}
	cause := answers[0].Err
	if !errors.Is(cause, locks.ErrLost) {
		t.Fatalf("the renewal round that reached no master, %v before the lease's deadline, does not end it: answer %+v, want ErrLost", time.Until(deadline), answers[0])
	}
	var qe *QuorumError
	if !errors.As(cause, &qe) {
		t.Errorf("cause = %v: not the failed renewal's", cause)
	}
}
