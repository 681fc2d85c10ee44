package natsputex_test

// Attack round 8, on two changes: a read or write nats.go refused to send
// while it reconnects is sent again every ~10ms once the connection is
// back, reads included (a Lock or TryLock made while the link is down
// waits for it within its ctx); and a lease's validity counts from when
// the write that was answered was sent (the resent attempt). The claim:
// the write cannot have been stored before it was sent, so the holder's
// deadline (sent + T − margin) stays before T of silence after its stored
// write, by the server's stamp. The clients connect with ConnectOptions
// through fault proxies of their own (link7, attack7_test.go) or to a
// nats-server process of the test's that it pauses with SIGSTOP.

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os/exec"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/latchkey-go/latchkey/contracttest"
	"github.com/latchkey-go/latchkey/contracttest/testenv"
	"github.com/latchkey-go/latchkey/contracttest/testenv/natsenv"
	"github.com/latchkey-go/latchkey/locks"
	"github.com/latchkey-go/latchkey/natsputex"
)

// deadlines samples a lease's Deadline every millisecond while it is
// live, to check each against the holder's writes the server stored.
type deadlines struct {
	mu      sync.Mutex
	samples []deadlineSample
	stop    chan struct{}
	done    chan struct{}
}

type deadlineSample struct{ at, deadline time.Time }

func sampleDeadlines(t *testing.T, l locks.Lease) *deadlines {
	d := &deadlines{stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(d.done)
		tick := time.NewTicker(time.Millisecond)
		defer tick.Stop()
		last := time.Time{}
		for {
			select {
			case <-d.stop:
				return
			case <-l.Context().Done():
				return
			case <-tick.C:
			}
			dl := l.(interface{ Deadline() time.Time }).Deadline()
			if !dl.Equal(last) {
				last = dl
				d.mu.Lock()
				d.samples = append(d.samples, deadlineSample{time.Now(), dl})
				d.mu.Unlock()
			}
		}
	}()
	t.Cleanup(d.close)
	return d
}

func (d *deadlines) close() {
	select {
	case <-d.stop:
	default:
		close(d.stop)
	}
	<-d.done
}

// check fails t if a deadline the lease showed lies more than T − margin
// (+2ms) after the server's stamp of the latest write of token stored
// when it was seen: the validity of a write counted from its sending
// cannot outrun T of silence after the stored write, which is when a
// waiter may take over. It returns the largest excess over that stamp.
func (d *deadlines) check(t *testing.T, writes *keyWatch, token string, validity time.Duration) time.Duration {
	t.Helper()
	d.close()
	d.mu.Lock()
	defer d.mu.Unlock()
	var most time.Duration
	for _, s := range d.samples {
		w, ok := writes.lastBy(token, s.at)
		if !ok {
			t.Errorf("the lease showed deadline %v at %v, before any write of its token was stored", s.deadline.Format("15:04:05.000"), s.at.Format("15:04:05.000"))
			continue
		}
		ex := s.deadline.Sub(w.created)
		most = max(most, ex)
		if ex > validity+2*time.Millisecond {
			t.Errorf("the lease's deadline (seen at %v) is %v after its last stored write (rev %d): more than T − margin = %v, so it outlives T of silence by the server's stamp",
				s.at.Format("15:04:05.000"), ms(ex), w.rev, validity)
		}
	}
	return most
}

// holdWatched takes key with holder's TryLock and returns the lease, its
// token in the key, a validity watch and the name's grants holding it,
// and the lease's deadlines sampled from now on.
func holdWatched(t *testing.T, holder *natsputex.Client, writes *keyWatch, key string) (locks.Lease, string, *validity, *grants, *deadlines) {
	t.Helper()
	v, g := watchValidity(t), newGrants()
	lease, err := holder.Locker().TryLock(context.Background(), key)
	if err != nil {
		t.Fatal(err)
	}
	v.add("holder", lease)
	g.grant("holder", lease)
	return lease, writeAt(t, writes, lease.Token()).value, v, g, sampleDeadlines(t, lease)
}

