package tests

import (
	"context"
	"errors"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	"testing"
	"time"

	"github.com/latchkey-go/latchkey/lockotel"
	"github.com/latchkey-go/latchkey/locks"
	"github.com/latchkey-go/latchkey/locks/driver"
)

// A generous bound for what the backends promise within a TTL or a few
// renewal intervals (liveness, not a performance claim).
const within = 15 * time.Second

func testContext(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 2*within)
	t.Cleanup(cancel)
	return ctx
}

// checkRoundTrip has a hold a name that b then fails to take, and checks
// the spans and metrics of the three calls and of the lease's end.
func checkRoundTrip(t *testing.T, tl *telemetry, backendName string, a, b locks.Locker) {
	t.Helper()
	ctx := tl.traced(testContext(t))
	la := lockotel.WrapLocker(a, tl.opts()...)
	lb := lockotel.WrapLocker(b, tl.opts()...)
	defer la.StopEvents()
	defer lb.StopEvents()
	nm := unique("lockotel")
	lease, err := la.Lock(ctx, nm)
	if err != nil {
		t.Fatal(err)
	}
	inner := lease.(interface{ Unwrap() locks.Lease }).Unwrap()
	if got := tl.sum(t, "latchkey.leases.held", backend(backendName)); got != 1 {
		t.Errorf("leases held = %d, want 1", got)
	}
	if _, err := lb.TryLock(ctx, nm); !errors.Is(err, locks.ErrNotAcquired) {
		t.Fatalf("TryLock of a held name: %v", err)
	}
	if err := lease.Release(ctx); err != nil {
		t.Fatal(err)
	}
	// The wrapper passes the slot through (the contract's 0 for a
	// Locker's lease is the conformance suite's to check).
	slot := inner.(locks.SlotLease).Slot()
	if got := lease.(locks.SlotLease).Slot(); got != slot {
		t.Errorf("wrapped lease's slot %d, the backend's %d", got, slot)
	}
	checkAttrs(t, tl.lastSpan(t, "latchkey.lock"), backend(backendName), kind("lock"), name(nm),
		outcome("acquired"), lockotel.TokenKey.Int64(int64(inner.Token())), lockotel.SlotKey.Int(slot))
	checkAttrs(t, tl.lastSpan(t, "latchkey.trylock"), backend(backendName), name(nm), outcome("not_acquired"))
	checkAttrs(t, tl.lastSpan(t, "latchkey.release"), backend(backendName), name(nm), outcome("released"))
	if got := tl.sum(t, "latchkey.lock.acquisitions", backend(backendName), op("lock"), outcome("acquired")); got != 1 {
		t.Errorf("lock acquisitions = %d, want 1", got)
	}
	if got := tl.sum(t, "latchkey.lock.acquisitions", op("trylock"), outcome("not_acquired")); got != 1 {
		t.Errorf("trylock not_acquired = %d, want 1", got)
	}
	if n, s := tl.hist(t, "latchkey.lock.wait.duration", backend(backendName)); n != 2 || s <= 0 {
		t.Errorf("wait durations: %d totalling %vs, want 2 above 0", n, s)
	}
	if n, _ := tl.hist(t, "latchkey.lock.hold.duration", cause("released")); n != 1 {
		t.Errorf("hold durations released = %d, want 1", n)
	}
	if got := tl.sum(t, "latchkey.lease.ends", backend(backendName), cause("released")); got != 1 {
		t.Errorf("ends released = %d, want 1", got)
	}
	if got := tl.sum(t, "latchkey.leases.held"); got != 0 {
		t.Errorf("leases held after release = %d", got)
	}
}

// checkLost acquires name with acquire, has revoke take it away at the
// broker, and checks that the end is recorded with cause lost and that
// Release reports the loss on its span.
func checkLost(t *testing.T, tl *telemetry, nm string, acquire func(context.Context, string) (locks.Lease, error), revoke func()) {
	t.Helper()
	ctx := tl.traced(testContext(t))
	lease, err := acquire(ctx, nm)
	if err != nil {
		t.Fatal(err)
	}
	revoke()
	select {
	case <-lease.Context().Done():
	case <-time.After(within):
		t.Fatalf("lease not lost %v after its name was taken away", within)
	}
	eventually(t, within, "lease end with cause lost not recorded", func() bool {
		return tl.sum(t, "latchkey.lease.ends", name(nm), cause("lost")) == 1
	})
	if err := lease.Release(ctx); !errors.Is(err, locks.ErrLost) {
		t.Errorf("Release of a lost lease: %v", err)
	}
	checkAttrs(t, tl.lastSpan(t, "latchkey.release"), name(nm), outcome("lost"))
	if got := tl.sum(t, "latchkey.leases.held", name(nm)); got != 0 {
		t.Errorf("leases held after the loss = %d", got)
	}
}

// needEvents skips the test unless v reports the backend's events.
func needEvents(t *testing.T, backendName string, v any) {
	t.Helper()
	if _, ok := v.(driver.Observable); !ok {
		t.Skipf("%s's %T does not implement driver.Observable yet: the backends' move to the driver kit (issue 19) adds it", backendName, v)
	}
}

