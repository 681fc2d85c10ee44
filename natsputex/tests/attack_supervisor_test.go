package natsputex_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/latchkey-go/latchkey/contracttest"
	"github.com/latchkey-go/latchkey/locks"
	"github.com/latchkey-go/latchkey/natsputex"
)

// TestAttackSlowFailingHealthCheck: the active node-a's health check
// becomes slow and then fails (or hangs until its context ends at T). Its
// Stop takes 220ms, less than the margin + C·R = 250ms the docs give Stop
// "at least" (R = 100ms, F = 3, C = 2, margin R/2): "A Supervisor cut off
// from NATS begins Service.Stop at that same moment [last write + T −
// margin] ... The same bound holds whenever the agent stops its service
// itself (a failed health check or write, or shutdown)", and "An active
// agent that has not renewed for T minus the safety margin begins to stop
// its service by itself". node-b must not start before node-a's Stop has
// returned.
func TestAttackSlowFailingHealthCheck(t *testing.T) {
	const C = 2
	for _, hc := range []time.Duration{180 * time.Millisecond, 280 * time.Millisecond, time.Second} {
		t.Run(hc.String(), func(t *testing.T) {
			url, bucket, key := supervisorEnv(t)
			h := contracttest.NewHistory(1)
			a := startAgentWith(t, url, bucket, key, "node-a", "node-a", h, nil, natsputex.WithConfirmations(C))
			waitFor(t, 5*time.Second, "node-a starts its service", a.running)
			b := startAgentWith(t, url, bucket, key, "node-b", "node-b", h, nil, natsputex.WithConfirmations(C))
			time.Sleep(3 * testR)
			a.stopDelay.Store(int64(220 * time.Millisecond))
			a.hcDelay.Store(int64(hc))
			a.failHC.Store(true)
			waitFor(t, (testF+C+2)*testR+3*time.Second, "node-b starts its service", b.running)
			a.mu.Lock()
			stopped := append([]time.Time(nil), a.stopped...)
			a.mu.Unlock()
			if len(stopped) > 0 {
				t.Logf("health check %v: node-a's service stopped %v before node-b's started", hc, b.lastStart().Sub(stopped[len(stopped)-1]).Round(time.Millisecond))
			} else {
				t.Logf("health check %v: node-a's service has not stopped when node-b's started", hc)
			}
			a.stop()
			b.stop()
			if err := h.Check(); err != nil {
				t.Errorf("services overlapped: %v", err)
			}
		})
	}
}

// TestAttackShutdownSlowStop: node-a is shut down (Run's context ends) at
// various points of its stroke while its Stop takes 360ms, less than the
// "about T − R + C·R" (400ms with R = 100ms, F = 3, C = 2) the docs give
// Stop on shutdown; Stop's context must not end before T + C·R, and
// node-b must not start before node-a's Stop has returned.
func TestAttackShutdownSlowStop(t *testing.T) {
	const C = 2
	for _, off := range []time.Duration{0, 30 * time.Millisecond, 60 * time.Millisecond, 90 * time.Millisecond} {
		t.Run(off.String(), func(t *testing.T) {
			url, bucket, key := supervisorEnv(t)
			writes := watchWrites(t, url, bucket, key)
			h := contracttest.NewHistory(1)
			a := startAgentWith(t, url, bucket, key, "node-a", "node-a", h, nil, natsputex.WithConfirmations(C))
			waitFor(t, 5*time.Second, "node-a starts its service", a.running)
			b := startAgentWith(t, url, bucket, key, "node-b", "node-b", h, nil, natsputex.WithConfirmations(C))
			time.Sleep(3 * testR)
			a.stopHonoursCtx.Store(true)
			a.stopDelay.Store(int64(360 * time.Millisecond))
			// Shut node-a down off after one of its writes.
			writes.mu.Lock()
			n := len(writes.writes)
			writes.mu.Unlock()
			waitFor(t, time.Second, "node-a renews", func() bool {
				writes.mu.Lock()
				defer writes.mu.Unlock()
				return len(writes.writes) > n
			})
			time.Sleep(off)
			go a.stop()
			waitFor(t, (testF+C+2)*testR+3*time.Second, "node-b starts its service", b.running)
			time.Sleep(100 * time.Millisecond)
			a.mu.Lock()
			stopped := append([]time.Time(nil), a.stopped...)
			a.mu.Unlock()
			if len(stopped) > 0 {
				t.Logf("shut down %v after a renewal: node-a's service stopped %v before node-b's started; Stops cut short: %d",
					off, b.lastStart().Sub(stopped[len(stopped)-1]).Round(time.Millisecond), a.stopsCut.Load())
			}
			if a.stopsCut.Load() > 0 {
				t.Errorf("node-a's Stop of 360ms was cut short, though its context ends after T + C·R = %v", testF*testR+C*testR)
			}
			b.stop()
			if err := h.Check(); err != nil {
				t.Errorf("services overlapped: %v", err)
			}
		})
	}
}

