package redlockprio_test

import (
	"context"
	"errors"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/latchkey-go/latchkey/contracttest/testenv"
	"github.com/latchkey-go/latchkey/locks"
	"github.com/latchkey-go/latchkey/redlockprio"
)

// callSeen says on seen when a script call through one go-redis client
// has returned an error.
type callSeen struct {
	once sync.Once
	seen chan struct{}
	arm  chan struct{} // closed when calls start to count
}

func (h *callSeen) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h *callSeen) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		select {
		case <-h.arm:
			if n := strings.ToLower(cmd.Name()); err != nil && (n == "evalsha" || n == "eval") {
				h.once.Do(func() { close(h.seen) })
			}
		default:
		}
		return err
	}
}

func (h *callSeen) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// TestFailedAttemptWithRefusedMasterAcknowledgesAtOnce: of 5 masters,
// master 4 refuses connections, refused at once (DialerRetries 1, no
// retries). A priority-1 attempt (TTL 3s) fails (the name is held at
// priority 5 on masters 0, 1 and 2); it got master 3's free key, and its
// cleanup there is slow. Masters 0 and 1 are then freed, and a priority-2
// Lock displaces master 3's leftover key. The attempt knows from every
// answer that it took nothing from anyone: master 4 refused the
// connection, so it never got the call. It must acknowledge the notice at
// once. Before the fix, a refused dial counted as "may have granted", the
// attempt remembered that it might have kept a victim's key, never
// acknowledged, and the thief waited out the leftover key's PTTL (3s):
// with 1 of 5 masters down, a higher priority stalled a whole TTL behind
// every failed lower attempt (TestAttackRefusingMinorityStallsMixedContention).
// Master 4 refuses from the start (its calls end in the first-contact
// check, before the acquire script) or after the Locker verified it (the
// acquire script's own dial is refused).
func TestFailedAttemptWithRefusedMasterAcknowledgesAtOnce(t *testing.T) {
	for _, when := range []string{"from the start", "after first contact"} {
		t.Run(when, func(t *testing.T) {
			servers := testenv.StartRedis(t, 5)
			addrs := addrsOf(servers)
			if when == "from the start" {
				servers[4].Stop()
				addrs[4] = deadAddr(t)
			}
			ctx := ctxFor(t, 15*time.Second)
			delay := &releaseDelay{delay: 2 * time.Second, seen: make(chan struct{})}
			refused := &callSeen{seen: make(chan struct{}), arm: make(chan struct{})}
			var rcs []*redis.Client
			var ms []redis.UniversalClient
			for i, a := range addrs {
				o := clientOptions(a).Simple()
				o.DialerRetries = 1
				rc := redis.NewClient(o)
				switch i {
				case 3:
					rc.AddHook(delay)
				case 4:
					rc.AddHook(refused)
				}
				rcs = append(rcs, rc)
				ms = append(ms, rc)
			}
			lowC, err := redlockprio.New(ms, redlockprio.WithPriority(1),
				redlockprio.WithTTL(3*time.Second), redlockprio.WithRenewInterval(900*time.Millisecond))
			if err != nil {
				t.Fatal(err)
			}
			low := lowC.Locker()
			t.Cleanup(func() {
				_ = lowC.Close(context.Background())
				for _, rc := range rcs {
					_ = rc.Close()
				}
			})
			warm(t, low)
			if when == "after first contact" {
				if err := servers[4].Kill(); err != nil {
					t.Fatal(err)
				}
				// Let the client's pooled connections fail until it dials.
				for i := 0; ; i++ {
					err := rcs[4].Ping(ctx).Err()
					var op *net.OpError
					if errors.As(err, &op) && op.Op == "dial" {
						break
					}
					if i == 100 {
						t.Fatalf("master 4's client never failed to dial: %v", err)
					}
				}
			}
			high := mustClient(t, addrs, redlockprio.WithPriority(2))
			warm(t, high.l)
			name := uniqueName(t)
			for _, i := range []int{0, 1, 2} {
				plant(t, addrs[i], name, 1, "other", 5)
			}
			close(refused.arm)
			_, err = low.TryLock(ctx, name)
			if !errors.Is(err, locks.ErrNotAcquired) {
				t.Fatalf("the low attempt = %v, want ErrNotAcquired", err)
			}
			for _, ch := range []chan struct{}{delay.seen, refused.seen} {
				select { // its cleanup on master 3; master 4's refusal
				case <-ch:
				case <-ctx.Done():
					t.Fatal("the low attempt's calls never came")
				}
			}
			time.Sleep(100 * time.Millisecond) // master 4's late answer seen to
			if got := holderOf(t, addrs[3], name); !strings.HasPrefix(got, lowC.ID()+":") {
				t.Fatalf("master 3's key is %q's, want the failed attempt's", got)
			}
			unplant(t, addrs[0], name, 1)
			unplant(t, addrs[1], name, 1)
			start := time.Now()
			lease, err := high.l.Lock(ctx, name)
			took := time.Since(start)
			if err != nil {
				t.Fatal(err)
			}
			defer lease.Release(ctx)
			t.Logf("the higher priority got the name in %v", took.Round(time.Millisecond))
			if took > time.Second {
				t.Errorf("the higher priority waited %v for an attempt that never held the name (its TTL 3s), master 4 refusing connections",
					took.Round(time.Millisecond))
			}
		})
	}
}
