package redlockprio_test

// Attack round 3, on the Client refactor: Close bounded by its context,
// the batched renewal, thefts' acknowledgement waits, Locker and
// Semaphore on one name, mixed clients under a pausing master.

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/latchkey-go/latchkey/contracttest/testenv"
	"github.com/latchkey-go/latchkey/locks"
	"github.com/latchkey-go/latchkey/redlockprio"
)

// atk3Leaks waits up to 5s for the goroutines not in ignore to end and
// fails t with those left. The Client's background work after a Close
// whose context ended is bounded by call timeouts and publish timeouts
// (at most max(TTL/2, 1s)), so 5s is generous.
func atk3Leaks(t *testing.T, ignore goleak.Option) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		err := goleak.Find(ignore, goleak.IgnoreTopFunction("github.com/redis/go-redis/v9/internal/pool.(*ConnPool).reaper"))
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Errorf("goroutines outlive Close by 5s: %v", err)
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// atk3Client is a Client on addrs without proxies, whose go-redis clients
// are closed at the end of the test (after the Client).
func atk3Client(t *testing.T, addrs []string, opts ...redlockprio.Option) *client {
	t.Helper()
	return mustClient(t, addrs, opts...)
}

// TestAttack3CloseWithEndedContextReleases: a Client (TTL 3s) holds 5
// names on 3 masters, another Client waits on each with Lock; the holder
// is closed with a context that has already ended (variant "canceled")
// or ends 1ms after Close begins (variant "1ms"). Docs: Close "ends every
// lease [...] and releases them at the masters [...] Every wait is bounded
// by ctx: when ctx ends first, Close returns an error matching ctx.Err()
// and the rest finishes in the background". So the waiters must get the
// names soon after Close (we allow 1s), not when the keys expire (3s).
// goleak: no goroutine of either Client outlives their Close by 5s.
func TestAttack3CloseWithEndedContextReleases(t *testing.T) {
	for _, variant := range []string{"canceled", "1ms"} {
		t.Run(variant, func(t *testing.T) {
			addrs := addrsOf(testenv.StartRedis(t, 3))
			ignore := goleak.IgnoreCurrent()
			h := atk3Client(t, addrs, atkOpts(3*time.Second, 0.01, 0)...)
			w := atk3Client(t, addrs, atkOpts(3*time.Second, 0.01, 0)...)
			ctx := ctxFor(t, 20*time.Second)
			const n = 5
			var names []string
			for i := range n {
				name := fmt.Sprintf("%s-%d", uniqueName(t), i)
				if _, err := h.l.TryLock(ctx, name); err != nil {
					t.Fatal(err)
				}
				names = append(names, name)
			}
			type got struct {
				at  time.Time
				err error
			}
			res := make(chan got, n)
			for _, name := range names {
				go func() {
					l, err := w.l.Lock(ctx, name)
					at := time.Now()
					if err == nil {
						_ = l.Release(context.Background())
					}
					res <- got{at, err}
				}()
			}
			time.Sleep(300 * time.Millisecond) // the waiters are subscribed and polling
			cctx, cancel := context.WithCancel(context.Background())
			if variant == "canceled" {
				cancel()
			} else {
				cctx, cancel = context.WithTimeout(context.Background(), time.Millisecond)
			}
			begun := time.Now()
			err := h.c.Close(cctx)
			took := time.Since(begun)
			cancel()
			t.Logf("Close took %v: %v", took, err)
			if !errors.Is(err, context.Canceled) && !errors.Is(err, context.DeadlineExceeded) && err != nil {
				t.Errorf("Close = %v, want nil or ctx's error", err)
			}
			slow := 0
			for range n {
				g := <-res
				if g.err != nil {
					t.Errorf("waiter: %v", g.err)
					continue
				}
				d := g.at.Sub(begun)
				t.Logf("waiter got the name %v after Close began", d)
				if d > time.Second {
					slow++
				}
			}
			if slow > 0 {
				t.Errorf("%d of %d names were not released by Close with an ended context: the waiters got them only when the keys expired (TTL 3s)", slow, n)
			}
			_ = w.c.Close(context.Background())
			atk3Leaks(t, ignore)
		})
	}
}

// TestAttack3VictimClientClosesDuringTheft: V (TTL 3s, priority 0,
// default acknowledgement) holds a name; its code has stopped working.
// T (priority 1, TTL 600ms) steals it and waits for V's acknowledgement,
// which the docs say is sent "when the victim calls Release [...], when
// its Client closes, or when its validity runs out, whichever comes
// first". Once V's lease context has ended (the notice arrived), V's
// Client is closed with a context that is live ("background"), already
// canceled ("canceled"), or ends 1ms after Close begins ("1ms"). T's Lock
// must return soon after V's Close (we allow 1s), not at V's validity
// (~3s).
func TestAttack3VictimClientClosesDuringTheft(t *testing.T) {
	for _, variant := range []string{"background", "canceled", "1ms"} {
		t.Run(variant, func(t *testing.T) {
			addrs := addrsOf(testenv.StartRedis(t, 3))
			v := atk3Client(t, addrs, atkOpts(3*time.Second, 0.01, 0)...)
			th := atk3Client(t, addrs, atkOpts(600*time.Millisecond, 0.01, 1)...)
			warm(t, th.l)
			name := uniqueName(t)
			ctx := ctxFor(t, 20*time.Second)
			vl, err := v.l.TryLock(ctx, name)
			if err != nil {
				t.Fatal(err)
			}
			type got struct {
				at    time.Time
				lease locks.Lease
				err   error
			}
			res := make(chan got, 1)
			go func() {
				l, err := th.l.Lock(ctx, name)
				res <- got{time.Now(), l, err}
			}()
			select {
			case <-vl.Context().Done():
			case <-time.After(3 * time.Second):
				t.Fatal("V was not told of the theft within 3s")
			}
			if !errors.Is(context.Cause(vl.Context()), locks.ErrPreempted) {
				t.Fatalf("V's lease ended with %v, want ErrPreempted", context.Cause(vl.Context()))
			}
			cctx, cancel := context.WithCancel(context.Background())
			switch variant {
			case "canceled":
				cancel()
			case "1ms":
				cctx, cancel = context.WithTimeout(context.Background(), time.Millisecond)
			}
			begun := time.Now()
			cerr := v.c.Close(cctx)
			cancel()
			g := <-res
			if g.err != nil {
				t.Fatalf("T's Lock: %v", g.err)
			}
			_ = g.lease.Release(context.Background())
			d := g.at.Sub(begun)
			t.Logf("V's Close: %v; T's Lock returned %v after V's Close began (V's deadline was %v after)",
				cerr, d, vl.(*redlockprio.Lease).Deadline().Sub(begun))
			if d > time.Second {
				t.Errorf("T waited %v after V's Client closed: no acknowledgement was sent at Close, T waited out V's validity", d)
			}
		})
	}
}
