// Command lockbench measures the latchkey lock backends side by side with
// peer libraries and the brokers' raw floors, in one process and one run,
// and prints one table (optionally also JSON and an SVG chart).
//
// Usage:
//
//	lockbench [flags]
//
// From the repository root:
//
//	go run ./benchmarks/cmd/lockbench --duration 2s --json out.json --svg out.svg
//	go run ./benchmarks/cmd/lockbench --only 'redlockprio/*,redsync/*,redislock,floor/redis' --scenarios uncontended,contended
//
// It starts what it needs through testenv and natsenv, as the tests do:
// NATS always in-process (a single JetStream node and a 3-node cluster),
// Redis masters from the local redis-server on free loopback ports (or
// LOCKS_REDIS_ADDRS), and uses the RabbitMQ at LOCKS_AMQP_URL or
// amqp://guest:guest@127.0.0.1:5672/ (Redis and RabbitMQ in Docker
// containers when those are missing and a Docker engine answers). Systems
// whose broker is missing are left out, and the output says which and why.
// Run lockbench --help for the flags, the systems and the scenarios.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/latchkey-go/latchkey/benchmarks"
)

const usage = `lockbench measures the latchkey lock backends side by side with peer
libraries and each broker's raw floor, in one process and one run.

Usage:
  lockbench [flags]

Examples:
  go run ./benchmarks/cmd/lockbench --duration 2s --json out.json --svg out.svg
  go run ./benchmarks/cmd/lockbench --only 'redlockprio/*,redsync/*,redislock,floor/redis'
  go run ./benchmarks/cmd/lockbench --only natsputex,floor/nats-kv --scenarios uncontended,handoff
  go run ./benchmarks/cmd/lockbench --only natsputex,redlockprio/N3 --otel --scenarios uncontended --rounds 3
  go run ./benchmarks/cmd/lockbench --list

Scenarios:
  uncontended  one client, one name: latency of Lock + Release
  contended    --workers clients on one name, a 100µs critical section each:
               hand-offs per second (latencies are the waits in Lock)
  waiters      contended at each of --waiters client counts (8, 64, 256, 1000),
               reported as waiters/<count>: hand-offs/s, hand-offs to another
               client/s, p50/p99 and longest wait, the busiest client's
               share and broker operations per hand-off; the clients run
               in ⌈count / --waiters-per-process⌉ worker processes (lockbench
               itself), so that no one scheduler limits a thousand waiters
               (the RabbitMQ systems, one connection per client, skip counts
               above --amqp-connections: RabbitMQ's stock socket limit is 832)
  handoff      two clients: time from just before the holder's Release to
               the moment the blocked waiter's Lock returns (monotonic clock)
  semaphore    a semaphore of 8 with 7 slots held by other clients: latency
               of Acquire of the last slot (systems with semaphores only)
  many         one client holds --leases leases for a few renewal ticks:
               renewal round trips per second to the masters, per master per
               tick, and heap per lease (systems with TTL leases only; peers
               are renewed one lease at a time, as their users must)
  mixed-priority  contended with one of the --workers clients at a higher
               priority, taking the name from the others (redlockprio only);
               compare its hand-offs/s with contended's
  hung-minority   contended with the first of N >= 3 masters hung (accepting
               requests, never answering) for the whole run (redlockprio/N3,
               N5 only); compare its hand-offs/s with contended's

Each system runs each scenario for --duration (many: the renewal window).
With --rounds N everything runs N times, the systems in another order each
round (so that none always goes first on a cold machine), and each figure
is the median round's.
The table gives p50/p90/p99, ops/s, and each system's ratio to its floor
(natsputex to floor/nats-kv, amqpsem to floor/amqp, the Redis systems to
floor/redis) and to its best peer (redlockprio/Nk to redsync/Nk, and N1 also
to redislock): p50 ÷ p50 for latency scenarios, ops/s ÷ ops/s for contended
and many.

Variants: natsputex+otel and redlockprio/N3+otel are natsputex and
redlockprio/N3 with each client's Locker (and Semaphores) wrapped by
lockotel on a real OpenTelemetry SDK: every span sampled, batched and
dropped by a no-op exporter; every measurement aggregated by a meter
provider with a manual reader. They run only when named in --only (globs
and "all" leave them out) or with --otel, which adds the variant of each
selected system that has one. The output then gives each variant's
overhead over its twin, in the same run: p50 ÷ twin's p50 − 1 (contended:
twin's ops/s ÷ variant's − 1). They skip many, mixed-priority and
hung-minority.

Brokers (started or found, as testenv does for the tests; loopback only):
  NATS      nats-server processes of the version lockbench links, built
            once with go install (one node and a 3-node cluster)
  Redis     LOCKS_REDIS_ADDRS (5 independent masters), else 5 redis-server
            processes started from the PATH on free ports (else Docker)
  RabbitMQ  LOCKS_AMQP_URL, else amqp://guest:guest@127.0.0.1:5672/
            (else Docker)
Systems whose broker is missing are left out, and lockbench says why.

Flags:
`

