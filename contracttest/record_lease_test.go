package contracttest

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/latchkey-go/latchkey/locks"
	"github.com/latchkey-go/latchkey/locks/memlock"
)

// TestEnterLeaseEndsWithLease: a section entered with EnterLease ends
// when its lease ends, saying why, or when exit is called, whichever
// comes first; exit is safe to call again.
func TestEnterLeaseEndsWithLease(t *testing.T) {
	ctx := context.Background()
	store := memlock.New()
	l, err := store.NewLocker()
	if err != nil {
		t.Fatal(err)
	}
	h := NewHistory(1)

	first, err := l.TryLock(ctx, "n")
	if err != nil {
		t.Fatal(err)
	}
	exit := h.EnterLease("first", first)
	if n := store.Revoke("n"); n != 1 {
		t.Fatalf("Revoke = %d, want 1", n)
	}
	// The lease's end ends the section, from a goroutine of its own.
	for deadline := time.Now().Add(5 * time.Second); h.Len() == 0; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the revoked lease's section did not end")
		}
	}
	before := h.Now()
	exit() // after the end: changes nothing
	spans := h.Spans()
	if len(spans) != 1 || spans[0].Ended == "" || spans[0].Exit > before {
		t.Fatalf("spans after the lease was revoked = %+v, want one ended by the lease, before %v", spans, before)
	}

	second, err := l.TryLock(ctx, "n")
	if err != nil {
		t.Fatal(err)
	}
	exit = h.EnterLease("second", second)
	exit()
	exit()
	if err := second.Release(ctx); err != nil && !errors.Is(err, locks.ErrReleased) {
		t.Fatal(err)
	}
	spans = h.Spans()
	if len(spans) != 2 || spans[1].Ended != "" || !strings.HasPrefix(spans[1].Who, "second") {
		t.Fatalf("spans = %+v, want the second ended by exit, not by its lease", spans)
	}
	if err := h.Check(); err != nil {
		t.Error(err)
	}
	if h.Peak() != 1 || h.Len() != 2 {
		t.Errorf("Peak %d, Len %d; want 1 and 2", h.Peak(), h.Len())
	}
}
