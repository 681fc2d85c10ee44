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

// TestAttack2ConfirmerGivesUp: "A Supervisor cut off from NATS begins
// Service.Stop at that same moment; a standby starts its service no
// earlier than T + C·R after that write, so Stop has margin + C·R to
// finish before the two could overlap." All agents share R = 200ms,
// F = 3, C = 3 (T = 600ms, C·R = 600ms, margin 100ms: Stop has 700ms).
// node-a's link is black-holed; its Stop takes 550ms. node-b or node-c
// takes the key over after T and confirms; while it confirms it gives up
// — it is shut down (Run's context ends: "blanks the key if it still
// holds the agent's last write (so another agent takes over at once") or
// its health check fails — and the other standby finds the key blank,
// "free", and starts at once. It must not start before node-a's Stop
// has returned. (Fails now, shutdown case, 4 runs of 4: the other
// standby started 805–807ms after node-a's last write, ~245ms before
// node-a's Stop returned; the health-check case held.)
func TestAttack2ConfirmerGivesUp(t *testing.T) {
	for _, how := range []string{"shutdown", "healthcheck"} {
		t.Run(how, func(t *testing.T) {
			url, bucket, key := supervisorEnv(t)
			writes := watchWrites(t, url, bucket, key)
			proxy := testenv.NewProxy(t, strings.TrimPrefix(url, "nats://"))
			h := contracttest.NewHistory(1)
			timing := []natsputex.Option{natsputex.WithRenewInterval(200 * time.Millisecond), natsputex.WithFailureThreshold(3), natsputex.WithConfirmations(3)}
			a := startAgentWith(t, "nats://"+proxy.Addr(), bucket, key, "node-a", "node-a", h,
				func(a *agent) { a.stopDelay.Store(int64(550 * time.Millisecond)) }, timing...)
			waitFor(t, 5*time.Second, "node-a starts its service", a.running)
			b := startAgentWith(t, url, bucket, key, "node-b", "node-b", h, nil, timing...)
			c := startAgentWith(t, url, bucket, key, "node-c", "node-c", h, nil, timing...)
			time.Sleep(500 * time.Millisecond)
			proxy.BlackHole()
			confirming := func(ag *agent) bool {
				return ag.sawEvent(func(e natsputex.Event) bool { return e.Phase == natsputex.PhaseConfirming })
			}
			var taker, other *agent
			waitFor(t, 5*time.Second, "a standby takes the key over", func() bool {
				switch {
				case confirming(b):
					taker, other = b, c
				case confirming(c):
					taker, other = c, b
				}
				return taker != nil
			})
			gaveUp := time.Now()
			if how == "shutdown" {
				taker.stop()
			} else {
				taker.failHC.Store(true)
			}
			waitFor(t, 5*time.Second, "the other standby starts", other.running)
			time.Sleep(300 * time.Millisecond)
			proxy.Restore()
			for _, ag := range []*agent{a, b, c} {
				ag.stop()
			}
			a.mu.Lock()
			aStopped := a.stopped
			a.mu.Unlock()
			last, _ := writes.lastBy("node-a", time.Now())
			t.Logf("node-a's last write at %v; %s gave up confirming (%s) at %v; %s started at %v; node-a's service stopped at %v",
				last.created.Format("15:04:05.000"), taker.name, how, gaveUp.Format("15:04:05.000"), other.name,
				other.lastStart().Format("15:04:05.000"), aStopped)
			if s := other.lastStart(); !s.IsZero() && s.Sub(last.created) < 1200*time.Millisecond {
				t.Errorf("%s started %v after node-a's last write, before T + C·R = 1.2s", other.name, s.Sub(last.created).Round(time.Millisecond))
			}
			if err := h.Check(); err != nil {
				t.Errorf("two services ran at once: %v", err)
			}
		})
	}
}