// TestAttack8CallDuringCut: Lock and TryLock: "The silence is counted
// from the key's last write as the server's clock stamped it, against the
// server's time when this call first reads the key ... and from then on
// by this call's own clock"; "a key held by another token is taken over
// only after it has gone T = F·R without any write"; change A: a Lock or
// TryLock made while the link is down waits for it, its read (and clock
// write) sent again once the connection is back. If the call counted its
// own clock from its first, refused attempt rather than from the attempt
// the server stamped, it would think the key silent for the time the link
// was down longer than it was. A holder (R = 100ms, F = 6: T = 600ms,
// validity 550ms) is cut off for good halfway between two renewals; a
// caller (R = 50ms, F = 3, C = 0: it waits for the holder's longer T) on a
// link of its own cut beforehand makes its Lock or TryLock 20ms after the
// holder's cut, and its link comes back 100ms or 250ms later (nats.go
// reconnects 100–200ms after). In the "waiting" case the Lock is made
// with the link up, and both links are cut just as a renewal is stored,
// the caller's restored 100ms later. The caller's takeover write must be
// stored no sooner than T (−5ms) after the holder's last write, its lease
// granted only once the holder's has ended (C = 0: no confirmation hides
// an early takeover), and no lease live past its deadline.
func TestAttack8CallDuringCut(t *testing.T) {
	const (
		F = 6
		T = F * testR
	)
	for _, tc := range []struct {
		name string
		try  bool
		wait bool
		down time.Duration // from the call (the cut, when waiting) to the restore
	}{
		{"trylock-down100", true, false, 100 * time.Millisecond},
		{"trylock-down250", true, false, 250 * time.Millisecond},
		{"lock-down100", false, false, 100 * time.Millisecond},
		{"lock-down250", false, false, 250 * time.Millisecond},
		{"waiting-cut-at-renewal", false, true, 100 * time.Millisecond},
	} {
		t.Run(tc.name, func(t *testing.T) {
			url, bucket, key := atk4Env(t)
			writes := watchWrites(t, url, bucket, key)
			hl, cl := dial7(t, url), dial7(t, url)
			holder := hl.client(t, bucket, natsputex.WithFailureThreshold(F), natsputex.WithHolderID("holder"))
			caller := cl.client(t, bucket, natsputex.WithRenewInterval(testR/2), natsputex.WithConfirmations(0), natsputex.WithHolderID("caller"))
			lease, token, v, g, _ := holdWatched(t, holder, writes, key)
			ctx, cancel := context.WithTimeout(context.Background(), 4*time.Second)
			defer cancel()
			var got <-chan outcome
			var call time.Time
			if tc.wait {
				got = goLock(ctx, caller.Locker(), key, false)
				time.Sleep(3 * testR)
				call = afterRenewal(t, writes, token, 0, func() { cl.proxy.Cut(); hl.proxy.Cut() })
			} else {
				time.Sleep(2 * testR)
				cl.cut(t)
				cutAfterRenewal(t, writes, token, hl.proxy.Cut)
				time.Sleep(20 * time.Millisecond)
				call = time.Now()
				got = goLock(ctx, caller.Locker(), key, tc.try)
			}
			waitFor(t, 2*time.Second, "nats.go sees the caller's link cut", cl.nc.IsReconnecting)
			time.Sleep(time.Until(call.Add(tc.down)))
			back := cl.restore(t)
			o := waitOutcome(t, got, 5*time.Second, "the caller's call")
			last, _ := writes.lastBy(token, time.Now())
			t.Logf("holder's last write rev %d; the call made %v after it, the caller's link back %v after it; the call returned %v after it: lease %v, err %v; the holder's lease ended: %v (deadline %v after its last write)",
				last.rev, ms(call.Sub(last.created)), ms(back.Sub(last.created)), ms(o.at.Sub(last.created)), o.lease != nil, o.err,
				lease.Context().Err() != nil, ms(lease.(interface{ Deadline() time.Time }).Deadline().Sub(last.created)))
			if o.err != nil {
				if !tc.try || !errors.Is(o.err, locks.ErrNotAcquired) {
					t.Errorf("the call failed: %v", o.err)
				}
				if !tc.try && o.at.Before(call.Add(3*time.Second)) {
					t.Errorf("the Lock failed %v after it was made, its ctx with time left", ms(o.at.Sub(call)))
				}
				v.check(t)
				return
			}
			g.grant("caller", o.lease)
			v.add("caller", o.lease)
			w := writeAt(t, writes, o.lease.Token())
			t.Logf("the caller's takeover write rev %d stored %v after the holder's last write (T = %v)", w.rev, ms(w.created.Sub(last.created)), T)
			if d := w.created.Sub(last.created); d < T-5*time.Millisecond {
				t.Errorf("the caller took the key %v after the holder's last write, before T = %v: it counted the time its link was down as silence", ms(d), T)
			}
			if tc.try && back.Sub(last.created) < T-50*time.Millisecond && w.created.Sub(last.created) < T {
				t.Errorf("the TryLock, whose link was back %v after the holder's last write, took the key", ms(back.Sub(last.created)))
			}
			_ = o.lease.Release(context.Background())
			v.check(t)
			g.check(t)
		})
	}
}

