package natsputex_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/latchkey-go/latchkey/contracttest"
	"github.com/latchkey-go/latchkey/contracttest/testenv/natsenv"
	"github.com/latchkey-go/latchkey/natsputex"
)

// TestAttack2RestartFreshStandby: the server of a file-stored bucket
// goes down under an active node-a (R = 200ms, F = 3, C = 2: T = 600ms,
// C·R = 400ms, margin 100ms) whose Stop takes 450ms, within the margin +
// C·R = 500ms the docs give it: "A Supervisor cut off from NATS begins
// Service.Stop at that same moment; a standby starts its service no
// earlier than T + C·R after that write". node-b (R = 50ms, F = 2) stands
// by throughout; node-c (same timing) is started as the server comes
// back, after down, and may measure the key's silence by the server's
// stamps. No two services may run at once, and no takeover write may
// come less than node-a's T after its last write.
func TestAttack2RestartFreshStandby(t *testing.T) {
	for _, down := range []time.Duration{400 * time.Millisecond, 700 * time.Millisecond} {
		t.Run(fmt.Sprint(down), func(t *testing.T) {
			srv := natsenv.StartServer(t)
			url := srv.URL()
			bucket := uniqueBucket("atk2restart")
			prepareBucket(t, url, bucket)
			const key = "spof-service"
			h := contracttest.NewHistory(1)
			a := startAgentWith(t, url, bucket, key, "node-a", "node-a", h,
				func(a *agent) { a.stopDelay.Store(int64(450 * time.Millisecond)) },
				natsputex.WithRenewInterval(200*time.Millisecond), natsputex.WithFailureThreshold(3), natsputex.WithConfirmations(2))
			waitFor(t, 5*time.Second, "node-a starts its service", a.running)
			fast := []natsputex.Option{natsputex.WithRenewInterval(50 * time.Millisecond), natsputex.WithFailureThreshold(2), natsputex.WithConfirmations(1)}
			b := startAgentWith(t, url, bucket, key, "node-b", "node-b", h, nil, fast...)
			time.Sleep(500 * time.Millisecond)
			srv.Shutdown()
			downAt := time.Now()
			time.Sleep(down)
			if err := srv.Restart(); err != nil {
				t.Fatal(err)
			}
			upAt := time.Now()
			writes := watchWrites(t, url, bucket, key)
			c := startAgentWith(t, url, bucket, key, "node-c", "node-c", h, nil, fast...)
			time.Sleep(2 * time.Second)
			for _, ag := range []*agent{a, b, c} {
				ag.stop()
			}
			t.Logf("server down for %v (restart took %v)", down, upAt.Sub(downAt).Round(time.Millisecond))
			for _, ag := range []*agent{a, b, c} {
				ag.mu.Lock()
				for i, s := range ag.started {
					var st string
					if i < len(ag.stopped) {
						st = ag.stopped[i].Sub(downAt).Round(time.Millisecond).String()
					}
					t.Logf("%s: service up %v .. %s (from the shutdown)", ag.name, s.Sub(downAt).Round(time.Millisecond), st)
				}
				ag.mu.Unlock()
			}
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
					T = 600 * time.Millisecond
				}
				gap := w.created.Sub(prev.created)
				t.Logf("rev %d %q took over rev %d %q %v after it", w.rev, w.value, prev.rev, prev.value, gap.Round(time.Millisecond))
				if gap < T {
					t.Errorf("rev %d %q took over rev %d %q %v after it, before T = %v", w.rev, w.value, prev.rev, prev.value, gap.Round(time.Millisecond), T)
				}
			}
			if err := h.Check(); err != nil {
				t.Errorf("two services ran at once: %v", err)
			}
		})
	}
}
