// Package testenv provides real message brokers to tests: RabbitMQ, Redis,
// and a fault-injecting TCP proxy to put between a client and a broker.
//
// Each helper finds a broker in this order and uses the first that answers:
//
//  1. an address from the environment: LOCKS_AMQP_URL (an amqp:// URL) or
//     LOCKS_REDIS_ADDRS (a comma-separated list of host:port);
//  2. a broker already listening on its standard local port
//     (127.0.0.1:5672 for AMQP, 127.0.0.1:6379 for Redis);
//  3. a server binary on the PATH started on a free loopback port
//     (redis-server);
//  4. a container started through dockertest when a Docker engine answers;
//  5. otherwise the test is skipped with a message naming what was missing and
//     how to provide it, except when the CI environment variable is set (see
//     [RequireCI]): then the test fails, so CI never skips a backend silently.
//
// Everything a helper starts (processes, containers, proxies) is stopped by
// [testing.TB.Cleanup]. Servers and proxies listen on loopback only.
//
// Programs that are not tests (lockbench) use the same helpers through an
// [Env]: each helper taking a testing.TB is a thin wrapper over the Env
// method of the same name, which returns an error (a [*MissingError] for
// step 5) instead of stopping a test, and leaves what it started to
// [Env.Close]. [ForTest] makes the Env of a test and [Require] stops the
// test on an error as the helpers do.
//
// NATS lives in the separate module
// github.com/latchkey-go/latchkey/contracttest/testenv/natsenv, so that
// importing this package never pulls a broker client or server library into a
// backend's module graph.
//
// Tests built on this package should not produce false positives, may produce
// false negatives, and run under the race detector.
package testenv