// TestAttack2MixedChainConfirmerDies: the bounds "Supervisors on one key
// with different R, F or C (a rolling change) ... keep": "a standby
// starts its service no earlier than T + C·R after that write, so Stop
// has margin + C·R to finish". node-a (R = 200ms, F = 3, C = 3: T =
// 600ms, C·R = 600ms, margin 100ms, so Stop has 700ms) is cut off; its
// Stop takes 550ms. node-b and node-c run a new timing (R = 50ms, F = 2,
// C = 1: T = 100ms, C·R = 50ms). The first to take node-a's key over
// waits node-a's T and must confirm for node-a's 600ms, but it crashes
// (kill) while it confirms; the other then waits the crashed agent's T
// (100ms) and confirms for the longer of the two agents' C·R (50ms).
// Neither may start before node-a's T + C·R = 1.2s after its last write.
// (Fails now, 3 runs of 3: the survivor started 781–785ms after node-a's
// last write, "confirming for 50ms", ~265ms before node-a's Stop
// returned.)
func TestAttack2MixedChainConfirmerDies(t *testing.T) {
	url, bucket, key := supervisorEnv(t)
	writes := watchWrites(t, url, bucket, key)
	proxy := testenv.NewProxy(t, strings.TrimPrefix(url, "nats://"))
	h := contracttest.NewHistory(1)
	a := startAgentWith(t, "nats://"+proxy.Addr(), bucket, key, "node-a", "node-a", h,
		func(a *agent) { a.stopDelay.Store(int64(550 * time.Millisecond)) },
		natsputex.WithRenewInterval(200*time.Millisecond), natsputex.WithFailureThreshold(3), natsputex.WithConfirmations(3))
	waitFor(t, 5*time.Second, "node-a starts its service", a.running)
	fast := []natsputex.Option{natsputex.WithRenewInterval(50 * time.Millisecond), natsputex.WithFailureThreshold(2), natsputex.WithConfirmations(1)}
	b := startAgentWith(t, url, bucket, key, "node-b", "node-b", h, nil, fast...)
	c := startAgentWith(t, url, bucket, key, "node-c", "node-c", h, nil, fast...)
	time.Sleep(500 * time.Millisecond)
	proxy.BlackHole()
	confirming := func(ag *agent) bool {
		return ag.sawEvent(func(e natsputex.Event) bool { return e.Phase == natsputex.PhaseConfirming })
	}
	var taker, other *agent
	waitFor(t, 5*time.Second, "a standby takes the key over", func() bool {
		switch {
		case confirming(b):
			taker, other = b, c
		case confirming(c):
			taker, other = c, b
		}
		return taker != nil
	})
	taker.kill()
	waitFor(t, 5*time.Second, "the other standby starts", other.running)
	time.Sleep(300 * time.Millisecond)
	proxy.Restore()
	a.stop()
	other.stop()
	last, _ := writes.lastBy("node-a", time.Now())
	a.mu.Lock()
	aStopped := a.stopped
	a.mu.Unlock()
	t.Logf("node-a's last write at %v; %s crashed while confirming; %s started at %v (%v after node-a's last write); node-a's service stopped at %v",
		last.created.Format("15:04:05.000"), taker.name, other.name, other.lastStart().Format("15:04:05.000"),
		other.lastStart().Sub(last.created).Round(time.Millisecond), aStopped)
	if s := other.lastStart(); !s.IsZero() && s.Sub(last.created) < 1200*time.Millisecond {
		t.Errorf("%s started %v after node-a's last write, before node-a's T + C·R = 1.2s", other.name, s.Sub(last.created).Round(time.Millisecond))
	}
	if err := h.Check(); err != nil {
		t.Errorf("two services ran at once: %v", err)
	}
}

// TestAttack2LockerConfirmCancelled: TestAttack2ConfirmerGivesUp with a
// Locker in the middle. node-a, a Supervisor (R = 200ms, F = 3, C = 3:
// T + C·R = 1.2s, Stop has margin + C·R = 700ms) is cut off, its Stop
// takes 550ms; a Locker's Lock (same timing) takes the key over after T
// and "confirms for the longer of its own C·R and the holder's", but its
// context ends while it confirms ("On failure Lock returns an error and
// holds nothing"). node-b, a standby Supervisor with node-a's timing,
// must not start before node-a's T + C·R after node-a's last write.
// (Fails now, 3 runs of 3: node-b started 816–822ms after node-a's last
// write, ~230ms before node-a's Stop returned.)
func TestAttack2LockerConfirmCancelled(t *testing.T) {
	url, bucket, key := supervisorEnv(t)
	writes := watchWrites(t, url, bucket, key)
	proxy := testenv.NewProxy(t, strings.TrimPrefix(url, "nats://"))
	h := contracttest.NewHistory(1)
	timing := []natsputex.Option{natsputex.WithRenewInterval(200 * time.Millisecond), natsputex.WithFailureThreshold(3), natsputex.WithConfirmations(3)}
	a := startAgentWith(t, "nats://"+proxy.Addr(), bucket, key, "node-a", "node-a", h,
		func(a *agent) { a.stopDelay.Store(int64(550 * time.Millisecond)) }, timing...)
	waitFor(t, 5*time.Second, "node-a starts its service", a.running)
	locker := newTestClient(t, url, bucket, append(timing, natsputex.WithHolderID("locker"))...)
	time.Sleep(300 * time.Millisecond)
	proxy.BlackHole()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	lockErr := make(chan error, 1)
	go func() {
		l, err := locker.Locker().Lock(ctx, key)
		if err == nil {
			_ = l.Release(context.Background())
		}
		lockErr <- err
	}()
	var taken time.Time
	waitFor(t, 5*time.Second, "the Locker takes the key over", func() bool {
		writes.mu.Lock()
		defer writes.mu.Unlock()
		for _, w := range writes.writes {
			if strings.HasPrefix(w.value, "locker/") {
				taken = w.created
				return true
			}
		}
		return false
	})
	b := startAgentWith(t, url, bucket, key, "node-b", "node-b", h, nil, timing...)
	time.Sleep(50 * time.Millisecond)
	cancel()
	t.Logf("Lock returned: %v", <-lockErr)
	waitFor(t, 5*time.Second, "node-b starts", b.running)
	time.Sleep(300 * time.Millisecond)
	proxy.Restore()
	a.stop()
	b.stop()
	last, _ := writes.lastBy("node-a", time.Now())
	t.Logf("node-a's last write at %v; the Locker's takeover at %v; node-b started at %v (%v after node-a's last write)",
		last.created.Format("15:04:05.000"), taken.Format("15:04:05.000"), b.lastStart().Format("15:04:05.000"),
		b.lastStart().Sub(last.created).Round(time.Millisecond))
	if s := b.lastStart(); !s.IsZero() && s.Sub(last.created) < 1200*time.Millisecond {
		t.Errorf("node-b started %v after node-a's last write, before T + C·R = 1.2s", s.Sub(last.created).Round(time.Millisecond))
	}
	if err := h.Check(); err != nil {
		t.Errorf("two services ran at once: %v", err)
	}
}
