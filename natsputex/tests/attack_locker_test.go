package natsputex_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/latchkey-go/latchkey/contracttest/testenv"
	"github.com/latchkey-go/latchkey/locks"
	"github.com/latchkey-go/latchkey/natsputex"
)

// grants records the leases granted on one name, in grant order, and
// checks at each grant that no earlier lease is still live (its Context
// not done) and that the token is above every earlier one.
type grants struct {
	mu     sync.Mutex
	start  time.Time
	leases []attackGrant
	bad    []string
}

type attackGrant struct {
	who   string
	lease locks.Lease
	at    time.Duration
}

func newGrants() *grants { return &grants{start: time.Now()} }

func (g *grants) grant(who string, l locks.Lease) {
	g.mu.Lock()
	defer g.mu.Unlock()
	at := time.Since(g.start)
	for _, o := range g.leases {
		if o.lease.Context().Err() == nil {
			g.bad = append(g.bad, fmt.Sprintf("%s got token %d at %v while %s's lease (token %d, granted at %v) was live",
				who, l.Token(), at.Round(time.Millisecond), o.who, o.lease.Token(), o.at.Round(time.Millisecond)))
		}
		if o.lease.Token() >= l.Token() {
			g.bad = append(g.bad, fmt.Sprintf("%s got token %d at %v, not above %s's %d granted earlier",
				who, l.Token(), at.Round(time.Millisecond), o.who, o.lease.Token()))
		}
	}
	g.leases = append(g.leases, attackGrant{who, l, at})
}

func (g *grants) check(t *testing.T) {
	t.Helper()
	g.mu.Lock()
	defer g.mu.Unlock()
	for i, o := range g.leases {
		if i > 4 && i < len(g.leases)-2 {
			continue
		}
		t.Logf("grant: %s token %d at %v", o.who, o.lease.Token(), o.at.Round(time.Millisecond))
	}
	for _, b := range g.bad {
		t.Error(b)
	}
}

// TestAttackTryLockRaceCrashed: a holder crashes (its connection closed,
// no release); two TryLock clients, each in a loop, race for its key.
// Exactly one gets it at a time, the first within T + R + C·R of the
// crash, and tokens rise in grant order.
func TestAttackTryLockRaceCrashed(t *testing.T) {
	url, bucket := promiseEnv(t, "atkrace")
	writes := watchWrites(t, url, bucket, "job")
	nc, js, err := connect(url)
	if err != nil {
		t.Fatal(err)
	}
	crashed, err := natsputex.New(context.Background(), js, bucket, natsputex.WithHolderID("crashed"),
		natsputex.WithRenewInterval(testR), natsputex.WithFailureThreshold(testF), natsputex.WithConfirmations(testC))
	if err != nil {
		t.Fatal(err)
	}
	g := newGrants()
	held, err := crashed.Locker().TryLock(context.Background(), "job")
	if err != nil {
		t.Fatal(err)
	}
	g.grant("crashed", held)
	time.Sleep(2*testR + testR/2)
	nc.Close()
	crash := time.Now()
	t.Cleanup(func() { _ = crashed.Close(context.Background()) })

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var wg sync.WaitGroup
	var first sync.Once
	var firstAt time.Duration
	for i := range 2 {
		who := fmt.Sprintf("trylock-%d", i)
		c := newTestClient(t, url, bucket, natsputex.WithHolderID(who))
		wg.Add(1)
		go func() {
			defer wg.Done()
			end := time.Now().Add(3 * time.Second)
			for time.Now().Before(end) {
				l, err := c.Locker().TryLock(ctx, "job")
				if errors.Is(err, locks.ErrNotAcquired) {
					time.Sleep(5 * time.Millisecond)
					continue
				}
				if err != nil {
					t.Errorf("%s: %v", who, err)
					return
				}
				first.Do(func() { firstAt = time.Since(crash) })
				g.grant(who, l)
				time.Sleep(50 * time.Millisecond)
				_ = l.Release(context.Background())
			}
		}()
	}
	wg.Wait()
	g.check(t)
	silence(t, writes, "crashed", testF*testR)
	bound := testF*testR + testR + testC*testR
	t.Logf("first TryLock grant %v after the crash (bound T + R + C·R = %v)", firstAt.Round(time.Millisecond), bound)
	if firstAt == 0 || firstAt > bound+200*time.Millisecond {
		t.Errorf("the crashed holder's key came back %v after the crash, want within %v (+200ms)", firstAt, bound)
	}
}

