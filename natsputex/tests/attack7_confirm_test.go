package natsputex_test

// Attack round 7 (see attack7_test.go), continued: a takeover's C·R
// counted from the answer to its write.

import (
	"context"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/latchkey-go/latchkey/contracttest"
	"github.com/latchkey-go/latchkey/contracttest/testenv"
	"github.com/latchkey-go/latchkey/locks/driver"
	"github.com/latchkey-go/latchkey/natsputex"
)

// TestAttack7ConfirmFromAnswer: C: "after a takeover, the new holder
// rewrites its token for C intervals, counted from the answer to its
// takeover write (which may land well after it was begun, when it waited
// for a reconnect), before the lease is handed to the caller (or the
// Supervisor starts the service)"; a standby "confirms for the longer C·R
// of its own and the holder's". So a Start, or a Lock returning a key
// taken over, must come at least C·R after the takeover write was stored
// (the server's stamp), and at least the reply's delay more when the
// answer was held back. node-a (direct link, R = 100ms, F = 3) is active,
// node-b (C = 2 unless said) stands by behind a proxy; node-a is killed
// right after a renewal and node-b takes over:
//   - latency: 60ms each way on node-b's link (the write lands 60ms after
//     it began, its answer 60ms after that): Start ≥ write + 60ms + C·R.
//   - slow-replies: node-b's answers held 150ms (the write lands at once):
//     Start ≥ write + 150ms + C·R.
//   - mixed-C: node-a has C = 5 (C·R = 500ms, in its value), node-b C = 1,
//     60ms each way: Start ≥ write + 60ms + 500ms, and node-b's writes
//     while it confirms carry C·R=500ms (but for the last, "until its last
//     confirmation": those stored from C·R − R after the takeover write).
//   - locker: node-a has C = 5; a Locker (C = 0) behind the proxy (60ms
//     each way) waits in Lock for the key: Lock must return ≥ its write +
//     60ms + 500ms; its driver.EventConfirmation's Duration ("the time
//     since the takeover write was answered, from which the confirmation
//     counts", package doc) must be at least C·R, and no more than the
//     time since the write was stored (+20ms) when the event is told (the
//     answer comes after the write is stored, and 60ms later here).
//
// Every takeover comes T after node-a's last write; the services never
// overlap.
func TestAttack7ConfirmFromAnswer(t *testing.T) {
	const T = testF * testR
	for _, tc := range []struct {
		name           string
		aC, bC         int
		latency, reply time.Duration
		locker         bool
	}{
		{"latency", 2, 2, 60 * time.Millisecond, 0, false},
		{"slow-replies", 2, 2, 0, 150 * time.Millisecond, false},
		{"mixed-C", 5, 1, 60 * time.Millisecond, 0, false},
		{"locker", 5, 0, 60 * time.Millisecond, 0, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			url, bucket, key := atk4Env(t)
			writes := watchWrites(t, url, bucket, key)
			raw := watchRaw(t, url, bucket, key)
			proxy := testenv.NewProxy(t, strings.TrimPrefix(url, "nats://"))
			h := contracttest.NewHistory(1)
			a := startNode5(t, url, bucket, key, "node-a", "node-a", h, true, natsputex.WithConfirmations(tc.aC))
			waitFor(t, 5*time.Second, "node-a starts its service", a.running)
			CR := time.Duration(max(tc.aC, tc.bC)) * testR
			delay := tc.latency + tc.reply
			var b *node4
			var got <-chan outcome
			var confirmations []driver.Event
			var eventAt []time.Time
			var mu sync.Mutex
			if tc.locker {
				l := dial7(t, url)
				c := l.client(t, bucket, natsputex.WithConfirmations(tc.bC), natsputex.WithHolderID("locker"))
				stop := c.Locker().Observe(func(e driver.Event) {
					if e.Kind == driver.EventConfirmation || e.Kind == driver.EventTakeover {
						mu.Lock()
						confirmations = append(confirmations, e)
						eventAt = append(eventAt, time.Now())
						mu.Unlock()
					}
				})
				defer stop()
				l.proxy.Latency(tc.latency)
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				defer cancel()
				got = goLock(ctx, c.Locker(), key, false)
				time.Sleep(3 * testR)
				// The proxy of dial7 is l.proxy; node-b is not used.
			} else {
				b = startNode5(t, "nats://"+proxy.Addr(), bucket, key, "node-b", "node-b", h, true, natsputex.WithConfirmations(tc.bC))
				waitFor(t, 5*time.Second, "node-b is standby", func() bool {
					return b.sawEvent(func(e natsputex.Event) bool { return e.Holder == "node-a" })
				})
				if tc.latency > 0 {
					proxy.Latency(tc.latency)
				} else {
					proxy.DelayReplies(tc.reply)
				}
				time.Sleep(3 * testR)
			}
			afterRenewal(t, writes, "node-a", 0, a.kill)
			lastA, _ := writes.lastBy("node-a", time.Now())
			var done time.Time
			var took keyWrite
			if tc.locker {
				o := waitOutcome(t, got, 5*time.Second, "the Locker's Lock")
				if o.err != nil {
					t.Fatalf("the Locker's Lock: %v", o.err)
				}
				defer func() { _ = o.lease.Release(context.Background()) }()
				done, took = o.at, writeAt(t, writes, o.lease.Token())
				mu.Lock()
				for i, e := range confirmations {
					since := eventAt[i].Sub(took.created)
					t.Logf("Locker event %s token %d duration %v (told %v after the takeover write was stored)", e.Kind, e.Token, ms(e.Duration), ms(since))
					if e.Kind != driver.EventConfirmation {
						continue
					}
					if e.Duration > since+20*time.Millisecond {
						t.Errorf("EventConfirmation's Duration is %v, but it was told %v after the takeover write was stored: longer than since the write's answer", ms(e.Duration), ms(since))
					}
					if e.Duration < CR-10*time.Millisecond {
						t.Errorf("EventConfirmation's Duration is %v, under the C·R = %v it confirms for", ms(e.Duration), ms(CR))
					}
				}
				mu.Unlock()
			} else {
				waitFor(t, 5*time.Second, "node-b starts", b.running)
				st := b.getStarts()[0]
				done, took = st.begin, writeAt(t, writes, st.token)
				stopNodes(b)
				checkTakeovers(t, writes, b, T, CR)
			}
			t.Logf("%s: the takeover write rev %d %q stored %v after node-a's last write; handed over %v after it (C·R = %v, delay %v)",
				tc.name, took.rev, took.value, ms(took.created.Sub(lastA.created)), ms(done.Sub(took.created)), CR, delay)
			if d := took.created.Sub(lastA.created); d < T-10*time.Millisecond {
				t.Errorf("the key was taken %v after node-a's last write, before T = %v", ms(d), T)
			}
			if d := done.Sub(took.created); d < delay+CR-10*time.Millisecond {
				t.Errorf("handed over %v after the takeover write was stored, before its answer (held %v) + C·R (%v)", ms(d), delay, CR)
			}
			if tc.name == "mixed-C" {
				for _, w := range raw.all() {
					if w.token == "node-b" {
						t.Logf("  node-b rev %d T=%v C·R=%v stored %v before its Start", w.rev, w.T, w.CR, ms(done.Sub(w.created)))
					}
					if w.token == "node-b" && w.created.Before(took.created.Add(CR-testR)) && w.CR < CR {
						t.Errorf("node-b confirmed with C·R=%v in its value (rev %d), not node-a's longer %v", w.CR, w.rev, CR)
					}
				}
			}
			if err := h.Check(); err != nil {
				t.Errorf("services overlapped: %v", err)
			}
		})
	}
}

