package redlockprio_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/latchkey-go/latchkey/contracttest/testenv"
	"github.com/latchkey-go/latchkey/locks"
	"github.com/latchkey-go/latchkey/redlockprio"
)

// proxied is a client whose connections to each master go through its own
// proxy, so that a test can cut it off (as a partition or a hung process
// would) while the masters stay up.
type proxied struct {
	*client
	proxies []*testenv.Proxy
}

func mustProxied(t testing.TB, addrs []string, opts ...redlockprio.Option) *proxied {
	t.Helper()
	p := &proxied{}
	var via []string
	for _, a := range addrs {
		px := testenv.NewProxy(t, a)
		p.proxies = append(p.proxies, px)
		via = append(via, px.Addr())
	}
	p.client = mustClient(t, via, opts...)
	return p
}

func (p *proxied) cut() {
	for _, px := range p.proxies {
		px.Cut()
	}
}

func holderOf(t testing.TB, addr, name string) string {
	t.Helper()
	rc := newRedis(addr)
	defer rc.Close()
	id, _ := rc.HGet(context.Background(), "latchkey:{"+name+"}:1", "id").Result()
	return id
}

func TestTheftWithAcknowledgement(t *testing.T) {
	addrs := addrsOf(testenv.StartRedis(t, 3))
	low := mustClient(t, addrs, redlockprio.WithPriority(1))
	high := mustClient(t, addrs, redlockprio.WithPriority(5))
	high2 := mustClient(t, addrs, redlockprio.WithPriority(5))
	name := uniqueName(t)
	ctx := ctxFor(t, 10*time.Second)
	victim, err := low.l.TryLock(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	thief, err := high.l.Lock(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	took := time.Since(start)
	if victim.Context().Err() == nil {
		t.Fatal("the thief's Lock returned while the victim's lease was live")
	}
	if cause := context.Cause(victim.Context()); !errors.Is(cause, locks.ErrPreempted) {
		t.Errorf("victim's cause = %v, want ErrPreempted", cause)
	}
	// With the acknowledgement, the thief does not wait out the TTL.
	if took > testTTL/2 {
		t.Errorf("the theft took %v: the acknowledgement did not arrive (TTL %v)", took, testTTL)
	}
	if thief.Token() <= victim.Token() {
		t.Errorf("thief's token %d not above the victim's %d", thief.Token(), victim.Token())
	}
	if _, err := high2.l.TryLock(ctx, name); !errors.Is(err, locks.ErrNotAcquired) {
		t.Errorf("an equal priority took the name from the thief: %v", err)
	}
	// The victim's stale release and renewals must not touch the thief's keys.
	_ = victim.Release(ctx)
	time.Sleep(2 * testRenew)
	id := thief.(*redlockprio.Lease).HolderID()
	for _, a := range addrs {
		if got := holderOf(t, a, name); got != id {
			t.Errorf("master %s: key held by %q, want the thief %q", a, got, id)
		}
	}
	if err := context.Cause(thief.Context()); err != nil {
		t.Fatalf("the thief's lease ended: %v", err)
	}
	t.Logf("theft with acknowledgement took %v", took.Round(time.Millisecond))
	_ = thief.Release(ctx)
}

func TestTheftFromUnreachableVictimWaitsOutItsValidity(t *testing.T) {
	addrs := addrsOf(testenv.StartRedis(t, 3))
	low := mustProxied(t, addrs, redlockprio.WithPriority(1))
	high := mustClient(t, addrs, redlockprio.WithPriority(5))
	name := uniqueName(t)
	ctx := ctxFor(t, 10*time.Second)
	victim, err := low.l.TryLock(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	low.cut() // the victim hears nothing from now on, and renews nothing
	deadline := victim.(*redlockprio.Lease).Deadline()
	thief, err := high.l.Lock(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	got := time.Now()
	if got.Before(deadline) {
		t.Fatalf("the thief got the lock %v before the unreachable victim's validity deadline", deadline.Sub(got))
	}
	if victim.Context().Err() == nil {
		t.Fatalf("the victim still believes it holds the name after the thief got it")
	}
	t.Logf("thief got the lock %v after the victim's deadline; victim ended with %v", got.Sub(deadline).Round(time.Millisecond), context.Cause(victim.Context()))
	_ = thief.Release(ctx)
}

func TestUnsafeStolenConsistencyFactor(t *testing.T) {
	addrs := addrsOf(testenv.StartRedis(t, 3))
	low := mustProxied(t, addrs, redlockprio.WithPriority(1))
	high := mustClient(t, addrs, redlockprio.WithPriority(5), redlockprio.WithUnsafeStolenConsistencyFactor(0.1))
	name := uniqueName(t)
	ctx := ctxFor(t, 10*time.Second)
	victim, err := low.l.TryLock(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	low.cut()
	deadline := victim.(*redlockprio.Lease).Deadline()
	start := time.Now()
	thief, err := high.l.Lock(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	took := time.Since(start)
	// As documented: the thief stops waiting after 0.1·TTL, while the
	// unreachable victim may still believe it holds the name.
	if !time.Now().Before(deadline) {
		t.Fatalf("with the unsafe factor the thief still waited out the victim's validity (%v)", took)
	}
	if took < testTTL/10-10*time.Millisecond {
		t.Errorf("the thief waited %v, less than 0.1·TTL", took)
	}
	_ = thief.Release(ctx)
}

// TestChainOfThieves: a victim that cannot answer, a thief of middle
// priority waiting for it, and a higher thief robbing the middle one. The
// highest gets the lock only after the first victim's validity has run
// out, and no two ever consider themselves holders at once.
func TestChainOfThieves(t *testing.T) {
	addrs := addrsOf(testenv.StartRedis(t, 3))
	p1 := mustProxied(t, addrs, redlockprio.WithPriority(1))
	p2 := mustClient(t, addrs, redlockprio.WithPriority(2))
	p3 := mustClient(t, addrs, redlockprio.WithPriority(3))
	name := uniqueName(t)
	ctx := ctxFor(t, 10*time.Second)
	v, err := p1.l.TryLock(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	p1.cut()
	vDeadline := v.(*redlockprio.Lease).Deadline()

	var (
		mu      sync.Mutex
		holders = map[string]locks.Lease{"p1": v}
		overlap []string
	)
	check := func(who string, lease locks.Lease) {
		mu.Lock()
		defer mu.Unlock()
		for other, l := range holders {
			if other != who && l.Context().Err() == nil {
				overlap = append(overlap, who+" got the lock while "+other+" held it")
			}
		}
		holders[who] = lease
	}
	ctx2, cancel2 := context.WithCancel(ctx)
	defer cancel2()
	done2 := make(chan struct{})
	go func() {
		defer close(done2)
		l, err := p2.l.Lock(ctx2, name)
		if err == nil {
			check("p2", l)
			<-ctx2.Done()
			_ = l.Release(context.Background())
		}
	}()
	time.Sleep(testTTL / 6) // p2 has stolen and waits for p1
	l3, err := p3.l.Lock(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	got := time.Now()
	check("p3", l3)
	if got.Before(vDeadline) {
		t.Errorf("p3 got the lock %v before p1's validity deadline", vDeadline.Sub(got))
	}
	time.Sleep(2 * testRenew) // p2 retries meanwhile and must keep waiting
	cancel2()
	<-done2
	mu.Lock()
	for _, o := range overlap {
		t.Error(o)
	}
	mu.Unlock()
	if err := context.Cause(l3.Context()); err != nil {
		t.Errorf("p3's lease ended: %v", err)
	}
	_ = l3.Release(ctx)
}
