package amqpsem_test

import (
	"context"
	"testing"

	"github.com/latchkey-go/latchkey/contracttest"
)

var _ contracttest.FaultHarness = (*harness)(nil)

// NewFaultyClient makes a client whose connection goes through a fault
// proxy of its own.
func (h *harness) NewFaultyClient(ctx context.Context) (contracttest.Client, contracttest.Link, error) {
	cl, err := h.newClient(ctx, true)
	if err != nil {
		return nil, nil, err
	}
	return cl, cl.proxy, nil
}

// TestFaultSuiteCatchesDefects shows the fault tests failing on the mutex
// broken on purpose: a holder that learns of its loss late, and
// a Lock that outlives its context.
func TestFaultSuiteCatchesDefects(t *testing.T) {
	nh := newHarness(blackHole, false)
	contracttest.RunDefectTests(t, nh)
}
