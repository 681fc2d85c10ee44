package testenv_test

import (
	"testing"
	"time"

	"github.com/latchkey-go/latchkey/contracttest/testenv"
)

// A Redlock test starts its own masters, so that it can crash and pause them.
func ExampleStartRedis() {
	testQuorum := func(t *testing.T) {
		masters := testenv.StartRedis(t, 3)
		addrs := []string{masters[0].Addr(), masters[1].Addr(), masters[2].Addr()}
		_ = addrs // connect a client to each

		if err := masters[0].Kill(); err != nil {
			t.Fatal(err)
		}
		// ... a lock is still acquired on the two others ...
		if err := masters[0].Restart(); err != nil { // same port, empty
			t.Fatal(err)
		}
	}
	_ = testQuorum
}

// A client behind a Proxy can be cut off from its broker without touching the
// broker: its lease must then be lost within the backend's bound.
func ExampleNewProxy() {
	testLoss := func(t *testing.T) {
		p := testenv.NewProxy(t, testenv.RedisAddr(t))
		_ = p.Addr() // the client dials this instead of the broker

		p.BlackHole() // a partition: nothing gets through
		// ... wait for the lease's context to end with locks.ErrLost ...
		p.Restore()

		p.Latency(50 * time.Millisecond)
		// ... every round trip now takes at least 100ms more ...
	}
	_ = testLoss
}

// A backend's test helper reports a broker it cannot find the way testenv
// does: skipped on a laptop, a failure in CI.
func ExampleMissing() {
	etcdEndpoint := func(t testing.TB) string {
		t.Helper()
		// ... look for a server ...
		testenv.Missing(t, "etcd", "set LOCKS_ETCD_URL or run etcd on 127.0.0.1:2379")
		return ""
	}
	_ = etcdEndpoint
}
