package contracttest

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/latchkey-go/latchkey/locks"
)

// EnterLease marks the start of a critical section held under lease, as
// [History.Enter] does, and returns the function that marks its end. The
// section ends at the first of that call and the end of the lease's
// context; when the lease ended first, [Span.Ended] says why. Calling exit
// more than once, from any goroutine, is safe: later calls do nothing.
func (h *History) EnterLease(who string, lease locks.Lease) (exit func()) {
	h.mu.Lock()
	s := Span{Who: who, Token: lease.Token(), Enter: time.Since(h.base)}
	h.open++
	h.peak = max(h.peak, h.open)
	h.mu.Unlock()
	end := sync.OnceFunc(func() {
		h.mu.Lock()
		defer h.mu.Unlock()
		s.Exit = time.Since(h.base)
		if lease.Context().Err() != nil {
			s.Ended = fmt.Sprint(context.Cause(lease.Context()))
		}
		h.open--
		h.spans = append(h.spans, s)
	})
	stop := context.AfterFunc(lease.Context(), end)
	return func() {
		stop()
		end()
	}
}

// Now returns the time elapsed on the History's clock, the clock of
// [Span.Enter] and [Span.Exit].
func (h *History) Now() time.Duration {
	return time.Since(h.base)
}

// Spans returns the finished sections, in the order they finished.
func (h *History) Spans() []Span {
	h.mu.Lock()
	defer h.mu.Unlock()
	return slices.Clone(h.spans)
}
