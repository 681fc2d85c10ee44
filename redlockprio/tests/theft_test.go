package redlockprio_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/latchkey-go/latchkey/contracttest/testenv"
	"github.com/latchkey-go/latchkey/locks"
	"github.com/latchkey-go/latchkey/redlockprio"
)

// TestChainOfThievesMixedTTLs: the first victim p1 holds with a TTL of
// 3s and is cut off (alive, hearing nothing); p2 (TTL 600ms, priority 2)
// steals and waits for it. Then either p3 (TTL 600ms, priority 3) steals
// from the waiting p2, or p2's Locker is closed while it waits and a
// priority-0 client locks. Neither may get the name before p1's validity
// has run out: the keys p2 set must outlast p1's validity though p2's own
// TTL is shorter. (They did not: p3 got the name about one of p2's TTLs
// after the theft, 2s before p1's deadline.)
func TestChainOfThievesMixedTTLs(t *testing.T) {
	for _, third := range []string{"higher thief", "closed thief then priority 0"} {
		t.Run(third, func(t *testing.T) {
			addrs := addrsOf(testenv.StartRedis(t, 3))
			p1 := mustProxied(t, addrs, redlockprio.WithPriority(1),
				redlockprio.WithTTL(3*time.Second), redlockprio.WithRenewInterval(900*time.Millisecond))
			p2 := mustClient(t, addrs, redlockprio.WithPriority(2))
			var p3 *client
			if third == "higher thief" {
				p3 = mustClient(t, addrs, redlockprio.WithPriority(3))
			} else {
				p3 = mustClient(t, addrs, redlockprio.WithPriority(0))
			}
			warm(t, p2.l)
			warm(t, p3.l)
			name := uniqueName(t)
			ctx := ctxFor(t, 15*time.Second)
			v, err := p1.l.TryLock(ctx, name)
			if err != nil {
				t.Fatal(err)
			}
			p1.cut() // p1 runs on, hearing nothing, until its deadline
			vDeadline := v.(*redlockprio.Lease).Deadline()

			ctx2, cancel2 := context.WithCancel(ctx)
			defer cancel2()
			done2 := make(chan error, 1)
			go func() {
				l, err := p2.l.Lock(ctx2, name)
				if err == nil {
					_ = l.Release(context.Background())
					err = errors.New("p2 got the name")
				}
				done2 <- err
			}()
			waitForHolder(t, addrs, name, p2.c.ID()) // p2 stole every key and waits for p1
			if third != "higher thief" {
				if err := p2.c.Close(context.Background()); err != nil {
					t.Fatal(err)
				}
			}
			l3, err := p3.l.Lock(ctx, name)
			if err != nil {
				t.Fatal(err)
			}
			got := time.Now()
			defer l3.Release(ctx)
			if got.Before(vDeadline) {
				t.Errorf("%s got the name %v before p1's validity deadline (p1 live: %v)",
					third, vDeadline.Sub(got).Round(time.Millisecond), v.Context().Err() == nil)
			} else {
				t.Logf("%s got the name %v after p1's validity deadline", third, got.Sub(vDeadline).Round(time.Millisecond))
			}
			cancel2()
			if err := <-done2; err == nil || strings.Contains(err.Error(), "p2 got") {
				t.Errorf("p2's Lock: %v", err)
			}
		})
	}
}

// releaseDelay delays, on one go-redis client, every call of the release
// script, and says on seen when the first one comes.
type releaseDelay struct {
	delay time.Duration
	once  sync.Once
	seen  chan struct{}
}

func (h *releaseDelay) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h *releaseDelay) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if args := cmd.Args(); strings.EqualFold(cmd.Name(), "evalsha") && len(args) > 1 &&
			scriptNames[args[1].(string)] == "release" {
			h.once.Do(func() { close(h.seen) })
			select {
			case <-time.After(h.delay):
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		return next(ctx, cmd)
	}
}

