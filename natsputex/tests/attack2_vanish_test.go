package natsputex_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/latchkey-go/latchkey/locks"
	"github.com/latchkey-go/latchkey/natsputex"
)

// TestAttack2PurgedStreamMixedT: "a waiting call, or a running
// Supervisor, that saw the key counts it as held for T (or the longest T
// a holder's value it read carried), and takes it only after T of
// silence and C·R of confirmation" (the stream purged is one of the
// doc's cases). A holder (R = 400ms, F = 3, T = 1.2s) renews; a Lock
// with T = 100ms (R = 50ms, F = 2) waits on the name, and a Semaphore
// slot likewise; the bucket's stream is purged. The old holder's next
// renewal fails within R = 400ms; the waiter, having read the holder's
// T, must not be granted the name while the holder's lease is live.
func TestAttack2PurgedStreamMixedT(t *testing.T) {
	url, bucket := promiseEnv(t, "atk2purge")
	slow := []natsputex.Option{natsputex.WithRenewInterval(400 * time.Millisecond), natsputex.WithFailureThreshold(3), natsputex.WithConfirmations(1)}
	fast := []natsputex.Option{natsputex.WithRenewInterval(50 * time.Millisecond), natsputex.WithFailureThreshold(2), natsputex.WithConfirmations(1)}
	holder := newTestClient(t, url, bucket, append(slow, natsputex.WithHolderID("holder"))...)
	waiter := newTestClient(t, url, bucket, append(fast, natsputex.WithHolderID("waiter"))...)
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	hs, _ := holder.Semaphore(1)
	ws, _ := waiter.Semaphore(1)
	g, gs := newGrants(), newGrants()
	for round := range 3 {
		lock, err := holder.Locker().TryLock(ctx, "job")
		if err != nil {
			t.Fatal(err)
		}
		g.grant("holder", lock)
		slot, err := hs.TryAcquire(ctx, "jobs")
		if err != nil {
			t.Fatal(err)
		}
		gs.grant("holder", slot)
		type res struct {
			l  locks.Lease
			at time.Time
		}
		got, gotSlot := make(chan res, 1), make(chan res, 1)
		go func() {
			l, err := waiter.Locker().Lock(ctx, "job")
			if err != nil {
				t.Errorf("Lock: %v", err)
			}
			if l != nil {
				g.grant("waiter", l)
			}
			got <- res{l, time.Now()}
		}()
		go func() {
			l, err := ws.Acquire(ctx, "jobs")
			if err != nil {
				t.Errorf("Acquire: %v", err)
			}
			if l != nil {
				gs.grant("waiter", l)
			}
			gotSlot <- res{l, time.Now()}
		}()
		// Let the waiters read the holder's value, then purge at various
		// points of the holder's 400ms renewal period.
		time.Sleep(300*time.Millisecond + time.Duration(round)*130*time.Millisecond)
		s, err := mustJS(t, url).Stream(ctx, "KV_"+bucket)
		if err != nil {
			t.Fatal(err)
		}
		if err := s.Purge(ctx); err != nil {
			t.Fatal(err)
		}
		purged := time.Now()
		r, rs := <-got, <-gotSlot
		t.Logf("round %d: lock granted %v after the purge (holder's lease ended %v: %v); slot granted %v after (%v)", round,
			r.at.Sub(purged).Round(time.Millisecond), errors.Is(context.Cause(lock.Context()), locks.ErrLost), context.Cause(lock.Context()),
			rs.at.Sub(purged).Round(time.Millisecond), context.Cause(slot.Context()))
		for _, l := range []locks.Lease{r.l, rs.l, lock, slot} {
			if l != nil {
				_ = l.Release(ctx)
			}
		}
	}
	g.check(t)
	gs.check(t)
}