// TestAttack8DelayedAnswers: "A holder that cannot renew ends its lease
// by itself at the start of its last successful write plus T minus a
// safety margin"; change B: the validity counts from when the write that
// was answered was sent. Were it counted from the answer, a slow answer
// would carry the deadline past T of silence after the stored write. A
// holder (R = 100ms, F = 3, margin 50ms: validity 250ms) gets every answer
// 80ms or 140ms late (its proxy delays replies: more than the margin),
// and its link is cut 30ms after a renewal is stored for 80ms, three
// times, so that renewals are refused and sent again, their answers late
// too. A waiter (R = 50ms, C = 0) on a direct link waits in Lock. Every
// deadline the lease shows must lie within T − margin (+2ms) of the
// server's stamp of its latest write stored then; no lease live past its
// deadline; the waiter granted only once the holder's lease has ended.
func TestAttack8DelayedAnswers(t *testing.T) {
	const (
		T      = testF * testR
		margin = testR / 2
	)
	for _, delay := range []time.Duration{80 * time.Millisecond, 140 * time.Millisecond} {
		t.Run(fmt.Sprintf("delay%v", delay), func(t *testing.T) {
			url, bucket, key := atk4Env(t)
			writes := watchWrites(t, url, bucket, key)
			l := dial7(t, url)
			holder := l.client(t, bucket, natsputex.WithHolderID("holder"))
			waiter := newTestClient(t, url, bucket, natsputex.WithRenewInterval(testR/2), natsputex.WithConfirmations(0), natsputex.WithHolderID("waiter"))
			lease, token, v, g, ds := holdWatched(t, holder, writes, key)
			ctx, cancel := context.WithTimeout(context.Background(), 8*time.Second)
			defer cancel()
			waiting := goLock(ctx, waiter.Locker(), key, false)
			l.proxy.DelayReplies(delay)
			for i := 0; i < 3 && lease.Context().Err() == nil; i++ {
				time.Sleep(3 * testR)
				if lease.Context().Err() != nil {
					break
				}
				// Cut 30ms after a renewal is stored, its answer still on
				// its way: the next renewal is refused and sent again.
				for end := time.Now().Add(2 * time.Second); time.Now().Before(end) && lease.Context().Err() == nil; time.Sleep(time.Millisecond) {
					if w, ok := writes.lastBy(token, time.Now()); ok && time.Since(w.seen) < 3*time.Millisecond {
						time.Sleep(30 * time.Millisecond)
						l.proxy.Cut()
						break
					}
				}
				time.Sleep(80 * time.Millisecond)
				l.proxy.Restore()
				l.proxy.DelayReplies(delay)
				t.Logf("cut %d: link down 80ms; lease live: %v", i, lease.Context().Err() == nil)
			}
			time.Sleep(3 * testR)
			live := lease.Context().Err() == nil
			if live {
				_ = lease.Release(context.Background())
			}
			o := waitOutcome(t, waiting, 8*time.Second, "the waiter's Lock")
			most := ds.check(t, writes, token, T-margin)
			t.Logf("answers %v late: the holder's lease live to the end: %v (%v); deadlines at most %v after the stored write; holder writes: %d; the waiter: lease %v, err %v",
				delay, live, context.Cause(lease.Context()), ms(most), len(nodeWrites(writes, token, time.Time{})), o.lease != nil, o.err)
			if o.err != nil {
				t.Fatalf("the waiter's Lock: %v", o.err)
			}
			g.grant("waiter", o.lease)
			v.add("waiter", o.lease)
			if !live {
				last, _ := writes.lastBy(token, time.Now())
				w := writeAt(t, writes, o.lease.Token())
				if d := w.created.Sub(last.created); d < T-5*time.Millisecond {
					t.Errorf("the waiter took the key %v after the holder's last write, before T = %v", ms(d), T)
				}
			}
			_ = o.lease.Release(context.Background())
			v.check(t)
			g.check(t)
		})
	}
}