// TestAttackSlowHealthCheckHolder: a live holder whose health check takes
// 270ms of T = 300ms (R = 100ms) writes less often than every T; a waiting
// Lock and a TryLock loop on the same name (same options) may take the
// key over, but never while the holder's lease is live: its validity
// (last write's start + T − margin) must end first.
func TestAttackSlowHealthCheckHolder(t *testing.T) {
	url, bucket := promiseEnv(t, "atkslowhc")
	var slow atomicBool
	holder := newTestClient(t, url, bucket, natsputex.WithHealthCheck(func(ctx context.Context, s natsputex.State) error {
		if slow.get() {
			return sleepCtx(ctx, 270*time.Millisecond)
		}
		return nil
	}))
	g := newGrants()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	l, err := holder.Locker().TryLock(ctx, "job")
	if err != nil {
		t.Fatal(err)
	}
	g.grant("holder", l)
	slow.set()
	waiter := newTestClient(t, url, bucket)
	trier := newTestClient(t, url, bucket)
	done := make(chan struct{})
	go func() {
		defer close(done)
		wl, err := waiter.Locker().Lock(ctx, "job")
		if err != nil {
			t.Errorf("waiter: %v", err)
			return
		}
		g.grant("waiter", wl)
		time.Sleep(100 * time.Millisecond)
		_ = wl.Release(context.Background())
	}()
	end := time.Now().Add(3 * time.Second)
	for time.Now().Before(end) {
		tl, err := trier.Locker().TryLock(ctx, "job")
		if err == nil {
			g.grant("trier", tl)
			time.Sleep(100 * time.Millisecond)
			_ = tl.Release(context.Background())
		}
		time.Sleep(10 * time.Millisecond)
	}
	<-done
	t.Logf("the holder's lease ended with: %v", context.Cause(l.Context()))
	g.check(t)
}

// TestAttackLostTakeoverReplyLocker: a waiting Lock, on a connection
// through a proxy, takes a crashed holder's key over; the answer to its
// takeover write (and only to it) is lost: the write lands, the proxy
// drops what comes back for dropFor and then closes the connection. A
// TryLock loop on a direct connection races it. No two leases are live at
// once, tokens rise, and the waiter's lease is handed out no sooner than
// C·R after the write that won the key ("after a takeover, the new holder
// rewrites its token for C intervals before the lease is handed to the
// caller").
func TestAttackLostTakeoverReplyLocker(t *testing.T) {
	for _, dropFor := range []time.Duration{50 * time.Millisecond, 400 * time.Millisecond} {
		t.Run(dropFor.String(), func(t *testing.T) { lostTakeoverReplyLocker(t, dropFor) })
	}
}

func lostTakeoverReplyLocker(t *testing.T, dropFor time.Duration) {
	const C = 5
	url, bucket := promiseEnv(t, "atklostreply")
	writes := watchWrites(t, url, bucket, "job")
	nc, js, err := connect(url)
	if err != nil {
		t.Fatal(err)
	}
	crashed, err := natsputex.New(context.Background(), js, bucket, natsputex.WithHolderID("crashed"),
		natsputex.WithRenewInterval(testR), natsputex.WithFailureThreshold(testF), natsputex.WithConfirmations(C))
	if err != nil {
		t.Fatal(err)
	}
	g := newGrants()
	held, err := crashed.Locker().TryLock(context.Background(), "job")
	if err != nil {
		t.Fatal(err)
	}
	g.grant("crashed", held)
	proxy := newTriggerProxy(t, strings.TrimPrefix(url, "nats://"), "PUB $KV."+bucket+".job ", dropFor)
	waiter := newTestClient(t, "nats://"+proxy.Addr(), bucket, natsputex.WithConfirmations(C), natsputex.WithHolderID("waiter"))
	trier := newTestClient(t, url, bucket, natsputex.WithConfirmations(C), natsputex.WithHolderID("trier"))
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	got := make(chan time.Time, 1)
	go func() {
		wl, err := waiter.Locker().Lock(ctx, "job")
		if err != nil {
			t.Errorf("waiter: %v", err)
			got <- time.Time{}
			return
		}
		g.grant("waiter", wl)
		got <- time.Now()
		time.Sleep(200 * time.Millisecond)
		_ = wl.Release(context.Background())
	}()
	time.Sleep(2 * testR)
	proxy.armed.Store(true)
	nc.Close() // crash
	t.Cleanup(func() { _ = crashed.Close(context.Background()) })
	var fired time.Time
	select {
	case fired = <-proxy.fired:
	case <-time.After(3 * time.Second):
		t.Fatal("the waiter never wrote the key")
	}
	stopTry := time.Now().Add(2 * time.Second)
	for time.Now().Before(stopTry) {
		tl, err := trier.Locker().TryLock(ctx, "job")
		if err == nil {
			g.grant("trier", tl)
			time.Sleep(50 * time.Millisecond)
			_ = tl.Release(context.Background())
		}
		time.Sleep(10 * time.Millisecond)
	}
	var at time.Time
	select {
	case at = <-got:
	case <-time.After(10 * time.Second):
	}
	writes.mu.Lock()
	var won keyWrite
	for _, w := range writes.writes {
		if strings.HasPrefix(w.value, "waiter") {
			won = w
			break
		}
	}
	writes.mu.Unlock()
	t.Logf("the waiter's write sent at %v (answer dropped for %v); its first write seen: rev %d at %v",
		fired.Format("15:04:05.000"), dropFor, won.rev, won.created.Format("15:04:05.000"))
	if !at.IsZero() && !won.created.IsZero() {
		after := at.Sub(won.created)
		t.Logf("the waiter got its lease %v after its first write landed (C·R = %v)", after.Round(time.Millisecond), C*testR)
		if after < C*testR {
			t.Errorf("the waiter's lease was handed out %v after the write that won the key, before C·R = %v", after.Round(time.Millisecond), C*testR)
		}
	}
	g.check(t)
	silence(t, writes, "crashed", testF*testR)
}

