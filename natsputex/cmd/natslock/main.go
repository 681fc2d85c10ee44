// Command natslock is putex's agent: it elects one node among several to
// run a service, using one key of a NATS JetStream KV bucket as the lock.
//
// Usage:
//
//	natslock [flags] <nats-url> <bucket> <key> <token>
//
// Run `natslock --help` for the meaning of R, F and C, the exit codes and
// an example.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"os"
	"os/signal"
	"runtime/debug"
	"sync"
	"syscall"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/latchkey-go/latchkey/natsputex"
)

// Exit codes.
const (
	exitOK         = 0  // stopped by a signal, the service stopped
	exitFailed     = 1  // could not connect, open the bucket, or run
	exitStopFailed = 3  // stopped by a signal, but the last stop command failed
	exitUsage      = 64 // bad flags or arguments (sysexits' EX_USAGE)
)

const usage = `natslock runs a service on at most one of several nodes, electing the node
through one key of a NATS JetStream KV bucket (putex's protocol).

Usage:
  natslock [flags] <nats-url> <bucket> <key> <token>
  natslock --help | --version

Every node runs natslock with the same bucket and key and its own token
(its host name, say): tokens must be distinct. The token is written in the
key while the node holds it, so the bucket documents who runs the service.
Every node should use the same -r, -f and -c; while they differ (a rolling
change), each node writes its T and C*R in the key after its token (on a
second line), and a standby waits for the longer T and confirms for the
longer C*R of its own and the active node's.

Timing:
  R  lock renewal interval (-r): how often the active node runs its health
     check and rewrites its token in the key.
  F  failure threshold (-f): how many R must pass without any write to the
     key before a standby node may take it. T = F*R is the lock timeout,
     measured by each standby on its own clock (no clock sync needed), and
     the longest a health check may run.
  C  confirmation count (-c): how many R a node that took the key over
     waits, rewriting its token, before it fences the others and starts the
     service. A free key (missing or blank) is started on at once; a node
     that finds its own token after a write whose answer was lost confirms
     for C*R too. While it confirms, a node writes the longer T and C*R of
     its own and the node it took over from, so the next one waits and
     confirms as long should it stop or die before it is done.

A failed write or health check, or another write in the key, stops the
service at once; an active node that could not renew for T minus a safety
margin (-margin, default R/2) begins to stop by itself then. A standby
starts no earlier than (F+C)*R after the last renewal, so the stop command
has margin + C*R to finish: choose -c for your slowest stop. The stop
command is given T + C*R before it is killed; a stop command that fails or
is killed is logged as failed and run again every R until it succeeds, and
the key is not blanked meanwhile. A dead node's service is taken over after
about (F+C)*R. A node whose start command failed leaves a free key to the
others for T (longer after repeated failures).

Commands:
  They run with /bin/sh -c, each in a process group of its own: a command
  cut short (a health check past T, a start when natslock stops) is killed
  with every process it started.
  -healthcheck gets the node's state, active or standby, as $1 and in
  $NATSLOCK_STATE. A node checks as active before it runs the start
  command too (on a free key, and when its confirmations are done), so an
  active check must fail only when the service cannot run here (a failed
  unit), not because it is not running yet: the example's check passes
  until systemd marks the unit failed.
  -start gets the fencing token (the revision of the write that won the
  key, greater for every later holder) as $1 and in $NATSLOCK_TOKEN (and
  $LOCK_TOKEN, as redlockrun and amqpsem acquire pass theirs): hand
  it to what the service writes to, and have that refuse a token lower
  than the highest it has seen, so that a node that lost the key without
  knowing it yet (paused, cut off) is refused.
  The commands must return: natslock waits for them. A start command that
  runs the service in the background must redirect its output (> log 2>&1),
  or it counts as failed and the service flaps. Better, signal a service
  manager (systemctl start ...), as putex advises.

Stopping:
  On SIGTERM, SIGINT or SIGHUP natslock stops the service and blanks the
  key, unless it was still confirming a takeover: it then leaves its last
  write, so the next node waits T without a write and confirms (the node
  it took over from may still be stopping). If natslock dies otherwise
  (kill -9, a crash), a reaper process it started (in a process group of
  its own) runs the stop command and kills the process groups of the
  start commands, with what they left running.
  A service that left that group (setsid, a systemd unit) is stopped by the
  stop command only; a reaper killed too (a whole cgroup killed) does
  nothing, nor does one on a system without Unix process groups.

NATS connection:
  natslock connects with the options natsputex.ConnectOptions gives: it
  reconnects forever by default (-max-reconnects -1; nats.go's own default
  gives up after 60 attempts, and a closed connection ends natslock with
  status 1), waits -reconnect-wait between attempts to one server (keep it
  well under R, or an active node cannot renew until it has reconnected),
  and does not buffer writes while reconnecting (a write then fails at
  once rather than landing seconds later).

Exit codes:
  0   stopped by SIGTERM, SIGINT or SIGHUP; the service was stopped
  1   could not connect, open the bucket or run (the message says why)
  2   the Go runtime: a panic or SIGQUIT (which dumps the goroutines); the
      service was not stopped by natslock (the reaper stops it)
  3   stopped by a signal, but the last stop command failed: the service
      may still run
  64  bad flags or arguments (the message says which)

Example:
  natslock -r 1s -f 3 -c 1 \
    -healthcheck '! systemctl is-failed --quiet db.service' \
    -start 'systemctl start db.service' -stop 'systemctl stop db.service' \
    nats://nats.cluster.local:4222 locks spof-service "$(hostname)"

Flags:
`

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

