package benchmarks

import (
	"sync"
	"testing"

	"github.com/latchkey-go/latchkey/contracttest/testenv"
	"github.com/latchkey-go/latchkey/contracttest/testenv/natsenv"
)

// brokers starts the brokers a test's systems need, each once, on first
// use, and keeps them for the whole top-level test: a subtest asks for a
// broker, and a missing broker skips (or fails, under CI) that subtest
// alone, through testenv.Require.
type brokers struct {
	owner natsenv.Env // the top-level test's: stopped at its end

	mu          sync.Mutex
	nats        string
	natsCluster string
	redis       []string
	amqp        string
}

func newBrokers(parent testing.TB) *brokers {
	parent.Helper()
	return &brokers{owner: natsenv.In(testenv.ForTest(parent))}
}

// env returns an Env with the brokers e needs, starting them if need be.
// It must be called from the goroutine running t.
func (bk *brokers) env(t testing.TB, e Entry) Env {
	t.Helper()
	bk.mu.Lock()
	defer bk.mu.Unlock()
	ctx := t.Context()
	var err error
	switch e.Needs {
	case NATS:
		if bk.nats == "" {
			bk.nats, err = bk.owner.URL(ctx)
		}
	case NATSCluster:
		if bk.natsCluster == "" {
			var c *natsenv.Cluster
			if c, err = bk.owner.StartCluster(ctx, 3, natsenv.ClusterConfig{}); err == nil {
				bk.natsCluster = c.URLs()
			}
		}
	case Redis:
		if len(bk.redis) == 0 {
			var servers []*testenv.RedisServer
			servers, err = bk.owner.StartRedis(ctx, 5, testenv.RedisConfig{})
			for _, s := range servers {
				bk.redis = append(bk.redis, s.Addr())
			}
		}
	case AMQP:
		if bk.amqp == "" {
			bk.amqp, err = bk.owner.AMQPURL(ctx)
		}
	}
	testenv.Require(t, err)
	return Env{TTL: testTTL, NATS: bk.nats, NATSCluster: bk.natsCluster, Redis: bk.redis, AMQP: bk.amqp}
}