// pausable is a nats-server process of the program on PATH, on a port of
// its own, that the test can pause with SIGSTOP.
type pausable struct {
	cmd *exec.Cmd
	url string
}

func startPausable(t *testing.T) *pausable {
	t.Helper()
	bin := natsenv.Binary(t)
	port := testenv.FreePort(t)
	p := &pausable{url: fmt.Sprintf("nats://127.0.0.1:%d", port)}
	p.cmd = exec.Command(bin, "-a", "127.0.0.1", "-p", strconv.Itoa(port), "-js", "-sd", t.TempDir())
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = p.cmd.Process.Signal(syscall.SIGCONT)
		_ = p.cmd.Process.Kill()
		_ = p.cmd.Wait()
	})
	waitFor(t, 10*time.Second, "the nats-server process accepts clients", func() bool {
		c, err := net.DialTimeout("tcp", p.url[len("nats://"):], 100*time.Millisecond)
		if err == nil {
			_ = c.Close()
			nc, js, err := connect(p.url)
			if err == nil {
				defer nc.Close()
				ctx, cancel := context.WithTimeout(context.Background(), time.Second)
				defer cancel()
				_, err = js.AccountInfo(ctx)
				return err == nil
			}
		}
		return false
	})
	return p
}

// TestAttack8ServerPaused: change B's claim is that a write cannot be
// stored before it was sent. With the server paused (SIGSTOP of
// nats-server), writes are sent and neither stored nor answered until it
// resumes; the server then stamps them at once, late. A holder (R =
// 100ms, F = 3, C = 1, margin 50ms) and a waiter (R = 50ms, C = 0,
// waiting in Lock) both connect with ConnectOptions to the server, which
// is paused 20ms after a renewal is stored for 150ms, 230ms (a renewal
// sent just before the holder's deadline is answered just after it),
// 400ms and 1.2s (past T). Every deadline the holder's lease shows must
// lie within T − margin (+2ms) of the stamp of its latest write stored
// then; no lease live past its deadline; the waiter granted only once the
// holder's lease has ended, its takeover write T after the holder's last
// one; and the waiter must get the key within T + 1.5s of the holder's
// last write once the holder stops renewing (its lease ended, or released
// 1s after the resume).
func TestAttack8ServerPaused(t *testing.T) {
	const (
		T      = testF * testR
		margin = testR / 2
	)
	checkLeaks6(t)
	srv := startPausable(t)
	for i, pause := range []time.Duration{150 * time.Millisecond, 230 * time.Millisecond, 400 * time.Millisecond, 1200 * time.Millisecond} {
		t.Run(fmt.Sprintf("pause%v", pause), func(t *testing.T) {
			bucket, key := uniqueBucket("atk8p"), fmt.Sprintf("job%d", i)
			prepareBucket(t, srv.url, bucket, natsputex.WithStorage(jetstream.MemoryStorage))
			writes := watchWrites(t, srv.url, bucket, key)
			dial := func() (*nats.Conn, jetstream.JetStream) {
				nc, js, err := connect(srv.url, natsputex.ConnectOptions()...)
				if err != nil {
					t.Fatal(err)
				}
				return nc, js
			}
			hnc, hjs := dial()
			holder := newClientOn(t, hnc, hjs, bucket, natsputex.WithHolderID("holder"))
			wnc, wjs := dial()
			waiter := newClientOn(t, wnc, wjs, bucket, natsputex.WithRenewInterval(testR/2), natsputex.WithConfirmations(0), natsputex.WithHolderID("waiter"))
			lease, token, v, g, ds := holdWatched(t, holder, writes, key)
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			waiting := goLock(ctx, waiter.Locker(), key, false)
			time.Sleep(3 * testR)
			paused := afterRenewal(t, writes, token, 20*time.Millisecond, func() {
				if err := srv.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
					t.Error(err)
				}
			})
			time.Sleep(time.Until(paused.Add(pause)))
			if err := srv.cmd.Process.Signal(syscall.SIGCONT); err != nil {
				t.Fatal(err)
			}
			resumed := time.Now()
			time.Sleep(time.Second)
			live := lease.Context().Err() == nil
			if live {
				_ = lease.Release(context.Background())
			}
			o := waitOutcome(t, waiting, 8*time.Second, "the waiter's Lock")
			last, _ := writes.lastBy(token, time.Now())
			most := ds.check(t, writes, token, T-margin)
			t.Logf("paused %v (resumed %v after the pause); the holder's last write rev %d stored %v after the resume; lease live 1s after the resume: %v (%v); deadlines at most %v after the stored write; the waiter returned %v after the holder's last write: lease %v, err %v",
				pause, ms(resumed.Sub(paused)), last.rev, ms(last.created.Sub(resumed)), live, context.Cause(lease.Context()), ms(most), ms(o.at.Sub(last.created)), o.lease != nil, o.err)
			if o.err != nil {
				t.Fatalf("the waiter's Lock: %v", o.err)
			}
			g.grant("waiter", o.lease)
			v.add("waiter", o.lease)
			w := writeAt(t, writes, o.lease.Token())
			if !live {
				if d := w.created.Sub(last.created); d < T-5*time.Millisecond {
					t.Errorf("the waiter took the key %v after the holder's last write, before T = %v", ms(d), T)
				}
				if d := o.at.Sub(last.created); d > T+1500*time.Millisecond {
					t.Errorf("the waiter got the key %v after the holder's last write, not within T + 1.5s", ms(d))
				}
			}
			_ = o.lease.Release(context.Background())
			v.check(t)
			g.check(t)
		})
	}
}

