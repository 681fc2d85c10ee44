package redlockprio_test

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/latchkey-go/latchkey/contracttest/testenv"
	"github.com/latchkey-go/latchkey/locks"
	"github.com/latchkey-go/latchkey/redlockprio"
)

// TestRefusingMinorityIsContention: with a minority of the masters
// refusing connections (1 of 3, 2 of 5), a name held elsewhere is
// contention, not a quorum failure: every TryLock fails with a
// *locks.HeldError naming the holder, a Lock waits until its context
// ends, and gets the name once it is released. The contender's clients
// do not retry a refused dial, so the refusals come first. (2 of 20 and
// 13 of 20 TryLocks failed with a *QuorumError, and Lock failed after
// 1ms.)
func TestRefusingMinorityIsContention(t *testing.T) {
	for _, c := range []struct{ n, dead int }{{3, 1}, {5, 2}} {
		t.Run(fmt.Sprintf("%d of %d masters refusing", c.dead, c.n), func(t *testing.T) {
			servers := testenv.StartRedis(t, c.n)
			addrs := addrsOf(servers)
			a := mustClient(t, addrs)
			// b's clients fail a refused dial at once (no dial retries),
			// so that the refusals come before the live masters' answers.
			var ms []redis.UniversalClient
			for _, addr := range addrs {
				o := clientOptions(addr).Simple()
				o.DialerRetries = 1
				rc := redis.NewClient(o)
				t.Cleanup(func() { _ = rc.Close() })
				ms = append(ms, rc)
			}
			blC, err := redlockprio.New(ms, redlockprio.WithTTL(testTTL), redlockprio.WithRenewInterval(testRenew))
			if err != nil {
				t.Fatal(err)
			}
			bl := blC.Locker()
			t.Cleanup(func() { _ = blC.Close(context.Background()) })
			b := &client{c: blC, l: bl}
			warm(t, b.l)
			name := uniqueName(t)
			ctx := ctxFor(t, 15*time.Second)
			held, err := a.l.TryLock(ctx, name)
			if err != nil {
				t.Fatal(err)
			}
			for _, s := range servers[:c.dead] {
				if err := s.Kill(); err != nil {
					t.Fatal(err)
				}
			}
			quorumErrs := 0
			for i := range 20 {
				l, err := b.l.TryLock(ctx, name)
				if err == nil {
					_ = l.Release(ctx)
					t.Fatalf("TryLock #%d granted a held name", i)
				}
				var he *locks.HeldError
				var qe *redlockprio.QuorumError
				switch {
				case errors.As(err, &qe):
					quorumErrs++
				case !errors.As(err, &he):
					t.Errorf("TryLock #%d = %v, want a *locks.HeldError", i, err)
				case he.Holder != held.(*redlockprio.Lease).HolderID():
					t.Errorf("TryLock #%d: holder %q, want %q", i, he.Holder, held.(*redlockprio.Lease).HolderID())
				}
			}
			if quorumErrs > 0 {
				t.Errorf("%d of 20 TryLocks of a held name failed with a *QuorumError with a quorum of masters up", quorumErrs)
			}
			short, cancel := context.WithTimeout(ctx, time.Second)
			start := time.Now()
			l, err := b.l.Lock(short, name)
			cancel()
			if err == nil {
				_ = l.Release(ctx)
				t.Fatal("Lock granted a held name")
			}
			if !errors.Is(err, context.DeadlineExceeded) {
				t.Errorf("Lock of a held name with 1s = %v after %v, want it to wait for its context", err, time.Since(start).Round(time.Millisecond))
			}
			if err := context.Cause(held.Context()); err != nil {
				t.Fatalf("the holder's lease ended: %v", err)
			}
			go func() {
				time.Sleep(200 * time.Millisecond)
				_ = held.Release(ctx)
			}()
			l, err = b.l.Lock(ctx, name)
			if err != nil {
				t.Fatalf("Lock after the release: %v", err)
			}
			if l.Token() <= held.Token() {
				t.Errorf("token %d after %d", l.Token(), held.Token())
			}
			_ = l.Release(ctx)
		})
	}
}

