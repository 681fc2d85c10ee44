package natsputex_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/latchkey-go/latchkey/contracttest"
	"github.com/latchkey-go/latchkey/contracttest/testenv"
	"github.com/latchkey-go/latchkey/natsputex"
)

// TestAttack2SupervisorConfirmToLocker: "a call waits for the longer of
// its own T and the T its holder's value carries, and confirms for the
// longer of its own C·R and the holder's (a Supervisor's value carries
// it)". node-a, a Supervisor with R = 200ms, F = 3, C = 5 (T = 600ms,
// C·R = 1s, margin 100ms) is active when its link is black-holed; its
// Stop takes 800ms, within the margin + C·R = 1.1s the docs give it. A
// Locker with R = 50ms, F = 2, C = 1, waiting in Lock on the key, must be
// handed its lease no sooner than T + C·R = 1.6s after node-a's last
// write, after node-a's Stop has returned.
func TestAttack2SupervisorConfirmToLocker(t *testing.T) {
	url, bucket, key := supervisorEnv(t)
	writes := watchWrites(t, url, bucket, key)
	proxy := testenv.NewProxy(t, strings.TrimPrefix(url, "nats://"))
	h := contracttest.NewHistory(1)
	a := startAgentWith(t, "nats://"+proxy.Addr(), bucket, key, "node-a", "node-a", h,
		func(a *agent) { a.stopDelay.Store(int64(800 * time.Millisecond)) },
		natsputex.WithRenewInterval(200*time.Millisecond), natsputex.WithFailureThreshold(3), natsputex.WithConfirmations(5))
	waitFor(t, 5*time.Second, "node-a starts its service", a.running)
	locker := newTestClient(t, url, bucket, natsputex.WithRenewInterval(50*time.Millisecond), natsputex.WithFailureThreshold(2),
		natsputex.WithConfirmations(1), natsputex.WithHolderID("locker"))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	got := make(chan time.Time, 1)
	var runningAtGrant bool
	go func() {
		l, err := locker.Locker().Lock(ctx, key)
		now := time.Now()
		if err != nil {
			t.Errorf("Lock: %v", err)
			got <- time.Time{}
			return
		}
		runningAtGrant = a.running()
		got <- now
		exit := h.Enter("locker", l.Token())
		time.Sleep(200 * time.Millisecond)
		exit()
		_ = l.Release(context.Background())
	}()
	time.Sleep(500 * time.Millisecond)
	proxy.BlackHole()
	at := <-got
	a.mu.Lock()
	var stoppedAt time.Time
	if len(a.stopped) > 0 {
		stoppedAt = a.stopped[len(a.stopped)-1]
	}
	a.mu.Unlock()
	last, _ := writes.lastBy("node-a", at)
	t.Logf("node-a's last write rev %d at %v; its service stopped at %v; the locker's lease at %v (%v after the write; T + C·R = 1.6s); node-a ran then: %t",
		last.rev, last.created.Format("15:04:05.000"), stoppedAt.Format("15:04:05.000"), at.Format("15:04:05.000"), at.Sub(last.created).Round(time.Millisecond), runningAtGrant)
	if !at.IsZero() && at.Sub(last.created) < 1600*time.Millisecond {
		t.Errorf("the Locker was handed the key %v after the Supervisor's last write, before its T + C·R = 1.6s", at.Sub(last.created).Round(time.Millisecond))
	}
	if runningAtGrant {
		t.Errorf("the Locker's lease was granted while node-a's service still ran (its Stop had margin + C·R = 1.1s)")
	}
	proxy.Restore()
	a.stop()
	if err := h.Check(); err != nil {
		t.Errorf("node-a's service and the Locker's lease overlapped: %v", err)
	}
}

// TestAttack2LockerHeldSupervisorStandby: a Locker (R = 400ms, F = 3,
// T = 1.2s) holds the key a Supervisor (R = 50ms, F = 2, C = 1) stands
// by on: "A Locker's token carries its T", so the standby must not start
// its service while the Locker's lease is live.
func TestAttack2LockerHeldSupervisorStandby(t *testing.T) {
	url, bucket, key := supervisorEnv(t)
	holder := newTestClient(t, url, bucket, natsputex.WithRenewInterval(400*time.Millisecond), natsputex.WithFailureThreshold(3),
		natsputex.WithConfirmations(1), natsputex.WithHolderID("locker"))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	l, err := holder.Locker().TryLock(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	h := contracttest.NewHistory(1)
	exit := h.Enter("locker", l.Token())
	b := startAgentWith(t, url, bucket, key, "node-b", "node-b", h, nil,
		natsputex.WithRenewInterval(50*time.Millisecond), natsputex.WithFailureThreshold(2), natsputex.WithConfirmations(1))
	deadline := time.Now().Add(1500 * time.Millisecond)
	for time.Now().Before(deadline) && l.Context().Err() == nil {
		if b.running() {
			t.Errorf("node-b (T = 100ms) started its service while the Locker's lease (T = 1.2s) was live")
			break
		}
		time.Sleep(2 * time.Millisecond)
	}
	t.Logf("the Locker's lease: %v", context.Cause(l.Context()))
	exit()
	_ = l.Release(ctx)
	b.stop()
	if err := h.Check(); err != nil {
		t.Errorf("overlap: %v", err)
	}
}
