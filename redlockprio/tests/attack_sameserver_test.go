package redlockprio_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/latchkey-go/latchkey/contracttest/testenv"
	"github.com/latchkey-go/latchkey/locks"
	"github.com/latchkey-go/latchkey/redlockprio"
)

// TestAttackSameServerBehindProxy: one server reached by two addresses
// (directly and through a TCP proxy, as through a load balancer or an SSH
// tunnel) is one master: "Two masters that are one server [...] are found
// on first contact". Also when the second address is unreachable at first
// (its answers must not count until it is verified) and comes back later,
// with the third master dead: one server must never make the quorum.
func TestAttackSameServerBehindProxy(t *testing.T) {
	for _, how := range []string{"both reachable", "alias reachable later, third dead"} {
		t.Run(how, func(t *testing.T) {
			servers := testenv.StartRedis(t, 2)
			px := testenv.NewProxy(t, servers[0].Addr())
			third := servers[1].Addr()
			if how != "both reachable" {
				px.Cut()
			}
			var rcs []*redis.Client
			var ms []redis.UniversalClient
			for _, a := range []string{servers[0].Addr(), px.Addr(), third} {
				rc := newRedis(a)
				rcs = append(rcs, rc)
				ms = append(ms, rc)
			}
			lc, err := redlockprio.New(ms, redlockprio.WithTTL(testTTL), redlockprio.WithRenewInterval(testRenew))
			if err != nil {
				t.Fatal(err)
			}
			l := lc.Locker()
			t.Cleanup(func() {
				_ = lc.Close(context.Background())
				for _, rc := range rcs {
					_ = rc.Close()
				}
			})
			ctx := ctxFor(t, 10*time.Second)
			name := uniqueName(t)
			if how != "both reachable" {
				// First contact with masters 0 and 2 only: a real quorum.
				lease, err := l.TryLock(ctx, name)
				t.Logf("with the alias cut: %v", err)
				if err == nil {
					_ = lease.Release(ctx)
				}
				servers[1].Stop()
				px.Restore()
			}
			var granted int
			for i := range 5 {
				lease, err := l.TryLock(ctx, name)
				if err == nil {
					granted++
					t.Errorf("TryLock #%d granted with %s: one server counted twice", i, how)
					_ = lease.Release(context.Background())
					continue
				}
				if i == 0 {
					t.Logf("TryLock: %v (ErrInvalidOption: %v)", err, errors.Is(err, locks.ErrInvalidOption))
				}
				if how == "both reachable" && !errors.Is(err, locks.ErrInvalidOption) {
					t.Errorf("TryLock #%d = %v, want ErrInvalidOption", i, err)
				}
				time.Sleep(50 * time.Millisecond)
			}
		})
	}
}
