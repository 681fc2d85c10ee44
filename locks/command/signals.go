package command

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"sync"
)

// Signals catches SIGINT, SIGTERM and SIGHUP (on Unix; os.Interrupt
// elsewhere) for a command run under a lease: while the lease is being
// acquired, a signal ends the context [Signals.Context] returns; once
// [Run] runs the command, every signal is forwarded to the command's
// process group. A signal caught after the wait but before the command
// started is forwarded when it starts.
//
// A Signals is safe for concurrent use. Stop it when done.
type Signals struct {
	ch       chan os.Signal
	stopOnce sync.Once
}

// CatchSignals starts catching the signals: from now until [Signals.Stop]
// they no longer end this process.
func CatchSignals() *Signals {
	s := &Signals{ch: make(chan os.Signal, 8)}
	signal.Notify(s.ch, forwarded...)
	return s
}

// Context returns a context derived from parent that ends, with a cause
// naming the signal, when a signal is caught; that signal is also kept
// for [Run] to forward, should the lease be acquired all the same. Call
// cancel once the wait is over: later signals are left for Run.
func (s *Signals) Context(parent context.Context) (ctx context.Context, cancel context.CancelFunc) {
	ctx, cancelCause := context.WithCancelCause(parent)
	done := make(chan struct{})
	go func() {
		defer close(done)
		select {
		case sig := <-s.ch:
			cancelCause(fmt.Errorf("command: caught %v", sig))
			s.keep(sig)
		case <-ctx.Done():
		}
	}()
	return ctx, func() {
		cancelCause(context.Canceled)
		<-done
	}
}

// keep puts sig back for Run, unless the buffer is full.
func (s *Signals) keep(sig os.Signal) {
	select {
	case s.ch <- sig:
	default:
	}
}

// Stop stops catching the signals. Stop is idempotent; a nil Signals is
// allowed and does nothing.
func (s *Signals) Stop() {
	if s == nil {
		return
	}
	s.stopOnce.Do(func() { signal.Stop(s.ch) })
}

// caught returns the channel of caught signals; nil (which never sends)
// for a nil Signals.
func (s *Signals) caught() <-chan os.Signal {
	if s == nil {
		return nil
	}
	return s.ch
}