// config is what the command line says.
type config struct {
	url, bucket, key, token string
	health, start, stop     string
	verbose, quiet          bool
	natsOpts                []nats.Option
	opts                    []natsputex.Option
}

// run runs natslock with args and returns its exit code.
func run(args []string, stdout, stderr io.Writer) int {
	cfg, code := parse(args, stdout, stderr)
	if cfg == nil {
		return code
	}
	logger := log.New(stderr, "", log.LstdFlags|log.Lmicroseconds)
	ctx, cancel := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP)
	defer cancel()
	err := supervise(ctx, cfg, logger)
	switch {
	case errors.Is(err, natsputex.ErrStopFailed):
		logger.Printf("natslock: key=%s %v", cfg.key, err)
		return exitStopFailed
	case err != nil:
		logger.Printf("natslock: key=%s %v", cfg.key, err)
		return exitFailed
	}
	return exitOK
}

// parse reads the command line. It returns nil and the exit code when
// natslock must not run: --help, --version, or a usage error.
func parse(args []string, stdout, stderr io.Writer) (*config, int) {
	fs := flag.NewFlagSet("natslock", flag.ContinueOnError)
	fs.SetOutput(io.Discard) // natslock reports errors itself
	r := fs.Duration("r", time.Second, "R, the lock renewal interval")
	f := fs.Int("f", 3, "F, renewal intervals without a write before a standby takes the key")
	c := fs.Int("c", 1, "C, renewal intervals to wait after a takeover before starting the service")
	margin := fs.Duration("margin", 0, "safety margin: an active node stops after T minus this without a renewal (default R/2)")
	health := fs.String("healthcheck", "", "health-check command, run with sh -c; $1 and $NATSLOCK_STATE are active or standby")
	start := fs.String("start", "", "command that unfences this node, fences the others and starts the service; $1 and $NATSLOCK_TOKEN are the fencing token; it must return")
	stop := fs.String("stop", "", "command that kills or fences the service on this node; it must return")
	creds := fs.String("creds", "", "NATS credentials file")
	tlsCert := fs.String("tlscert", "", "TLS client certificate file")
	tlsKey := fs.String("tlskey", "", "TLS client key file")
	tlsCA := fs.String("tlsca", "", "TLS CA certificate file")
	replicas := fs.Int("replicas", 1, "replicas of the bucket, if natslock creates it")
	reconnectWait := fs.Duration("reconnect-wait", 100*time.Millisecond, "time between reconnection attempts to one NATS server (plus up to 100ms of jitter, 1s with TLS)")
	maxReconnects := fs.Int("max-reconnects", -1, "reconnection attempts before natslock gives up and exits; -1: never give up")
	verbose := fs.Bool("v", false, "verbose: also log each command natslock runs, with its duration and result")
	quiet := fs.Bool("q", false, "quiet: log only failures and changes of phase")
	version := fs.Bool("version", false, "print natslock's version and exit")

	usageErr := func(format string, a ...any) (*config, int) {
		fmt.Fprintf(stderr, "natslock: "+format+"\nRun natslock --help for usage.\n", a...)
		return nil, exitUsage
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			fmt.Fprint(stdout, usage)
			fs.SetOutput(stdout)
			fs.PrintDefaults()
			return nil, exitOK
		}
		return usageErr("%v", err)
	}
	if *version {
		fmt.Fprintln(stdout, "natslock", versionString())
		return nil, exitOK
	}
	if fs.NArg() != 4 {
		return usageErr("want 4 arguments, <nats-url> <bucket> <key> <token>; got %d: %q", fs.NArg(), fs.Args())
	}
	cfg := &config{
		url: fs.Arg(0), bucket: fs.Arg(1), key: fs.Arg(2), token: fs.Arg(3),
		health: *health, start: *start, stop: *stop, verbose: *verbose, quiet: *quiet,
	}
	// Every argument is checked before any I/O: a typo must not wait for
	// a connection to fail first.
	switch {
	case cfg.url == "":
		return usageErr("empty NATS URL")
	case *verbose && *quiet:
		return usageErr("-v and -q exclude each other")
	case *reconnectWait <= 0:
		return usageErr("-reconnect-wait must be > 0, got %v", *reconnectWait)
	case *maxReconnects < -1:
		return usageErr("-max-reconnects must be >= -1 (-1: forever), got %d", *maxReconnects)
	case (*tlsCert == "") != (*tlsKey == ""):
		return usageErr("-tlscert and -tlskey go together")
	}
	cfg.opts = []natsputex.Option{
		natsputex.WithRenewInterval(*r), natsputex.WithFailureThreshold(*f),
		natsputex.WithConfirmations(*c), natsputex.WithReplicas(*replicas),
	}
	if *margin != 0 {
		cfg.opts = append(cfg.opts, natsputex.WithSafetyMargin(*margin))
	}
	if err := natsputex.CheckSupervisor(cfg.bucket, cfg.key, cfg.token, cfg.opts...); err != nil {
		return usageErr("%v", err)
	}
	cfg.natsOpts = append(natsputex.ConnectOptions(),
		nats.Name("natslock "+cfg.token),
		nats.MaxReconnects(*maxReconnects),
		nats.ReconnectWait(*reconnectWait),
	)
	if *creds != "" {
		cfg.natsOpts = append(cfg.natsOpts, nats.UserCredentials(*creds))
	}
	if *tlsCert != "" {
		cfg.natsOpts = append(cfg.natsOpts, nats.ClientCert(*tlsCert, *tlsKey))
	}
	if *tlsCA != "" {
		cfg.natsOpts = append(cfg.natsOpts, nats.RootCAs(*tlsCA))
	}
	return cfg, exitOK
}

