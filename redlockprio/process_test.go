package redlockprio_test

import (
	"context"
	"os"
	"strings"
	"testing"

	"github.com/latchkey-go/latchkey/contracttest"
	"github.com/latchkey-go/latchkey/locks"
)

// childAddrsEnv gives a holder process the suite starts (PausedHolder) the
// parent's masters, comma-separated.
const childAddrsEnv = "REDLOCKPRIO_TEST_ADDRS"

func TestMain(m *testing.M) { contracttest.Main(m, newChildLocker) }

var _ contracttest.ProcessHarness = (*harness)(nil)

// ChildEnv lets a holder process reach the harness's masters; it uses the
// suite's TTL and renewal interval.
func (h *harness) ChildEnv() []string {
	return []string{childAddrsEnv + "=" + strings.Join(h.addrs, ",")}
}

// newChildLocker is the Locker of a holder process, as NewClient makes it.
func newChildLocker(context.Context) (locks.Locker, func() error, error) {
	c, err := newClient(strings.Split(os.Getenv(childAddrsEnv), ","))
	if err != nil {
		return nil, nil, err
	}
	return c.Locker(), c.Close, nil
}
