package redlockprio_test

import (
	"context"
	"testing"
	"time"

	"github.com/latchkey-go/latchkey/contracttest/testenv"
	"github.com/latchkey-go/latchkey/locks"
	"github.com/latchkey-go/latchkey/redlockprio"
)

// TestAttack2NoticeAfterVictimReleased: V (priority 1, TTL 3s) holds; T
// (priority 2) takes the name, but its theft notice is held (a gate on T's
// PUBLISH) until V has called Release and it has returned. V's code has let
// go before it was told: the acknowledgement "is sent when the victim calls
// Lease.Release [...], when its Locker closes, or when its validity runs
// out, whichever comes first". T's Lock must then return soon after the
// notice goes out (within 500ms), not after V's remaining validity (~3s).
// Variant "V WithImmediateAck": the same with V's Locker acknowledging on
// the context's end.
func TestAttack2NoticeAfterVictimReleased(t *testing.T) {
	for _, variant := range []string{"V default", "V WithImmediateAck"} {
		t.Run(variant, func(t *testing.T) {
			addrs := addrsOf(testenv.StartRedis(t, 3))
			var vo []redlockprio.Option
			if variant == "V WithImmediateAck" {
				vo = append(vo, redlockprio.WithImmediateAck())
			}
			v := mustClient(t, addrs, atkOpts(3*time.Second, 0.01, 1, vo...)...)
			th := mustClient(t, addrs, atkOpts(600*time.Millisecond, 0.01, 2)...)
			warm(t, v.l)
			warm(t, th.l)
			notice := newCmdGate(isTheftNotice)
			t.Cleanup(notice.open)
			for _, rc := range th.rcs {
				rc.AddHook(notice)
			}
			notice.armed.Store(true)
			name := uniqueName(t)
			ctx := ctxFor(t, 15*time.Second)
			vl, err := v.l.TryLock(ctx, name)
			if err != nil {
				t.Fatal(err)
			}
			type res struct {
				l   locks.Lease
				err error
				at  time.Time
			}
			tr := make(chan res, 1)
			go func() {
				l, err := th.l.Lock(ctx, name)
				tr <- res{l, err, time.Now()}
			}()
			waitSeen(t, notice.seen, "T's theft notice")
			waitForHolder(t, addrs, name, th.c.ID())
			rerr := vl.Release(context.Background())
			t.Logf("V's Release: %v", rerr)
			opened := time.Now()
			notice.armed.Store(false)
			notice.open()
			select {
			case r := <-tr:
				if r.err != nil {
					t.Fatalf("T: %v", r.err)
				}
				d := r.at.Sub(opened)
				t.Logf("T's Lock returned %v after its notice went out (token %d after V's %d)", d, r.l.Token(), vl.Token())
				if d > 500*time.Millisecond {
					t.Errorf("T waited %v after the notice for a victim that had already released", d)
				}
				if r.l.Token() <= vl.Token() {
					t.Errorf("TOKEN: T %d after V %d", r.l.Token(), vl.Token())
				}
				_ = r.l.Release(ctx)
			case <-time.After(6 * time.Second):
				t.Fatal("T's Lock did not return")
			}
		})
	}
}