// version, if set at build time (-ldflags "-X main.version=v1.2.3"), is
// natslock's version; otherwise the module's build information says.
var version string

// versionString is the version natslock was built from, with its VCS
// revision when known.
func versionString() string {
	if version != "" {
		return version
	}
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return "(unknown)"
	}
	v := bi.Main.Version
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			v += " " + s.Value
		case "vcs.modified":
			if s.Value == "true" {
				v += "+dirty"
			}
		}
	}
	return v + " " + bi.GoVersion
}

// supervise connects and runs the Supervisor until ctx ends. Its error
// matches [natsputex.ErrStopFailed] when the last stop failed.
func supervise(ctx context.Context, cfg *config, logger *log.Logger) error {
	// A connection that gives up reconnecting (-max-reconnects) ends the
	// run: the Supervisor stops the service, and natslock exits 1.
	ctx, closed := context.WithCancelCause(ctx)
	defer closed(nil)
	var reaper *natsputex.CommandReaper
	if cfg.start != "" {
		var err error
		if reaper, err = natsputex.StartCommandReaper(cfg.stop); err != nil {
			logger.Printf("natslock: key=%s no reaper: a natslock killed outright leaves its service running: %v", cfg.key, err)
			reaper = nil
		} else {
			defer func() {
				if err := reaper.Close(); err != nil {
					logger.Printf("natslock: key=%s %v", cfg.key, err)
				}
			}()
		}
	}
	natsOpts := append(cfg.natsOpts[:len(cfg.natsOpts):len(cfg.natsOpts)],
		nats.DisconnectErrHandler(func(_ *nats.Conn, err error) {
			if ctx.Err() == nil {
				logger.Printf("natslock: key=%s disconnected from NATS: %v", cfg.key, err)
			}
		}),
		nats.ReconnectHandler(func(nc *nats.Conn) {
			logger.Printf("natslock: key=%s reconnected to NATS at %s", cfg.key, nc.ConnectedUrlRedacted())
		}),
		nats.ClosedHandler(func(nc *nats.Conn) {
			if ctx.Err() == nil {
				closed(fmt.Errorf("the NATS connection closed (it stopped reconnecting): %v", nc.LastError()))
			}
		}),
	)
	nc, err := nats.Connect(cfg.url, natsOpts...)
	if err != nil {
		return err
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return err
	}
	opts := cfg.opts
	if cfg.health != "" {
		check := natsputex.CommandHealthCheck(cfg.health)
		if cfg.verbose {
			check = timedCheck(check, cfg.key, logger)
		}
		opts = append(opts[:len(opts):len(opts)], natsputex.WithHealthCheck(check))
	}
	client, err := natsputex.New(ctx, js, cfg.bucket, opts...)
	if err != nil {
		return err
	}
	defer client.Close(context.WithoutCancel(ctx))
	svc := reaper.Service(cfg.start, cfg.stop, observer(cfg, logger))
	if cfg.verbose {
		svc = timedService(svc, cfg, logger)
	}
	sup, err := client.Supervisor(cfg.key, cfg.token, svc)
	if err != nil {
		return err
	}
	logger.Printf("natslock: key=%s token=%q T=%v: running", cfg.key, cfg.token, client.TTL())
	err = sup.Run(ctx)
	cause := context.Cause(ctx)
	switch {
	case errors.Is(err, natsputex.ErrStopFailed):
		return err
	case err != nil && ctx.Err() == nil:
		return err
	case cause != nil && !errors.Is(cause, context.Canceled):
		return cause
	}
	return nil
}