func main() {
	if len(os.Args) == 2 && os.Args[1] == workerFlag {
		os.Exit(serveWorker())
	}
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

// workerFlag, hidden, makes lockbench a worker process of the waiters
// scenario: it speaks JSON with its parent on stdin and stdout.
const workerFlag = "--waiters-worker"

func serveWorker() int {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := benchmarks.ServeWorker(ctx, os.Stdin, os.Stdout); err != nil {
		fmt.Fprintf(os.Stderr, "lockbench worker: %v\n", err)
		return 1
	}
	return 0
}

// workerCommand runs this program as a worker process.
func workerCommand(ctx context.Context) *exec.Cmd {
	self, err := os.Executable()
	if err != nil {
		self = os.Args[0]
	}
	return exec.CommandContext(ctx, self, workerFlag)
}

// flags are lockbench's command line.
type flags struct {
	only, scenarios string
	duration, ttl   time.Duration
	rounds, workers int
	leases          int
	waiters         string
	perProcess      int
	amqpConns       int
	waiterCounts    []int
	jsonOut, svgOut string
	list, otel      bool
	entries         []benchmarks.Entry // what only selects
	scenarioList    []string           // what scenarios selects, in report order
}

// parseFlags parses args; on an error or --help it returns ok false and
// the exit code, having said why on stderr.
func parseFlags(args []string, stderr io.Writer) (f flags, code int, ok bool) {
	fs := flag.NewFlagSet("lockbench", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&f.only, "only", "all", "systems to run: comma-separated names or globs (\"redsync/*\", \"floor/\")")
	fs.StringVar(&f.scenarios, "scenarios", strings.Join(benchmarks.Scenarios(), ","), "scenarios to run, comma-separated")
	fs.DurationVar(&f.duration, "duration", 3*time.Second, "how long each system runs each scenario")
	fs.IntVar(&f.rounds, "rounds", 1, "run everything this many times, the systems in another order each round, and report each pair's median round")
	fs.IntVar(&f.workers, "workers", 8, "clients in the contended scenario (and acquiring goroutines in many)")
	fs.IntVar(&f.leases, "leases", 10000, "leases held in the many scenario")
	fs.StringVar(&f.waiters, "waiters", "8,64,256,1000", "client counts of the waiters scenario, comma-separated")
	fs.IntVar(&f.amqpConns, "amqp-connections", benchmarks.DefaultAMQPConnections, "most RabbitMQ connections a run opens (one per client): larger waiter counts skip the RabbitMQ systems")
	fs.IntVar(&f.perProcess, "waiters-per-process", benchmarks.DefaultPerProcess, "most clients of the waiters scenario in one worker process")
	fs.DurationVar(&f.ttl, "ttl", benchmarks.DefaultTTL, "lease TTL of the systems with TTLs (renewed every third)")
	fs.StringVar(&f.jsonOut, "json", "", "write the results as JSON to `FILE`")
	fs.StringVar(&f.svgOut, "svg", "", "write a chart as SVG to `FILE`")
	fs.BoolVar(&f.otel, "otel", false, "also run the +otel variant (the system wrapped by lockotel on the OpenTelemetry SDK) of each selected system that has one, and print its overhead")
	fs.BoolVar(&f.list, "list", false, "list the systems and scenarios, and exit")
	fs.Usage = func() {
		fmt.Fprint(stderr, usage)
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return f, 0, false
		}
		return f, 2, false
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "lockbench: unexpected arguments %q (see --help)\n", fs.Args())
		return f, 2, false
	}
	if f.list {
		return f, 0, true
	}
	var err error
	if f.entries, err = benchmarks.Match(f.only); err != nil {
		fmt.Fprintf(stderr, "lockbench: --only: %v\n", err)
		return f, 2, false
	}
	if f.otel {
		f.entries = benchmarks.WithVariants(f.entries)
	}
	if f.scenarioList, err = pickScenarios(f.scenarios); err != nil {
		fmt.Fprintf(stderr, "lockbench: --scenarios: %v\n", err)
		return f, 2, false
	}
	if f.duration <= 0 || f.workers < 2 || f.leases < 1 || f.ttl <= 0 || f.rounds < 1 || f.perProcess < 1 {
		fmt.Fprintln(stderr, "lockbench: --duration and --ttl must be > 0, --workers >= 2, --leases >= 1, --rounds >= 1, --waiters-per-process >= 1")
		return f, 2, false
	}
	if f.waiterCounts, err = benchmarks.ParseWaiters(f.waiters); err != nil {
		fmt.Fprintf(stderr, "lockbench: --waiters: %v\n", err)
		return f, 2, false
	}
	return f, 0, true
}

