package natsputex_test

import (
	"context"
	"net/url"
	"strings"
	"testing"

	"github.com/nats-io/nats.go"

	"github.com/latchkey-go/latchkey/contracttest"
	"github.com/latchkey-go/latchkey/contracttest/testenv"
	"github.com/latchkey-go/latchkey/contracttest/testenv/natsenv"
	"github.com/latchkey-go/latchkey/natsputex"
)

var _ contracttest.FaultHarness = (*harness)(nil)

// NewFaultyClient connects a client to the first server through a fault
// proxy, ignoring the other servers the cluster advertises, so that every
// byte it exchanges goes through the proxy.
func (h *harness) NewFaultyClient(ctx context.Context) (contracttest.Client, contracttest.Link, error) {
	first, _, _ := strings.Cut(h.urls, ",")
	u, err := url.Parse(first)
	if err != nil {
		return nil, nil, err
	}
	p := testenv.NewProxy(h.t, u.Host)
	h.mu.Lock()
	h.proxies = append(h.proxies, p)
	h.mu.Unlock()
	nc, js, err := connect("nats://"+p.Addr(), nats.IgnoreDiscoveredServers())
	if err != nil {
		return nil, nil, err
	}
	c, err := natsputex.New(ctx, js, h.bucket, h.opts...)
	if err != nil {
		nc.Close()
		return nil, nil, err
	}
	return &client{nc: nc, c: c}, p, nil
}

// TestFaultSuiteCatchesDefects shows the fault tests failing on this
// backend broken on purpose: a holder that learns of its loss late, and
// a Lock that outlives its context.
func TestFaultSuiteCatchesDefects(t *testing.T) {
	url := natsenv.StartServer(t).URL()
	bucket := uniqueBucket("defect")
	prepareBucket(t, url, bucket)
	nh := newHarnessFunc(url, bucket)
	contracttest.RunDefectTests(t, nh)
}