// silence checks that the first write to the key by another than prefix,
// after prefix's writes, came T or more after prefix's last write, by
// the server's stamps (the server runs on this machine).
func silence(t *testing.T, w *keyWatch, prefix string, T time.Duration) {
	t.Helper()
	w.mu.Lock()
	defer w.mu.Unlock()
	var last keyWrite
	for _, kw := range w.writes {
		if strings.HasPrefix(kw.value, prefix) {
			last = kw
			continue
		}
		if last.rev != 0 && kw.value != "" {
			gap := kw.created.Sub(last.created)
			t.Logf("%s's last write rev %d; the next write, rev %d by %q, %v later (T = %v)", prefix, last.rev, kw.rev, kw.value, gap.Round(time.Millisecond), T)
			if gap < T {
				t.Errorf("a dead holder's key was taken over %v after its last write, before T = %v", gap.Round(time.Millisecond), T)
			}
			return
		}
	}
}

// TestAttackCancelDuringConfirm: "On failure Lock returns an error and
// holds nothing; when ctx ends first, the error matches ctx.Err()." A
// waiting Lock with C = 10 takes a crashed holder's key over, and its
// context ends while it confirms. It must return ctx's error, write the
// key no more after it returned, and leave the key to others (another
// client's TryLock gets it within T + C·R + R of the return).
func TestAttackCancelDuringConfirm(t *testing.T) {
	const C = 10
	url, bucket := promiseEnv(t, "atkcancelconf")
	writes := watchWrites(t, url, bucket, "job")
	nc, js, err := connect(url)
	if err != nil {
		t.Fatal(err)
	}
	crashed, err := natsputex.New(context.Background(), js, bucket, natsputex.WithHolderID("crashed"),
		natsputex.WithRenewInterval(testR), natsputex.WithFailureThreshold(testF), natsputex.WithConfirmations(testC))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := crashed.Locker().TryLock(context.Background(), "job"); err != nil {
		t.Fatal(err)
	}
	time.Sleep(2 * testR)
	nc.Close()
	t.Cleanup(func() { _ = crashed.Close(context.Background()) })
	waiter := newTestClient(t, url, bucket, natsputex.WithConfirmations(C), natsputex.WithHolderID("waiter"))
	ctx, cancel := context.WithTimeout(context.Background(), testF*testR+5*testR)
	defer cancel()
	l, err := waiter.Locker().Lock(ctx, "job")
	returned := time.Now()
	if err == nil {
		t.Fatalf("Lock returned a lease (token %d) though its context ended during confirmation", l.Token())
	}
	t.Logf("Lock returned after its context ended mid-confirmation: %v", err)
	if !errors.Is(err, ctx.Err()) {
		t.Errorf("Lock's error %v does not match ctx.Err() = %v", err, ctx.Err())
	}
	other := newTestClient(t, url, bucket, natsputex.WithHolderID("other"))
	var got time.Duration
	for time.Since(returned) < 3*time.Second {
		ol, err := other.Locker().TryLock(context.Background(), "job")
		if err == nil {
			got = time.Since(returned)
			_ = ol.Release(context.Background())
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	writes.mu.Lock()
	late := 0
	for _, w := range writes.writes {
		if strings.HasPrefix(w.value, "waiter") && w.created.After(returned.Add(20*time.Millisecond)) {
			late++
		}
	}
	writes.mu.Unlock()
	t.Logf("another client got the key %v after the cancelled Lock returned; the cancelled waiter wrote %d time(s) after it returned", got.Round(time.Millisecond), late)
	if late > 0 {
		t.Errorf("the cancelled Lock's token was written %d time(s) after it returned", late)
	}
	if got == 0 || got > testF*testR+C*testR+testR {
		t.Errorf("the key was not free for others within T + C·R + R = %v of the cancelled Lock's return (got %v)", testF*testR+C*testR+testR, got)
	}
}

// TestAttackSlowLinkHolder: a live holder whose link to NATS gets slower
// (a proxy adding 0 to 250ms each way, or delaying only its answers by
// 100 to 400ms) while a TryLock loop with the same options, on a direct
// link, tries the name every 5ms: whenever the server's clock shows the
// key silent for T the holder's lease must already have ended (its
// validity counts from the start of its last successful write).
func TestAttackSlowLinkHolder(t *testing.T) {
	url, bucket := promiseEnv(t, "atkslowlink")
	proxy := testenv.NewProxy(t, strings.TrimPrefix(url, "nats://"))
	holder := newTestClient(t, "nats://"+proxy.Addr(), bucket, natsputex.WithHolderID("holder"))
	trier := newTestClient(t, url, bucket, natsputex.WithHolderID("trier"))
	g := newGrants()
	ctx, cancel := context.WithTimeout(context.Background(), 40*time.Second)
	defer cancel()
	faults := []func(){
		func() { proxy.Latency(60 * time.Millisecond) },
		func() { proxy.Latency(120 * time.Millisecond) },
		func() { proxy.Latency(160 * time.Millisecond) },
		func() { proxy.Latency(250 * time.Millisecond) },
		func() { proxy.DelayReplies(100 * time.Millisecond) },
		func() { proxy.DelayReplies(230 * time.Millisecond) },
		func() { proxy.DelayReplies(400 * time.Millisecond) },
	}
	for i, fault := range faults {
		proxy.Restore()
		var held locks.Lease
		waitFor(t, 5*time.Second, "the holder takes the name", func() bool {
			l, err := holder.Locker().TryLock(ctx, "job")
			if err == nil {
				held = l
			}
			return err == nil
		})
		g.grant("holder", held)
		fault()
		end := time.Now().Add(time.Second)
		for time.Now().Before(end) {
			l, err := trier.Locker().TryLock(ctx, "job")
			if err == nil {
				g.grant("trier", l)
				_ = l.Release(ctx)
				break
			}
			time.Sleep(5 * time.Millisecond)
		}
		t.Logf("fault %d: holder's lease: %v", i, context.Cause(held.Context()))
		proxy.Restore()
		_ = held.Release(ctx)
	}
	g.check(t)
}

// TestAttackClockKeyName: "an empty message to the bucket's key
// "natsputex:clock", which no lock can be named": Lock, TryLock, a
// Semaphore and a Supervisor on that name fail with ErrInvalidName.
func TestAttackClockKeyName(t *testing.T) {
	url, bucket := promiseEnv(t, "atkclockname")
	c := newTestClient(t, url, bucket)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	const name = "natsputex:clock"
	if _, err := c.Locker().TryLock(ctx, name); !errors.Is(err, locks.ErrInvalidName) {
		t.Errorf("TryLock(%q): %v, want ErrInvalidName", name, err)
	}
	if _, err := c.Locker().Lock(ctx, name); !errors.Is(err, locks.ErrInvalidName) {
		t.Errorf("Lock(%q): %v, want ErrInvalidName", name, err)
	}
	if _, err := c.Supervisor(name, "node-a", natsputex.Service{}); !errors.Is(err, locks.ErrInvalidName) {
		t.Errorf("Supervisor(%q): %v, want ErrInvalidName", name, err)
	}
	if err := natsputex.CheckSupervisor(bucket, name, "node-a"); !errors.Is(err, locks.ErrInvalidName) {
		t.Errorf("CheckSupervisor(%q): %v, want ErrInvalidName", name, err)
	}
	s, err := c.Semaphore(1)
	if err != nil {
		t.Fatal(err)
	}
	if l, err := s.TryAcquire(ctx, "natsputex:clock"); err == nil {
		t.Logf("a Semaphore named %q uses the slot key %q.1, not the clock key: token %d", name, name, l.Token())
		_ = l.Release(ctx)
	}
}
