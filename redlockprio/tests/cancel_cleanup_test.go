package redlockprio_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/latchkey-go/latchkey/contracttest/testenv"
	"github.com/latchkey-go/latchkey/locks"
	"github.com/latchkey-go/latchkey/redlockprio"
)

// TestCancelledAttemptHoldsNothingAtReturn: "On failure, Lock returns an
// error and holds nothing". Every master grants B's attempt at once, but
// its replies are delayed (DelayReplies) past the end of B's context: B
// has not heard of any grant when its context ends. When Lock (or
// Acquire, TryLock) returns, with an error matching
// context.DeadlineExceeded, no key of B's may be left on any master, and
// a third client takes the name at once. Before the fix the call
// returned at the deadline and deleted the keys only later, in the
// background, so they were all still there. The wait is bounded by the
// call timeout.
func TestCancelledAttemptHoldsNothingAtReturn(t *testing.T) {
	const (
		delay    = 150 * time.Millisecond // each reply from a master, B's own
		deadline = 30 * time.Millisecond  // B's context, well before the first reply
		callTO   = 2 * time.Second
	)
	servers := testenv.StartRedis(t, 3)
	for _, tc := range []struct {
		masters int
		size    int // 0: the Locker; else a Semaphore of size slots
		try     bool
	}{
		{masters: 1}, {masters: 3}, {masters: 3, try: true}, {masters: 3, size: 2}, {masters: 3, size: 2, try: true}, {masters: 1, size: 2},
	} {
		t.Run(fmt.Sprintf("masters=%d/size=%d/try=%v", tc.masters, tc.size, tc.try), func(t *testing.T) {
			addrs := addrsOf(servers[:tc.masters])
			b := newAtk2Locker(t, addrs, false, redlockprio.WithCallTimeout(callTO))
			third := mustClient(t, addrs)
			warm(t, b.l) // verifies the masters, without delay
			warm(t, third.l)
			acquire := func(ctx context.Context, name string) (locks.Lease, error) {
				switch {
				case tc.size == 0 && tc.try:
					return b.l.TryLock(ctx, name)
				case tc.size == 0:
					return b.l.Lock(ctx, name)
				}
				s, err := b.c.Semaphore(tc.size)
				if err != nil {
					t.Fatal(err)
				}
				if tc.try {
					return s.TryAcquire(ctx, name)
				}
				return s.Acquire(ctx, name)
			}
			name := uniqueName(t)
			for _, px := range b.proxies {
				px.DelayReplies(delay)
			}
			ctx, cancel := context.WithTimeout(context.Background(), deadline)
			defer cancel()
			start := time.Now()
			lease, err := acquire(ctx, name)
			took := time.Since(start)
			var left []string
			for _, addr := range addrs {
				left = append(left, slotKeys(t, addr, name, max(tc.size, 1))...)
			}
			for _, px := range b.proxies {
				px.Restore()
			}
			if err == nil {
				_ = lease.Release(context.Background())
				t.Fatalf("acquire with a %v context got the name (took %v); want context.DeadlineExceeded", deadline, took)
			}
			if !errors.Is(err, context.DeadlineExceeded) {
				t.Fatalf("acquire = %v; want an error matching context.DeadlineExceeded", err)
			}
			if len(left) > 0 {
				t.Fatalf("acquire returned %v after %v, holding keys %v; want none left", err, took, left)
			}
			if took > callTO+time.Second {
				t.Errorf("acquire returned after %v; want within the call timeout (%v) of the deadline", took, callTO)
			}
			tl, terr := third.l.TryLock(ctxFor(t, 5*time.Second), name)
			if terr != nil {
				t.Fatalf("TryLock by a third client right after: %v; the name must be free", terr)
			}
			_ = tl.Release(context.Background())
			t.Logf("returned %v after %v, nothing left", err, took)
		})
	}
}
