package natsputex_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/latchkey-go/latchkey/contracttest"
	"github.com/latchkey-go/latchkey/natsputex"
)

// TestAttackTwoStandbysRace: node-a is killed; node-b and node-c, both
// standby with the same timing (R = 100ms, F = 3), race for its key. The
// one that loses must not take the winner's key over before it has gone
// T without a write ("waits until the key has gone T = F·R without any
// write, by its own clock, then writes its token at the revision it
// read"): every write of a token other than the key's last one comes T or
// more after that last write (by the server's stamps). With C = 0 (a
// takeover starts the service at once), no two services may overlap.
func TestAttackTwoStandbysRace(t *testing.T) {
	for _, C := range []int{0, 1} {
		t.Run(fmt.Sprintf("C=%d", C), func(t *testing.T) {
			for round := range 1 {
				url, bucket, key := supervisorEnv(t)
				writes := watchWrites(t, url, bucket, key)
				h := contracttest.NewHistory(1)
				opt := natsputex.WithConfirmations(C)
				a := startAgentWith(t, url, bucket, key, "node-a", "node-a", h, nil, opt)
				waitFor(t, 5*time.Second, "node-a starts its service", a.running)
				b := startAgentWith(t, url, bucket, key, "node-b", "node-b", h, nil, opt)
				c := startAgentWith(t, url, bucket, key, "node-c", "node-c", h, nil, opt)
				time.Sleep(time.Duration(3+round) * testR / 2)
				a.kill()
				time.Sleep(2 * time.Second)
				b.stop()
				c.stop()
				writes.mu.Lock()
				ws := append([]keyWrite(nil), writes.writes...)
				writes.mu.Unlock()
				for i := 1; i < len(ws); i++ {
					prev, w := ws[i-1], ws[i]
					if w.value == "" || prev.value == "" || w.value == prev.value {
						continue
					}
					gap := w.created.Sub(prev.created)
					t.Logf("round %d: rev %d %q took over rev %d %q %v after it", round, w.rev, w.value, prev.rev, prev.value, gap.Round(time.Millisecond))
					if gap < testF*testR {
						t.Errorf("round %d: %s took the key over %v after %s's write (rev %d), before T = %v", round, w.value, gap.Round(time.Millisecond), prev.value, prev.rev, testF*testR)
					}
				}
				if err := h.Check(); err != nil {
					t.Errorf("round %d: services overlapped: %v", round, err)
				}
			}
		})
	}
}

// TestAttackLateStandbyAfterSlowHolder: node-a (R = 400ms, F = 3, T =
// 1.2s) is killed; node-c (R = 50ms, F = 2, T = 100ms), standby from the
// start, takes its key over after node-a's T; node-b (node-c's timing),
// started 500ms after the kill, is still counting node-a's T when node-c
// writes. node-b must then count its T = 100ms from node-c's write, not
// take the key at once.
func TestAttackLateStandbyAfterSlowHolder(t *testing.T) {
	for _, C := range []int{1, 0} {
		t.Run(fmt.Sprintf("C=%d", C), func(t *testing.T) {
			url, bucket, key := supervisorEnv(t)
			writes := watchWrites(t, url, bucket, key)
			h := contracttest.NewHistory(1)
			a := startAgentWith(t, url, bucket, key, "node-a", "node-a", h, nil,
				natsputex.WithRenewInterval(400*time.Millisecond), natsputex.WithFailureThreshold(3), natsputex.WithConfirmations(C))
			waitFor(t, 5*time.Second, "node-a starts its service", a.running)
			fast := []natsputex.Option{natsputex.WithRenewInterval(50 * time.Millisecond), natsputex.WithFailureThreshold(2), natsputex.WithConfirmations(C)}
			c := startAgentWith(t, url, bucket, key, "node-c", "node-c", h, nil, fast...)
			time.Sleep(500 * time.Millisecond)
			a.kill()
			time.Sleep(500 * time.Millisecond)
			b := startAgentWith(t, url, bucket, key, "node-b", "node-b", h, nil, fast...)
			time.Sleep(1500 * time.Millisecond)
			b.stop()
			c.stop()
			writes.mu.Lock()
			ws := append([]keyWrite(nil), writes.writes...)
			writes.mu.Unlock()
			for i := 1; i < len(ws); i++ {
				prev, w := ws[i-1], ws[i]
				if w.value == "" || prev.value == "" || w.value == prev.value {
					continue
				}
				T := 100 * time.Millisecond
				if prev.value == "node-a" {
					T = 1200 * time.Millisecond
				}
				gap := w.created.Sub(prev.created)
				t.Logf("rev %d %q took over rev %d %q %v after it", w.rev, w.value, prev.rev, prev.value, gap.Round(time.Millisecond))
				if gap < T {
					t.Errorf("rev %d %q took over rev %d %q %v after it, before T = %v", w.rev, w.value, prev.rev, prev.value, gap.Round(time.Millisecond), T)
				}
			}
			if err := h.Check(); err != nil {
				t.Errorf("services overlapped: %v", err)
			}
		})
	}
}