// TestAttackLostTakeoverReplySupervisor: node-b, standby on a connection
// through a proxy, takes over from the killed node-a; the answer to its
// takeover write, and only to it, is lost (the proxy drops what comes
// back for dropFor, then closes the connection; nats.go reconnects and,
// without ReconnectBufSize(-1), may send writes buffered meanwhile
// late). node-c, a third agent on a direct link, races it. "it starts the
// service only after C·R of its own writes that it saw succeed, on every
// path": no service starts less than C·R after its agent's first write of
// the hold, and no two run at once.
func TestAttackLostTakeoverReplySupervisor(t *testing.T) {
	const C = 4
	for _, tc := range []struct {
		dropFor time.Duration
		racer   bool
	}{{30 * time.Millisecond, false}, {250 * time.Millisecond, false}, {30 * time.Millisecond, true}} {
		dropFor := tc.dropFor
		t.Run(fmt.Sprintf("%v/racer=%t", dropFor, tc.racer), func(t *testing.T) {
			url, bucket, key := supervisorEnv(t)
			writes := watchWrites(t, url, bucket, key)
			proxy := newTriggerProxy(t, strings.TrimPrefix(url, "nats://"), "PUB $KV."+bucket+"."+key+" ", dropFor)
			h := contracttest.NewHistory(1)
			a := startAgentWith(t, url, bucket, key, "node-a", "node-a", h, nil, natsputex.WithConfirmations(C))
			waitFor(t, 5*time.Second, "node-a starts its service", a.running)
			b := startAgentWith(t, "nats://"+proxy.Addr(), bucket, key, "node-b", "node-b", h, nil, natsputex.WithConfirmations(C))
			agents := []*agent{b}
			if tc.racer {
				agents = append(agents, startAgentWith(t, url, bucket, key, "node-c", "node-c", h, nil, natsputex.WithConfirmations(C)))
			}
			time.Sleep(3 * testR)
			proxy.armed.Store(true)
			a.kill()
			select {
			case <-proxy.fired:
			case <-time.After(3 * time.Second):
				t.Log("node-b never wrote the key (node-c won)")
			}
			active := waitActive(t, (testF+C+4)*testR+3*time.Second, agents...)
			time.Sleep(500 * time.Millisecond)
			first, _ := writes.firstBy(active.name)
			after := active.lastStart().Sub(first.created)
			t.Logf("%s started its service %v after its first write of the key (rev %d); C·R = %v", active.name, after.Round(time.Millisecond), first.rev, C*testR)
			for _, ag := range agents {
				ag.mu.Lock()
				st := append([]time.Time(nil), ag.started...)
				ag.mu.Unlock()
				w, ok := writes.firstBy(ag.name)
				for _, s := range st {
					if ok && s.Sub(w.created) < C*testR {
						t.Errorf("%s started its service %v after its first write, before C·R = %v", ag.name, s.Sub(w.created).Round(time.Millisecond), C*testR)
					}
				}
			}
			for _, ag := range agents {
				ag.stop()
			}
			if err := h.Check(); err != nil {
				t.Errorf("services overlapped: %v", err)
			}
		})
	}
}