// TestAttack8Flapping: "two leases on one name are never granted at
// once"; "A holder that cannot renew ends its lease by itself at the
// start of its last successful write plus T minus a safety margin";
// Lock: "when ctx ends first, the error matches ctx.Err()", a take write
// in flight answered "at most max(T, 1s) later"; Close "Every wait is
// bounded by ctx" and ends every lease of the client. Four clients of
// mixed timing lock two names in loops (Lock or TryLock, ctx 700ms; hold
// 40–120ms; Release, ctx 200ms): c1 (R = 100ms, F = 3, C = 0) and c2
// (R = 50ms, F = 4, C = 1) and c4 (R = 100ms, F = 3, C = 2) on links cut
// and restored every 150ms for 2s (c2's out of phase), c3 (R = 100ms,
// F = 5, C = 0) on a direct link; with 1.6s of flapping gone, c4 is
// closed (ctx 300ms) while its link flaps. No lease may be granted while
// another of its name is live, tokens must rise, no lease be live past its
// deadline (+3ms), each Lock and TryLock return within its ctx + 1s
// (+60ms), each Release within 200ms (+60ms), Close within 300ms (+60ms)
// with c4's leases ended, and some grants be made by the flapping clients.
func TestAttack8Flapping(t *testing.T) {
	url, bucket, _ := atk4Env(t)
	l1, l2, l4 := dial7(t, url), dial7(t, url), dial7(t, url)
	type member struct {
		name string
		c    *natsputex.Client
	}
	ms4 := []member{
		{"c1", l1.client(t, bucket, natsputex.WithConfirmations(0), natsputex.WithHolderID("c1"))},
		{"c2", l2.client(t, bucket, natsputex.WithRenewInterval(testR/2), natsputex.WithFailureThreshold(4), natsputex.WithHolderID("c2"))},
		{"c3", newTestClient(t, url, bucket, natsputex.WithFailureThreshold(5), natsputex.WithConfirmations(0), natsputex.WithHolderID("c3"))},
		{"c4", l4.client(t, bucket, natsputex.WithConfirmations(2), natsputex.WithHolderID("c4"))},
	}
	names := []string{"a", "b"}
	grants := map[string]*grants{"a": newGrants(), "b": newGrants()}
	v := watchValidity(t)
	var (
		mu       sync.Mutex
		problems []string
		byWho    = map[string]int{}
		c4Leases []locks.Lease
	)
	report := func(format string, args ...any) {
		mu.Lock()
		defer mu.Unlock()
		if len(problems) < 20 {
			problems = append(problems, fmt.Sprintf(format, args...))
		}
	}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for _, m := range ms4 {
		for i, name := range names {
			wg.Add(1)
			go func(m member, name string, try bool) {
				defer wg.Done()
				for n := 0; ; n++ {
					select {
					case <-stop:
						return
					default:
					}
					ctx, cancel := context.WithTimeout(context.Background(), 700*time.Millisecond)
					began := time.Now()
					var lease locks.Lease
					var err error
					if try && n%2 == 0 {
						lease, err = m.c.Locker().TryLock(ctx, name)
					} else {
						lease, err = m.c.Locker().Lock(ctx, name)
					}
					cancel()
					if d := time.Since(began); d > 700*time.Millisecond+time.Second+slack6 {
						report("%s's call on %q returned %v after it began (ctx 700ms): %v", m.name, name, ms(d), err)
					}
					if err != nil {
						if errors.Is(err, locks.ErrClosed) {
							return
						}
						time.Sleep(10 * time.Millisecond)
						continue
					}
					grants[name].grant(m.name, lease)
					v.add(m.name+" "+name, lease)
					mu.Lock()
					byWho[m.name]++
					if m.name == "c4" {
						c4Leases = append(c4Leases, lease)
					}
					mu.Unlock()
					select {
					case <-time.After(time.Duration(40+n*37%80) * time.Millisecond):
					case <-lease.Context().Done():
					}
					rctx, rcancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
					began = time.Now()
					_ = lease.Release(rctx)
					rcancel()
					if d := time.Since(began); d > 200*time.Millisecond+slack6 {
						report("%s's Release of %q returned %v after it began (ctx 200ms)", m.name, name, ms(d))
					}
				}
			}(m, name, i == 1)
		}
	}
	flapStart := time.Now()
	var closed time.Duration
	var closeErr error
	for i := 0; time.Since(flapStart) < 2*time.Second; i++ {
		if i%2 == 0 {
			l1.proxy.Cut()
			l4.proxy.Cut()
		} else {
			l1.proxy.Restore()
			l4.proxy.Restore()
		}
		time.Sleep(75 * time.Millisecond)
		if i%2 == 0 {
			l2.proxy.Cut()
		} else {
			l2.proxy.Restore()
		}
		time.Sleep(75 * time.Millisecond)
		if closed == 0 && time.Since(flapStart) > 1600*time.Millisecond {
			ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
			began := time.Now()
			closeErr = ms4[3].c.Close(ctx)
			closed = time.Since(began)
			cancel()
			mu.Lock()
			for _, l := range c4Leases {
				if l.Context().Err() == nil {
					report("c4's lease (token %d) live after Close returned", l.Token())
				}
			}
			mu.Unlock()
		}
	}
	l1.proxy.Restore()
	l2.proxy.Restore()
	l4.proxy.Restore()
	time.Sleep(500 * time.Millisecond)
	close(stop)
	wg.Wait()
	t.Logf("grants by client: %v; c4's Close (ctx 300ms, its link flapping) returned in %v: %v", byWho, ms(closed), closeErr)
	if closed > 300*time.Millisecond+slack6 {
		t.Errorf("c4's Close returned %v after it began, its ctx 300ms", ms(closed))
	}
	if byWho["c1"]+byWho["c2"]+byWho["c4"] == 0 {
		t.Error("no grant to a client on a flapping link")
	}
	for _, p := range problems {
		t.Error(p)
	}
	v.check(t)
	for _, name := range names {
		grants[name].check(t)
	}
}

