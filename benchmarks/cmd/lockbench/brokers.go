package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/latchkey-go/latchkey/benchmarks"
	"github.com/nats-io/nats-server/v2/server"
	amqp "github.com/rabbitmq/amqp091-go"
)

// The helpers of testenv and natsenv take a testing.TB, so lockbench
// starts its brokers itself: NATS in-process, Redis masters as child
// processes of the local redis-server, RabbitMQ found at its URL.

// brokers owns what lockbench started, and stops it all on close.
type brokers struct {
	env     benchmarks.Env
	missing map[benchmarks.Broker]string // why a broker is not available
	about   map[string]string            // what was used, for the report

	mu    sync.Mutex
	stops []func()
}

func (b *brokers) onClose(f func()) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.stops = append(b.stops, f)
}

// tempDir makes a directory removed at close.
func (b *brokers) tempDir(prefix string) (string, error) {
	d, err := os.MkdirTemp("", "lockbench-"+prefix+"-")
	if err != nil {
		return "", err
	}
	b.onClose(func() { _ = os.RemoveAll(d) })
	return d, nil
}

func (b *brokers) close() {
	b.mu.Lock()
	stops := b.stops
	b.stops = nil
	b.mu.Unlock()
	for i := len(stops) - 1; i >= 0; i-- {
		stops[i]()
	}
}

