package contracttest

import (
	"fmt"
	"sync/atomic"
	"testing"
	"time"
)

// A Bound is a liveness bound a test checks: the bound the backend
// documents, plus slack measured when the test starts, so that a loaded
// machine widens the bound by what it costs and no more. Every check
// prints all three parts when it fails.
type Bound struct {
	Documented time.Duration // what the package doc promises
	RoundTrip  time.Duration // the slowest of a few round trips to the broker
	Scheduler  time.Duration // the longest a 1ms sleep overshot, when measured and while a watched operation ran
}

// boundSamples is how many round trips and sleeps a measurement takes.
const boundSamples = 8

// MeasureBound measures the slack of a bound on documented now: the
// slowest of a few calls of roundTrip (one request to the broker and its
// answer; nil measures none) and the longest overshoot of a 1ms sleep. A
// failing round trip fails the test.
func MeasureBound(t testing.TB, documented time.Duration, roundTrip func() error) Bound {
	t.Helper()
	b := Bound{Documented: documented}
	for range boundSamples {
		start := time.Now()
		time.Sleep(time.Millisecond)
		b.Scheduler = max(b.Scheduler, time.Since(start)-time.Millisecond)
		if roundTrip == nil {
			continue
		}
		start = time.Now()
		if err := roundTrip(); err != nil {
			t.Fatalf("measuring the broker's round trip: %v", err)
		}
		b.RoundTrip = max(b.RoundTrip, time.Since(start))
	}
	return b
}

// Watch measures the scheduler's delay while an operation runs, from
// now until the returned stop is called, and widens b.Scheduler to the
// longest a 1ms sleep overshot meanwhile: a stall of a loaded machine
// (the operating system or the garbage collector not running the
// process) that came after MeasureBound delays the operation and the
// watcher alike. Call stop once, before Check; it returns when the
// watcher has ended.
func (b *Bound) Watch() (stop func()) {
	var longest time.Duration
	end := watchStalls(func(d time.Duration) { longest = max(longest, d) })
	return func() {
		end()
		b.Scheduler = max(b.Scheduler, longest)
	}
}

// watchStalls passes how long each 1ms sleep overshot to seen, from a
// goroutine of its own, until stop, which returns once it has ended.
func watchStalls(seen func(time.Duration)) (stop func()) {
	done := make(chan struct{})
	ended := make(chan struct{})
	go func() {
		defer close(ended)
		for {
			select {
			case <-done:
				return
			default:
			}
			start := time.Now()
			time.Sleep(time.Millisecond)
			seen(time.Since(start) - time.Millisecond)
		}
	}()
	return func() { close(done); <-ended }
}

// Limit is the bound with its slack: the documented bound, two round
// trips (the request that ends the wait and the one that sees it) and
// four times the scheduler's delay, for the goroutines a hand-over
// passes through, or 50ms if that is more.
func (b Bound) Limit() time.Duration {
	return b.Documented + 2*b.RoundTrip + max(4*b.Scheduler, 50*time.Millisecond)
}

// Check fails the test when took is over the limit, naming what took
// that long.
func (b Bound) Check(t testing.TB, what string, took time.Duration) {
	t.Helper()
	if took > b.Limit() {
		t.Errorf("%s took %v, over %v", what, took, b)
	}
}

// String names the limit and its parts.
func (b Bound) String() string {
	return fmt.Sprintf("%v (documented %v + round trip %v ×2 + scheduler %v ×4, at least 50ms)",
		b.Limit(), b.Documented, b.RoundTrip, b.Scheduler)
}

// A WatchedBound is a Bound whose scheduler slack keeps growing, from its
// making until the test ends, to the longest a 1ms sleep has overshot
// meanwhile (as [Bound.Watch] measures it for one operation): for tests
// that check several waits, or whose wait spans set-up steps. Make one
// with [Bound.Watched]; its methods are safe to call from any goroutine.
type WatchedBound struct {
	base    Bound
	longest atomic.Int64 // nanoseconds
}

// Watched starts watching the scheduler for b until t's cleanup.
func (b Bound) Watched(t testing.TB) *WatchedBound {
	w := &WatchedBound{base: b}
	t.Cleanup(watchStalls(func(d time.Duration) {
		if int64(d) > w.longest.Load() {
			w.longest.Store(int64(d)) // the watcher is the one writer
		}
	}))
	return w
}

// Bound returns the bound with the scheduler's delay seen so far.
func (w *WatchedBound) Bound() Bound {
	b := w.base
	b.Scheduler = max(b.Scheduler, time.Duration(w.longest.Load()))
	return b
}

// With returns the bound of another documented wait with the same slack
// so far.
func (w *WatchedBound) With(documented time.Duration) Bound {
	b := w.Bound()
	b.Documented = documented
	return b
}

// Check is [Bound.Check] with the scheduler's delay seen so far.
func (w *WatchedBound) Check(t testing.TB, what string, took time.Duration) {
	t.Helper()
	w.Bound().Check(t, what, took)
}
