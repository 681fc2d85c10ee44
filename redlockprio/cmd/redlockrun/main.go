// Command redlockrun runs a command while holding a Redlock lock (package
// redlockprio) on one or more independent Redis masters, and stops it
// when the lock is lost.
//
// Usage:
//
//	redlockrun [flags] NAME -- COMMAND [ARG...]
//
// Run "redlockrun --help" for the flags, an example and the exit codes.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/latchkey-go/latchkey/locks"
	"github.com/latchkey-go/latchkey/locks/command"
	"github.com/latchkey-go/latchkey/redlockprio"
)

const usage = `redlockrun runs COMMAND while holding the lock NAME on the Redis masters
given by -addrs (Redlock: a majority of them must grant it), and stops
COMMAND when the lock is lost.

Usage:
  redlockrun [flags] NAME -- COMMAND [ARG...]

COMMAND runs in a process group of its own, with LOCK_NAME, LOCK_TOKEN (the
lock's fencing token, greater for every later holder: hand it to what
COMMAND writes to, and have that refuse a token lower than the highest it
has seen) and LOCK_SLOT (0) in its environment. SIGINT, SIGTERM and SIGHUP
are forwarded to its group (the lock is held until COMMAND exits); while
redlockrun waits for the lock, they end the wait. When COMMAND exits, what
it left running in its group is killed, then the lock is released. When
the lock is lost (a majority of masters could not be renewed in time, a
higher priority took it, its keys were deleted), COMMAND's group is sent
SIGTERM, and SIGKILL if COMMAND has not exited -grace later. If redlockrun
is killed outright (kill -9), a reaper process it started kills COMMAND's
group at once, before the lock's TTL runs out at the masters (not on a
system without Unix process groups).

Example:
  redlockrun -addrs redis1:6379,redis2:6379,redis3:6379 -ttl 30s \
    nightly-report -- ./report.sh --out /data/report
  redlockrun -try nightly-report -- ./report.sh || echo "busy or failed: $?"

Exit codes (those of every command that runs a command under a lease,
amqpsem acquire's too):
  0  COMMAND succeeded
  1  error (a master refused or unreachable, COMMAND not found, ...)
  3  not acquired: the lock is held (-try), or -timeout passed
  4  the lock was lost while COMMAND ran (COMMAND was sent SIGTERM, and
     SIGKILL if it had not exited after -grace)
  64 usage error (bad flags, arguments or name; sysexits' EX_USAGE)
  otherwise COMMAND's own exit status, or 128+N when COMMAND was killed by
  signal N. 0, 1 and 64 are natslock's too. redlockrun's own codes avoid
  2, which the Go runtime exits with on a panic or SIGQUIT (a COMMAND that
  exits 2 still has its 2 passed on).

Messages:
  redlockrun's messages go to standard error through log/slog, one line
  each: -log-format text (the default: time=... level=... msg=...
  key=value) or json (one JSON object a line). Every line has the field
  name (the lock's), and, where they apply, token and error. Usage errors
  (exit code 64), found before any I/O, are plain lines "redlockrun: ...".

Flags:
`

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

// config is what the command line says.
type config struct {
	name    string
	argv    []string
	addrs   []string
	opts    []redlockprio.Option
	try     bool
	timeout time.Duration
	grace   time.Duration
	logFmt  string // text or json
}

// run runs redlockrun with args and returns its exit code.
func run(args []string, stdout, stderr io.Writer) int {
	cfg, exit := parse(args, stderr)
	if cfg == nil {
		return exit
	}
	logger, err := command.NewLogger(stderr, cfg.logFmt, nil)
	if err != nil { // parse has checked the format
		return fail(stderr, command.ExitUsage, "%v", err)
	}
	logger = logger.With(slog.String("name", cfg.name))
	slog.SetDefault(logger) // what the libraries log with the log package
	redis.SetLogger(redisLogger{logger})
	masters := make([]redis.UniversalClient, len(cfg.addrs))
	for i, addr := range cfg.addrs {
		c := redis.NewClient(&redis.Options{Addr: addr, ContextTimeoutEnabled: true})
		defer c.Close()
		masters[i] = c
	}
	client, err := redlockprio.New(masters, cfg.opts...)
	if err != nil {
		if code(err) == command.ExitUsage {
			return fail(stderr, command.ExitUsage, "%v", err)
		}
		logger.Error("failed", slog.String("error", err.Error()))
		return code(err)
	}
	defer client.Close(context.Background())
	return runLocked(client.Locker(), cfg, stdout, stderr, logger)
}