func run(args []string, stdout, stderr io.Writer) int {
	f, code, ok := parseFlags(args, stderr)
	if !ok {
		return code
	}
	if f.list {
		listSystems(stdout)
		return 0
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	logf := func(format string, args ...any) { fmt.Fprintf(stderr, format+"\n", args...) }

	bk := startBrokers(ctx, f.entries, logf)
	defer bk.close(logf)
	env := bk.env
	env.TTL = f.ttl
	runnable, leftOut := bk.runnable(f.entries, logf)
	rtt, idleRTT := measureRTT(ctx, env, logf)

	p := benchmarks.Params{Duration: f.duration, Workers: f.workers, Leases: f.leases, Rounds: f.rounds,
		Waiters: f.waiterCounts, AMQPConnections: f.amqpConns, Spread: &benchmarks.Spread{Command: workerCommand, PerProcess: f.perProcess, Env: env}}
	start := time.Now()
	rep, runErr := benchmarks.RunAll(ctx, env, runnable, f.scenarioList, p, stderr)
	rep.Skipped = append(leftOut, rep.Skipped...)
	rep.RTT, rep.IdleRTT = rtt, idleRTT
	rep.Machine.Brokers = bk.about
	rep.Machine.Params = map[string]string{
		"duration": f.duration.String(), "workers": fmt.Sprint(f.workers), "leases": fmt.Sprint(f.leases),
		"ttl": f.ttl.String(), "rounds": fmt.Sprint(f.rounds), "only": f.only, "otel": fmt.Sprint(f.otel), "scenarios": strings.Join(f.scenarioList, ","),
		"hold": "100µs", "semaphore_size": "8", "waiters": f.waiters, "waiters_per_process": fmt.Sprint(f.perProcess), "amqp_connections": fmt.Sprint(f.amqpConns),
	}
	logf("lockbench: done in %v", time.Since(start).Round(time.Second))

	code = 0
	if runErr != nil {
		fmt.Fprintf(stderr, "lockbench: stopped early: %v\n", runErr)
		code = 1
	}
	if !writeReport(rep, f, stdout, stderr) {
		code = 1
	}
	return code
}

// listSystems prints what --list prints.
func listSystems(stdout io.Writer) {
	for _, e := range benchmarks.Systems() {
		note := ""
		if e.NotWired != "" {
			note = "  (not wired: " + e.NotWired + ")"
		}
		if e.Twin != "" {
			note = "  (optional: " + e.Twin + " wrapped by lockotel; name it in --only, or --otel)"
		}
		fmt.Fprintf(stdout, "%-20s %-8s %s%s\n", e.Name, e.Kind, needs(e), note)
	}
	fmt.Fprintf(stdout, "scenarios: %s\n", strings.Join(benchmarks.Scenarios(), ", "))
}

// runnable returns the entries whose brokers are there, and the others
// as left out, saying why.
func (b *brokers) runnable(entries []benchmarks.Entry, logf func(string, ...any)) ([]benchmarks.Entry, []benchmarks.Skipped) {
	var runnable []benchmarks.Entry
	var leftOut []benchmarks.Skipped
	for _, e := range entries {
		if why, ok := b.missing[e.Needs]; ok && e.NotWired == "" && (e.Needs != benchmarks.Redis || len(b.env.Redis) < e.Masters) {
			leftOut = append(leftOut, benchmarks.Skipped{System: e.Name, Reason: e.Needs.String() + " unavailable: " + why})
			logf("lockbench: %-19s left out: %s unavailable: %s", e.Name, e.Needs, why)
			continue
		}
		runnable = append(runnable, e)
	}
	return runnable, leftOut
}

// measureRTT measures each broker's round trip, back to back and after
// an idle gap, in nanoseconds by broker name.
func measureRTT(ctx context.Context, env benchmarks.Env, logf func(string, ...any)) (rtt, idleRTT map[string]int64) {
	rtt, idleRTT = map[string]int64{}, map[string]int64{}
	for _, b := range []benchmarks.Broker{benchmarks.NATS, benchmarks.NATSCluster, benchmarks.Redis, benchmarks.AMQP} {
		d, err := benchmarks.BrokerRTT(ctx, env, b, 200, 0)
		if err != nil {
			continue
		}
		rtt[b.String()] = int64(d)
		idle, err := benchmarks.BrokerRTT(ctx, env, b, 100, benchmarks.IdleGap)
		if err == nil {
			idleRTT[b.String()] = int64(idle)
		}
		logf("lockbench: %s round trip p50 %s back to back, %s after %s idle", b, benchmarks.FormatDuration(d), benchmarks.FormatDuration(idle), benchmarks.IdleGap)
	}
	return rtt, idleRTT
}

// writeReport prints the table and writes the files asked for; it
// returns false if one could not be written.
func writeReport(rep *benchmarks.Report, f flags, stdout, stderr io.Writer) bool {
	ok := true
	fmt.Fprintf(stdout, "lockbench %s on %s (%s, %d CPUs, %s), %s per system and scenario%s\n\n",
		rep.Machine.Started.Format(time.RFC3339), rep.Machine.Hostname, rep.Machine.CPU, rep.Machine.CPUs, rep.Machine.GoVersion, f.duration, medianOf(f.rounds))
	if err := rep.WriteTable(stdout); err != nil {
		fmt.Fprintf(stderr, "lockbench: %v\n", err)
		ok = false
	}
	for _, out := range []struct {
		path  string
		write func(io.Writer) error
	}{{f.jsonOut, rep.WriteJSON}, {f.svgOut, rep.WriteSVG}} {
		if out.path == "" {
			continue
		}
		if err := writeFile(out.path, out.write); err != nil {
			fmt.Fprintf(stderr, "lockbench: %v\n", err)
			ok = false
		}
	}
	return ok
}

func medianOf(rounds int) string {
	if rounds <= 1 {
		return ""
	}
	return fmt.Sprintf(", median of %d rounds", rounds)
}

func needs(e benchmarks.Entry) string {
	switch {
	case e.Needs == 0:
		return "in-process"
	case e.Needs == benchmarks.Redis:
		return fmt.Sprintf("%d Redis master(s)", e.Masters)
	default:
		return e.Needs.String()
	}
}

func pickScenarios(list string) ([]string, error) {
	known := benchmarks.Scenarios()
	if strings.TrimSpace(list) == "" || list == "all" {
		return known, nil
	}
	want := map[string]bool{}
	for s := range strings.SplitSeq(list, ",") {
		s = strings.TrimSpace(s)
		if s == "" {
			continue
		}
		ok := false
		for _, k := range known {
			ok = ok || k == s
		}
		if !ok {
			return nil, fmt.Errorf("unknown scenario %q (scenarios: %s)", s, strings.Join(known, ", "))
		}
		want[s] = true
	}
	var out []string
	for _, k := range known { // report order
		if want[k] {
			out = append(out, k)
		}
	}
	return out, nil
}

func writeFile(path string, write func(io.Writer) error) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if err := write(f); err != nil {
		f.Close()
		return fmt.Errorf("%s: %w", path, err)
	}
	return f.Close()
}
