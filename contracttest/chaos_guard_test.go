package contracttest

import (
	"strings"
	"testing"
	"time"
)

// guardedChaos is a short memlock run with crashes only (each crash of
// a holder leaves a write in flight that lands after its successor
// wrote), writing through store.
func guardedChaos(t *testing.T, defect string) (*chaosRun, ChaosSummary) {
	r := newChaosRun(t, newMemHarness, ChaosConfig{
		Duration: 2 * time.Second, FaultEvery: 50 * time.Millisecond, Names: 2,
		Faults: []string{FaultCrash}, Guard: newMemStore(defect),
	})
	r.run()
	s := r.check()
	r.close()
	t.Logf("chaos summary: %v", s)
	return r, s
}

// TestChaosGuardedWrites: a chaos run on memlock writing through a
// guard: crashed holders' late writes are refused, none lands, and each
// name's data is the newest holder's.
func TestChaosGuardedWrites(t *testing.T) {
	_, s := guardedChaos(t, "")
	for _, v := range s.Violations {
		t.Errorf("violation (seed %d): %s", s.Seed, v)
	}
	if s.StaleLanded != 0 {
		t.Errorf("%d stale writes landed through a correct guard", s.StaleLanded)
	}
	if s.GuardedWrites == 0 || s.GuardRefused == 0 || s.LateWrites == 0 {
		t.Errorf("the run wrote too little through the guard to mean anything: %v", s)
	}
}

// TestChaosCatchesStaleWritesLanding: with a guard that checks tokens
// but never raises its fence, the late writes of crashed holders land,
// and the run reports each as a violation.
func TestChaosCatchesStaleWritesLanding(t *testing.T) {
	_, s := guardedChaos(t, "no-raise")
	if s.StaleLanded == 0 {
		t.Fatalf("no stale write landed through a guard that never raises its fence: %v", s)
	}
	for _, v := range s.Violations {
		if strings.Contains(v, "stale writes landed through the guard") {
			t.Logf("caught: %.300s", v)
			return
		}
	}
	t.Errorf("%d stale writes landed, but no violation says so: %q", s.StaleLanded, s.Violations)
}

// TestStaleLandedCounts: the check counts a write taken after one with a
// greater token had returned, and not one that overlapped it.
func TestStaleLandedCounts(t *testing.T) {
	w := func(token uint64, call, ret time.Duration) guardWrite {
		return guardWrite{who: "c", token: token, call: call, ret: ret, accepted: true}
	}
	for _, tc := range []struct {
		name string
		ws   []guardWrite
		want int
	}{
		{"increasing", []guardWrite{w(1, 0, 1), w(2, 2, 3), w(2, 4, 5)}, 0},
		{"overlapping", []guardWrite{w(2, 0, 5), w(1, 1, 6)}, 0},
		{"after", []guardWrite{w(2, 0, 1), w(1, 2, 3), w(1, 4, 5)}, 2},
	} {
		if n, first := staleLanded(tc.ws); n != tc.want {
			t.Errorf("%s: %d stale writes landed (%s), want %d", tc.name, n, first, tc.want)
		}
	}
}
