//go:build mage

package main

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/latchkey-go/latchkey/magefiles/internal/flakes"
)

// Flakes runs the tests matching PATTERN (a go test -run pattern; Top/Sub for subtests) $FLAKES_RUNS (20) times under -race while $FLAKES_HOG (one per CPU) goroutines keep the CPUs busy, in every module or those in $FLAKES_MODULES, and prints each test's failure rate.
func Flakes(pattern string) error {
	runs, err := envInt("FLAKES_RUNS", 20)
	if err != nil {
		return err
	}
	hog, err := envInt("FLAKES_HOG", 0)
	if err != nil {
		return err
	}
	mods, err := modules()
	if err != nil {
		return err
	}
	if only, err := envArgs("FLAKES_MODULES"); err != nil {
		return err
	} else if len(only) > 0 {
		mods = slices.DeleteFunc(slices.Clone(mods), func(m module) bool {
			return !slices.ContainsFunc(only, func(dir string) bool { return filepath.Clean(dir) == filepath.Clean(m.dir) })
		})
		if len(mods) == 0 {
			return fmt.Errorf("FLAKES_MODULES=%q names no workspace module (directories as in go.work, such as fence/tests)", only)
		}
	}
	stop := flakes.Hog(hog)
	defer stop()
	var all []flakes.Rate
	for _, m := range mods {
		// -list matches top-level names: a pattern of subtests such as
		// Conformance/CloseHungBroker lists by its first part.
		top, _, _ := strings.Cut(pattern, "/")
		listed, err := output("go", m.goC("test", "-list="+top, "./...")...)
		if err != nil || !hasTests(listed) {
			continue
		}
		args := m.goC("test", "-race", "-json", "-count="+strconv.Itoa(runs), "-timeout=0", "-run="+pattern, "./...")
		echo("go", args...)
		var out bytes.Buffer
		c := exec.Command("go", args...)
		c.Stdout, c.Stderr = &out, os.Stderr
		_ = c.Run() // failures are what is counted
		rates, err := flakes.Count(&out)
		if err != nil {
			return err
		}
		all = append(all, rates...)
	}
	if len(all) == 0 {
		return fmt.Errorf("flakes: no test matches %q in any module", pattern)
	}
	failed := 0
	for _, r := range all {
		fmt.Println(r)
		if r.Failed > 0 {
			failed++
		}
	}
	fmt.Printf("flakes: %d of %d tests failed at least once in %d runs under load\n", failed, len(all), runs)
	return nil
}

// hasTests reports whether go test -list printed a test name.
func hasTests(listed string) bool {
	for _, l := range strings.Split(listed, "\n") {
		if strings.HasPrefix(l, "Test") || strings.HasPrefix(l, "Example") {
			return true
		}
	}
	return false
}

// envInt reads a whole number from the environment, or def when unset.
func envInt(name string, def int) (int, error) {
	v := os.Getenv(name)
	if v == "" {
		return def, nil
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 0 {
		return 0, fmt.Errorf("%s=%q: want a whole number", name, v)
	}
	return n, nil
}