func (h *releaseDelay) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// TestFailedAttemptDoesNotStallThief: a lower-priority attempt that
// failed (the name held elsewhere on two masters of three) got the free
// key of the third master, and its cleanup there is slow. A higher
// priority that then displaces that key must not wait for an
// acknowledgement the attempt never gives: the attempt never held the
// name. (It waited the attempt's whole TTL, 3s.)
func TestFailedAttemptDoesNotStallThief(t *testing.T) {
	addrs := addrsOf(testenv.StartRedis(t, 3))
	ctx := ctxFor(t, 15*time.Second)
	delay := &releaseDelay{delay: 2 * time.Second, seen: make(chan struct{})}
	rcs := []*redis.Client{newRedis(addrs[0]), newRedis(addrs[1]), newRedis(addrs[2])}
	rcs[2].AddHook(delay)
	lowC, err := redlockprio.New([]redis.UniversalClient{rcs[0], rcs[1], rcs[2]}, redlockprio.WithPriority(1),
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
	high := mustClient(t, addrs, redlockprio.WithPriority(2))
	warm(t, high.l)
	name := uniqueName(t)
	// Another process holds the name on masters 0 and 1, at priority 5.
	plant(t, addrs[0], name, 1, "other", 5)
	plant(t, addrs[1], name, 1, "other", 5)
	tried := make(chan error, 1)
	go func() {
		l, err := low.TryLock(ctx, name)
		if err == nil {
			_ = l.Release(ctx)
		}
		tried <- err
	}()
	select {
	// The attempt failed and cleans up, slowly, on master 2; it may
	// return before master 2's answer comes (decided by masters 0 and 1):
	// its cleanup there comes then, in the background.
	case <-delay.seen:
	case <-ctx.Done():
		t.Fatal("the low attempt never cleaned up")
	}
	if got := holderOf(t, addrs[2], name); !strings.HasPrefix(got, lowC.ID()+":") {
		t.Fatalf("master 2's key is %q's, want the failed attempt's", got)
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
		t.Errorf("the higher priority waited %v for an attempt that never held the name (its TTL 3s)", took.Round(time.Millisecond))
	}
	if err := <-tried; !errors.Is(err, locks.ErrNotAcquired) {
		t.Errorf("the low attempt = %v, want ErrNotAcquired", err)
	}
}

// TestAcknowledgementWaitsForRelease: a victim whose work cannot be
// interrupted (a 300ms step that ignores its context) acknowledges a
// theft only when its code lets go of the lease — its Release, or Do
// returning — or when its validity has run out, never earlier; with
// WithImmediateAck it acknowledges when its context ends, as documented.
// (It acknowledged at once, and the thief overlapped the step.)
func TestAcknowledgementWaitsForRelease(t *testing.T) {
	addrs := addrsOf(testenv.StartRedis(t, 3))
	const step = 300 * time.Millisecond
	victimOpts := []redlockprio.Option{redlockprio.WithPriority(1),
		redlockprio.WithTTL(3 * time.Second), redlockprio.WithRenewInterval(900 * time.Millisecond)}
	for _, how := range []string{"Release", "Do", "never released", "WithImmediateAck"} {
		t.Run(how, func(t *testing.T) {
			opts := victimOpts
			if how == "WithImmediateAck" {
				opts = append(opts[:len(opts):len(opts)], redlockprio.WithImmediateAck())
			}
			low := mustClient(t, addrs, opts...)
			high := mustClient(t, addrs, redlockprio.WithPriority(5))
			warm(t, high.l)
			name := uniqueName(t)
			ctx := ctxFor(t, 15*time.Second)
			var (
				mu      sync.Mutex
				letGo   time.Time // when the victim's code let go of the lease
				victim  locks.Lease
				started = make(chan struct{})
				ended   = make(chan struct{})
			)
			work := func(lctx context.Context) {
				close(started)
				<-lctx.Done()
				time.Sleep(step) // cannot be interrupted
			}
			go func() {
				defer close(ended)
				if how == "Do" {
					err := locks.Do(ctx, low.l, name, func(lctx context.Context) error {
						work(lctx)
						mu.Lock()
						letGo = time.Now()
						mu.Unlock()
						return nil
					})
					if !errors.Is(err, locks.ErrPreempted) {
						t.Errorf("Do = %v, want ErrPreempted", err)
					}
					return
				}
				l, err := low.l.Lock(ctx, name)
				if err != nil {
					t.Error(err)
					close(started)
					return
				}
				mu.Lock()
				victim = l
				mu.Unlock()
				work(l.Context())
				if how == "never released" {
					return
				}
				mu.Lock()
				letGo = time.Now()
				mu.Unlock()
				_ = l.Release(ctx)
			}()
			<-started
			thief, err := high.l.Lock(ctx, name)
			if err != nil {
				t.Fatal(err)
			}
			got := time.Now()
			defer thief.Release(ctx)
			if how != "never released" {
				<-ended
			}
			mu.Lock()
			defer mu.Unlock()
			switch how {
			case "never released":
				dl := victim.(*redlockprio.Lease).Deadline()
				if got.Before(dl) {
					t.Errorf("the thief got the name %v before the unreleased victim's validity deadline", dl.Sub(got))
				}
				if got.After(dl.Add(time.Second)) {
					t.Errorf("the thief got the name %v after the unreleased victim's validity deadline", got.Sub(dl))
				}
				_ = victim.Release(ctx)
			case "WithImmediateAck":
				if !got.Before(letGo) {
					t.Errorf("with WithImmediateAck the thief got the name %v after the victim let go, want before", got.Sub(letGo))
				}
			default:
				if got.Before(letGo) {
					t.Errorf("the thief got the name %v before the victim let go of it (%s)", letGo.Sub(got).Round(time.Millisecond), how)
				} else {
					t.Logf("the thief got the name %v after the victim let go (%s)", got.Sub(letGo).Round(time.Millisecond), how)
				}
			}
		})
	}
}
