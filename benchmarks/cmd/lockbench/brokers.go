package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/latchkey-go/latchkey/benchmarks"
	"github.com/latchkey-go/latchkey/contracttest/testenv"
	"github.com/latchkey-go/latchkey/contracttest/testenv/natsenv"
)

// brokers is what lockbench started or found, through testenv and
// natsenv, which stop it all on close.
type brokers struct {
	env     benchmarks.Env
	missing map[benchmarks.Broker]string // why a broker is not available
	about   map[string]string            // what was used, for the report
	owner   *testenv.Env
}

// close stops what startBrokers started.
func (b *brokers) close(log func(string, ...any)) {
	if err := b.owner.Close(); err != nil {
		log("lockbench: stopping the brokers: %v", err)
	}
}

// startBrokers starts or finds what the entries need. A broker it cannot
// provide is recorded in missing; the systems on it are left out.
func startBrokers(ctx context.Context, entries []benchmarks.Entry, log func(string, ...any)) *brokers {
	b := &brokers{missing: map[benchmarks.Broker]string{}, about: map[string]string{}, owner: new(testenv.Env)}
	need := map[benchmarks.Broker]int{}
	for _, e := range entries {
		if e.NotWired == "" && e.Needs != 0 {
			need[e.Needs] = max(need[e.Needs], e.Masters)
		}
	}
	nats := natsenv.In(b.owner)
	if _, ok := need[benchmarks.NATS]; ok {
		if s, err := nats.StartServer(ctx, natsenv.ServerConfig{}); err != nil {
			b.missing[benchmarks.NATS] = "NATS server did not start: " + err.Error()
		} else {
			b.env.NATS = s.URL()
			b.about["NATS"] = "nats-server " + s.Version() + " (a process, JetStream on disk, " + s.URL() + ")"
			log("lockbench: NATS: nats-server %s at %s", s.Version(), s.URL())
		}
	}
	if _, ok := need[benchmarks.NATSCluster]; ok {
		if c, err := nats.StartCluster(ctx, 3, natsenv.ClusterConfig{}); err != nil {
			b.missing[benchmarks.NATSCluster] = "3-node NATS cluster did not start: " + err.Error()
		} else {
			b.env.NATSCluster = c.URLs()
			b.about["NATS cluster"] = "3 nats-server " + c.Versions()[0] + " processes (one JetStream cluster)"
			log("lockbench: NATS cluster: 3 nodes at %s", c.URLs())
		}
	}
	if n, ok := need[benchmarks.Redis]; ok {
		addrs, about, err := b.redisMasters(ctx, n)
		if err != nil {
			b.missing[benchmarks.Redis] = err.Error()
		}
		b.env.Redis = addrs
		if len(addrs) > 0 {
			b.about["Redis"] = about
			log("lockbench: Redis: %s", about)
		}
	}
	if _, ok := need[benchmarks.AMQP]; ok {
		u, about, err := b.rabbitMQ(ctx)
		if err != nil {
			b.missing[benchmarks.AMQP] = err.Error()
		} else {
			b.env.AMQP = u
			b.about["RabbitMQ"] = about
			log("lockbench: RabbitMQ: %s", about)
		}
	}
	return b
}

// redisMasters returns n independent masters: those listed in
// LOCKS_REDIS_ADDRS (and an error if there are fewer than n), else
// servers started from the local redis-server (or Docker).
func (b *brokers) redisMasters(ctx context.Context, n int) ([]string, string, error) {
	addrs, err := testenv.RedisAddrsFromEnv()
	if err != nil {
		return nil, "", err
	}
	if addrs != nil {
		about := fmt.Sprintf("%d masters from LOCKS_REDIS_ADDRS", len(addrs))
		if len(addrs) < n {
			return addrs, about, fmt.Errorf("LOCKS_REDIS_ADDRS lists %d masters, %d needed", len(addrs), n)
		}
		return addrs, about, nil
	}
	servers, err := b.owner.StartRedis(ctx, n, testenv.RedisConfig{})
	if err != nil {
		return nil, "", fmt.Errorf("%w (or set LOCKS_REDIS_ADDRS to %d independent masters)", err, n)
	}
	for _, s := range servers {
		addrs = append(addrs, s.Addr())
	}
	from := "Docker containers"
	if bin := servers[0].Binary(); bin != "" {
		from = bin
		if out, err := exec.Command(bin, "--version").Output(); err == nil {
			from += " (" + strings.TrimSpace(string(out)) + ")"
		}
	}
	return addrs, fmt.Sprintf("%d masters started from %s, no persistence: %s", n, from, strings.Join(addrs, " ")), nil
}

// rabbitMQ returns the URL of the broker testenv finds
// ($LOCKS_AMQP_URL, the local broker, or a container) once it accepts a
// connection, and a description naming its version.
func (b *brokers) rabbitMQ(ctx context.Context) (string, string, error) {
	u, err := b.owner.AMQPURL(ctx)
	if err != nil {
		return "", "", err
	}
	from := "found by testenv"
	if strings.TrimSpace(os.Getenv("LOCKS_AMQP_URL")) != "" {
		from = "from LOCKS_AMQP_URL"
	}
	conn, err := amqp.DialConfig(u, amqp.Config{Dial: amqp.DefaultDial(3 * time.Second)})
	if err != nil {
		return "", "", fmt.Errorf("no RabbitMQ at %s (%s): %v (set LOCKS_AMQP_URL, or run docker compose up rabbitmq)", testenv.RedactURL(u), from, err)
	}
	defer conn.Close()
	version, _ := conn.Properties["version"].(string)
	return u, fmt.Sprintf("RabbitMQ %s at %s (%s)", version, testenv.RedactURL(u), from), nil
}
