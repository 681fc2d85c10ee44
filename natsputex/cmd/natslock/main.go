// Command natslock is putex's agent: it elects one node among several to
// run a service, using one key of a NATS JetStream KV bucket as the lock.
//
// Usage:
//
//	natslock [flags] <nats-url> <bucket> <key> <token>
//
// Run `natslock --help` for the flags, the exit codes and an example.
//
// Every node runs natslock with the same bucket and key and its own token
// (its host name, say): tokens must be distinct. The token is written in the
// key while the node holds it, so the bucket documents who runs the service.
// Every node should use the same -r, -f and -c; while they differ (a rolling
// change), each node writes its T and C*R in the key after its token (on a
// second line), and a standby waits for the longer T and confirms for the
// longer C*R of its own and the active node's.
//
// # Timing
//
// R, the lock renewal interval (-r), is how often the active node runs its health
// check and rewrites its token in the key.
//
// F, the failure threshold (-f), is how many R must pass without any write to the
// key before a standby node may take it. T = F*R is the lock timeout,
// measured by each standby on its own clock (no clock sync needed), and
// the longest a health check may run.
//
// C, the confirmation count (-c), is how many R a node that took the key over
// waits, rewriting its token, before it fences the others and starts the
// service. A free key (missing or blank) is started on at once; a node
// that finds its own token after a write whose answer was lost confirms
// for C*R too. While it confirms, a node writes the longer T and C*R of
// its own and the node it took over from, so the next one waits and
// confirms as long should it stop or die before it is done.
//
// A failed write or health check, or another write in the key, stops the
// service at once; an active node that could not renew for T minus a safety
// margin (-margin, default R/2) begins to stop by itself then. A standby
// starts no earlier than (F+C)*R after the last renewal, so the stop command
// has margin + C*R to finish: choose -c for your slowest stop. The stop
// command is given T + C*R before it is killed; a stop command that fails or
// is killed is logged as failed and run again every R until it succeeds, and
// the key is not blanked meanwhile. A dead node's service is taken over after
// about (F+C)*R. A node whose start command failed leaves a free key to the
// others for T (longer after repeated failures).
//
// # Commands
//
// They run with /bin/sh -c, each in a process group of its own: a command
// cut short (a health check past T, a start when natslock stops) is killed
// with every process it started.
//
// -healthcheck gets the node's state, active or standby, as $1 and in
// $NATSLOCK_STATE. A node checks as active before it runs the start
// command too (on a free key, and when its confirmations are done), so an
// active check must fail only when the service cannot run here (a failed
// unit), not because it is not running yet: the example's check passes
// until systemd marks the unit failed.
//
// -start gets the fencing token (the revision of the write that won the
// key, greater for every later holder) as $1 and in $NATSLOCK_TOKEN (and
// $LOCK_TOKEN, as redlockrun and amqpsem acquire pass theirs): hand
// it to what the service writes to, and have that refuse a token lower
// than the highest it has seen, so that a node that lost the key without
// knowing it yet (paused, cut off) is refused.
//
// The commands must return: natslock waits for them. A start command that
// runs the service in the background must redirect its output (> log 2>&1),
// or it counts as failed and the service flaps. Better, signal a service
// manager (systemctl start ...), as putex advises.
//
// # Stopping
//
// On SIGTERM, SIGINT or SIGHUP natslock stops the service and blanks the
// key, unless it was still confirming a takeover: it then leaves its last
// write, so the next node waits T without a write and confirms (the node
// it took over from may still be stopping). If natslock dies otherwise
// (kill -9, a crash), a reaper process it started (in a process group of
// its own) runs the stop command and kills the process groups of the
// start commands, with what they left running.
// A service that left that group (setsid, a systemd unit) is stopped by the
// stop command only; a reaper killed too (a whole cgroup killed) does
// nothing, nor does one on a system without Unix process groups.
//
// # NATS connection
//
// natslock connects with the options natsputex.ConnectOptions gives: it
// reconnects forever by default (-max-reconnects -1; nats.go's own default
// gives up after 60 attempts, and a closed connection ends natslock with
// status 1), waits -reconnect-wait between attempts to one server (keep it
// well under R, or an active node cannot renew until it has reconnected),
// and does not buffer writes while reconnecting (a write then fails at
// once rather than landing seconds later).
//
// # Logging
//
// natslock logs to standard error, one line per event, with log/slog:
// --log-format text (the default: time=... level=... msg=... key=value)
// or json (one JSON object a line). Every line has the fields key and
// token (this node's); events add phase, holder (the token in the key),
// revision and error; commands (-v) add state (health check),
// fencing_token (start), duration and error. Levels: DEBUG for each
// command (-v), INFO for each event (the default), NOTICE for changes of
// phase and of the connection (-q shows only these and failures), WARN
// for failures, ERROR for what ends natslock. The reaper, once natslock
// has died, writes plain lines prefixed "natslock-reaper:".
//
// # Metrics
//
// With --metrics-addr host:port, natslock serves Prometheus metrics at
// /metrics (through the OpenTelemetry Prometheus exporter) and its state
// as JSON at /state: phase, holder, fencing token, time of the last
// renewal, takeovers, start and stop commands by outcome, failed health
// checks. Port 0 picks a free port: the log says which.
//
//	latchkey_natslock_phase{phase}                      1 for the current phase
//	latchkey_natslock_last_renewal_timestamp_seconds    broker time of the last write
//	latchkey_natslock_takeovers_total                   times this node took the key
//	latchkey_natslock_service_starts_total{outcome}     start commands, ok or failed
//	latchkey_natslock_service_stops_total{outcome}      stop commands, ok or failed
//	latchkey_natslock_health_check_failures_total       failed health checks
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	neturl "net/url"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/latchkey-go/latchkey/locks/command"
	"github.com/latchkey-go/latchkey/natsputex"
)

