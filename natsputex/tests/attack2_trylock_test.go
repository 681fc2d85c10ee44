package natsputex_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/latchkey-go/latchkey/locks"
	"github.com/latchkey-go/latchkey/natsputex"
)

// TestAttack2TryLockMixedTAfterCrash: "A TryLock made T or more after a
// crashed holder's last write takes the key", where T is "the longer of
// its own T and the T its holder's value carries". Two TryLock loops, one
// with T = 100ms (R = 50ms, F = 2), one with T = 1.2s (R = 400ms, F = 3),
// race for names whose holders crash: first a holder with T = 1.2s (the
// fast loop must wait 1.2s of server-stamped silence), then one with T =
// 300ms. Every takeover write of a crashed holder's key comes no sooner
// than the crashed holder's T after its last write (server stamps), and
// no grant overlaps a live lease.
func TestAttack2TryLockMixedTAfterCrash(t *testing.T) {
	url, bucket := promiseEnv(t, "atk2trymixed")
	fast := []natsputex.Option{natsputex.WithRenewInterval(50 * time.Millisecond), natsputex.WithFailureThreshold(2), natsputex.WithConfirmations(1)}
	slow := []natsputex.Option{natsputex.WithRenewInterval(400 * time.Millisecond), natsputex.WithFailureThreshold(3), natsputex.WithConfirmations(1)}
	cases := []struct {
		name string
		opts []natsputex.Option
		T    time.Duration
	}{
		{"slow", slow, 1200 * time.Millisecond},
		{"suite", nil, testF * testR},
	}
	for _, cs := range cases {
		name := "job-" + cs.name
		writes := watchWrites(t, url, bucket, name)
		nc, js, err := connect(url)
		if err != nil {
			t.Fatal(err)
		}
		opts := cs.opts
		if opts == nil {
			opts = []natsputex.Option{natsputex.WithRenewInterval(testR), natsputex.WithFailureThreshold(testF), natsputex.WithConfirmations(testC)}
		}
		crashed, err := natsputex.New(context.Background(), js, bucket, append(opts, natsputex.WithHolderID("crashed"))...)
		if err != nil {
			t.Fatal(err)
		}
		g := newGrants()
		held, err := crashed.Locker().TryLock(context.Background(), name)
		if err != nil {
			t.Fatal(err)
		}
		g.grant("crashed", held)
		time.Sleep(cs.T / 2)
		nc.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		var wg sync.WaitGroup
		for i, o := range [][]natsputex.Option{fast, slow} {
			who := []string{"fast", "slow"}[i]
			c := newTestClient(t, url, bucket, append(o, natsputex.WithHolderID(who))...)
			wg.Add(1)
			go func() {
				defer wg.Done()
				end := time.Now().Add(cs.T + 1500*time.Millisecond)
				for time.Now().Before(end) {
					l, err := c.Locker().TryLock(ctx, name)
					if errors.Is(err, locks.ErrNotAcquired) {
						time.Sleep(5 * time.Millisecond)
						continue
					}
					if err != nil {
						t.Errorf("%s: %v", who, err)
						return
					}
					g.grant(who, l)
					time.Sleep(100 * time.Millisecond)
					_ = l.Release(context.Background())
				}
			}()
		}
		wg.Wait()
		cancel()
		_ = crashed.Close(context.Background())
		g.check(t)
		writes.mu.Lock()
		var last keyWrite
		for _, w := range writes.writes {
			if strings.HasPrefix(w.value, "crashed") {
				last = w
				continue
			}
			if last.rev != 0 && w.value != "" {
				gap := w.created.Sub(last.created)
				t.Logf("%s: crashed holder's last write rev %d; taken over by %q %v later (its T = %v)", name, last.rev, w.value, gap.Round(time.Millisecond), cs.T)
				if gap < cs.T {
					t.Errorf("%s: a crashed holder's key (T = %v) was taken over %v after its last write", name, cs.T, gap.Round(time.Millisecond))
				}
				break
			}
		}
		writes.mu.Unlock()
	}
}
