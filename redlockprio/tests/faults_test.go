package redlockprio_test

import (
	"context"
	"testing"

	"github.com/latchkey-go/latchkey/contracttest"
	"github.com/latchkey-go/latchkey/contracttest/testenv"
)

var _ contracttest.FaultHarness = (*harness)(nil)

// NewFaultyClient makes a client whose link to every master goes through a
// fault proxy of its own; the link faults them all together.
func (h *harness) NewFaultyClient(context.Context) (contracttest.Client, contracttest.Link, error) {
	var (
		link testenv.Proxies
		via  []string
	)
	for _, a := range h.addrs {
		p := testenv.NewProxy(h.t, a)
		link = append(link, p)
		via = append(via, p.Addr())
	}
	h.mu.Lock()
	h.proxies = append(h.proxies, link...)
	h.mu.Unlock()
	c, err := newClient(via)
	if err != nil {
		return nil, nil, err
	}
	h.mu.Lock()
	h.made = append(h.made, c)
	h.mu.Unlock()
	return c, link, nil
}

// TestFaultSuiteCatchesDefects shows the fault tests failing on this
// backend (3 masters) broken on purpose: a holder that learns of its loss
// late, and a Lock that outlives its context.
func TestFaultSuiteCatchesDefects(t *testing.T) {
	nh := harnessOn(addrsOf(testenv.StartRedis(t, 3)))
	contracttest.RunDefectTests(t, nh)
}
