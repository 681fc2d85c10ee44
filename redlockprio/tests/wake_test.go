package redlockprio_test

import (
	"testing"
	"time"

	"github.com/latchkey-go/latchkey/contracttest/testenv"
	"github.com/latchkey-go/latchkey/locks"
	"github.com/latchkey-go/latchkey/redlockprio"
)

// TestWaiterWokenByRelease: a waiting Lock is woken by the release notices
// the masters publish, not by polling: with a 5s backoff it still gets the
// name within a fraction of a second of the Release.
func TestWaiterWokenByRelease(t *testing.T) {
	addrs := addrsOf(testenv.StartRedis(t, 3))
	slow := locks.Backoff{Min: 5 * time.Second, Max: 5 * time.Second}
	holder := mustClient(t, addrs)
	waiter := mustClient(t, addrs, redlockprio.WithBackoff(slow))
	ctx := ctxFor(t, 10*time.Second)
	name := uniqueName(t)
	lease, err := holder.l.TryLock(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	got := make(chan error, 1)
	go func() {
		l, err := waiter.l.Lock(ctx, name)
		if err == nil {
			defer l.Release(ctx)
		}
		got <- err
	}()
	time.Sleep(300 * time.Millisecond) // the waiter has tried once and listens
	released := time.Now()
	if err := lease.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-got; err != nil {
		t.Fatalf("the waiter's Lock: %v", err)
	}
	took := time.Since(released)
	t.Logf("the waiter got the name %v after the Release (backoff %v)", took.Round(time.Microsecond), slow.Min)
	if took > time.Second {
		t.Errorf("the waiter got the name %v after the Release: not woken (its backoff is %v)", took, slow.Min)
	}
}
