// Package benchmarks compares the latchkey backends with each other, with
// peer libraries and with each broker's raw floor, on the same scenarios in
// one process and one run. It is never released; its command
// [github.com/latchkey-go/latchkey/benchmarks/cmd/lockbench] is how it is
// run:
//
//	go run ./benchmarks/cmd/lockbench --duration 2s --json out.json --svg out.svg
//	go run ./benchmarks/cmd/lockbench --only 'redlockprio/*,redsync/*,redislock,floor/redis'
//	go run ./benchmarks/cmd/lockbench --list
//
// The same scenarios run as Go benchmarks, b.N operations each, on brokers
// started by testenv and natsenv (all of them, once per benchmark function):
//
//	go test -run '^$' -bench 'Uncontended/redlockprio' ./benchmarks/...
//
// # Systems
//
// [Systems] is the registry, one [Entry] per system, named exactly as in
// the results:
//   - backends: memlock (in-process, the ceiling), natsputex (one NATS node,
//     a process of the nats-server version the module links) and natsputex/R3 (a 3-node cluster, bucket with 3
//     replicas), amqpsem/mutex and amqpsem/semaphore (a one-slot semaphore
//     in the lock scenarios), amqpsem/quorum (the quorum-queue layout),
//     redlockprio/N1, /N3, /N5 (Redis masters);
//   - peers: redsync/N1, /N3, /N5 (go-redsync/redsync with its default
//     retry policy, re-locking after each ErrFailed) and redislock
//     (bsm/redislock, ExponentialBackoff(16ms, 256ms), its recommended
//     minimum);
//   - floors, the least a lock can cost on each broker: floor/redis (SET NX
//   - DEL), floor/nats-kv (kv.Create + kv.Delete; note that nats.go's
//     Create over the delete marker of a freed key costs three round trips)
//     and floor/amqp (exclusive queue declare + delete). Floors have no
//     TTL, no ownership check and poll when they wait;
//   - variants, optional (only their exact names, or lockbench --otel,
//     pick them): natsputex+otel and redlockprio/N3+otel, their twin with
//     each client's Locker wrapped by lockotel on the OpenTelemetry SDK
//     (see [OtelSuffix]); the report gives their overhead over the twin
//     ([OverheadMetric]).
//
// Each system is a [System] handing out [Client]s (one per simulated
// process, on its own connections) whose Lock returns a [Held]; backends'
// leases are used as they are, peers and floors are wrapped. Systems with
// TTLs are made with [Env.TTL] (3s by default) and renew every third of it.
//
// # Scenarios
//
//   - uncontended: one client, one name; a sample is Lock+Release.
//   - contended: 8 clients on one name, each holding it for a 100µs
//     critical section; ops/s is acquisitions ("hand-offs") per second;
//     samples are the waits in Lock. Metrics add how many acquisitions went
//     to another client than the previous holder, and the busiest client's
//     share, because a greedy re-acquirer can post a high rate while
//     starving the others.
//   - waiters: contended at several client counts (8, 64, 256 and 1,000
//     by default), one scenario each, named waiters/<count>. The clients
//     run in ⌈count / 250⌉ worker processes (lockbench runs itself with a
//     hidden flag; see [Spread] and [ServeWorker]) that start together on
//     the wall clock they share; their acquisitions are merged by time.
//     Both contended and waiters report, beside hand-offs/s and the waits'
//     percentiles, the hand-offs to another client per second, the
//     busiest client's share, the longest single wait (counting waits
//     still unanswered at the end), the clients never served, and broker
//     operations per hand-off: Redis commands executed on the masters
//     (INFO commandstats, read before and after the run), NATS messages
//     published and received by the clients' connections (summed over the
//     workers), none for RabbitMQ (see [MetricOpsPerHandoff]).
//     Connections: every client has its own. Redis: one or more per
//     master (redlockprio/N3 at 1,000 waiters peaked at 3,114 on one
//     master), under redis-server's default maxclients of 10,000, which
//     testenv keeps. NATS: one per client (the server's default
//     max_connections is 64K). RabbitMQ: one per client, and counts
//     needing more than [Params.AMQPConnections] (300) are not
//     applicable: a stock RabbitMQ takes 832 sockets, and it is often
//     shared.
//   - handoff: two clients; the holder waits until the waiter is blocked in
//     Lock (three uncontended acquire times, at least 1ms, not measured),
//     then a sample runs from a monotonic timestamp just before Release to
//     one just after the waiter's Lock returns.
//   - semaphore: a semaphore of 8 with 7 slots held by other clients; a
//     sample is the Acquire of the last slot. Systems with semaphores only.
//   - many: one client holds 10,000 leases for a window of whole renewal
//     intervals; ops/s is renewal round trips per second to all masters
//     (counted at the client: go-redis hooks, NATS OutMsgs), with the round
//     trips per master per tick and the heap growth per lease (of the whole
//     process; the NATS servers run in processes of their own). Peers do
//     not renew by themselves: the scenario renews each lease once per
//     interval, as their users must. Systems with TTL leases over a network
//     only.
//
// Measurements are taken with the monotonic clock, in the same run, with no
// sleeps inside a measured path. The machine is shared and small: compare
// ratios within a run, not figures across runs.
//
// # Reports
//
// [RunAll] runs entries × scenarios into a [Report], which prints one
// table (p50, p90, p99, ops/s, ratio to the floor and to the best peer),
// writes JSON with a stable schema ([Report.WriteJSON]) and an SVG chart
// ([Report.WriteSVG]), with the waiters scenario's hand-offs to another
// client per second against the waiter count, one line per system.
package benchmarks