// Exit codes: the runner's (package locks/command), shared with amqpsem
// and redlockrun, for what the commands have in common: command.ExitOK
// (stopped by a signal, the service stopped), command.ExitError (could not
// connect, open the bucket, or run) and command.ExitUsage (64, bad flags
// or arguments), and one of natslock's own.
const (
	// exitStopFailed: stopped by a signal, but the last stop command
	// failed (the service may still run). natslock never acquires a lease
	// and then runs one command under it (a node that does not get the
	// key waits as a standby), so the runner's 3, command.ExitNotAcquired,
	// cannot arise here and natslock gives 3 this meaning of its own.
	exitStopFailed = 3
)

const help = `natslock runs a service on at most one of several nodes, electing the node
through one key of a NATS JetStream KV bucket (putex's protocol).

Usage:
  natslock [flags] <nats-url> <bucket> <key> <token>
  natslock --help | --version

Every node runs natslock with the same URL, bucket, key, -r, -f and -c,
and a token of its own (its host name, say). R (-r) is the renewal
interval and T = F*R (-f) the lock timeout; a node that took the key over
waits C*R (-c) before it starts the service. The commands run with
/bin/sh -c and must return: -healthcheck gets active or standby as $1 and
$NATSLOCK_STATE, -start the fencing token as $1 and $NATSLOCK_TOKEN.
--metrics-addr serves Prometheus metrics (latchkey_natslock_phase,
latchkey_natslock_takeovers_total, ...) at /metrics and the state as JSON
at /state. -tlsca, -tlscert and -tlskey, the old names of -tls-ca,
-tls-cert and -tls-key, still work but are deprecated.
"go doc github.com/latchkey-go/latchkey/natsputex/cmd/natslock" tells the
timing, the stopping and the logging in full.

Exit codes:
  0   stopped by SIGTERM, SIGINT or SIGHUP; the service was stopped
  1   could not connect, open the bucket or run
  3   stopped by a signal, but the last stop command failed: the service
      may still run
  64  usage error, found before any I/O

Example:
  natslock -r 1s -f 3 -c 1 -healthcheck '! systemctl is-failed --quiet db' \
    -start 'systemctl start db' -stop 'systemctl stop db' \
    nats://nats.local:4222 locks db-primary "$(hostname)"
`

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

// config is what the command line says.
type config struct {
	url, bucket, key, token string
	health, start, stop     string
	verbose, quiet          bool
	logFormat               string
	metricsAddr             string // "": no metrics
	natsOpts                []nats.Option
	opts                    []natsputex.Option
}

// run runs natslock with args and returns its exit code.
func run(args []string, stdout, stderr io.Writer) int {
	cli := &command.CLI{Name: "natslock", Help: help, Stdout: stdout, Stderr: stderr, Aliases: oldFlags}
	cfg, code := parse(cli, args)
	if cfg == nil {
		return code
	}
	logger, err := newLogger(stderr, cfg.logFormat, logLevel(cfg.verbose, cfg.quiet))
	if err != nil { // parse has checked the format
		return cli.Fail("%v", err)
	}
	logger = logger.With(slog.String("key", command.ShortName(cfg.key)), slog.String("token", command.ShortName(cfg.token)))
	slog.SetDefault(logger) // what the libraries log with the log package
	ctx, cancel := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP)
	defer cancel()
	err = supervise(ctx, cfg, logger)
	switch {
	case errors.Is(err, natsputex.ErrStopFailed):
		logger.Error("natslock ends: the service may still run", slog.String("error", err.Error()))
		return exitStopFailed
	case err != nil:
		logger.Error("natslock ends", slog.String("error", err.Error()))
		return command.ExitError
	}
	return command.ExitOK
}

