//go:build mage

package main

import (
	"errors"
	"fmt"
	"os"
	"regexp"
	"strings"

	"github.com/magefile/mage/mg"
)

const (
	testTimeout     = "20m" // per module: go test -timeout
	defaultFuzzTime = "3s"
)

// Test runs go test -race on every workspace module, with $TESTFLAGS.
func Test() error {
	extra, err := envArgs("TESTFLAGS")
	if err != nil {
		return err
	}
	if isCI() {
		fmt.Println("CI is set: a test that finds no broker fails instead of skipping")
	}
	printBrokerVersions()
	return eachModule("go test", nil, func(m module) error {
		args := append([]string{"test", "-race", "-count=1", "-timeout=" + testTimeout, "./..."}, extra...)
		return runV("go", m.goC(args...)...)
	})
}

// TestShort runs go test -short -race on every module, then each fuzz target for $FUZZTIME (3s).
func TestShort() error {
	extra, err := envArgs("TESTFLAGS")
	if err != nil {
		return err
	}
	fuzzTime := os.Getenv("FUZZTIME")
	if fuzzTime == "" {
		fuzzTime = defaultFuzzTime
	}
	short := eachModule("go test -short", nil, func(m module) error {
		args := append([]string{"test", "-short", "-race", "-count=1", "-timeout=" + testTimeout, "./..."}, extra...)
		return runV("go", m.goC(args...)...)
	})
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
