//go:build ignore

// Mage without installing it: `go run mage.go <target>` builds and runs the
// targets of magefile.go; `go run mage.go -l` lists them.
package main

import (
	"os"

	"github.com/magefile/mage/mage"
)

func main() { os.Exit(mage.Main()) }
