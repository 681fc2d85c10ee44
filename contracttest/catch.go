package contracttest

import (
	"fmt"
	"runtime"
	"sync"
	"testing"
)

// RunDefectTests runs, for each [Defect], the conformance tests that must
// catch it ([Defect.CaughtBy]) against nh with the defect put in
// ([Defective]), each as a subtest "DEFECT/TEST" that fails unless the
// conformance test fails. A conformance test that skips (the harness
// lacks what it needs, such as a [ProcessHarness] for PausedHolder)
// skips its subtest, saying why. It shows that the suite's checks can
// fail on the backend's real broker, where the suite's own tests (on
// memlock) cannot go.
func RunDefectTests(t *testing.T, nh NewHarness) {
	t.Helper()
	for _, d := range Defects() {
		t.Run(string(d), func(t *testing.T) {
			for _, name := range d.CaughtBy() {
				t.Run(name, func(t *testing.T) {
					r := runRecorded(t, findTest(name), Defective(nh, d))
					switch {
					case r.skipped != "":
						t.Skipf("%s skipped on this harness: %s", name, r.skipped)
					case !r.Failed():
						t.Errorf("%s passed: it did not catch %s", name, d)
					default:
						t.Logf("%s caught it: %.300s", name, r.failures[0])
					}
				})
			}
		})
	}
}

// MustCatch runs each named conformance test (as listed by
// [RunConformanceTests], such as "PausedHolder") against nh, which should
// be a [Defective] harness, and fails t unless every one of them fails.
// A test that skips counts as not catching.
func MustCatch(t *testing.T, nh NewHarness, tests ...string) {
	t.Helper()
	for _, name := range tests {
		t.Run(name, func(t *testing.T) {
			run := findTest(name)
			if run == nil {
				t.Fatalf("no conformance test %q", name)
			}
			r := runRecorded(t, run, nh)
			switch {
			case r.skipped != "":
				t.Errorf("%s skipped instead of failing: %s", name, r.skipped)
			case !r.Failed():
				t.Errorf("%s passed: it did not catch the defect", name)
			default:
				t.Logf("%s caught it: %.300s", name, r.failures[0])
			}
		})
	}
}

// findTest returns the conformance test called name, or nil.
func findTest(name string) func(testing.TB, NewHarness) {
	for _, tc := range conformanceTests {
		if tc.name == name {
			return tc.run
		}
	}
	return nil
}

// recorder is a testing.TB that records failures instead of failing the
// real test, so the suite can be run against a broken backend and be seen
// to catch it. Fatal and Skip end the calling goroutine, as testing does.
type recorder struct {
	testing.TB // the real test: Name, Helper, Cleanup, TempDir...
	mu         sync.Mutex
	failures   []string
	skipped    string
}

func (r *recorder) Errorf(format string, args ...any) { r.record(fmt.Sprintf(format, args...)) }
func (r *recorder) Error(args ...any)                 { r.record(fmt.Sprint(args...)) }
func (r *recorder) Fatalf(format string, args ...any) { r.Errorf(format, args...); runtime.Goexit() }
func (r *recorder) Fatal(args ...any)                 { r.Error(args...); runtime.Goexit() }
func (r *recorder) Fail()                             { r.record("Fail") }
func (r *recorder) FailNow()                          { r.record("FailNow"); runtime.Goexit() }
func (r *recorder) Skipf(format string, args ...any)  { r.skip(fmt.Sprintf(format, args...)) }
func (r *recorder) Skip(args ...any)                  { r.skip(fmt.Sprint(args...)) }
func (r *recorder) SkipNow()                          { r.skip("SkipNow") }
func (r *recorder) Logf(format string, args ...any)   {}
func (r *recorder) Log(args ...any)                   {}
func (r *recorder) Failed() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.failures) > 0
}

func (r *recorder) record(msg string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.failures = append(r.failures, msg)
}

func (r *recorder) skip(msg string) {
	r.mu.Lock()
	r.skipped = msg
	r.mu.Unlock()
	runtime.Goexit()
}

// runRecorded runs one suite test against nh on a recorder and returns it.
func runRecorded(t testing.TB, test func(testing.TB, NewHarness), nh NewHarness) *recorder {
	r := &recorder{TB: t}
	done := make(chan struct{})
	go func() {
		defer close(done)
		test(r, nh)
	}()
	<-done
	return r
}