// faultAtTakeover starts node-a on url and node-b on bURL (ConnectOptions,
// C = 2), node-b's Standby health check calling fault (and waiting for its
// connection to reconnect) once a takeover of node-a's key is due; node-a
// is killed right after a renewal. It returns the nodes, node-a's last
// write and the time of the fault.
func faultAtTakeover(t *testing.T, url, bURL, bucket, key string, writes *keyWatch, h *contracttest.History, fault func()) (a, b *node4, lastA keyWrite, at time.Time) {
	t.Helper()
	const T = testF * testR
	opts := []natsputex.Option{natsputex.WithConfirmations(2)}
	a = startNode5(t, url, bucket, key, "node-a", "node-a", h, true, opts...)
	waitFor(t, 5*time.Second, "node-a starts its service", a.running)
	var armed atomic.Pointer[time.Time]
	var bn atomic.Pointer[node4]
	hc, faults := faultHook(&armed, fault, func() bool { return bn.Load().nc.IsReconnecting() })
	b = startNode5(t, bURL, bucket, key, "node-b", "node-b", h, true, append(opts, natsputex.WithHealthCheck(hc))...)
	bn.Store(b)
	waitFor(t, 5*time.Second, "node-b is standby", func() bool {
		return b.sawEvent(func(e natsputex.Event) bool { return e.Holder == "node-a" })
	})
	time.Sleep(2 * testR)
	afterRenewal(t, writes, "node-a", 0, a.kill)
	lastA, _ = writes.lastBy("node-a", time.Now())
	from := lastA.created.Add(T - 30*time.Millisecond)
	armed.Store(&from)
	select {
	case at = <-faults:
	case <-time.After(5 * time.Second):
		t.Fatal("node-b ran no Standby check before its takeover")
	}
	return a, b, lastA, at
}

