//go:build mage

package main

import (
	"cmp"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/magefile/mage/mg"

	"github.com/latchkey-go/latchkey/magefiles/internal/parallel"
)

const (
	testTimeout       = "20m" // per module: go test -timeout
	defaultTestJobs   = 4     // go test runs at once: see testModules
	defaultTestSplit  = 2     // runs a module of many tests is split into
	splitMinTests     = 50    // the tests a module needs to be split
	testProgressEvery = 2 * time.Minute
	defaultFuzzTime   = "3s"
)

// Test runs go test -race on every workspace module, $LATCHKEY_TEST_JOBS (4) runs at a time, the largest modules in $LATCHKEY_TEST_SPLIT (2) runs each, with $TESTFLAGS.
func Test() error {
	extra, err := envArgs("TESTFLAGS")
	if err != nil {
		return err
	}
	if isCI() {
		fmt.Println("CI is set: a test that finds no broker fails instead of skipping")
	}
	printBrokerVersions()
	return testModules("go test", append([]string{"-race", "-count=1", "-timeout=" + testTimeout}, extra...))
}

// TestShort runs go test -short -race on every module ($LATCHKEY_TEST_JOBS at a time), then each fuzz target for $FUZZTIME (3s).
func TestShort() error {
	extra, err := envArgs("TESTFLAGS")
	if err != nil {
		return err
	}
	fuzzTime := os.Getenv("FUZZTIME")
	if fuzzTime == "" {
		fuzzTime = defaultFuzzTime
	}
	short := testModules("go test -short", append([]string{"-short", "-race", "-count=1", "-timeout=" + testTimeout}, extra...))
	// Fuzz even when a test failed: one run reports both.
	fuzz := eachModule("fuzz", nil, func(m module) error {
		targets, err := fuzzTargets(m)
		if err != nil {
			return err
		}
		var errs []error
		for _, t := range targets {
			// -fuzz takes one package and one target at a time.
			err := run("go", m.goC("test", "-run=^$", "-fuzz=^"+t.name+"$", "-fuzztime="+fuzzTime, t.pkg)...)
			errs = append(errs, err)
		}
		return errors.Join(errs...)
	})
	return errors.Join(short, fuzz)
}

// testModules runs `go test <flags> ./...` in every module that has
// packages, $LATCHKEY_TEST_JOBS runs at a time, the modules with the most
// test code first, and prints each run's output whole when it ends, then a
// summary naming every failed module and test. A failed module does not
// stop the others. A one-package module with many tests runs as
// $LATCHKEY_TEST_SPLIT runs of a share of its tests each (unless flags
// choose tests with -run): its tests mostly wait on timers, and one such
// module alone would otherwise set the wall time.
func testModules(what string, flags []string) error {
	limit, err := envInt("LATCHKEY_TEST_JOBS", defaultTestJobs)
	if err != nil {
		return err
	}
	split, err := envInt("LATCHKEY_TEST_SPLIT", defaultTestSplit)
	if err != nil {
		return err
	}
	if limit < 1 || split < 1 {
		return fmt.Errorf("LATCHKEY_TEST_JOBS=%d, LATCHKEY_TEST_SPLIT=%d: want at least 1 each", limit, split)
	}
	if choosesTests(flags) {
		split = 1
	}
	mods, err := modules()
	if err != nil {
		return err
	}
	var jobs []parallel.Job
	var unlisted []string // modules whose packages go list could not list
	for _, m := range mods {
		tests, err := listTests(m)
		switch {
		case err != nil:
			unlisted = append(unlisted, fmt.Sprintf("%s: %v", m.dir, err))
		case tests.packages == 0:
			if mg.Verbose() {
				fmt.Printf("%s: no packages, skipped\n", m.dir)
			}
		case tests.packages > 1 || len(tests.names) < splitMinTests || split == 1 || unsplit[filepath.ToSlash(filepath.Clean(m.dir))]:
			args := m.goC(append(append([]string{"test"}, flags...), "./...")...)
			jobs = append(jobs, parallel.Job{Name: m.dir, Cmd: "go", Args: args, Weight: tests.weight})
		default:
			patterns := parallel.Shards(tests.names, split)
			for i, run := range patterns {
				args := m.goC(append(append([]string{"test"}, flags...), "-run="+run, "./...")...)
				name := fmt.Sprintf("%s [%d/%d]", m.dir, i+1, len(patterns))
				jobs = append(jobs, parallel.Job{Name: name, Cmd: "go", Args: args, Weight: tests.weight / int64(len(patterns))})
			}
		}
	}
	fmt.Printf("%s: %d runs, %d at a time (LATCHKEY_TEST_JOBS), modules of %d tests or more split in %d (LATCHKEY_TEST_SPLIT), the most test code first; each run's output shows when it ends\n",
		what, len(jobs), limit, splitMinTests, split)
	start := time.Now()
	results := parallel.Runner{
		Limit: limit,
		Out:   os.Stdout,
		Every: testProgressEvery,
		Line:  func(j parallel.Job) string { return cmdline(j.Cmd, j.Args) },
	}.Run(jobs)
	return testSummary(os.Stdout, what, results, unlisted, limit, time.Since(start))
}

