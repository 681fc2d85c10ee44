package redlockprio_test

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/latchkey-go/latchkey/contracttest/testenv"
	"github.com/latchkey-go/latchkey/locks"
	"github.com/latchkey-go/latchkey/redlockprio"
)

// plantFor is plant with a chosen expiry.
func plantFor(t testing.TB, addr, name string, slot int, id string, prio int, ttl time.Duration) {
	t.Helper()
	rc := newRedis(addr)
	defer rc.Close()
	key := "latchkey:{" + name + "}:" + strconv.Itoa(slot)
	ctx := context.Background()
	if err := rc.HSet(ctx, key, "id", id, "p", prio, "ch", "nobody").Err(); err != nil {
		t.Fatal(err)
	}
	if err := rc.PExpire(ctx, key, ttl).Err(); err != nil {
		t.Fatal(err)
	}
}

func holderOfSlot(t testing.TB, addr, name string, slot int) string {
	t.Helper()
	rc := newRedis(addr)
	defer rc.Close()
	id, _ := rc.HGet(context.Background(), "latchkey:{"+name+"}:"+strconv.Itoa(slot), "id").Result()
	return id
}

// TestAttack2SemaphoreWriteBackOnLosingSlot: a semaphore of 2 slots on 3
// masters; counters 100, 0, 0. Slot 2 is held on masters 0 and 1 by a
// priority 9, slot 1 on master 2 by a priority 0 (planted). A (priority 1)
// gets slot 1 on masters 0 (counter 101) and 1 (counter 1), and the free
// slot 2 on master 2: it keeps slot 1, token 101, to be written back to
// master 1 or 2. Its write-backs are held. B (priority 2; its call to
// master 0 held) takes slot 1 on master 1 (from A) and on master 2 (from
// the planted holder), counters 2 and 2: granted slot 1, token 2. Then
// A's write-back reaches master 2, where A still has a key — in slot 2,
// not the slot it keeps — and then master 1 (B's now). The docs: "counts a
// master only if that same script finds the attempt's key still there"; "An
// attempt robbed before its write-back reached a quorum fails"; "Lease.Token
// is strictly greater for every later holder of a name". If A's Acquire
// returns, its token 101 must be below that of B, who holds slot 1 after it.
func TestAttack2SemaphoreWriteBackOnLosingSlot(t *testing.T) {
	addrs := addrsOf(testenv.StartRedis(t, 3))
	ctx := ctxFor(t, 25*time.Second)
	name := uniqueName(t)
	opts := []redlockprio.Option{
		redlockprio.WithTTL(4 * time.Second), redlockprio.WithRenewInterval(1200 * time.Millisecond),
		redlockprio.WithCallTimeout(1900 * time.Millisecond),
	}
	a := mustClient(t, addrs, append(opts, redlockprio.WithPriority(1))...)
	b := mustClient(t, addrs, append(opts, redlockprio.WithPriority(2))...)
	warm(t, a.l)
	warm(t, b.l)
	aRaise1 := newCmdGate(runsScript("raise"))
	aRaise2 := newCmdGate(runsScript("raise"))
	aClean := newCmdGate(runsScript("release"))
	bAcq0 := newCmdGate(runsScript("acquire"))
	bNotice := newCmdGate(isTheftNotice)
	gates := []*cmdGate{aRaise1, aRaise2, aClean, bAcq0, bNotice}
	t.Cleanup(func() {
		for _, g := range gates {
			g.open()
		}
	})
	a.rcs[1].AddHook(aRaise1)
	a.rcs[2].AddHook(aRaise2)
	for _, rc := range a.rcs {
		rc.AddHook(aClean)
	}
	b.rcs[0].AddHook(bAcq0)
	for _, rc := range b.rcs {
		rc.AddHook(bNotice)
	}
	aClean.open()
	for _, g := range gates {
		g.armed.Store(true)
	}
	setFence(t, addrs[0], name, 100)
	plantFor(t, addrs[0], name, 2, "y", 9, 20*time.Second)
	plantFor(t, addrs[1], name, 2, "y", 9, 20*time.Second)
	plantFor(t, addrs[2], name, 1, "x", 0, 1500*time.Millisecond)
	semA, _ := a.c.Semaphore(2)
	semB, _ := b.c.Semaphore(2)

	type res struct {
		l   locks.Lease
		err error
		at  time.Time
	}
	aRes := make(chan res, 1)
	go func() {
		l, err := semA.Acquire(ctx, name)
		aRes <- res{l, err, time.Now()}
	}()
	select {
	case <-aRaise1.seen:
	case <-aRaise2.seen:
	case r := <-aRes:
		t.Fatalf("A's Acquire returned without a write-back: %v", r.err)
	case <-time.After(10 * time.Second):
		t.Fatal("no write-back by A")
	}
	for i, addr := range addrs {
		t.Logf("after A's acquire: master %d slot1 %q slot2 %q fence %d", i,
			holderOfSlot(t, addr, name, 1), holderOfSlot(t, addr, name, 2), fenceOf(t, addr, name))
	}
	bRes := make(chan res, 1)
	go func() {
		l, err := semB.Acquire(ctx, name)
		bRes <- res{l, err, time.Now()}
	}()
	deadline := time.Now().Add(10 * time.Second)
	for !(strings.HasPrefix(holderOfSlot(t, addrs[1], name, 1), b.c.ID()+":") &&
		strings.HasPrefix(holderOfSlot(t, addrs[2], name, 1), b.c.ID()+":")) {
		if time.Now().After(deadline) {
			for i, addr := range addrs {
				t.Logf("master %d slot1 %q slot2 %q", i, holderOfSlot(t, addr, name, 1), holderOfSlot(t, addr, name, 2))
			}
			t.Fatal("B did not take slot 1 on masters 1 and 2")
		}
		time.Sleep(2 * time.Millisecond)
	}
	waitSeen(t, bNotice.seen, "B's theft notice")
	for i, addr := range addrs {
		t.Logf("after B's acquire: master %d slot1 %q slot2 %q fence %d", i,
			holderOfSlot(t, addr, name, 1), holderOfSlot(t, addr, name, 2), fenceOf(t, addr, name))
	}
	// A's write-back to master 2 (its slot-2 key), then to master 1.
	aRaise2.armed.Store(false)
	aRaise2.open()
	time.Sleep(100 * time.Millisecond)
	aRaise1.armed.Store(false)
	aRaise1.open()
	for i, g := range []*cmdGate{aRaise1, aRaise2} {
		select {
		case <-g.seen:
			t.Logf("A's write-back to master %d was sent", i+1)
		default:
			t.Logf("A sent no write-back to master %d", i+1)
		}
	}
	var ar res
	select {
	case ar = <-aRes:
		t.Logf("A's Acquire returned: %v", ar.err)
	case <-aClean.seen:
		t.Logf("A gave its attempt up (cleanup seen)")
	case <-time.After(5 * time.Second):
		t.Logf("A's Acquire still waiting")
	}
	bAcq0.armed.Store(false)
	bAcq0.open()
	bNotice.armed.Store(false)
	bNotice.open()
	if ar.l != nil {
		t.Logf("A holds slot %d token %d", ar.l.(locks.SlotLease).Slot(), ar.l.Token())
		go func() { <-ar.l.Context().Done(); _ = ar.l.Release(context.Background()) }()
	}
	var br res
	select {
	case br = <-bRes:
	case <-time.After(15 * time.Second):
		t.Fatal("B's Acquire did not return")
	}
	if br.err != nil {
		t.Fatalf("B: %v", br.err)
	}
	t.Logf("B holds slot %d token %d", br.l.(locks.SlotLease).Slot(), br.l.Token())
	if ar.l != nil && ar.l.(locks.SlotLease).Slot() == br.l.(locks.SlotLease).Slot() && ar.at.Before(br.at) && br.l.Token() <= ar.l.Token() {
		t.Errorf("TOKEN: A held slot %d with token %d, then B held it with token %d", ar.l.(locks.SlotLease).Slot(), ar.l.Token(), br.l.Token())
	}
	_ = br.l.Release(ctx)
	if ar.l == nil {
		select {
		case ar = <-aRes:
			if ar.err == nil {
				t.Logf("A later got slot %d token %d", ar.l.(locks.SlotLease).Slot(), ar.l.Token())
				if ar.l.Token() <= br.l.Token() {
					t.Errorf("TOKEN: A got %d after B's %d", ar.l.Token(), br.l.Token())
				}
				_ = ar.l.Release(ctx)
			} else {
				t.Logf("A: %v", ar.err)
			}
		case <-time.After(10 * time.Second):
			t.Error("A's Acquire did not return after B released")
		}
	}
}
