package amqpsem_test

import (
	"context"
	"testing"
	"time"

	"github.com/latchkey-go/latchkey/contracttest/testenv"

	"github.com/latchkey-go/latchkey/amqpsem"
)

// TestAttackMixedHeartbeatsBlackHole: a holder with a 3s heartbeat is cut
// off without a close; a waiter with a 1s heartbeat waits. "a cut-off holder
// stops before anyone else starts", its lease ends within one interval of
// its last verification, and the broker frees the slot within three
// intervals (plus the delete).
func TestAttackMixedHeartbeatsBlackHole(t *testing.T) {
	url, host := amqpURL(t)
	name := atkName("mixhb")
	atkCleanup(t, url, name)
	p := testenv.NewProxy(t, host)
	hc := atkDial(t, url, p.Addr(), amqpsem.WithHeartbeat(3*time.Second), amqpsem.WithVerifyInterval(time.Second))
	if hb := hc.Heartbeat(); hb != 3*time.Second {
		t.Fatalf("holder heartbeat %v", hb)
	}
	wc := atkDial(t, url, "")
	ctx, cancel := context.WithTimeout(context.Background(), 40*time.Second)
	defer cancel()
	if err := atkAdmin(t, wc).Create(ctx, name, 1); err != nil {
		t.Fatal(err)
	}
	hs, _ := hc.Semaphore(amqpsem.MaxSemaphoreSize)
	ws, _ := wc.Semaphore(amqpsem.MaxSemaphoreSize)
	hl, err := hs.TryAcquire(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	lostAt := make(chan time.Time, 1)
	context.AfterFunc(hl.Context(), func() { lostAt <- time.Now() })
	got := make(chan time.Time, 1)
	go func() {
		l, err := ws.Acquire(ctx, name)
		if err != nil {
			t.Errorf("waiter: %v", err)
			close(got)
			return
		}
		got <- time.Now()
		l.Release(context.Background())
	}()
	time.Sleep(1500 * time.Millisecond) // a verification or two
	t0 := time.Now()
	p.BlackHole()
	var lost, acq time.Time
	select {
	case lost = <-lostAt:
	case <-time.After(15 * time.Second):
		t.Fatal("holder's lease did not end")
	}
	select {
	case acq = <-got:
	case <-time.After(20 * time.Second):
		t.Fatal("waiter did not acquire")
	}
	t.Logf("holder lease ended %v after the black hole (%v); waiter acquired at %v", lost.Sub(t0), context.Cause(hl.Context()), acq.Sub(t0))
	if !lost.Before(acq) {
		t.Errorf("waiter acquired at %v before the holder's lease ended at %v", acq.Sub(t0), lost.Sub(t0))
	}
	if lost.Sub(t0) > 3*time.Second+time.Second+300*time.Millisecond {
		t.Errorf("holder's lease ended %v after the black hole: more than one interval (3s) after its last verification (every 1s)", lost.Sub(t0))
	}
	if acq.Sub(t0) > 9*time.Second+2*time.Second {
		t.Errorf("slot freed %v after the black hole: more than three 3s intervals", acq.Sub(t0))
	}
}

// TestAttackURLHeartbeatWins: a heartbeat in the URL replaces WithHeartbeat.
func TestAttackURLHeartbeatWins(t *testing.T) {
	url, _ := amqpURL(t)
	c := atkDial(t, url+"?heartbeat=2", "", amqpsem.WithHeartbeat(5*time.Second))
	if hb := c.Heartbeat(); hb != 2*time.Second {
		t.Errorf("URL heartbeat=2 with WithHeartbeat(5s): Heartbeat() = %v", hb)
	}
}
