package amqpsem_test

import (
	"context"
	"errors"
	"os"
	"testing"

	"github.com/latchkey-go/latchkey/amqpsem"
	"github.com/latchkey-go/latchkey/contracttest"
	"github.com/latchkey-go/latchkey/locks"
)

// The environment of a holder process the suite starts (PausedHolder):
// the broker's URL, and "semaphore" for a one-slot semaphore as the
// Locker rather than the Mutex.
const (
	childURLEnv  = "AMQPSEM_TEST_URL"
	childModeEnv = "AMQPSEM_TEST_MODE"
)

func TestMain(m *testing.M) { contracttest.Main(m, newChildLocker) }

var _ contracttest.ProcessHarness = (*harness)(nil)

// ChildEnv lets a holder process reach the broker directly (no proxy: a
// pause is the fault), with the suite's heartbeat and verify interval.
func (h *harness) ChildEnv() []string {
	mode := "mutex"
	if h.semLocker {
		mode = "semaphore"
	}
	return []string{childURLEnv + "=" + h.url, childModeEnv + "=" + mode}
}

// newChildLocker is the Locker of a holder process, as NewClient makes it.
func newChildLocker(ctx context.Context) (locks.Locker, func() error, error) {
	c, err := amqpsem.Dial(ctx, os.Getenv(childURLEnv), append(testOptions(), amqpsem.WithCreate(true))...)
	if err != nil {
		return nil, nil, err
	}
	if os.Getenv(childModeEnv) == "semaphore" {
		s, err := c.Semaphore(1)
		if err != nil {
			return nil, nil, errors.Join(err, c.Close(context.Background()))
		}
		return semLocker{s}, closeFunc(c), nil
	}
	m := c.Locker()
	return m, closeFunc(c), nil
}

// closeFunc returns c's Close as the process harness wants it.
func closeFunc(c *amqpsem.Client) func() error {
	return func() error { return c.Close(context.Background()) }
}
