//go:build mage

// Build targets of latchkey: `go run mage.go <target>`, no mage install needed; -v shows every command's output.
package main

import (
	"github.com/magefile/mage/mg"
)

// Every target works on all the modules of the workspace, read from
// `go work edit -json`: `go test ./...` at the root does not reach them.
// Each command is echoed before it runs; a quiet one shows its output when it
// fails, or always with -v.
//
// Environment:
//
//	TESTFLAGS            extra go test flags for test and testShort, e.g. TESTFLAGS='-run TestLock -v'
//	LATCHKEY_TEST_JOBS   how many go test runs test and testShort run at once (default 4)
//	LATCHKEY_TEST_SPLIT  in how many runs they split a one-package module of 50 tests or more (default 2; not with -run in TESTFLAGS)
//	FLAKES_RUNS          how many times flakes runs each test (default 20)
//	FLAKES_HOG           how many goroutines flakes keeps busy meanwhile (default one per CPU)
//	FLAKES_MODULES       the modules flakes looks in, blank-separated directories as in go.work (default all)
//	FUZZTIME             how long testShort fuzzes each target (default 3s)
//	BENCH                benchmark regexp for bench (default .)
//	BENCHFLAGS           extra go test flags for bench, e.g. BENCHFLAGS='-count=10 -benchtime=2s'
//	LOCKBENCH_ARGS       arguments for lockbench
//	CHAOS_DURATION       how long chaos runs each backend (default 5m)
//	CI                   set on CI: tests fail on a missing broker instead of skipping; lint shows gofmt diffs

// Tools run with `go run pkg@version`: pinned, and nothing to install.
const (
	staticcheck = "honnef.co/go/tools/cmd/staticcheck@v0.8.2"
	actionlint  = "github.com/rhysd/actionlint/cmd/actionlint@v1.7.12"
)

// Default is the target run by a bare `go run mage.go`.
var Default = Test

// Check runs Lint, then Models, then Test, then ReleaseCheck.
func Check() {
	mg.SerialDeps(Lint, Models, Test, ReleaseCheck)
}
