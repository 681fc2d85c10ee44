package amqpsem_test

import (
	"context"

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
