package parallel

import (
	"regexp"
	"slices"
	"strings"
)

// A Failure is what the output of a failed `go test` run says failed.
type Failure struct {
	// Tests are the failed tests and subtests, each without its failed
	// parents (a subtest's failure fails its parent too), in the order
	// they were reported; a test still running when the test binary timed
	// out is listed with " (timed out)".
	Tests []string
	// Packages are the packages reported as failed, with go test's reason
	// when it gives one, such as "[build failed]".
	Packages []string
}

var (
	failedTest    = regexp.MustCompile(`^\s*--- FAIL: (\S+)`)
	failedPackage = regexp.MustCompile(`^FAIL\t(\S+)(?:\t\S+|\s+(\[[^]]+\]))?\s*$`)
	runningTest   = regexp.MustCompile(`^\t\t(\S+) \(\S+\)$`)
)

// Failures reads the plain (not -json) output of `go test`, possibly of
// several packages, and returns what it says failed.
func Failures(output string) Failure {
	var f Failure
	var tests []string
	inTimeout := false
	for _, line := range strings.Split(output, "\n") {
		line = strings.TrimSuffix(line, "\r")
		// A test binary that times out prints the running tests under
		// "panic: test timed out after D", then "\trunning tests:".
		if strings.HasPrefix(line, "panic: test timed out after ") {
			inTimeout = true
			continue
		}
		if inTimeout {
			if m := runningTest.FindStringSubmatch(line); m != nil {
				tests = append(tests, m[1]+" (timed out)")
				continue
			}
			if line != "\trunning tests:" {
				inTimeout = false
			}
		}
		if m := failedTest.FindStringSubmatch(line); m != nil {
			tests = append(tests, m[1])
			continue
		}
		if m := failedPackage.FindStringSubmatch(line); m != nil {
			f.Packages = append(f.Packages, strings.TrimSpace(m[1]+" "+m[2]))
		}
	}
	for _, t := range tests {
		name := strings.TrimSuffix(t, " (timed out)")
		hasChild := slices.ContainsFunc(tests, func(u string) bool { return strings.HasPrefix(u, name+"/") })
		if !hasChild && !slices.Contains(f.Tests, t) {
			f.Tests = append(f.Tests, t)
		}
	}
	return f
}

// String reads as the failed tests joined with ", " (a subtest as Top/sub) or, when no test is named, as the
// failed packages: "example.com/p [build failed]".
func (f Failure) String() string {
	if len(f.Tests) > 0 {
		return strings.Join(f.Tests, ", ")
	}
	if len(f.Packages) > 0 {
		return "no failed test named; failed: " + strings.Join(f.Packages, ", ")
	}
	return "no failed test or package named in the output"
}

// testFunc matches the declaration of a function `go test` runs: a test, a
// fuzz target (its seed corpus) or an example.
var testFunc = regexp.MustCompile(`(?m)^func ((?:Test|Fuzz|Example)\w*)\(`)

// TestNames returns the names of the tests, fuzz targets and examples
// declared in the source src of a _test.go file, in their order; not
// TestMain, which runs the others.
func TestNames(src string) []string {
	var names []string
	for _, m := range testFunc.FindAllStringSubmatch(src, -1) {
		if m[1] != "TestMain" {
			names = append(names, m[1])
		}
	}
	return names
}

// Shards deals names round-robin into at most n groups and returns each
// group as a `go test -run` pattern matching exactly its names, so that n
// `go test` runs with these patterns together run each test once. Tests
// declared next to each other, often alike in length, land in different
// shards. With n < 2 or fewer than two names it returns one pattern
// matching all of names.
func Shards(names []string, n int) []string {
	n = max(min(n, len(names)), 1)
	groups := make([][]string, n)
	for i, name := range names {
		groups[i%n] = append(groups[i%n], regexp.QuoteMeta(name))
	}
	patterns := make([]string, n)
	for i, g := range groups {
		patterns[i] = "^(" + strings.Join(g, "|") + ")$"
	}
	return patterns
}