// TestAttack7RestartAtTakeover: the same on the nats-server program (file
// storage), both agents on ConnectOptions: node-a (C = 2) is killed right
// after a renewal; node-b's (C = 2) Standby health check, run before its
// takeover write, shuts the server down and returns once nats.go
// reconnects; the server is started again at once. node-b's takeover
// write waits for the reconnect and lands well after it was begun: its
// Start must still come C·R after the write was stored (checkTakeovers,
// from the bucket's history), T after node-a's last write.
func TestAttack7RestartAtTakeover(t *testing.T) {
	const T = testF * testR
	srv, url, bucket, key := binaryEnv6(t, "atk7takeover")
	hist := newHistoryLog(t, url, bucket, key)
	h := contracttest.NewHistory(1)
	_, b, lastA, at := faultAtTakeover(t, url, url, bucket, key, watchWrites(t, url, bucket, key), h, srv.Shutdown)
	if err := srv.Restart(); err != nil {
		t.Fatal(err)
	}
	up := time.Now()
	waitFor(t, 10*time.Second, "node-b starts", b.running)
	stopNodes(b)
	hist.collect()
	all := hist.watch()
	st := b.getStarts()[0]
	var took keyWrite
	for _, w := range all.all() {
		if w.rev == st.token {
			took = w
		}
	}
	t.Logf("server shut down %v after node-a's last write, back %v later; node-b's takeover write rev %d stored %v after the shutdown; Start %v after it (C·R = %v)",
		ms(at.Sub(lastA.created)), ms(up.Sub(at)), took.rev, ms(took.created.Sub(at)), ms(st.begin.Sub(took.created)), 2*testR)
	if !took.created.After(at) {
		t.Errorf("node-b's takeover write landed before the shutdown: the path was not exercised")
	}
	checkTakeovers(t, all, b, T, 2*testR)
	if err := h.Check(); err != nil {
		t.Errorf("services overlapped: %v", err)
	}
}

// proxied7 is a fresh bucket of the local server (atk4Env) with a watch
// of its key, a fault proxy to the server and a service history.
type proxied7 struct {
	url, bucket, key string
	writes           *keyWatch
	proxy            *testenv.Proxy
	h                *contracttest.History
}

func newProxied7(t *testing.T) proxied7 {
	url, bucket, key := atk4Env(t)
	return proxied7{url, bucket, key, watchWrites(t, url, bucket, key), testenv.NewProxy(t, strings.TrimPrefix(url, "nats://")), contracttest.NewHistory(1)}
}

func (p proxied7) addr() string { return "nats://" + p.proxy.Addr() }

