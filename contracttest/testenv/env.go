package testenv

import (
	"errors"
	"fmt"
	"os"
	"slices"
	"sync"
	"testing"
)

// An Env owns what the package's error-returning helpers start (servers,
// containers, proxies, temporary directories) and stops all of it when it
// is closed. It is how a program that is not a test, such as a benchmark
// command, gets the brokers tests get: each helper taking a [testing.TB]
// is [ForTest] and [Require] around the Env method of the same name.
//
//	env := new(testenv.Env)
//	defer env.Close()
//	servers, err := env.StartRedis(ctx, 3, testenv.RedisConfig{})
//
// The zero Env is ready to use. Its methods are safe to call from several
// goroutines. Once Close has begun, a helper stops at once what it
// starts and returns an error matching [ErrClosed].
type Env struct {
	// Logf, if set, receives what servers started in the Env log; a nil
	// Logf discards it. Set it before the first helper call.
	Logf func(format string, args ...any)

	// reportTo, if set, gets at once the errors of what the Env started
	// that come after the helper returned; otherwise Close returns them.
	reportTo func(error)

	mu       sync.Mutex
	cleanups []func() error
	errs     []error // reported after the helper that caused them returned
	closing  bool    // Close has begun: helpers fail, logs still pass
	closed   bool    // Close has ended: logs are dropped
}

// ErrClosed is returned by the methods of an [Env] called after its Close.
var ErrClosed = errors.New("testenv: env closed")

// A MissingError reports that a helper cannot run because a broker or a
// program is not available; it says how to provide it. [Require] turns
// it into [Missing]: a skipped test, or a failed one under CI.
type MissingError struct {
	What string // what is missing, such as "RabbitMQ"
	How  string // how to provide it
}

func (e *MissingError) Error() string {
	return fmt.Sprintf("testenv: %s is not available; %s", e.What, e.How)
}

// ForTest returns an Env that t closes at its cleanup, failing t with the
// errors Close returns, and whose servers log through t.Logf when tests
// run with -v. ForTest must be called from the goroutine running the
// test.
func ForTest(t testing.TB) *Env {
	t.Helper()
	e := &Env{reportTo: func(err error) { t.Errorf("%v", err) }}
	if testing.Verbose() {
		e.Logf = t.Logf
	}
	t.Cleanup(func() {
		if err := e.Close(); err != nil {
			t.Errorf("%v", err)
		}
	})
	return e
}

// Require stops t if err is not nil: through [Missing] (a skip, or a
// failure under CI) when err is or wraps a [*MissingError], and through
// t.Fatal otherwise. Require must be called from the goroutine running
// the test.
func Require(t testing.TB, err error) {
	t.Helper()
	if err == nil {
		return
	}
	if m, ok := errors.AsType[*MissingError](err); ok {
		Missing(t, m.What, m.How)
		return
	}
	t.Fatal(err)
}

// OnClose registers f to run at [Env.Close], before every function
// registered earlier (last in, first out). If the Env is already closing,
// f runs at once and its error is returned; otherwise OnClose returns nil.
func (e *Env) OnClose(f func() error) error {
	e.mu.Lock()
	if e.closing {
		e.mu.Unlock()
		return errors.Join(ErrClosed, f())
	}
	e.cleanups = append(e.cleanups, f)
	e.mu.Unlock()
	return nil
}

// TempDir makes a new directory, removed at [Env.Close].
func (e *Env) TempDir() (string, error) {
	d, err := os.MkdirTemp("", "latchkey-testenv-")
	if err != nil {
		return "", fmt.Errorf("testenv: %w", err)
	}
	if err := e.OnClose(func() error { return os.RemoveAll(d) }); err != nil {
		return "", err
	}
	return d, nil
}

// report records err, from something the Env started, to be returned by
// Close (or fails the test at once, for an Env of ForTest): the
// error-returning counterpart of t.Errorf.
func (e *Env) report(err error) {
	if e.reportTo != nil {
		e.reportTo(err)
		return
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	e.errs = append(e.errs, err)
}

// log passes a server's log line to Logf until Close has ended.
func (e *Env) log(format string, args ...any) {
	if e.Logf == nil {
		return
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	// t.Logf panics once its test is over: nothing logs after Close.
	if !e.closed {
		e.Logf(format, args...)
	}
}

// LogFunc returns a function that logs through the Env's Logf until Close
// has ended, then discards: for servers that log from goroutines of their
// own. It returns nil when Logf is nil.
func (e *Env) LogFunc() func(format string, args ...any) {
	if e.Logf == nil {
		return nil
	}
	return e.log
}

// Close stops everything the Env started, the last started first, and
// returns every error that stopping gave and every error reported along
// the way (such as a [Proxy] that could not listen again in Restore).
// Calling Close again returns nil.
func (e *Env) Close() error {
	e.mu.Lock()
	if e.closing {
		e.mu.Unlock()
		return nil
	}
	e.closing = true
	cleanups := e.cleanups
	e.cleanups = nil
	e.mu.Unlock()
	var errs []error
	for _, f := range slices.Backward(cleanups) {
		if err := f(); err != nil {
			errs = append(errs, err)
		}
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	e.closed = true
	return errors.Join(append(e.errs, errs...)...)
}
