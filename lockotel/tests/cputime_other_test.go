//go:build !unix

package tests

import "time"

// cpuTime reports that this platform cannot tell the process's CPU time.
func cpuTime() (time.Duration, bool) { return 0, false }
