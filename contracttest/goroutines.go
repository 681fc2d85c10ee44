package contracttest

import (
	"runtime"
	"strings"
)

// goroutineStacks returns the stack of every goroutine now running, one
// string a goroutine, as [runtime.Stack] writes them.
func goroutineStacks() []string {
	buf := make([]byte, 1<<16)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			return strings.Split(string(buf[:n]), "\n\n")
		}
		buf = make([]byte, 2*len(buf))
	}
}

// GoroutinesIn returns how many goroutines now run a function whose full
// name (package path, receiver and name, as in
// "example.com/pkg.(*T).Method") starts with fn, in any frame of their
// stacks: a test waits with it until so many callers are blocked in a
// function. A goroutine that fn only created is not counted.
func GoroutinesIn(fn string) int {
	n := 0
	for _, g := range goroutineStacks() {
		for line := range strings.SplitSeq(g, "\n") {
			if strings.HasPrefix(line, fn) {
				n++
				break
			}
		}
	}
	return n
}
