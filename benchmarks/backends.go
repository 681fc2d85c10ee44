package benchmarks

import "fmt"

// The latchkey backends, wired in once their packages built.

func natsputexEntries() []Entry {
	return []Entry{
		{Name: "natsputex", Kind: Backend, Needs: NATS, Floor: "floor/nats-kv", Peers: []string{"redsync/N1"}, New: newNatsputex(1)},
		{Name: "natsputex/R3", Kind: Backend, Needs: NATSCluster, Peers: []string{"redsync/N3"}, New: newNatsputex(3)},
	}
}

func amqpsemEntries() []Entry {
	return []Entry{
		{Name: "amqpsem/mutex", Kind: Backend, Needs: AMQP, Floor: "floor/amqp", New: newAmqpsem(false)},
		{Name: "amqpsem/semaphore", Kind: Backend, Needs: AMQP, Floor: "floor/amqp", New: newAmqpsem(true)},
	}
}

func redlockprioEntry(n int, peers []string) Entry {
	return Entry{Name: fmt.Sprintf("redlockprio/N%d", n), Kind: Backend, Needs: Redis, Masters: n,
		Floor: "floor/redis", Peers: peers, New: newRedlockprio(n)}
}