// observer logs the Supervisor's events: every one, or with -q only
// failures and changes of phase.
func observer(cfg *config, logger *log.Logger) func(natsputex.Event) {
	var mu sync.Mutex
	last := natsputex.Phase(-1)
	return func(e natsputex.Event) {
		mu.Lock()
		changed := e.Phase != last
		last = e.Phase
		mu.Unlock()
		if cfg.quiet && !changed && e.Err == nil {
			return
		}
		logger.Printf("natslock: key=%s %s", cfg.key, e)
	}
}

// timedCheck is check, logged with its duration (-v).
func timedCheck(check natsputex.HealthCheck, key string, logger *log.Logger) natsputex.HealthCheck {
	return func(ctx context.Context, s natsputex.State) error {
		begin := time.Now()
		err := check(ctx, s)
		logCommand(logger, key, "health check ("+s.String()+")", begin, err)
		return err
	}
}

// timedService logs each start and stop command with its duration (-v).
func timedService(svc natsputex.Service, cfg *config, logger *log.Logger) natsputex.Service {
	if start := svc.Start; start != nil {
		svc.Start = func(ctx context.Context, token uint64) error {
			begin := time.Now()
			err := start(ctx, token)
			logCommand(logger, cfg.key, fmt.Sprintf("start command (token %d)", token), begin, err)
			return err
		}
	}
	if stop := svc.Stop; stop != nil {
		svc.Stop = func(ctx context.Context) error {
			begin := time.Now()
			err := stop(ctx)
			logCommand(logger, cfg.key, "stop command", begin, err)
			return err
		}
	}
	return svc
}

func logCommand(logger *log.Logger, key, what string, begin time.Time, err error) {
	took := time.Since(begin).Round(time.Millisecond)
	if err != nil {
		logger.Printf("natslock: key=%s %s failed after %v: %v", key, what, took, err)
		return
	}
	logger.Printf("natslock: key=%s %s succeeded in %v", key, what, took)
}