// parse reads the command line and checks it before any I/O. It returns
// nil and the exit code when redlockrun must not go on: --help, or a
// usage error.
func parse(args []string, stderr io.Writer) (*config, int) {
	fs := flag.NewFlagSet("redlockrun", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprint(stderr, usage)
		fs.PrintDefaults()
	}
	addrs := fs.String("addrs", "127.0.0.1:6379", "the Redis masters, host:port, comma-separated: independent servers, not replicas of one another")
	ttl := fs.Duration("ttl", 10*time.Second, "how long the masters keep the lock of a redlockrun that stopped renewing it (a crash)")
	priority := fs.Int("priority", 0, "priority: takes the lock at once from a holder of a strictly lower priority")
	twoMasters := fs.Bool("two-masters", false, "allow two masters (both must grant: they tolerate no failure)")
	try := fs.Bool("try", false, "fail at once (exit code 3) when the lock is held")
	timeout := fs.Duration("timeout", 0, "give up waiting for the lock after this long (0: no limit); exit code 3")
	grace := fs.Duration("grace", 10*time.Second, "when the lock is lost, how long COMMAND has to exit after SIGTERM before SIGKILL")
	logFmt := fs.String("log-format", "text", "format of the messages on standard error (usage errors aside): text or json")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil, command.ExitOK
		}
		return nil, command.ExitUsage
	}
	rest := fs.Args()
	if len(rest) < 3 || rest[1] != "--" {
		return nil, fail(stderr, command.ExitUsage, "want NAME -- COMMAND [ARG...], got %q (see redlockrun --help)", rest)
	}
	cfg := &config{name: rest[0], argv: rest[2:], try: *try, timeout: *timeout, grace: *grace, logFmt: *logFmt}
	for _, a := range strings.Split(*addrs, ",") {
		if a = strings.TrimSpace(a); a != "" {
			cfg.addrs = append(cfg.addrs, a)
		}
	}
	switch {
	case len(cfg.addrs) == 0:
		return nil, fail(stderr, command.ExitUsage, "-addrs: no master")
	case *timeout < 0:
		return nil, fail(stderr, command.ExitUsage, "-timeout must not be negative, got %v", *timeout)
	case *grace < 0:
		return nil, fail(stderr, command.ExitUsage, "-grace must not be negative, got %v", *grace)
	}
	if err := command.CheckLogFormat(*logFmt); err != nil {
		return nil, fail(stderr, command.ExitUsage, "%v", err)
	}
	cfg.opts = []redlockprio.Option{redlockprio.WithTTL(*ttl), redlockprio.WithPriority(*priority)}
	if *twoMasters {
		cfg.opts = append(cfg.opts, redlockprio.WithTwoMasters())
	}
	return cfg, command.ExitOK
}

// runLocked takes the lock and runs the command under it.
func runLocked(locker *redlockprio.Locker, cfg *config, stdout, stderr io.Writer, logger *slog.Logger) int {
	sigs := command.CatchSignals()
	defer sigs.Stop()
	lease, err := lock(locker, cfg, sigs)
	if err != nil {
		if code(err) == command.ExitUsage {
			return fail(stderr, command.ExitUsage, "%v", err)
		}
		logger.Error("failed", slog.String("error", err.Error()))
		return code(err)
	}
	defer lease.Release(context.Background())
	logger = logger.With(slog.Uint64("token", lease.Token()))

	reaper, err := command.StartReaper("redlockrun", "")
	if err != nil {
		logger.Warn("no reaper: a redlockrun killed outright leaves its command running", slog.String("error", err.Error()))
	}
	defer reaper.Close()
	cmd := exec.Command(cfg.argv[0], cfg.argv[1:]...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, stdout, stderr
	exit, err := command.RunLease(lease, cmd, command.Options{
		Grace: cfg.grace, Signals: sigs, Reaper: reaper,
		Logf: func(format string, a ...any) { logger.Warn(fmt.Sprintf(format, a...)) },
	})
	switch {
	case exit == command.ExitLost:
		logger.Error("lock lost while the command ran", slog.String("error", context.Cause(lease.Context()).Error()))
	case err != nil:
		logger.Error("running the command failed", slog.String("error", err.Error()))
	}
	return exit
}

// lock takes the lock (at once, or waiting up to cfg.timeout) until a
// signal comes.
func lock(locker *redlockprio.Locker, cfg *config, sigs *command.Signals) (locks.Lease, error) {
	ctx, cancel := sigs.Context(context.Background())
	defer cancel()
	if cfg.try {
		return locker.TryLock(ctx, cfg.name)
	}
	if cfg.timeout > 0 {
		var stop context.CancelFunc
		ctx, stop = context.WithTimeout(ctx, cfg.timeout)
		defer stop()
	}
	return locker.Lock(ctx, cfg.name)
}

// code maps an error of the lock to an exit code.
func code(err error) int {
	switch {
	case errors.Is(err, locks.ErrInvalidName), errors.Is(err, locks.ErrInvalidOption):
		return command.ExitUsage
	case errors.Is(err, locks.ErrNotAcquired), errors.Is(err, context.DeadlineExceeded):
		return command.ExitNotAcquired
	}
	return command.ExitError
}

// fail reports a usage error, as a plain line, and returns code.
func fail(stderr io.Writer, code int, format string, a ...any) int {
	fmt.Fprintf(stderr, "redlockrun: "+format+"\n", a...)
	return code
}