// TestAttack8ClusterNodeRestart: on a 3-node cluster of the nats-server
// program (2.9.10: a single-replica bucket), one client, connected with
// ConnectOptions to a node that does not hold the bucket's stream (the
// others' URLs after it), runs a Supervisor (node-a: R = 100ms, F = 10,
// C = 1) and holds four Locker leases it took; a second client on the
// stream's node runs node-b and waits in Lock (R = 50ms, C = 0) for each
// name. The first client's node is shut down 50ms after one of node-a's
// renewals and started again (Cluster.Restart): its requests are refused
// while nats.go reconnects to another node, and sent again there. No
// lease may be live past its deadline (+3ms); no waiter granted a name
// while its holder's lease is live; node-a and node-b never both run
// their services (History), and node-b's takeover, if any, comes T after
// node-a's write and starts C·R after it (checkTakeovers).
func TestAttack8ClusterNodeRestart(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a 3-node cluster")
	}
	const F = 10
	cluster, bucket, sn := binaryClusterBucket(t, "atk8cluster")
	servers, key := cluster.Servers(), "spof-service"
	i := (sn + 1) % 3
	ordered := servers[i].URL() + "," + servers[(i+1)%3].URL() + "," + servers[(i+2)%3].URL()
	writes := watchWrites(t, servers[sn].URL(), bucket, key)
	h := contracttest.NewHistory(1)
	a := startNodeConn(t, append(natsputex.ConnectOptions(), nats.DontRandomize()), ordered, bucket, key, "node-a", "node-a", h, true, natsputex.WithFailureThreshold(F))
	waitActive4(t, 10*time.Second, a)
	b := startNodeConn(t, append(natsputex.ConnectOptions(), nats.IgnoreDiscoveredServers()), servers[sn].URL(), bucket, key, "node-b", "node-b", h, true,
		natsputex.WithFailureThreshold(F))
	bnc, bjs, err := connect(servers[sn].URL(), append(natsputex.ConnectOptions(), nats.IgnoreDiscoveredServers())...)
	if err != nil {
		t.Fatal(err)
	}
	waiter := newClientOn(t, bnc, bjs, bucket, natsputex.WithRenewInterval(testR/2), natsputex.WithConfirmations(0), natsputex.WithHolderID("waiter"))
	v := watchValidity(t)
	names := []string{"j1", "j2", "j3", "j4"}
	leases := map[string]locks.Lease{}
	gs := map[string]*grants{}
	waits := map[string]<-chan outcome{}
	wctx, wcancel := context.WithTimeout(context.Background(), 12*time.Second)
	defer wcancel()
	for _, name := range names {
		l, err := a.c.Locker().TryLock(context.Background(), name)
		if err != nil {
			t.Fatal(err)
		}
		leases[name], gs[name] = l, newGrants()
		v.add("holder "+name, l)
		gs[name].grant("holder", l)
		waits[name] = goLock(wctx, waiter.Locker(), name, false)
	}
	time.Sleep(5 * testR)
	down := afterRenewal(t, writes, "node-a", 50*time.Millisecond, func() { cluster.Stop(i) })
	if err := cluster.Restart(i); err != nil {
		t.Fatal(err)
	}
	t.Logf("%s (node-a's and the holder's) stopped and back %v later; the stream on %s", servers[i].Name(), ms(time.Since(down)), servers[sn].Name())
	time.Sleep(2 * time.Second)
	kept := 0
	for _, name := range names {
		if leases[name].Context().Err() == nil {
			kept++
			_ = leases[name].Release(context.Background())
		} else {
			t.Logf("%s: the holder's lease ended: %v", name, context.Cause(leases[name].Context()))
		}
	}
	for _, name := range names {
		o := waitOutcome(t, waits[name], 12*time.Second, "the waiter's Lock of "+name)
		if o.err != nil {
			t.Errorf("%s: the waiter's Lock: %v", name, o.err)
			continue
		}
		gs[name].grant("waiter", o.lease)
		v.add("waiter "+name, o.lease)
		_ = o.lease.Release(context.Background())
	}
	t.Logf("holder leases kept across the restart: %d of %d; node-a running: %v, node-b running: %v", kept, len(names), a.running(), b.running())
	a.cancel()
	a.wait(5 * time.Second)
	b.cancel()
	b.wait(5 * time.Second)
	checkTakeovers(t, writes, b, F*testR, testC*testR)
	if err := h.Check(); err != nil {
		t.Errorf("services overlapped: %v", err)
	}
	v.check(t)
	for _, name := range names {
		gs[name].check(t)
	}
}
