//go:build mage

package main

import (
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
)

const lockbenchPkg = "./benchmarks/cmd/lockbench"

// Bench runs the benchmarks of every workspace module matching $BENCH (.), with $BENCHFLAGS.
func Bench() error {
	bench := os.Getenv("BENCH")
	if bench == "" {
		bench = "."
	}
	extra, err := envArgs("BENCHFLAGS")
	if err != nil {
		return err
	}
	return eachModule("go test -bench", nil, func(m module) error {
		args := append([]string{"test", "-run=^$", "-bench=" + bench, "-benchmem", "-timeout=" + testTimeout, "./..."}, extra...)
		return runV("go", m.goC(args...)...)
	})
}

// Lockbench runs the cross-backend benchmark command with $LOCKBENCH_ARGS.
func Lockbench() error {
	root, err := workspaceRoot()
	if err != nil {
		return err
	}
	if _, err := os.Stat(filepath.Join(root, lockbenchPkg)); err != nil {
		fmt.Printf("lockbench is not built yet: %s does not exist\n", lockbenchPkg)
		return fmt.Errorf("lockbench: %s: %w", lockbenchPkg, fs.ErrNotExist)
	}
	args, err := envArgs("LOCKBENCH_ARGS")
	if err != nil {
		return err
	}
	return runV("go", append([]string{"-C", display(root), "run", lockbenchPkg}, args...)...)
}
