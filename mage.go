//go:build ignore

// Mage without installing it: `go run mage.go <target>` builds and runs the
// targets of magefiles/ from the repository root; `go run mage.go -l` lists
// them.
package main

import (
	"os"

	"github.com/magefile/mage/mage"
)

func main() {
	// -d: the targets live in magefiles/; -w: they run from the root, where
	// go.work, models/ and docs/ are.
	args := append([]string{"-d", "magefiles", "-w", "."}, os.Args[1:]...)
	os.Exit(mage.ParseAndRun(os.Stdout, os.Stderr, os.Stdin, args))
}
