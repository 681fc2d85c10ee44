// Package flakes counts how often each test passes and fails in the JSON
// stream of `go test -json -count=N`, and keeps the machine busy while the
// tests run, so that a timing bound that holds only on an idle machine
// shows up as a failure rate. It backs `go run mage.go flakes PATTERN`.
package flakes

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
)

// A Rate is one test's outcomes over the runs.
type Rate struct {
	Test          string // package: name (subtests count under their own names)
	Runs, Failed  int
	Skipped       int
	FirstFailLine string // the first output line of a failed run that says why
}

// String reads as "locks/driver: TestLeaseReleaseOnce: 2 of 20 failed (10%)".
func (r Rate) String() string {
	s := fmt.Sprintf("%s: %d of %d failed (%.0f%%)", r.Test, r.Failed, r.Runs, 100*float64(r.Failed)/float64(max(r.Runs, 1)))
	if r.Skipped > 0 {
		s += fmt.Sprintf(", %d skipped", r.Skipped)
	}
	if r.FirstFailLine != "" {
		s += ": " + r.FirstFailLine
	}
	return s
}

// event is one line of test2json's output.
type event struct {
	Action, Package, Test, Output string
}

// Count reads a `go test -json` stream and returns each test's rate,
// sorted by failure rate, highest first. Lines that are not JSON (the go
// command's own messages) are skipped.
func Count(r io.Reader) ([]Rate, error) {
	rates := map[string]*Rate{}
	lastOut := map[string]string{} // test → its last output line that looks like a reason
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<20), 1<<24)
	for sc.Scan() {
		var e event
		if json.Unmarshal(sc.Bytes(), &e) != nil || e.Test == "" {
			continue
		}
		key := e.Package + ": " + e.Test
		rt := rates[key]
		if rt == nil {
			rt = &Rate{Test: key}
			rates[key] = rt
		}
		switch e.Action {
		case "output":
			if line := strings.TrimSpace(e.Output); line != "" && !strings.HasPrefix(line, "===") && !strings.HasPrefix(line, "---") {
				lastOut[key] = line
			}
		case "pass":
			rt.Runs++
		case "skip":
			rt.Runs++
			rt.Skipped++
		case "fail":
			rt.Runs++
			rt.Failed++
			if rt.FirstFailLine == "" {
				rt.FirstFailLine = lastOut[key]
			}
		}
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	out := make([]Rate, 0, len(rates))
	for _, r := range rates {
		out = append(out, *r)
	}
	slices.SortFunc(out, func(a, b Rate) int {
		fa, fb := float64(a.Failed)/float64(max(a.Runs, 1)), float64(b.Failed)/float64(max(b.Runs, 1))
		switch {
		case fa > fb:
			return -1
		case fa < fb:
			return 1
		}
		return strings.Compare(a.Test, b.Test)
	})
	return out, nil
}

// Hog keeps n goroutines spinning on the CPU (n < 1: one per CPU) until
// the returned stop is called; stop waits for them.
func Hog(n int) (stop func()) {
	if n < 1 {
		n = runtime.NumCPU()
	}
	var quit atomic.Bool
	var wg sync.WaitGroup
	for range n {
		wg.Go(func() {
			x := uint64(1)
			for !quit.Load() {
				for range 1 << 16 {
					x = x*6364136223846793005 + 1442695040888963407
				}
			}
			_ = x
		})
	}
	return func() { quit.Store(true); wg.Wait() }
}
