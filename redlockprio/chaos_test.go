package redlockprio_test

import (
	"context"
	"testing"
	"time"

	"github.com/latchkey-go/latchkey/contracttest"
	"github.com/latchkey-go/latchkey/contracttest/testenv"
)

// TestChaos runs the randomized fault run on three masters: crashed,
// closed and impatient clients on a few names, every critical section
// checked for overlap, fencing and recovery. `mage chaos` runs it for
// minutes; here it runs for seconds.
func TestChaos(t *testing.T) {
	if testing.Short() {
		t.Skip("the chaos run takes seconds")
	}
	var addrs []string
	for _, s := range testenv.StartRedis(t, 3) {
		addrs = append(addrs, s.Addr())
	}
	contracttest.RunChaos(t, func(context.Context, testing.TB) (contracttest.Harness, error) {
		return &harness{addrs: addrs}, nil
	}, contracttest.ChaosConfig{Duration: 5 * time.Second})
}