// TestAttackStopAndStartContexts: "Stop's context ends after T + C·R,
// never sooner" (Service.Stop: "Its context ends after T + C·R"), on
// every call: when Run begins, after a failed health check, and when Run
// returns; and "Start's context ends when the agent's hold would run
// out": no later than T − margin after Start is called.
func TestAttackStopAndStartContexts(t *testing.T) {
	const C = 3
	url, bucket, key := supervisorEnv(t)
	var failHC atomicBool
	c := newTestClient(t, url, bucket, natsputex.WithConfirmations(C),
		natsputex.WithHealthCheck(func(ctx context.Context, s natsputex.State) error {
			if failHC.get() && s == natsputex.Active {
				return errors.New("unhealthy (test)")
			}
			return nil
		}))
	type call struct {
		what string
		left time.Duration // deadline − call time; -1: none
	}
	var mu sync.Mutex
	var calls []call
	record := func(what string, ctx context.Context) {
		left := time.Duration(-1)
		if d, ok := ctx.Deadline(); ok {
			left = time.Until(d)
		}
		mu.Lock()
		calls = append(calls, call{what, left})
		mu.Unlock()
	}
	sup, err := c.Supervisor(key, "node-a", natsputex.Service{
		Start: func(ctx context.Context, _ uint64) error { record("start", ctx); return nil },
		Stop:  func(ctx context.Context) error { record("stop", ctx); return nil },
	})
	if err != nil {
		t.Fatal(err)
	}
	stop := runSupervisor(t, sup)
	waitFor(t, 5*time.Second, "node-a becomes active", func() bool { return sup.Phase() == natsputex.PhaseActive })
	time.Sleep(2 * testR)
	failHC.set()
	waitFor(t, 5*time.Second, "node-a stops after its failed check", func() bool { return sup.Phase() != natsputex.PhaseActive })
	time.Sleep(2 * testR)
	_ = stop()
	T := c.TTL()
	mu.Lock()
	defer mu.Unlock()
	for _, cl := range calls {
		t.Logf("%s: context ends %v after the call", cl.what, cl.left.Round(time.Microsecond))
		switch cl.what {
		case "stop":
			if cl.left >= 0 && cl.left < T+C*testR-5*time.Millisecond {
				t.Errorf("a Stop's context ends %v after the call, sooner than T + C·R = %v", cl.left.Round(time.Millisecond), T+C*testR)
			}
		case "start":
			if cl.left < 0 || cl.left > T-testR/2 {
				t.Errorf("Start's context ends %v after the call, later than the hold (T − margin = %v)", cl.left.Round(time.Millisecond), T-testR/2)
			}
		}
	}
}

// TestAttackClientCloseUnderSupervisor: "Run pumps until ctx ends or the
// client closes. Then it stops the service, blanks the key if it still
// holds the agent's last write (so another agent takes over at once ...)
// and returns an error matching ctx.Err() (or locks.ErrClosed)". node-a's
// Client is closed while its Supervisor is active: Run returns ErrClosed
// after Stop, and node-b starts well before T + C·R, after node-a's Stop.
// Then Run on the same Supervisor fails, and a second Run while one runs
// fails at once.
func TestAttackClientCloseUnderSupervisor(t *testing.T) {
	const C = 3
	url, bucket, key := supervisorEnv(t)
	h := contracttest.NewHistory(1)
	ca := newTestClient(t, url, bucket, natsputex.WithConfirmations(C))
	var mu sync.Mutex
	var exit func()
	var stoppedAt time.Time
	supA, err := ca.Supervisor(key, "node-a", natsputex.Service{
		Start: func(context.Context, uint64) error {
			mu.Lock()
			defer mu.Unlock()
			if exit == nil {
				exit = h.Enter("node-a", 0)
			}
			return nil
		},
		Stop: func(context.Context) error {
			time.Sleep(50 * time.Millisecond)
			mu.Lock()
			defer mu.Unlock()
			if exit != nil {
				exit()
				exit = nil
				stoppedAt = time.Now()
			}
			return nil
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- supA.Run(context.Background()) }()
	waitFor(t, 5*time.Second, "node-a becomes active", func() bool { return supA.Phase() == natsputex.PhaseActive })
	if err := supA.Run(context.Background()); err == nil {
		t.Error("a second Run while one runs returned nil")
	}
	b := startAgentWith(t, url, bucket, key, "node-b", "node-b", h, nil, natsputex.WithConfirmations(C))
	time.Sleep(3 * testR)
	closed := time.Now()
	_ = ca.Close(context.Background())
	var runErr error
	select {
	case runErr = <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("Run did not return after its client closed")
	}
	t.Logf("Run returned %v after Close: %v; phase %v", time.Since(closed).Round(time.Millisecond), runErr, supA.Phase())
	if !errors.Is(runErr, locks.ErrClosed) {
		t.Errorf("Run's error %v does not match locks.ErrClosed", runErr)
	}
	if supA.Phase() != natsputex.PhaseStopped {
		t.Errorf("phase after Run returned: %v, want stopped", supA.Phase())
	}
	waitFor(t, 5*time.Second, "node-b starts its service", b.running)
	took := b.lastStart().Sub(closed)
	mu.Lock()
	st := stoppedAt
	mu.Unlock()
	t.Logf("node-b started %v after node-a's client closed (T + C·R = %v); node-a's Stop returned %v after the close", took.Round(time.Millisecond), testF*testR+C*testR, st.Sub(closed).Round(time.Millisecond))
	if took >= testF*testR {
		t.Errorf("node-b started %v after node-a's client closed: node-a did not blank the key (T = %v)", took.Round(time.Millisecond), testF*testR)
	}
	b.stop()
	if err := h.Check(); err != nil {
		t.Errorf("services overlapped: %v", err)
	}
}
