package natsenv

import (
	"context"
	"fmt"
	"testing"
	"time"

	"go.uber.org/goleak"
)

// TestProxyRoutesNoBypass isolates and heals each node of a cluster with
// proxied routes in turn, and checks that every route connection still
// goes through a proxy: no node holds a route it dialled to another
// node's own cluster port. Without the advertised unroutable address,
// nodes reconnecting after a heal learn each other's cluster ports by
// gossip and dial them directly (seen with nats-server 2.11). Like any
// race, it may miss a bypass, never report a false one.
func TestProxyRoutesNoBypass(t *testing.T) {
	t.Cleanup(func() { goleak.VerifyNone(t) })
	c := StartClusterWith(t, 3, ClusterConfig{ProxyRoutes: true})
	ports := map[int]string{}
	for _, s := range c.servers {
		ports[s.opts.Cluster.Port] = s.Name()
	}
	check := func(when string) {
		t.Helper()
		err := waitFor(context.Background(), 10*time.Second, func() error {
			for _, s := range c.servers {
				rz, err := s.server().Routez(nil)
				if err != nil {
					return err
				}
				if len(rz.Routes) != len(c.servers)-1 {
					return fmt.Errorf("%s has %d routes, want %d", s.Name(), len(rz.Routes), len(c.servers)-1)
				}
			}
			return nil
		})
		if err != nil {
			t.Fatalf("%s: %v", when, err)
		}
		for _, s := range c.servers {
			rz, _ := s.server().Routez(nil)
			for _, r := range rz.Routes {
				if name, ok := ports[r.Port]; ok {
					t.Errorf("%s: %s has a route to %s's own cluster port %s:%d, bypassing the proxies", when, s.Name(), name, r.IP, r.Port)
				}
			}
		}
	}
	check("after start")
	for i := range c.servers {
		c.Isolate(i)
		if err := c.Heal(); err != nil {
			t.Fatal(err)
		}
		check(fmt.Sprintf("after isolating node %d and healing", i))
	}
}
