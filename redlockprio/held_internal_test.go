package redlockprio

import (
	"errors"
	"testing"
	"time"

	"github.com/latchkey-go/latchkey/locks"
)

// TestHeldErrorSplitVote: a lock seen held by different attempts on
// different masters, none on a quorum, is retried soon, not after their
// PTTLs; one holder seen on a quorum (or alone) is waited out.
func TestHeldErrorSplitVote(t *testing.T) {
	retry := func(held []grant, size int) time.Duration {
		var he *locks.HeldError
		if !errors.As(heldError("n", held, 2, size, nil), &he) {
			t.Fatal("heldError is not a *locks.HeldError")
		}
		return he.RetryAfter
	}
	const full = 600 * time.Millisecond
	split := []grant{{holder: "w1", pttl: full}, {holder: "w2", pttl: full - time.Millisecond}}
	if d := retry(split, 1); d >= 4*splitRetry {
		t.Errorf("split vote: retry after %v, want under %v", d, 4*splitRetry)
	}
	if d := retry(split, 3); d != full-time.Millisecond {
		t.Errorf("semaphore slots held by several holders: retry after %v, want the smallest PTTL", d)
	}
	held := []grant{{holder: "h", pttl: 300 * time.Millisecond}, {holder: "h", pttl: 280 * time.Millisecond}, {holder: "w", pttl: full}}
	if d := retry(held, 1); d != 280*time.Millisecond {
		t.Errorf("a holder on a quorum: retry after %v, want its smallest PTTL 280ms", d)
	}
	if d := retry([]grant{{holder: "h", pttl: 300 * time.Millisecond}}, 1); d != 300*time.Millisecond {
		t.Errorf("one holder seen alone: retry after %v, want its PTTL", d)
	}
}