// oldFlags are the old names of flags, still taken for the current ones
// (deprecated, not listed in the help): the TLS flags are named as
// amqpsem's and redlockrun's now.
var oldFlags = map[string]string{"tlsca": "tls-ca", "tlscert": "tls-cert", "tlskey": "tls-key"}

// flags are the command line's flags.
type flags struct {
	r, margin, reconnectWait                    *time.Duration
	f, c, replicas, maxReconnects               *int
	health, start, stop, creds, tlsCert, tlsKey *string
	tlsCA, logFormat, metricsAddr               *string
	verbose, quiet                              *bool
}

// newFlags defines natslock's flags in fs.
func newFlags(fs *flag.FlagSet) *flags {
	return &flags{
		r:             fs.Duration("r", time.Second, "R, the lock renewal interval"),
		f:             fs.Int("f", 3, "F, renewal intervals without a write before a standby takes the key"),
		c:             fs.Int("c", 1, "C, renewal intervals to wait after a takeover before starting the service"),
		margin:        fs.Duration("margin", 0, "safety margin: an active node stops after T minus this without a renewal (default R/2)"),
		health:        fs.String("healthcheck", "", "health-check command, run with sh -c; $1 and $NATSLOCK_STATE are active or standby"),
		start:         fs.String("start", "", "command that unfences this node, fences the others and starts the service; $1 and $NATSLOCK_TOKEN are the fencing token; it must return"),
		stop:          fs.String("stop", "", "command that kills or fences the service on this node; it must return"),
		creds:         fs.String("creds", "", "NATS credentials file"),
		tlsCert:       fs.String("tls-cert", "", "TLS client certificate file"),
		tlsKey:        fs.String("tls-key", "", "TLS client key file"),
		tlsCA:         fs.String("tls-ca", "", "TLS CA certificate file"),
		replicas:      fs.Int("replicas", 1, "replicas of the bucket, if natslock creates it"),
		reconnectWait: fs.Duration("reconnect-wait", 100*time.Millisecond, "time between reconnection attempts to one NATS server (plus up to 100ms of jitter, 1s with TLS)"),
		maxReconnects: fs.Int("max-reconnects", -1, "reconnection attempts before natslock gives up and exits; -1: never give up"),
		verbose:       fs.Bool("v", false, "verbose: also log each command natslock runs, with its duration and result (level DEBUG)"),
		quiet:         fs.Bool("q", false, "quiet: log only failures and changes of phase (level NOTICE and above)"),
		logFormat:     fs.String("log-format", "text", "log format on standard error: text or json"),
		metricsAddr:   fs.String("metrics-addr", "", "serve Prometheus metrics at /metrics and the state as JSON at /state on this host:port (port 0: any free port); off by default"),
	}
}

// parse reads the command line and checks it before any I/O. It returns
// nil and the exit code when natslock must not run: --help, --version, or
// a usage error.
func parse(cli *command.CLI, args []string) (*config, int) {
	fs := flag.NewFlagSet("natslock", flag.ContinueOnError)
	f := newFlags(fs)
	usageErr := func(format string, a ...any) (*config, int) {
		return nil, cli.Fail(format, a...)
	}
	if code, done := cli.Parse(fs, args); done {
		return nil, code
	}
	if fs.NArg() != 4 {
		return usageErr("want 4 arguments, <nats-url> <bucket> <key> <token>; got %d: %q", fs.NArg(), fs.Args())
	}
	cfg := &config{
		url: fs.Arg(0), bucket: fs.Arg(1), key: fs.Arg(2), token: fs.Arg(3),
		health: *f.health, start: *f.start, stop: *f.stop, verbose: *f.verbose, quiet: *f.quiet,
		logFormat: *f.logFormat, metricsAddr: *f.metricsAddr,
	}
	// Every argument is checked before any I/O: a typo must not wait for
	// a connection to fail first.
	if msg := checkFlags(cfg, f); msg != "" {
		return usageErr("%s", msg)
	}
	cfg.opts = []natsputex.Option{
		natsputex.WithRenewInterval(*f.r), natsputex.WithFailureThreshold(*f.f),
		natsputex.WithConfirmations(*f.c), natsputex.WithReplicas(*f.replicas),
	}
	if *f.margin != 0 {
		cfg.opts = append(cfg.opts, natsputex.WithSafetyMargin(*f.margin))
	}
	if err := natsputex.CheckSupervisor(cfg.bucket, cfg.key, cfg.token, cfg.opts...); err != nil {
		return usageErr("%s", command.ShortenIn(command.Message(err, cfg.key), cfg.token))
	}
	cfg.natsOpts = natsOptions(cfg.token, f)
	return cfg, command.ExitOK
}

