//go:build mage

package main

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"time"
)

const modelsDir = "models"

// A protocolModel is one Promela model of models/: checked as it is, it
// must hold; compiled with each of its seeded bugs (-D<macro>), spin must
// find a counterexample.
type protocolModel struct {
	file   string
	cc     []string // extra flags for compiling pan.c
	pan    []string // extra flags for running pan
	seeded []string // macros that each select a seeded bug
}

// protocolModels lists every model in models/; Models fails on a .pml file
// missing here, so that none is silently skipped. The flags are the ones
// each model's header comment gives.
var protocolModels = []protocolModel{
	{file: "natsputex_takeover.pml", pan: []string{"-E"}, seeded: []string{"BUGGY", "BUGGY2"}},
	{file: "natsputex_queue.pml", pan: []string{"-E"}, seeded: []string{"BUGGY", "BUGGY2", "BUGGY3"}},
	{file: "redlockprio_theft.pml", cc: []string{"-DCOLLAPSE"}, pan: []string{"-E"}, seeded: []string{"BUGGY"}},
	{file: "amqpsem_semaphore.pml", cc: []string{"-DCOLLAPSE"}, seeded: []string{"BUGGY", "BUGGY_LAYOUT"}},
	{file: "amqpsem_quorum.pml", seeded: []string{"BUGGY", "BUGGY_NACK", "BUGGY_NOCANCEL"}},
}

// Models checks the protocol models in models/ with spin, and that each seeded bug is found.
func Models() error {
	for _, tool := range []string{"spin", "cc"} {
		if _, err := exec.LookPath(tool); err != nil {
			return fmt.Errorf("models: %s is not installed (Debian/Ubuntu: apt-get install spin gcc): %w", tool, err)
		}
	}
	root, err := workspaceRoot()
	if err != nil {
		return err
	}
	dir := filepath.Join(root, modelsDir)
	files, err := filepath.Glob(filepath.Join(dir, "*.pml"))
	if err != nil {
		return err
	}
	known := map[string]bool{}
	for _, m := range protocolModels {
		known[m.file] = true
	}
	var errs []error
	for _, f := range files {
		if !known[filepath.Base(f)] {
			errs = append(errs, fmt.Errorf("models: %s is not listed in magefiles/models.go's protocolModels", display(f)))
		}
	}
	for _, m := range protocolModels {
		errs = append(errs, checkModel(filepath.Join(dir, m.file), m, ""))
		for _, bug := range m.seeded {
			errs = append(errs, checkModel(filepath.Join(dir, m.file), m, bug))
		}
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("models failed:\n%w", err)
	}
	return nil
}

var (
	panErrors = regexp.MustCompile(`errors: (\d+)`)
	panStates = regexp.MustCompile(`(\d+) states, stored`)
)

// checkModel runs spin -a on a copy of the model in a temporary directory
// (spin and pan write their files into the current one), compiles pan and
// runs it. Without bug, pan must finish its search with no error; with
// bug, spin -D<bug> must lead pan to at least one error. A model that
// fails when it should hold has its counterexample replayed (spin -t).
func checkModel(path string, m protocolModel, bug string) error {
	name := m.file
	var defs []string
	if bug != "" {
		name += " -D" + bug
		defs = []string{"-D" + bug}
	}
	src, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("%s: %w", name, err)
	}
	tmp, err := os.MkdirTemp("", "latchkey-models-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	if err := os.WriteFile(filepath.Join(tmp, m.file), src, 0o644); err != nil {
		return err
	}
	if _, err := outputIn(tmp, "spin", append(append(defs, "-a"), m.file)...); err != nil {
		return fmt.Errorf("%s: %w", name, err)
	}
	// -w: pan.c's generated code draws warnings from newer compilers.
	ccArgs := append(append([]string{"-O2", "-w", "-DSAFETY", "-DMEMLIM=2048"}, m.cc...), "-o", "pan", "pan.c")
	if _, err := outputIn(tmp, "cc", ccArgs...); err != nil {
		return fmt.Errorf("%s: %w", name, err)
	}
	start := time.Now()
	out, err := outputIn(tmp, "./pan", append([]string{"-m100000"}, m.pan...)...)
	took := time.Since(start).Round(10 * time.Millisecond)
	if err != nil {
		return fmt.Errorf("%s: %w", name, err)
	}
	found := panErrors.FindStringSubmatch(out)
	if found == nil {
		fmt.Print(out)
		return fmt.Errorf("%s: pan printed no error count", name)
	}
	states := "?"
	if s := panStates.FindStringSubmatch(out); s != nil {
		states = s[1]
	}
	errCount := found[1]
	switch {
	case bug == "" && errCount == "0" && !strings.Contains(out, "Search not completed") && !strings.Contains(out, "max search depth too small"):
		fmt.Printf("models: %s holds (%s states, %v)\n", name, states, took)
		return nil
	case bug == "":
		fmt.Print(out)
		if errCount != "0" {
			fmt.Printf("counterexample (spin -t %s):\n", m.file)
			trail, _ := outputIn(tmp, "spin", "-t", m.file)
			fmt.Print(trail)
		}
		return fmt.Errorf("%s: the model should hold, pan found %s error(s) or did not finish its search", name, errCount)
	case errCount != "0":
		fmt.Printf("models: %s: seeded bug found as expected (%s states, %v)\n", name, states, took)
		return nil
	default:
		fmt.Print(out)
		return fmt.Errorf("%s: the seeded bug was not found: the model no longer catches it", name)
	}
}