// startBrokers starts or finds what the entries need. A broker it cannot
// provide is recorded in missing; the systems on it are left out.
func startBrokers(ctx context.Context, entries []benchmarks.Entry, log func(string, ...any)) *brokers {
	b := &brokers{missing: map[benchmarks.Broker]string{}, about: map[string]string{}}
	need := map[benchmarks.Broker]int{}
	for _, e := range entries {
		if e.NotWired == "" && e.Needs != 0 {
			need[e.Needs] = max(need[e.Needs], e.Masters)
		}
	}
	if _, ok := need[benchmarks.NATS]; ok {
		if u, err := b.startNATS(); err != nil {
			b.missing[benchmarks.NATS] = "embedded NATS server did not start: " + err.Error()
		} else {
			b.env.NATS = u
			b.about["NATS"] = "embedded nats-server " + server.VERSION + " (in-process, JetStream on disk, " + u + ")"
			log("lockbench: NATS: embedded server %s at %s", server.VERSION, u)
		}
	}
	if _, ok := need[benchmarks.NATSCluster]; ok {
		if u, err := b.startNATSCluster(3); err != nil {
			b.missing[benchmarks.NATSCluster] = "embedded 3-node NATS cluster did not start: " + err.Error()
		} else {
			b.env.NATSCluster = u
			b.about["NATS cluster"] = "3 embedded nats-server " + server.VERSION + " nodes (in-process, one JetStream cluster)"
			log("lockbench: NATS cluster: 3 embedded nodes at %s", u)
		}
	}
	if n, ok := need[benchmarks.Redis]; ok {
		addrs, about, err := b.startRedis(ctx, n)
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
		u, about, err := findAMQP()
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

// --- NATS, in-process ---

func (b *brokers) natsOptions(name string) (*server.Options, error) {
	dir, err := b.tempDir("nats")
	if err != nil {
		return nil, err
	}
	return &server.Options{
		ServerName:             name,
		Host:                   "127.0.0.1",
		Port:                   server.RANDOM_PORT,
		NoLog:                  true,
		NoSigs:                 true,
		DisableJetStreamBanner: true,
		JetStream:              true,
		JetStreamMaxMemory:     256 << 20,
		JetStreamMaxStore:      1 << 30,
		StoreDir:               dir,
	}, nil
}

func (b *brokers) runNATS(opts *server.Options) (*server.Server, error) {
	ns, err := server.NewServer(opts)
	if err != nil {
		return nil, err
	}
	ns.Start()
	b.onClose(func() { ns.Shutdown(); ns.WaitForShutdown() })
	if !ns.ReadyForConnections(10 * time.Second) {
		return nil, fmt.Errorf("%s: not ready for connections after 10s", opts.ServerName)
	}
	return ns, nil
}

func (b *brokers) startNATS() (string, error) {
	opts, err := b.natsOptions("lockbench")
	if err != nil {
		return "", err
	}
	ns, err := b.runNATS(opts)
	if err != nil {
		return "", err
	}
	if !ns.JetStreamEnabled() {
		return "", errors.New("JetStream did not start")
	}
	return ns.ClientURL(), nil
}

func (b *brokers) startNATSCluster(n int) (string, error) {
	ports := make([]int, n)
	routes := make([]string, n)
	for i := range ports {
		p, err := freePort()
		if err != nil {
			return "", err
		}
		ports[i] = p
		routes[i] = fmt.Sprintf("nats-route://127.0.0.1:%d", p)
	}
	var (
		nodes []*server.Server
		urls  []string
	)
	for i := range n {
		opts, err := b.natsOptions(fmt.Sprintf("lockbench-n%d", i))
		if err != nil {
			return "", err
		}
		opts.Cluster = server.ClusterOpts{Name: "lockbench", Host: "127.0.0.1", Port: ports[i]}
		opts.Routes = server.RoutesFromStr(strings.Join(routes, ","))
		ns, err := b.runNATS(opts)
		if err != nil {
			return "", err
		}
		nodes = append(nodes, ns)
		urls = append(urls, ns.ClientURL())
	}
	// Ready when a meta leader sees every node and all are current.
	deadline := time.Now().Add(30 * time.Second)
	for {
		ready := false
		for _, ns := range nodes {
			if ns.JetStreamIsLeader() && len(ns.JetStreamClusterPeers()) == n {
				ready = true
			}
		}
		for _, ns := range nodes {
			ready = ready && ns.JetStreamIsCurrent()
		}
		if ready {
			return strings.Join(urls, ","), nil
		}
		if time.Now().After(deadline) {
			return "", errors.New("no JetStream meta leader with every node after 30s")
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// --- Redis masters, child processes ---

// startRedis returns n independent masters: those listed in
// LOCKS_REDIS_ADDRS, else redis-server processes on free loopback ports.
func (b *brokers) startRedis(ctx context.Context, n int) ([]string, string, error) {
	if env := strings.TrimSpace(os.Getenv("LOCKS_REDIS_ADDRS")); env != "" {
		var addrs []string
		for a := range strings.SplitSeq(env, ",") {
			if a = strings.TrimSpace(a); a != "" {
				if err := redisPing(a); err != nil {
					return nil, "", fmt.Errorf("LOCKS_REDIS_ADDRS: %s: %w", a, err)
				}
				addrs = append(addrs, a)
			}
		}
		about := fmt.Sprintf("%d masters from LOCKS_REDIS_ADDRS", len(addrs))
		if len(addrs) < n {
			return addrs, about, fmt.Errorf("LOCKS_REDIS_ADDRS lists %d masters, %d needed", len(addrs), n)
		}
		return addrs, about, nil
	}
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		return nil, "", errors.New("no redis-server on the PATH (install Redis, or set LOCKS_REDIS_ADDRS to 5 independent masters)")
	}
	var addrs []string
	for range n {
		var (
			addr string
			err  error
		)
		for range 3 { // a free port may be taken before redis binds it
			if addr, err = b.runRedis(ctx, bin); err == nil {
				break
			}
		}
		if err != nil {
			return addrs, "", fmt.Errorf("redis-server: %w", err)
		}
		addrs = append(addrs, addr)
	}
	version := ""
	if out, err := exec.Command(bin, "--version").Output(); err == nil {
		version = strings.TrimSpace(string(out))
	}
	return addrs, fmt.Sprintf("%d masters started from %s (%s), no persistence: %s", n, bin, version, strings.Join(addrs, " ")), nil
}

func (b *brokers) runRedis(ctx context.Context, bin string) (string, error) {
	port, err := freePort()
	if err != nil {
		return "", err
	}
	dir, err := b.tempDir("redis")
	if err != nil {
		return "", err
	}
	cmd := exec.Command(bin, "--port", strconv.Itoa(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
		"--daemonize", "no", "--dir", dir, "--logfile", "")
	// Its own process group, so that ^C reaches lockbench first and
	// lockbench stops it.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		return "", err
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	stop := func() {
		_ = cmd.Process.Kill()
		<-exited
	}
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	deadline := time.Now().Add(10 * time.Second)
	for {
		err := redisPing(addr)
		if err == nil {
			b.onClose(stop)
			return addr, nil
		}
		select {
		case <-exited:
			return "", fmt.Errorf("exited on port %d", port)
		case <-ctx.Done():
			stop()
			return "", ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			stop()
			return "", fmt.Errorf("no PONG on %s after 10s: %w", addr, err)
		}
	}
}

func redisPing(addr string) error {
	c, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		return err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(time.Second))
	if _, err := c.Write([]byte("PING\r\n")); err != nil {
		return err
	}
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		return err
	}
	if strings.TrimSpace(line) != "+PONG" {
		return fmt.Errorf("PING: %q", line)
	}
	return nil
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// --- RabbitMQ ---

const localAMQP = "amqp://guest:guest@127.0.0.1:5672/"

// findAMQP connects to $LOCKS_AMQP_URL or the local broker and returns
// its URL and a description.
func findAMQP() (string, string, error) {
	u := strings.TrimSpace(os.Getenv("LOCKS_AMQP_URL"))
	from := "LOCKS_AMQP_URL"
	if u == "" {
		u, from = localAMQP, "the local broker"
	}
	conn, err := amqp.DialConfig(u, amqp.Config{Dial: amqp.DefaultDial(3 * time.Second)})
	if err != nil {
		return "", "", fmt.Errorf("no RabbitMQ at %s (%s): %v (set LOCKS_AMQP_URL, or run docker compose up rabbitmq)", redact(u), from, err)
	}
	defer conn.Close()
	version, _ := conn.Properties["version"].(string)
	return u, fmt.Sprintf("RabbitMQ %s at %s (%s)", version, redact(u), from), nil
}

// redact hides a URL's password.
func redact(raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		return "(unparsable URL)"
	}
	return u.Redacted()
}
