package natsputex_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/latchkey-go/latchkey/contracttest"
	"github.com/latchkey-go/latchkey/locks"
	"github.com/latchkey-go/latchkey/natsputex"
)

// mustJS is JetStream on a connection of its own to url, closed at cleanup.
func mustJS(t *testing.T, url string) jetstream.JetStream {
	t.Helper()
	nc, js, err := connect(url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	return js
}

// TestAttack2UnprintableIDs: WithHolderID: "It must be non-empty and
// printable"; Client.Supervisor: "an empty or unprintable token one
// matching locks.ErrInvalidOption". Unicode's line and paragraph
// separators, zero-width and byte-order-mark format characters are not
// printable (unicode.IsPrint is false for each, as for the right-to-left
// override U+202E): each must be refused, by New and CheckSupervisor
// alike. (Fails now: all five are accepted by WithHolderID and by
// CheckSupervisor, and written into the key; '\t', '\r', '\n', U+0085 and
// U+007F are refused.)
func TestAttack2UnprintableIDs(t *testing.T) {
	url, bucket := promiseEnv(t, "atk2unprint")
	js := mustJS(t, url)
	bad := []string{"x\u2028y", "x\u2029y", "x\u200by", "x\ufeffy", "x\u202ey"}
	for _, id := range bad {
		c, err := natsputex.New(context.Background(), js, bucket, natsputex.WithHolderID(id))
		if err == nil {
			_ = c.Close(context.Background())
		}
		if !errors.Is(err, locks.ErrInvalidOption) || !strings.Contains(err.Error(), "holder id") {
			t.Errorf("WithHolderID(%q) (unicode.IsPrint false): New returned %v, want ErrInvalidOption", id, err)
		}
		if err := natsputex.CheckSupervisor("b", "k", id); !errors.Is(err, locks.ErrInvalidOption) {
			t.Errorf("CheckSupervisor token %q (unicode.IsPrint false): %v, want ErrInvalidOption", id, err)
		}
	}
}

// TestAttack2OddHolderIDTiming: a Locker's value is
// "<holder id>/<random suffix>/<T>", and a holder id may contain '/', as
// well as " T=": "A Locker's token carries its T", and "a call waits for
// the longer of its own T and the T its holder's value carries". A live
// holder (R = 400ms, F = 3, T = 1.2s) whose holder id looks like a value
// of its own ("team/job", "x/1ms", "a/b/1ms/c", "x T=1ms") renews every
// 400ms; a TryLock loop with T = 100ms (R = 50ms, F = 2) must never get
// the key while the holder's lease is live.
func TestAttack2OddHolderIDTiming(t *testing.T) {
	url, bucket := promiseEnv(t, "atk2oddid")
	slow := []natsputex.Option{natsputex.WithRenewInterval(400 * time.Millisecond), natsputex.WithFailureThreshold(3), natsputex.WithConfirmations(1)}
	trier := newTestClient(t, url, bucket, natsputex.WithRenewInterval(50*time.Millisecond), natsputex.WithFailureThreshold(2), natsputex.WithConfirmations(1), natsputex.WithHolderID("trier"))
	kv := mustBucket(t, url, bucket)
	for i, id := range []string{"team/job", "x/1ms", "a/b/1ms/c", "x T=1ms"} {
		name := fmt.Sprintf("job%d", i)
		holder := newTestClient(t, url, bucket, append(slow, natsputex.WithHolderID(id))...)
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		held, err := holder.Locker().TryLock(ctx, name)
		if err != nil {
			t.Fatal(err)
		}
		e, _ := kv.Get(ctx, name)
		end := time.Now().Add(1300 * time.Millisecond)
		for time.Now().Before(end) {
			l, err := trier.Locker().TryLock(ctx, name)
			if errors.Is(err, locks.ErrNotAcquired) {
				time.Sleep(10 * time.Millisecond)
				continue
			}
			if err != nil {
				t.Fatal(err)
			}
			live := held.Context().Err() == nil
			t.Logf("holder id %q (value %q): the T = 100ms TryLock got token %d; holder's lease (token %d) live: %t (%v)", id, e.Value(), l.Token(), held.Token(), live, context.Cause(held.Context()))
			if live {
				t.Errorf("holder id %q (value %q): a TryLock with T = 100ms took the key of a live holder with T = 1.2s", id, e.Value())
			}
			_ = l.Release(ctx)
			break
		}
		_ = held.Release(ctx)
		cancel()
	}
}

// TestAttack2SupervisorTokenTiming: a Supervisor's token is any printable
// string, '/' and " T=" included, and its value is "<token>\nT=.. C·R=..".
// An active node (R = 400ms, F = 3, T = 1.2s) whose token looks like a
// Locker's value ("node/x/100ms") or carries a fake timing ("node-a
// T=100ms C·R=0s") renews every 400ms; a standby Supervisor (R = 50ms,
// F = 2) and a Locker's TryLock loop (R = 50ms, F = 2) on the same key
// must wait for the holder's T: no standby service starts while node-a's
// runs, and no lease is granted while it runs.
func TestAttack2SupervisorTokenTiming(t *testing.T) {
	for _, token := range []string{"node/x/100ms", "node-a T=100ms C·R=0s", "n/1/100ms T=100ms"} {
		t.Run(token, func(t *testing.T) {
			url, bucket, key := supervisorEnv(t)
			h := contracttest.NewHistory(1)
			fast := []natsputex.Option{natsputex.WithRenewInterval(50 * time.Millisecond), natsputex.WithFailureThreshold(2), natsputex.WithConfirmations(1)}
			a := startAgentWith(t, url, bucket, key, "node-a", token, h, nil,
				natsputex.WithRenewInterval(400*time.Millisecond), natsputex.WithFailureThreshold(3), natsputex.WithConfirmations(1))
			waitFor(t, 5*time.Second, "node-a starts its service", a.running)
			b := startAgentWith(t, url, bucket, key, "node-b", "node-b", h, nil, fast...)
			locker := newTestClient(t, url, bucket, append(fast, natsputex.WithHolderID("locker"))...)
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			end := time.Now().Add(1500 * time.Millisecond)
			for time.Now().Before(end) {
				l, err := locker.Locker().TryLock(ctx, key)
				if err == nil {
					up := a.running() || b.running()
					t.Logf("the locker got token %d; a service ran then: %t", l.Token(), up)
					if up {
						t.Errorf("token %q: a Locker with T = 100ms got the key while a service ran", token)
					}
					_ = l.Release(ctx)
					break
				}
				time.Sleep(10 * time.Millisecond)
			}
			a.stop()
			b.stop()
			if err := h.Check(); err != nil {
				t.Errorf("token %q: two services ran at once: %v", token, err)
			}
		})
	}
}
