package amqpsem_test

import (
	"context"
	"fmt"
	neturl "net/url"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/latchkey-go/latchkey/contracttest/testenv"
	"github.com/latchkey-go/latchkey/locks"

	"github.com/latchkey-go/latchkey/amqpsem"
)

// waitResult runs WaitReleased in the background.
func atkWaitBG(a *amqpsem.Admin, name string, d time.Duration) (<-chan error, <-chan time.Time) {
	done := make(chan error, 1)
	at := make(chan time.Time, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), d)
		defer cancel()
		err := a.WaitReleased(ctx, name)
		at <- time.Now()
		done <- err
	}()
	return done, at
}

// atkMutexFree waits until no connection holds name's administration
// mutex (the queue name itself, in the default layout).
func atkMutexFree(t *testing.T, r *atkRawConn, name string, d time.Duration) {
	t.Helper()
	deadline := time.Now().Add(d)
	for st := r.state(name); st != "absent"; st = r.state(name) {
		if time.Now().After(deadline) {
			t.Fatalf("administration mutex %q still %s after %v", name, st, d)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestAttackWaitUpThenDownDuringWait: a wait is running for a removed slot
// (9, C=5); meanwhile the semaphore grows to 10, a holder takes slot 6 or 8
// while it exists (a library Semaphore whose slots 1..5 are taken, or a
// non-linear holder of another implementation), and the semaphore shrinks
// back to 5: slot 6 / 8 is now a held removed slot. WaitReleased must not
// return nil while it is held, even though C is 5 at every poll it makes.
//
// The waiter's traffic goes through a fault proxy that holds it while the
// semaphore is grown and shrunk back: whatever it sends meanwhile reaches
// the broker after the shrink, so C is 5 at every poll it makes, as the
// attack intends. (A poll that saw C = 10 could rightly end the wait: no
// removed slot was held then; see TestAttackWaitGrowBack.)
func TestAttackWaitUpThenDownDuringWait(t *testing.T) {
	url, host := amqpURL(t)
	for _, lib := range []bool{true, false} {
		t.Run(fmt.Sprintf("library=%v", lib), func(t *testing.T) {
			name := atkName("updown")
			atkCleanup(t, url, name)
			c := atkDial(t, url, "")
			a := atkAdmin(t, c)
			ctx, cancel := context.WithTimeout(context.Background(), 50*time.Second)
			defer cancel()
			if err := a.Create(ctx, name, 10); err != nil {
				t.Fatal(err)
			}
			h9 := atkRaw(t, url)
			if err := h9.hold(name + "-9-B"); err != nil {
				t.Fatal(err)
			}
			if _, err := a.Resize(ctx, name, 5); err != nil {
				t.Fatal(err)
			}
			p := testenv.NewProxy(t, host)
			// A long heartbeat: the held traffic must not cost the waiter
			// its connection.
			a2 := atkAdmin(t, atkDial(t, url, p.Addr(), amqpsem.WithHeartbeat(60*time.Second)))
			done, _ := atkWaitBG(a2, name, 40*time.Second)
			time.Sleep(4 * time.Second) // let the full scan finish
			select {
			case err := <-done:
				t.Fatalf("WaitReleased returned %v while slot 9 was held", err)
			default:
			}
			// A check of every slot may hold the administration mutex:
			// let it end before holding the waiter's traffic, or the
			// resizes would wait for its release, held in the proxy.
			atkMutexFree(t, h9, name, 20*time.Second)
			p.Latency(time.Hour)
			if _, err := a.Resize(ctx, name, 10); err != nil {
				t.Fatal(err)
			}
			var held string
			var lease locks.Lease
			if lib {
				// Only this package's clients: one with slow verifications
				// (every 30s) takes slots 1..6 and keeps 6.
				lc, err := amqpsem.Dial(ctx, url, amqpsem.WithHeartbeat(60*time.Second), amqpsem.WithVerifyInterval(30*time.Second))
				if err != nil {
					t.Fatal(err)
				}
				defer lc.Close(context.Background())
				s, _ := lc.Semaphore(amqpsem.MaxSemaphoreSize)
				var first []locks.Lease
				for range 6 {
					lease, err = s.TryAcquire(ctx, name)
					if err != nil {
						t.Fatal(err)
					}
					first = append(first, lease)
				}
				for _, l := range first[:5] {
					l.Release(ctx)
				}
				held = fmt.Sprintf("%s-%d-B", name, lease.(*amqpsem.Lease).Slot())
			} else {
				held = name + "-8-B"
				if err := atkRaw(t, url).hold(held); err != nil {
					t.Fatal(err)
				}
			}
			if _, err := a.Resize(ctx, name, 5); err != nil {
				t.Fatal(err)
			}
			p.Restore() // the held polls reach the broker: C is 5
			if err := h9.drop(name + "-9-B"); err != nil {
				t.Fatal(err)
			}
			select {
			case err := <-done:
				lost := "n/a"
				if lease != nil {
					lost = fmt.Sprint(context.Cause(lease.Context()))
				}
				t.Fatalf("WaitReleased returned %v while removed slot queue %s was still held (state %s, lease end: %s)",
					err, held, h9.state(held), lost)
			case <-time.After(12 * time.Second): // a poll finds slot 9 free, then a check of every slot (4-5s under -race)
			}
		})
	}
}

// TestAttackWaitResizeDownTwice: while a wait runs for slot 9 (C=5), C drops
// to 2 with slot 4 held: the doc says newly removed slots are checked too.
func TestAttackWaitResizeDownTwice(t *testing.T) {
	url, _ := amqpURL(t)
	name := atkName("down2")
	atkCleanup(t, url, name)
	c := atkDial(t, url, "")
	a := atkAdmin(t, c)
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Second)
	defer cancel()
	if err := a.Create(ctx, name, 10); err != nil {
		t.Fatal(err)
	}
	h := atkRaw(t, url)
	for _, q := range []string{"-9-B", "-4-B"} {
		if err := h.hold(name + q); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := a.Resize(ctx, name, 5); err != nil {
		t.Fatal(err)
	}
	a2 := atkAdmin(t, atkDial(t, url, ""))
	done, _ := atkWaitBG(a2, name, 40*time.Second)
	time.Sleep(3 * time.Second)
	if _, err := a.Resize(ctx, name, 2); err != nil {
		t.Fatal(err)
	}
	time.Sleep(500 * time.Millisecond)
	h.drop(name + "-9-B")
	select {
	case err := <-done:
		t.Errorf("WaitReleased returned %v while removed slot 4 was held", err)
	case <-time.After(3 * time.Second):
	}
	h.drop(name + "-4-B")
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("WaitReleased: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Errorf("WaitReleased did not return after every removed slot was freed")
	}
}

// TestAttackCommandWaitUpThenDown: the command's wait, run while the
// semaphore grows and shrinks back with a new holder of a slot above the
// final size. "wait NAME: wait until no removed slot is held, whatever its
// number". As in TestAttackWaitUpThenDownDuringWait, the command's traffic
// is held in a fault proxy while the semaphore grows and shrinks back, so
// that C is 5 at every poll it makes.
func TestAttackCommandWaitUpThenDown(t *testing.T) {
	url, host := amqpURL(t)
	name := atkName("cmdupdown")
	atkCleanup(t, url, name)
	c := atkDial(t, url, "")
	a := atkAdmin(t, c)
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Second)
	defer cancel()
	if err := a.Create(ctx, name, 10); err != nil {
		t.Fatal(err)
	}
	h9 := atkRaw(t, url)
	if err := h9.hold(name + "-9-B"); err != nil {
		t.Fatal(err)
	}
	if _, err := a.Resize(ctx, name, 5); err != nil {
		t.Fatal(err)
	}
	type res struct {
		out  string
		code int
	}
	done := make(chan res, 1)
	atkBin(t)
	p := testenv.NewProxy(t, host)
	via, err := neturl.Parse(url)
	if err != nil {
		t.Fatal(err)
	}
	via.Host = p.Addr()
	go func() {
		out, code := atkRun(t, 40*time.Second, []string{"AMQPSEM_URL=" + via.String()}, "--heartbeat", "60s", "wait", name)
		done <- res{out, code}
	}()
	time.Sleep(3 * time.Second) // the full scan
	atkMutexFree(t, h9, name, 20*time.Second)
	p.Latency(time.Hour)
	if _, err := a.Resize(ctx, name, 10); err != nil {
		t.Fatal(err)
	}
	if err := atkRaw(t, url).hold(name + "-8-B"); err != nil {
		t.Fatal(err)
	}
	if _, err := a.Resize(ctx, name, 5); err != nil {
		t.Fatal(err)
	}
	p.Restore()
	if err := h9.drop(name + "-9-B"); err != nil {
		t.Fatal(err)
	}
	select {
	case r := <-done:
		t.Errorf("command wait exited %d while removed slot 8 was held (%s): %s", r.code, h9.state(name+"-8-B"), r.out)
	case <-time.After(10 * time.Second): // a poll finds slot 9 free, then a check of every slot
	}
}

// TestAttackLongNameSlotLimit: for names so long that few slots fit, a
// holder of the last slot that fits (above C) is found by Status and
// WaitReleased.
func TestAttackLongNameSlotLimit(t *testing.T) {
	url, _ := amqpURL(t)
	for _, tc := range []struct {
		layout amqpsem.Layout
		n      int
		holder func(string, int) string
	}{
		{amqpsem.DefaultLayout, 250, func(n string, i int) string { return fmt.Sprintf("%s-%d-B", n, i) }},
		{amqpsem.PythonLayout, 251, func(n string, i int) string { return fmt.Sprintf("%s-B-%d", n, i) }},
	} {
		t.Run(tc.layout.Name, func(t *testing.T) {
			base := atkName("long")
			name := base + strings.Repeat("y", tc.n-len(base))
			limit := tc.layout.SlotLimit(name)
			t.Logf("%d-byte name: SlotLimit %d", len(name), limit)
			atkCleanup(t, url, name)
			c := atkDial(t, url, "")
			a := atkAdmin(t, c, amqpsem.WithLayout(tc.layout))
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			if err := a.Create(ctx, name, 2); err != nil {
				t.Fatal(err)
			}
			h := atkRaw(t, url)
			if err := h.hold(tc.holder(name, limit)); err != nil {
				t.Fatal(err)
			}
			st, err := a.Status(ctx, name)
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(st.Removed, []int{limit}) {
				t.Errorf("Status = %+v, want removed [%d]", st, limit)
			}
			wctx, wcancel := context.WithTimeout(ctx, 2*time.Second)
			if err := a.WaitReleased(wctx, name); err == nil {
				t.Errorf("WaitReleased nil while slot %d held", limit)
			}
			wcancel()
		})
	}
}

// TestAttackWaitGrowBack: while a wait runs for removed slot 9 (C=5), the
// semaphore grows back to 10: slot 9 is no longer removed. "WaitReleased
// waits until no slot of name above its current maximum C is held".
func TestAttackWaitGrowBack(t *testing.T) {
	url, _ := amqpURL(t)
	name := atkName("growback")
	atkCleanup(t, url, name)
	a := atkAdmin(t, atkDial(t, url, ""))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := a.Create(ctx, name, 10); err != nil {
		t.Fatal(err)
	}
	if err := atkRaw(t, url).hold(name + "-9-B"); err != nil {
		t.Fatal(err)
	}
	if _, err := a.Resize(ctx, name, 5); err != nil {
		t.Fatal(err)
	}
	done, _ := atkWaitBG(atkAdmin(t, atkDial(t, url, "")), name, 40*time.Second)
	time.Sleep(3 * time.Second)
	if _, err := a.Resize(ctx, name, 10); err != nil {
		t.Fatal(err)
	}
	t0 := time.Now()
	select {
	case err := <-done:
		t.Logf("WaitReleased after growing back: %v after %v", err, time.Since(t0))
		if err != nil {
			t.Errorf("WaitReleased: %v", err)
		}
	case <-time.After(15 * time.Second):
		// A generous bound: returning takes a full check of every slot
		// number under the administration mutex (4–5 s under -race).
		t.Errorf("WaitReleased still waiting 15s after C grew to 10 (slot 9 held, not removed)")
	}
}