// waitForCount waits until the metric (a sum or a histogram's count)
// reaches at least want.
func waitForCount(t *testing.T, tl *telemetry, metric string, want int64) {
	t.Helper()
	eventually(t, within, metric+" not recorded", func() bool {
		m, ok := tl.metric(t, metric)
		if !ok {
			return false
		}
		if _, isHist := m.Data.(metricdata.Histogram[float64]); isHist {
			n, _ := tl.hist(t, metric)
			return int64(n) >= want
		}
		return tl.sum(t, metric) >= want
	})
}

func TestNATS(t *testing.T) {
	e := startNATS(t)
	t.Run("RoundTrip", func(t *testing.T) {
		a, _ := e.locker(t, "a")
		b, _ := e.locker(t, "b")
		checkRoundTrip(t, newTelemetry(t), "natsputex", a, b)
	})
	t.Run("Lost", func(t *testing.T) {
		tl := newTelemetry(t)
		inner, _ := e.locker(t, "lost")
		l := lockotel.WrapLocker(inner, tl.opts(lockotel.WithMetricNames())...)
		nm := unique("lost")
		checkLost(t, tl, nm, l.Lock, func() { e.revoke(t, nm) })
	})
	t.Run("Events", func(t *testing.T) {
		tl := newTelemetry(t)
		crashed, kill := e.locker(t, "crashed")
		inner, _ := e.locker(t, "taker")
		needEvents(t, "natsputex", inner)
		l := lockotel.WrapLocker(inner, tl.opts()...)
		defer l.StopEvents()
		nm := unique("takeover")
		if _, err := crashed.Lock(tl.traced(testContext(t)), nm); err != nil {
			t.Fatal(err)
		}
		kill()
		lease, err := l.Lock(tl.traced(testContext(t)), nm)
		if err != nil {
			t.Fatal(err)
		}
		defer lease.Release(context.Background())
		waitForCount(t, tl, "latchkey.takeovers", 1)
		waitForCount(t, tl, "latchkey.takeover.confirmation.duration", 1)
		waitForCount(t, tl, "latchkey.renew.duration", 1)
		t.Logf("lock span events: %v", tl.lastSpan(t, "latchkey.lock").Events())
	})
}

func TestAMQP(t *testing.T) {
	e := startAMQP(t)
	t.Run("RoundTrip", func(t *testing.T) {
		checkRoundTrip(t, newTelemetry(t), "amqpsem", e.locker(t), e.locker(t))
	})
	t.Run("Lost", func(t *testing.T) {
		tl := newTelemetry(t)
		inner := e.semaphore(t, 1)
		s := lockotel.WrapSemaphore(inner, tl.opts(lockotel.WithMetricNames())...)
		defer s.StopEvents()
		nm := unique("lost")
		e.destroyAtCleanup(t, nm)
		checkLost(t, tl, nm, s.Acquire, func() { e.revoke(t, nm) })
		checkAttrs(t, tl.lastSpan(t, "latchkey.acquire"), backend("amqpsem"), kind("semaphore"),
			outcome("acquired"), lockotel.SlotKey.Int(1))
		t.Run("Events", func(t *testing.T) {
			needEvents(t, "amqpsem", inner)
			waitForCount(t, tl, "latchkey.verify.failures", 1)
		})
	})
}

func TestRedis(t *testing.T) {
	e := startRedis(t)
	t.Run("RoundTrip", func(t *testing.T) {
		checkRoundTrip(t, newTelemetry(t), "redlockprio", e.locker(t, 0), e.locker(t, 0))
	})
	t.Run("Lost", func(t *testing.T) {
		tl := newTelemetry(t)
		l := lockotel.WrapLocker(e.locker(t, 0), tl.opts(lockotel.WithMetricNames())...)
		defer l.StopEvents()
		nm := unique("lost")
		checkLost(t, tl, nm, l.Lock, func() { e.revoke(t, nm) })
	})
	t.Run("Preempted", func(t *testing.T) {
		tl := newTelemetry(t)
		lowInner, highInner := e.locker(t, 0), e.locker(t, 1)
		low := lockotel.WrapLocker(lowInner, tl.opts()...)
		high := lockotel.WrapLocker(highInner, tl.opts()...)
		defer low.StopEvents()
		defer high.StopEvents()
		nm := unique("preempted")
		victim, err := low.Lock(tl.traced(testContext(t)), nm)
		if err != nil {
			t.Fatal(err)
		}
		thief, err := high.Lock(tl.traced(testContext(t)), nm)
		if err != nil {
			t.Fatal(err)
		}
		defer thief.Release(context.Background())
		select {
		case <-victim.Context().Done():
		case <-time.After(within):
			t.Fatal("victim's lease did not end")
		}
		if !errors.Is(context.Cause(victim.Context()), locks.ErrPreempted) {
			t.Fatalf("victim's cause: %v", context.Cause(victim.Context()))
		}
		eventually(t, within, "lease end with cause preempted not recorded", func() bool {
			return tl.sum(t, "latchkey.lease.ends", backend("redlockprio"), cause("preempted")) == 1
		})
		if got := tl.sum(t, "latchkey.leases.held"); got != 1 {
			t.Errorf("leases held = %d, want 1 (the thief's)", got)
		}
		t.Run("Events", func(t *testing.T) {
			needEvents(t, "redlockprio", highInner)
			waitForCount(t, tl, "latchkey.thefts", 1)
			waitForCount(t, tl, "latchkey.renew.duration", 1)
			t.Logf("thief's lock span events: %v", tl.lastSpan(t, "latchkey.lock").Events())
		})
	})
}
