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
// alone, through testenv.Missing.
type brokers struct {
	parent testing.TB

	mu          sync.Mutex
	nats        string
	natsCluster string
	redis       []string
	amqp        string
}

func newBrokers(parent testing.TB) *brokers { return &brokers{parent: parent} }

// scoped is the TB the testenv helpers get: stopping the test (Skip, Fatal)
// acts on the subtest that asked, on its own goroutine, while what must
// outlive the subtest (Cleanup, TempDir, logging from the servers) belongs
// to the top-level test.
type scoped struct {
	testing.TB
	parent testing.TB
}

func (s scoped) Cleanup(f func())                  { s.parent.Cleanup(f) }
func (s scoped) TempDir() string                   { return s.parent.TempDir() }
func (s scoped) Log(args ...any)                   { s.parent.Log(args...) }
func (s scoped) Logf(format string, args ...any)   { s.parent.Logf(format, args...) }
func (s scoped) Error(args ...any)                 { s.parent.Error(args...) }
func (s scoped) Errorf(format string, args ...any) { s.parent.Errorf(format, args...) }

// env returns an Env with the brokers e needs, starting them if need be.
// It must be called from the goroutine running t.
func (bk *brokers) env(t testing.TB, e Entry) Env {
	t.Helper()
	bk.mu.Lock()
	defer bk.mu.Unlock()
	st := scoped{TB: t, parent: bk.parent}
	env := Env{TTL: testTTL}
	switch e.Needs {
	case NATS:
		if bk.nats == "" {
			bk.nats = natsenv.URL(st)
		}
	case NATSCluster:
		if bk.natsCluster == "" {
			bk.natsCluster = natsenv.StartCluster(st, 3).URLs()
		}
	case Redis:
		if len(bk.redis) == 0 {
			for _, s := range testenv.StartRedis(st, 5) {
				bk.redis = append(bk.redis, s.Addr())
			}
		}
	case AMQP:
		if bk.amqp == "" {
			bk.amqp = testenv.AMQPURL(st)
		}
	}
	env.NATS, env.NATSCluster, env.Redis, env.AMQP = bk.nats, bk.natsCluster, bk.redis, bk.amqp
	return env
}