// unsplit are the modules testModules never splits: amqpsem/tests share
// the one RabbitMQ on 127.0.0.1:5672, and two runs of its Status scans of
// 65535 slots at once, on a machine at load 14, kept the broker from
// answering heartbeats of 1s (connections closed on i/o timeouts, leases
// lost); whole, the module ran beside the others without failing.
var unsplit = map[string]bool{"amqpsem/tests": true}

// choosesTests reports whether go test flags choose tests by name, which
// a split would override.
func choosesTests(flags []string) bool {
	return slices.ContainsFunc(flags, func(f string) bool {
		name, _, _ := strings.Cut(strings.TrimLeft(f, "-"), "=")
		return name == "run" || name == "test.run"
	})
}

// testSummary prints every run's outcome and time, the longest first,
// with the failed tests of each failed run, and returns an error naming
// the failed runs.
func testSummary(w io.Writer, what string, results []parallel.Result, unlisted []string, limit int, wall time.Duration) error {
	slices.SortStableFunc(results, func(a, b parallel.Result) int { return cmp.Compare(b.Elapsed, a.Elapsed) })
	var failed []string
	for _, r := range results {
		if r.Err != nil {
			failed = append(failed, r.Name)
		}
	}
	for _, u := range unlisted {
		failed = append(failed, strings.SplitN(u, ":", 2)[0])
	}
	fmt.Fprintf(w, "\n==== %s summary: %d of %d runs failed; %s wall, %d at a time ====\n",
		what, len(failed), len(results)+len(unlisted), wall.Round(time.Second), limit)
	for _, r := range results {
		if r.Err == nil {
			fmt.Fprintf(w, "ok    %-36s %s\n", r.Name, r.Elapsed.Round(time.Second))
			continue
		}
		fmt.Fprintf(w, "FAIL  %-36s %s: %s\n", r.Name, r.Elapsed.Round(time.Second), parallel.Failures(r.Output))
	}
	for _, u := range unlisted {
		fmt.Fprintf(w, "FAIL  %s (go list)\n", u)
	}
	if len(failed) > 0 {
		return fmt.Errorf("%s failed in %s", what, strings.Join(failed, ", "))
	}
	return nil
}

// moduleTests is what testModules needs to know of a module's tests.
type moduleTests struct {
	packages int      // how many packages the module has
	weight   int64    // bytes of test code: the expected test time, to start the longest first
	names    []string // the tests, fuzz targets and examples go test runs
}

// listTests reads the test files of a module's packages.
func listTests(m module) (moduleTests, error) {
	var tests moduleTests
	out, err := output("go", m.goC("list", "-e", "-f", "{{.Dir}}{{range .TestGoFiles}}\t{{.}}{{end}}{{range .XTestGoFiles}}\t{{.}}{{end}}", "./...")...)
	if err != nil {
		return tests, err
	}
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		f := strings.Split(line, "\t") // the package's directory, then its test files
		if f[0] == "" {
			continue
		}
		tests.packages++
		for _, name := range f[1:] {
			src, err := os.ReadFile(filepath.Join(f[0], name))
			if err != nil {
				return tests, err
			}
			tests.weight += int64(len(src))
			tests.names = append(tests.names, parallel.TestNames(string(src))...)
		}
	}
	return tests, nil
}

// A fuzzTarget is one Fuzz function of one package.
type fuzzTarget struct{ pkg, name string }

var fuzzName = regexp.MustCompile(`^Fuzz\w*$`)

// fuzzTargets lists the fuzz targets of a module with go test -list.
func fuzzTargets(m module) ([]fuzzTarget, error) {
	out, err := output("go", m.goC("test", "-list=^Fuzz", "./...")...)
	if err != nil {
		return nil, err
	}
	// go test -list prints a package's matching names, then "ok  <pkg> <time>".
	var targets []fuzzTarget
	var names []string
	for _, line := range strings.Split(out, "\n") {
		line = strings.TrimSpace(line)
		f := strings.Fields(line)
		switch {
		case fuzzName.MatchString(line):
			names = append(names, line)
		case len(f) >= 2 && f[0] == "ok":
			for _, n := range names {
				targets = append(targets, fuzzTarget{pkg: f[1], name: n})
			}
			names = nil
		default:
			names = nil
		}
	}
	if len(targets) == 0 && mg.Verbose() {
		fmt.Printf("%s: no fuzz targets\n", m.dir)
	}
	return targets, nil
}
