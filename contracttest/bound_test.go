package contracttest

import (
	"errors"
	"runtime"
	"strings"
	"testing"
	"time"
)

// TestBoundLimitAndMessage: the limit is the documented bound plus the
// measured slack, and a failed check names all three.
func TestBoundLimitAndMessage(t *testing.T) {
	b := Bound{Documented: time.Second, RoundTrip: 10 * time.Millisecond, Scheduler: 20 * time.Millisecond}
	if got, want := b.Limit(), time.Second+20*time.Millisecond+80*time.Millisecond; got != want {
		t.Fatalf("Limit = %v, want %v", got, want)
	}
	if got := (Bound{Documented: time.Second}).Limit(); got != time.Second+50*time.Millisecond {
		t.Fatalf("Limit without slack = %v, want the 50ms floor", got)
	}
	for _, part := range []string{"documented 1s", "round trip 10ms", "scheduler 20ms"} {
		if !strings.Contains(b.String(), part) {
			t.Errorf("%q does not name %q", b.String(), part)
		}
	}
}

// TestMeasureBound measures real round trips and sleeps, and a failing
// round trip fails the test.
func TestMeasureBound(t *testing.T) {
	calls := 0
	b := MeasureBound(t, time.Second, func() error {
		calls++
		time.Sleep(2 * time.Millisecond)
		return nil
	})
	if calls != boundSamples || b.RoundTrip < 2*time.Millisecond || b.Scheduler < 0 {
		t.Fatalf("MeasureBound = %+v after %d round trips", b, calls)
	}
	ft := &fakeTB{TB: t}
	func() {
		defer func() { _ = recover() }()
		MeasureBound(ft, time.Second, func() error { return errors.New("broker down") })
	}()
	if !ft.failed {
		t.Fatal("a failing round trip did not fail the test")
	}
}

// TestBoundWatchWidensScheduler: a stall while the watched operation
// runs widens the scheduler's part of the slack, and only widens it.
func TestBoundWatchWidensScheduler(t *testing.T) {
	b := Bound{Documented: time.Second, Scheduler: time.Hour}
	b.Watch()()
	if b.Scheduler != time.Hour {
		t.Fatalf("Watch narrowed the measured scheduler delay to %v", b.Scheduler)
	}
	// With one P kept busy, the watcher's 1ms sleeps end only when the
	// busy goroutine is preempted, some 10ms later: a stall of the process
	// as the machine's load or the garbage collector makes.
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	b = Bound{Documented: time.Second}
	stop := b.Watch()
	for start := time.Now(); time.Since(start) < 50*time.Millisecond; {
	}
	stop()
	if b.Scheduler < 2*time.Millisecond {
		t.Errorf("Watch saw a scheduler delay of %v through 50ms of one busy P", b.Scheduler)
	}
}

// fakeTB records a Fatalf instead of ending the test.
type fakeTB struct {
	testing.TB
	failed bool
}

func (f *fakeTB) Helper() {}
func (f *fakeTB) Fatalf(string, ...any) {
	f.failed = true
	panic("fatal")
}

// TestWatchedBoundWidensUntilCleanup: a WatchedBound's scheduler slack
// grows with a stall that comes after it was made, before any Check.
func TestWatchedBoundWidensUntilCleanup(t *testing.T) {
	w := Bound{Documented: time.Second}.Watched(t)
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	for start := time.Now(); time.Since(start) < 50*time.Millisecond; {
	}
	time.Sleep(5 * time.Millisecond) // let the watcher record its overshoot
	if s := w.Bound().Scheduler; s < 2*time.Millisecond {
		t.Errorf("the watched bound saw a scheduler delay of %v through 50ms of one busy P", s)
	}
	if got := w.With(time.Minute); got.Documented != time.Minute || got.Scheduler < 2*time.Millisecond {
		t.Errorf("With gave %v, want the documented minute and the slack so far", got)
	}
}
