package amqpsem_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/latchkey-go/latchkey/locks"

	"github.com/latchkey-go/latchkey/amqpsem"
)

// The regression table: findings of one shape, each a named scenario run
// by one driver (lateReply.run). A call's request runs at the broker at
// once, but the broker's replies come late, after the call's context
// ended, while the connection stays up (heartbeats arrive, late). The
// promise each checks (Semaphore.Acquire, Mutex.Lock and their Try forms):
// "On failure nothing is held; when ctx ends first, the error matches
// ctx.Err()", and a call in flight when ctx ends waits up to one heartbeat
// to undo what it declared. So: the call fails with ctx's error within its
// ctx plus a heartbeat; the queue its late declare-ok gives the client is
// gone within a heartbeat of the call's return, never held again; another
// client takes the name while the late client's connection is still open.

// lateReply is one scenario of the regression table.
type lateReply struct {
	name    string
	finding string        // what was found, and how
	kind    string        // "semaphore" (TryAcquire of a 1-slot semaphore) or "mutex" (TryLock)
	hb      time.Duration // the late client's heartbeat
	verify  time.Duration // its verify interval; 0: testVerify
	delay   time.Duration // how late every reply comes
	ctx     time.Duration // the failing call's context
	warm    bool          // one call before the fault: the client's channels are open
}

var lateReplies = []lateReply{
	{
		name:    "semaphore-declare-ok-after-ctx",
		finding: "a holder queue declared by a TryAcquire whose declare-ok came after its ctx stayed held by the live connection",
		kind:    "semaphore", hb: time.Second, verify: time.Second / 3,
		delay: 600 * time.Millisecond, ctx: 1300 * time.Millisecond, warm: true,
	},
	{
		name:    "mutex-declare-ok-after-ctx",
		finding: "the same for a Mutex TryLock's queue",
		kind:    "mutex", hb: time.Second, verify: time.Second / 3,
		delay: 600 * time.Millisecond, ctx: 300 * time.Millisecond, warm: true,
	},
	{
		name: "semaphore-cold-client-long-heartbeat",
		finding: "a fresh client (no channel open yet, 5s heartbeat) whose probes are pipelined at full speed and whose " +
			"replies come 1.5s late: the slot must be free again while its connection stays open",
		kind: "semaphore", hb: 5 * time.Second,
		delay: 1500 * time.Millisecond, ctx: 300 * time.Millisecond,
	},
}

// TestLateReplyLeavesNothingHeld runs the regression table.
func TestLateReplyLeavesNothingHeld(t *testing.T) {
	for _, sc := range lateReplies {
		t.Run(sc.name, sc.run)
	}
}

// run is the driver of the regression table.
func (sc lateReply) run(t *testing.T) {
	t.Logf("finding: %s", sc.finding)
	url, host := amqpURL(t)
	sl := measureSlack(t, url)
	name := newName(t, url)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	p, via := viaProxy(t, host)
	opts := []amqpsem.Option{via, amqpsem.WithHeartbeat(sc.hb)}
	if sc.verify > 0 {
		opts = append(opts, amqpsem.WithVerifyInterval(sc.verify))
	}
	c := dial(t, url, opts...)
	other := dial(t, url)
	var try, otry func(context.Context) (locks.Lease, error)
	queue := name
	if sc.kind == "semaphore" {
		if err := admin(t, other).Create(ctx, name, 1); err != nil {
			t.Fatal(err)
		}
		s := semaphore(t, c, amqpsem.MaxSemaphoreSize)
		os := semaphore(t, other, amqpsem.MaxSemaphoreSize)
		try = func(ctx context.Context) (locks.Lease, error) { return s.TryAcquire(ctx, name) }
		otry = func(ctx context.Context) (locks.Lease, error) { return os.TryAcquire(ctx, name) }
		queue = amqpsem.DefaultLayout.Holder(name, 1)
	} else {
		m, om := c.Locker(), other.Locker()
		try = func(ctx context.Context) (locks.Lease, error) { return m.TryLock(ctx, name) }
		otry = func(ctx context.Context) (locks.Lease, error) { return om.TryLock(ctx, name) }
	}
	if sc.warm {
		l, err := try(ctx)
		if err != nil {
			t.Fatal(err)
		}
		l.Release(ctx)
	}
	raw := rawConn(t, url)
	p.DelayReplies(sc.delay)
	cctx, ccancel := context.WithTimeout(ctx, sc.ctx)
	t0 := time.Now()
	during := make(chan time.Duration, 1)
	stop := make(chan struct{})
	go func() {
		first := time.Duration(-1)
		for {
			select {
			case <-stop:
				during <- first
				return
			default:
			}
			if st := raw.state(queue); st != "absent" && first < 0 {
				first = time.Since(t0)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}()
	l, err := try(cctx)
	close(stop)
	t.Logf("queue first seen held during the call at %v", <-during)
	ccancel()
	ret := time.Since(t0)
	t.Logf("call with late replies: %v after %v", err, ret)
	if err == nil {
		l.Release(context.Background())
		t.Skip("acquired before the ctx ended")
	}
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("the call whose ctx ended returned %v, want an error matching ctx.Err()", err)
	}
	sl.within(t, "the failing call", ret, sc.ctx+sc.hb, 2)
	// Watch the queue for a heartbeat and the delay after the call
	// returned: it must be gone, and not come back.
	lastLocked := time.Duration(-1)
	var st string
	for window := ret + sl.bound(sc.hb+sc.delay, 2); time.Since(t0) < window; {
		st = raw.state(queue)
		if st != "absent" {
			lastLocked = time.Since(t0)
		}
		time.Sleep(25 * time.Millisecond)
	}
	t.Logf("queue %s last seen held %v after the call started, returned at %v (client connected: %v), now %s", queue, lastLocked, ret, c.Connected(), st)
	if st != "absent" {
		t.Errorf("failed call left %s %s; client connected %v", queue, st, c.Connected())
	}
	if bound := ret + sl.bound(sc.hb, 1); lastLocked > bound {
		t.Errorf("the failed call's queue was held %v after the call returned: more than a heartbeat (%v; %v)", lastLocked-ret, sc.hb, sl)
	}
	// Before Restore, which closes the late client's connection.
	ol, err := otry(ctx)
	if err != nil {
		t.Errorf("another client cannot take %s while the late client is connected (%v): %v", name, c.Connected(), err)
	} else {
		ol.Release(ctx)
	}
	p.Restore()
}