// TestPausedMinorityUnderContention: with one master of three paused
// (SIGSTOP), three clients pass one name back and forth for 3s. A step
// must be decided once a quorum has answered either way, or at the
// per-master call timeout, never at TTL/2: the name is never left
// without a holder for long. (With a 2s TTL, gaps of a second — TTL/2,
// the deadline of an undecided step — were common.)
func TestPausedMinorityUnderContention(t *testing.T) {
	servers := testenv.StartRedis(t, 3)
	addrs := addrsOf(servers)
	opts := []redlockprio.Option{redlockprio.WithTTL(2 * time.Second), redlockprio.WithRenewInterval(600 * time.Millisecond)}
	var cs []*client
	for range 3 {
		c := mustClient(t, addrs, opts...)
		warm(t, c.l)
		cs = append(cs, c)
	}
	if err := servers[2].Pause(); err != nil {
		t.Fatal(err)
	}
	defer servers[2].Resume()
	name := uniqueName(t)
	ctx := ctxFor(t, 20*time.Second)
	run, stop := context.WithTimeout(ctx, 3*time.Second)
	defer stop()
	var (
		mu       sync.Mutex
		sections [][2]time.Time
		errs     []error
	)
	var wg sync.WaitGroup
	for _, c := range cs {
		wg.Go(func() {
			for run.Err() == nil {
				l, err := c.l.Lock(run, name)
				if err != nil {
					if run.Err() == nil {
						mu.Lock()
						errs = append(errs, err)
						mu.Unlock()
					}
					return
				}
				from := time.Now()
				time.Sleep(2 * time.Millisecond)
				to := time.Now()
				_ = l.Release(ctx)
				mu.Lock()
				sections = append(sections, [2]time.Time{from, to})
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	for _, err := range errs {
		t.Errorf("Lock with one master of three paused: %v", err)
	}
	sort.Slice(sections, func(i, j int) bool { return sections[i][0].Before(sections[j][0]) })
	var longest time.Duration
	for i := 1; i < len(sections); i++ {
		longest = max(longest, sections[i][0].Sub(sections[i-1][1]))
	}
	t.Logf("%d hand-offs in 3s with one master of three paused; longest without a holder: %v", len(sections), longest.Round(time.Millisecond))
	if len(sections) < 10 {
		t.Errorf("only %d critical sections in 3s", len(sections))
	}
	if bound := 700 * time.Millisecond; longest > bound {
		t.Errorf("the name went %v without a holder (bound %v; TTL 2s)", longest.Round(time.Millisecond), bound)
	}
}

// TestSameServerTwiceRefused: two clients of the same Redis server, by
// the same address twice or by two names of one host, are one master, not
// two: with the third master dead, that one server would make a quorum.
// The Locker refuses them on first contact with an error matching
// locks.ErrInvalidOption that names both masters. (A lease was granted.)
func TestSameServerTwiceRefused(t *testing.T) {
	servers := testenv.StartRedis(t, 2)
	a, other := servers[0].Addr(), servers[1].Addr()
	_, port, _ := strings.Cut(a, ":")
	for _, c := range []struct {
		what  string
		addrs []string
	}{
		{"same address twice", []string{a, a, other}},
		{"127.0.0.1 and localhost", []string{a, "localhost:" + port, other}},
	} {
		t.Run(c.what, func(t *testing.T) {
			for _, dead := range []bool{false, true} {
				if dead {
					// A dead third master: the same server twice would
					// make the quorum on its own.
					c.addrs = []string{c.addrs[0], c.addrs[1], deadAddr(t)}
				}
				cl := mustClient(t, c.addrs)
				ctx := ctxFor(t, 10*time.Second)
				l, err := cl.l.Lock(ctx, uniqueName(t))
				if err == nil {
					_ = l.Release(ctx)
					t.Fatalf("a lease was granted with masters 0 and 1 the same server (third master dead: %v)", dead)
				}
				if !errors.Is(err, locks.ErrInvalidOption) || !strings.Contains(err.Error(), "same") {
					t.Errorf("Lock = %v, want an error matching ErrInvalidOption saying they are the same server", err)
				}
				t.Logf("third master dead %v: %v", dead, err)
			}
		})
	}
}

// deadAddr returns an address where nothing listens.
func deadAddr(t testing.TB) string {
	return fmt.Sprintf("127.0.0.1:%d", testenv.FreePort(t))
}
