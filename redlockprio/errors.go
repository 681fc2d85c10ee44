package redlockprio

import (
	"fmt"
	"strings"
)

// QuorumError reports that fewer masters than a quorum answered a step
// (acquire, renew): Got answered (or granted), Need is the quorum
// (N/2+1), and Errs holds one error per master that failed, each naming
// the master's index and address. Check for it with [errors.As]; its
// Unwrap returns Errs, so errors.Is sees through to the masters' causes
// (for example [context.DeadlineExceeded] or a network error).
type QuorumError struct {
	Got, Need int
	Errs      []error
}

func (e *QuorumError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "quorum not reached: %d of %d needed", e.Got, e.Need)
	for i, err := range e.Errs {
		if i == 0 {
			b.WriteString(": ")
		} else {
			b.WriteString("; ")
		}
		b.WriteString(err.Error())
	}
	return b.String()
}

// Unwrap returns the per-master errors.
func (e *QuorumError) Unwrap() []error { return e.Errs }

// masterError names the master an error came from.
type masterError struct {
	index int
	addr  string
	err   error
}

func (e *masterError) Error() string {
	return fmt.Sprintf("master %d (%s): %v", e.index, e.addr, e.err)
}

func (e *masterError) Unwrap() error { return e.err }