// TestAttack7ConfirmAcrossCut: a Supervisor "starts the service only once
// C intervals (C·R) have passed since its first write of the hold was
// answered as a success, every write since having succeeded too"; a
// confirmation write refused while nats.go reconnects is sent again once
// back (ConnectOptions), and a holder "cut off from NATS ends its lease by
// itself once T − margin has passed since its last successful write
// began"; a confirmer that gives up "never blanks the key". node-a
// (direct, R = 100ms, F = 3, C = 3) is killed; node-b (behind a proxy,
// C = 3) takes over and, while it confirms, its link is cut:
//   - short (restored after 90ms: nats.go back 100–200ms after the cut,
//     within its validity of 250ms): its confirmation writes are sent
//     again once back; it starts C·R after its takeover write.
//   - long (400ms, longer than its validity): it must give up without
//     blanking; node-c (direct, C = 3), started during the cut, may take
//     the key only T after node-b's last write.
//
// Every Start comes T after another token's write and C·R after its first
// write (checkTakeovers); the services never overlap.
func TestAttack7ConfirmAcrossCut(t *testing.T) {
	const (
		C = 3
		T = testF * testR
	)
	for _, tc := range []struct {
		name string
		down time.Duration
	}{{"short", 90 * time.Millisecond}, {"long", 400 * time.Millisecond}} {
		t.Run(tc.name, func(t *testing.T) {
			p := newProxied7(t)
			opts := []natsputex.Option{natsputex.WithConfirmations(C)}
			a, b := activeAndStandby(t, p.url, p.addr(), p.bucket, p.key, p.h, 20*time.Millisecond, opts...)
			time.Sleep(2 * testR)
			afterRenewal(t, p.writes, "node-a", 0, a.kill)
			waitFor(t, 3*time.Second, "node-b confirms", func() bool { return b.sup.Phase() == natsputex.PhaseConfirming })
			took := nodeWrites(p.writes, "node-b", time.Time{})[0]
			time.Sleep(testR)
			cut := time.Now()
			p.proxy.Cut()
			waitFor(t, 2*time.Second, "node-b's connection reconnects", b.nc.IsReconnecting)
			nodes := []*node4{b}
			if tc.name == "long" {
				nodes = append(nodes, startNode5(t, p.url, p.bucket, p.key, "node-c", "node-c", p.h, true, opts...))
			}
			time.Sleep(time.Until(cut.Add(tc.down)))
			p.proxy.Restore()
			waitFor(t, 3*time.Second, "node-b's connection is back", b.nc.IsConnected)
			back := time.Now()
			up := waitActive4(t, 5*time.Second, nodes...)
			time.Sleep(T + C*testR)
			bl := blanks(p.writes, cut)
			stopNodes(nodes...)
			t.Logf("%s: node-b's takeover write rev %d; cut %v after it for %v (back %v after the cut); %s active, %d blanks since the cut",
				tc.name, took.rev, ms(cut.Sub(took.created)), tc.down, ms(back.Sub(cut)), up.name, len(bl))
			p.writes.logAll(t, cut)
			if tc.name == "long" && len(bl) > 0 {
				t.Error("node-b, cut off while it confirmed, blanked the key")
			}
			for _, n := range nodes {
				checkTakeovers(t, p.writes, n, T, C*testR)
			}
			if err := p.h.Check(); err != nil {
				t.Errorf("services overlapped: %v", err)
			}
		})
	}
}

// TestAttack7SupervisorTakeAcrossCut: TestAttack7RestartAtTakeover through
// a proxy, node-b's link cut by its Standby check before its takeover
// write and restored 90ms later (nats.go back 100–200ms after the cut,
// within node-b's validity of 250ms) or 300ms later (after it). Every
// Start must come T after another token's write and C·R after its first
// write (checkTakeovers); one agent must run the service within T + C·R +
// the cut + 2R (+0.5s) of node-a's last write; the services never
// overlap. What node-b did with a write that landed after its validity is
// logged.
func TestAttack7SupervisorTakeAcrossCut(t *testing.T) {
	const (
		C = 2
		T = testF * testR
	)
	for _, down := range []time.Duration{90 * time.Millisecond, 300 * time.Millisecond} {
		t.Run(down.String(), func(t *testing.T) {
			p := newProxied7(t)
			_, b, lastA, cut := faultAtTakeover(t, p.url, p.addr(), p.bucket, p.key, p.writes, p.h, p.proxy.Cut)
			time.Sleep(time.Until(cut.Add(down)))
			p.proxy.Restore()
			waitFor(t, 3*time.Second, "node-b's connection is back", b.nc.IsConnected)
			back := time.Now()
			waitFor(t, 5*time.Second, "node-b starts", b.running)
			st := b.getStarts()[0]
			stopNodes(b)
			t.Logf("cut %v after node-a's last write, back %v after the cut; node-b started %v after node-a's last write", ms(cut.Sub(lastA.created)), ms(back.Sub(cut)), ms(st.begin.Sub(lastA.created)))
			p.writes.logAll(t, back)
			for _, e := range eventsAfter(b, cut) {
				t.Logf("  node-b: %v", e)
			}
			if bound := T + C*testR + back.Sub(cut) + 2*testR + 500*time.Millisecond; st.begin.Sub(lastA.created) > bound {
				t.Errorf("node-b started %v after node-a's last write, later than T + C·R + the cut + 2R (+0.5s) = %v", ms(st.begin.Sub(lastA.created)), ms(bound))
			}
			checkTakeovers(t, p.writes, b, T, C*testR)
			if err := p.h.Check(); err != nil {
				t.Errorf("services overlapped: %v", err)
			}
		})
	}
}
