package redlockprio_test

import (
	"context"
	"os"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/latchkey-go/latchkey/contracttest"
	"github.com/latchkey-go/latchkey/contracttest/testenv"
	"github.com/latchkey-go/latchkey/locks"
	"github.com/latchkey-go/latchkey/redlockprio"
)

// The environment of a holder process (the suite's PausedHolder, and
// TestTheftFromPausedVictimProcess): the parent's masters,
// comma-separated, and optionally a priority.
const (
	childAddrsEnv    = "REDLOCKPRIO_TEST_ADDRS"
	childPriorityEnv = "REDLOCKPRIO_TEST_PRIORITY"
)

func TestMain(m *testing.M) { contracttest.Main(m, newChildLocker) }

var _ contracttest.ProcessHarness = (*harness)(nil)

// ChildEnv lets a holder process reach the harness's masters; it uses the
// suite's TTL and renewal interval.
func (h *harness) ChildEnv() []string {
	return []string{childAddrsEnv + "=" + strings.Join(h.addrs, ",")}
}

// newChildLocker is the Locker of a holder process, as NewClient makes it.
func newChildLocker(context.Context) (locks.Locker, func() error, error) {
	var opts []redlockprio.Option
	if v := os.Getenv(childPriorityEnv); v != "" {
		p, err := strconv.Atoi(v)
		if err != nil {
			return nil, nil, err
		}
		opts = append(opts, redlockprio.WithPriority(p))
	}
	c, err := newClient(strings.Split(os.Getenv(childAddrsEnv), ","), opts...)
	if err != nil {
		return nil, nil, err
	}
	return c.Locker(), func() error { return c.Close(context.Background()) }, nil
}

// TestTheftFromPausedVictimProcess: a victim that cannot answer because its
// process is paused (SIGSTOP) is robbed only once its validity has run
// out, never earlier; resumed, it sees its lease ended before it writes
// again, and its stale token is below the thief's.
func TestTheftFromPausedVictimProcess(t *testing.T) {
	addrs := addrsOf(testenv.StartRedis(t, 3))
	name := uniqueName(t)
	env := []string{childAddrsEnv + "=" + strings.Join(addrs, ","), childPriorityEnv + "=1"}
	p, victimToken, _ := contracttest.StartHolder(t, env, name)
	defer p.Stop()
	var deadline time.Time // the victim's validity when paused
	for range 3 {
		line, _ := p.Next(10 * time.Second)
		if _, d, err := contracttest.ParseWrite(line); err != nil {
			t.Fatal(err)
		} else {
			deadline = d
		}
	}
	if err := p.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	for _, line := range p.Drain(100 * time.Millisecond) {
		if _, d, err := contracttest.ParseWrite(line); err == nil {
			deadline = d
		}
	}

	high := mustClient(t, addrs, withPriority(5))
	ctx := ctxFor(t, 10*time.Second)
	thief, err := high.l.Lock(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	got := time.Now()
	if got.Before(deadline) {
		t.Fatalf("the thief got the lock %v before the paused victim's validity deadline", deadline.Sub(got))
	}
	t.Logf("the thief got the lock %v after the paused victim's deadline", got.Sub(deadline).Round(time.Millisecond))
	if thief.Token() <= victimToken {
		t.Errorf("the thief's token %d is not above the victim's %d", thief.Token(), victimToken)
	}

	if err := p.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	p.ResumedWrites(t)
	_ = thief.Release(ctx)
}