// checkFlags returns what is wrong with the flags, "" if nothing.
func checkFlags(cfg *config, f *flags) string {
	if msg := checkURLs(cfg.url); msg != "" {
		return msg
	}
	switch {
	case cfg.bucket == "":
		return "empty <bucket>: want a JetStream KV bucket's name"
	case cfg.key == "":
		return "empty <key>: want a key of the bucket"
	case cfg.token == "":
		return "empty <token>: want this node's own token, its host name say"
	case *f.verbose && *f.quiet:
		return "-v and -q exclude each other"
	case *f.reconnectWait <= 0:
		return fmt.Sprintf("-reconnect-wait must be > 0, got %v", *f.reconnectWait)
	case *f.maxReconnects < -1:
		return fmt.Sprintf("-max-reconnects must be >= -1 (-1: forever), got %d", *f.maxReconnects)
	case (*f.tlsCert == "") != (*f.tlsKey == ""):
		return "-tls-cert and -tls-key go together"
	}
	if err := command.CheckLogFormat(*f.logFormat); err != nil {
		return "-" + err.Error()
	}
	// The files are read when natslock connects: a missing one is a
	// usage error, as it is for amqpsem and redlockrun.
	for _, file := range []struct{ flag, path string }{
		{"-creds", *f.creds}, {"-tls-cert", *f.tlsCert}, {"-tls-key", *f.tlsKey}, {"-tls-ca", *f.tlsCA},
	} {
		if file.path == "" {
			continue
		}
		fh, err := os.Open(file.path)
		if err != nil {
			return fmt.Sprintf("%s: %v", file.flag, err)
		}
		_ = fh.Close()
	}
	if cfg.metricsAddr != "" {
		if _, _, err := net.SplitHostPort(cfg.metricsAddr); err != nil {
			return fmt.Sprintf("--metrics-addr must be host:port: %v", err)
		}
	}
	return ""
}

// natsOptions are the NATS connection's options the flags give.
func natsOptions(token string, f *flags) []nats.Option {
	opts := append(natsputex.ConnectOptions(),
		nats.Name("natslock "+token),
		nats.MaxReconnects(*f.maxReconnects),
		nats.ReconnectWait(*f.reconnectWait),
	)
	if *f.creds != "" {
		opts = append(opts, nats.UserCredentials(*f.creds))
	}
	if *f.tlsCert != "" {
		opts = append(opts, nats.ClientCert(*f.tlsCert, *f.tlsKey))
	}
	if *f.tlsCA != "" {
		opts = append(opts, nats.RootCAs(*f.tlsCA))
	}
	return opts
}

// checkURLs returns what is wrong with the NATS URLs, "" if nothing:
// one or more, comma-separated, each nats://, tls://, ws:// or wss://
// (or host:port, which nats.go reads as nats://) with a host and a port
// number if any.
func checkURLs(urls string) string {
	if strings.TrimSpace(urls) == "" {
		return "empty NATS URL: want nats://host:port"
	}
	for u := range strings.SplitSeq(urls, ",") {
		u = strings.TrimSpace(u)
		shown := redactURL(u)
		if !strings.Contains(u, "://") {
			u = "nats://" + u
		}
		p, err := neturl.Parse(u)
		if err != nil {
			return fmt.Sprintf("NATS URL %q: %s", shown, strings.ReplaceAll(err.Error(), u, shown))
		}
		switch p.Scheme {
		case "nats", "tls", "ws", "wss":
		default:
			return fmt.Sprintf("NATS URL %q: want nats://, tls://, ws:// or wss://, got %s://", shown, p.Scheme)
		}
		if p.Hostname() == "" {
			return fmt.Sprintf("NATS URL %q: no host", shown)
		}
		if port := p.Port(); port != "" {
			if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 {
				return fmt.Sprintf("NATS URL %q: bad port %q", shown, port)
			}
		}
	}
	return ""
}

// redactURL returns u with its password, if any, replaced by "xxxxx".
func redactURL(u string) string {
	p, err := neturl.Parse(u)
	if err != nil || p.User == nil {
		return u
	}
	return p.Redacted()
}
