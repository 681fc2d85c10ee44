package redlockprio_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/latchkey-go/latchkey/contracttest/testenv"
)

// TestAttackCancelledWaiterAfterRelease: B's Lock waits for A (equal
// priority); A releases and B's context is cancelled right after. "When
// ctx ends first, Lock returns an error matching ctx.Err()": B's Lock must
// either get the name or return an error matching context.Canceled.
// 20 rounds.
func TestAttackCancelledWaiterAfterRelease(t *testing.T) {
	addrs := addrsOf(testenv.StartRedis(t, 3))
	a := mustClient(t, addrs)
	b := mustClient(t, addrs)
	warm(t, a.l)
	warm(t, b.l)
	ctx := ctxFor(t, 30*time.Second)
	bad, got := 0, 0
	for round := range 20 {
		name := uniqueName(t)
		al, err := a.l.TryLock(ctx, name)
		if err != nil {
			t.Fatal(err)
		}
		bctx, cancel := context.WithCancel(ctx)
		done := make(chan error, 1)
		go func() {
			l, err := b.l.Lock(bctx, name)
			if err == nil {
				_ = l.Release(context.Background())
			}
			done <- err
		}()
		time.Sleep(50 * time.Millisecond)
		_ = al.Release(ctx)
		cancel()
		err = <-done
		switch {
		case err == nil:
			got++
		case !errors.Is(err, context.Canceled):
			bad++
			t.Errorf("round %d: cancelled Lock = %v", round, err)
		}
	}
	t.Logf("20 rounds: %d got the name, %d errors not matching context.Canceled", got, bad)
}
