// Command redlockrun runs a command while holding a Redlock lock (package
// redlockprio) on one or more independent Redis masters, and stops it
// when the lock is lost.
//
// Usage:
//
//	redlockrun [flags] NAME -- COMMAND [ARG...]
//
// Run "redlockrun --help" for the flags, an example and the exit codes.
//
// -addrs takes host:port and redis:// or rediss:// URLs (user, password,
// db), as go-redis's ParseURL reads them; -password-file and
// $REDLOCKRUN_PASSWORD give a password for masters whose URL has none;
// -tls and -tls-ca, -tls-cert, -tls-key, -tls-server-name, -tls-insecure
// (the flags amqpsem has) set TLS. Every address is parsed before any
// I/O. -timeout bounds the whole acquisition, dials included.
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
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/latchkey-go/latchkey/locks"
	"github.com/latchkey-go/latchkey/locks/command"
	"github.com/latchkey-go/latchkey/redlockprio"
)

const help = `redlockrun runs COMMAND while holding the lock NAME on Redis masters
(Redlock: a majority must grant it), and stops COMMAND (SIGTERM, then
SIGKILL after -grace) when the lock is lost.

Usage:
  redlockrun [flags] NAME -- COMMAND [ARG...]
  redlockrun --help | --version

-addrs lists the masters, comma-separated: host:port (with -tls: over TLS),
or redis:// and rediss:// (TLS) URLs with user, password and db, as
go-redis reads them. Give the password in $REDLOCKRUN_PASSWORD or a file
(-password-file), not on the command line. COMMAND gets LOCK_NAME,
LOCK_TOKEN (the fencing token) and LOCK_SLOT (0) in its environment.

Exit codes:
  0   COMMAND succeeded
  1   error (masters unreachable or refusing, COMMAND not found, ...)
  3   not acquired: the lock is held (-try), or -timeout passed
  4   the lock was lost while COMMAND ran
  64  usage error, found before any I/O
  otherwise COMMAND's own exit status, or 128+N if signal N killed it

Example:
  REDLOCKRUN_PASSWORD=secret redlockrun -tls -tls-ca ca.pem \
    -addrs r1:6380,r2:6380,r3:6380 -timeout 1m nightly-report -- ./report.sh
`

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

// config is what the command line says.
type config struct {
	name    string
	argv    []string
	masters []*redis.Options
	opts    []redlockprio.Option
	try     bool
	timeout time.Duration
	grace   time.Duration
	callTO  time.Duration // bounds each call to a master
	logFmt  string        // text or json
	verbose bool

	start    time.Time // when redlockrun began: -timeout counts from there
	acquired bool      // the lock was acquired
}

// run runs redlockrun with args and returns its exit code.
func run(args []string, stdout, stderr io.Writer) int {
	cli := &command.CLI{Name: "redlockrun", Help: help, Stdout: stdout, Stderr: stderr}
	cfg, exit := parse(cli, args)
	if cfg == nil {
		return exit
	}
	cfg.start = time.Now()
	level := slog.LevelInfo
	if cfg.verbose {
		level = slog.LevelDebug
	}
	logger, err := command.NewLogger(stderr, cfg.logFmt, &slog.HandlerOptions{Level: level})
	if err != nil { // parse has checked the format
		return cli.Fail("%v", err)
	}
	logger = logger.With(slog.String("name", command.ShortName(cfg.name)))
	slog.SetDefault(logger) // what the libraries log with the log package
	redis.SetLogger(redisLogger{logger})
	masters := make([]redis.UniversalClient, len(cfg.masters))
	for i, o := range cfg.masters {
		masters[i] = redis.NewClient(o)
	}
	defer closeAll(masters)
	client, err := redlockprio.New(masters, cfg.opts...)
	if err != nil {
		if code(err) == command.ExitUsage {
			return cli.Fail("%s", command.Message(err, cfg.name))
		}
		logger.Error("failed", slog.String("error", err.Error()))
		return code(err)
	}
	defer func() {
		// Bounded: a master that never answers must not hold the exit
		// (nor past -timeout, if the lock was not acquired). Close
		// waits for such a master about the call timeout, twice it
		// when a waiting Lock must also leave the name's queue: once
		// the lease is released, nothing of it is left to wait for.
		bound := 2 * cfg.callTO
		if cfg.acquired {
			bound = cfg.callTO
		}
		ctx, cancel := context.WithTimeout(context.Background(), bound)
		defer cancel()
		if cfg.timeout > 0 && !cfg.acquired {
			var stop context.CancelFunc
			ctx, stop = context.WithDeadline(ctx, cfg.start.Add(cfg.timeout))
			defer stop()
		}
		// Close may wait past ctx for goroutines talking to a master
		// that never answers: redlockrun exits without them.
		closed := make(chan struct{})
		go func() {
			defer close(closed)
			_ = client.Close(ctx)
		}()
		select {
		case <-closed:
		case <-ctx.Done():
		}
	}()
	return runLocked(client.Locker(), cfg, cli, logger)
}

// parse reads the command line and checks it before any I/O. It returns
// nil and the exit code when redlockrun must not go on: --help,
// --version, or a usage error.
func parse(cli *command.CLI, args []string) (*config, int) {
	fs := flag.NewFlagSet("redlockrun", flag.ContinueOnError)
	addrs := fs.String("addrs", "127.0.0.1:6379", "the masters, comma-separated: host:port or redis://, rediss:// URLs; independent servers, not replicas")
	var sec security
	fs.StringVar(&sec.user, "user", "", "ACL user, for masters whose URL names none")
	fs.StringVar(&sec.passwordFile, "password-file", "", "file holding the password, for masters whose URL has none (default $"+passwordEnv+")")
	fs.BoolVar(&sec.tls, "tls", false, "use TLS with host:port masters (rediss:// always does)")
	fs.StringVar(&sec.ca, "tls-ca", "", "PEM file of CA certificates to trust (default: the system's)")
	fs.StringVar(&sec.cert, "tls-cert", "", "PEM client certificate file")
	fs.StringVar(&sec.key, "tls-key", "", "PEM client key file")
	fs.StringVar(&sec.tlsServer, "tls-server-name", "", "server name to verify (default: the master's host)")
	fs.BoolVar(&sec.insecure, "tls-insecure", false, "do not verify the masters' certificates (testing only)")
	ttl := fs.Duration("ttl", 10*time.Second, "how long the masters keep the lock of a redlockrun that stopped renewing it (a crash)")
	priority := fs.Int("priority", 0, "priority: a holder of a strictly lower priority is made to give the lock up (its COMMAND is stopped); this COMMAND starts once it has")
	twoMasters := fs.Bool("two-masters", false, "allow two masters (both must grant: they tolerate no failure)")
	try := fs.Bool("try", false, "fail at once (exit code 3) when the lock is held")
	timeout := fs.Duration("timeout", 0, "give up after this long, connecting included (0: no limit); exit code 3")
	grace := fs.Duration("grace", 10*time.Second, "when the lock is lost, how long COMMAND has to exit after SIGTERM before SIGKILL")
	logFmt := fs.String("log-format", "text", "format of the messages on standard error: text or json")
	verbose := fs.Bool("v", false, "verbose: also log go-redis's messages (failed dials...)")
	if code, done := cli.Parse(fs, args); done {
		return nil, code
	}
	rest := fs.Args()
	if len(rest) < 3 || rest[1] != "--" {
		return nil, cli.Fail("want NAME -- COMMAND [ARG...], got %d arguments", len(rest))
	}
	cfg := &config{name: rest[0], argv: rest[2:], try: *try, timeout: *timeout, grace: *grace, logFmt: *logFmt, verbose: *verbose}
	switch {
	case *timeout < 0:
		return nil, cli.Fail("-timeout must not be negative, got %v", *timeout)
	case *grace < 0:
		return nil, cli.Fail("-grace must not be negative, got %v", *grace)
	case *ttl <= 0:
		return nil, cli.Fail("-ttl must be positive, got %v", *ttl)
	}
	if err := command.CheckLogFormat(*logFmt); err != nil {
		return nil, cli.Fail("-%v", err)
	}
	// The library's default call timeout: TTL/10 within [200ms, 1s].
	cfg.callTO = min(max(*ttl/10, 200*time.Millisecond), time.Second)
	masters, err := masterOptions(*addrs, &sec, cfg.callTO)
	if err != nil {
		return nil, cli.Fail("%v", err)
	}
	cfg.masters = masters
	cfg.opts = []redlockprio.Option{redlockprio.WithTTL(*ttl), redlockprio.WithPriority(*priority)}
	if *twoMasters {
		cfg.opts = append(cfg.opts, redlockprio.WithTwoMasters())
	}
	return cfg, command.ExitOK
}

// runLocked takes the lock and runs the command under it.
func runLocked(locker *redlockprio.Locker, cfg *config, cli *command.CLI, logger *slog.Logger) int {
	sigs := command.CatchSignals()
	defer sigs.Stop()
	lease, timedOut, err := lock(locker, cfg, sigs)
	if err != nil {
		msg := command.Message(err, cfg.name)
		exit := code(err)
		if exit == command.ExitNotAcquired && !timedOut && !errors.Is(err, locks.ErrNotAcquired) {
			// A master's call timeout (a TLS handshake that never
			// ends, say), not -timeout: an error.
			exit = command.ExitError
		}
		switch exit {
		case command.ExitUsage:
			return cli.Fail("%s", msg)
		case command.ExitNotAcquired:
			// The expected outcomes of -try and -timeout: not errors.
			if errors.Is(err, locks.ErrNotAcquired) {
				logger.Info("not acquired: the lock is held")
			} else {
				logger.Warn("not acquired: -timeout passed", slog.String("error", msg))
			}
			return command.ExitNotAcquired
		}
		logger.Error("failed", slog.String("error", msg))
		return exit
	}
	cfg.acquired = true
	defer func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*cfg.callTO)
		defer cancel()
		_ = lease.Release(ctx)
	}()
	logger = logger.With(slog.Uint64("token", lease.Token()))

	reaper, err := command.StartReaper("redlockrun", "")
	if err != nil {
		logger.Warn("no reaper: a redlockrun killed outright leaves its command running", slog.String("error", err.Error()))
	}
	defer reaper.Close()
	cmd := exec.Command(cfg.argv[0], cfg.argv[1:]...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, cli.Stdout, cli.Stderr
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

// lock takes the lock (at once with -try, or waiting) until cfg.timeout
// passes or a signal comes. timedOut reports that the wait ended by
// -timeout: a deadline in err is then -timeout's, not a master's call
// timeout.
func lock(locker *redlockprio.Locker, cfg *config, sigs *command.Signals) (lease locks.Lease, timedOut bool, err error) {
	ctx, cancel := sigs.Context(context.Background())
	defer cancel()
	if cfg.timeout > 0 {
		// The wait ends a call timeout before -timeout (at most half of
		// it): room for the clean-up of a failed attempt (the deletes of
		// its partial grants, up to a call timeout), which Close waits
		// for until -timeout, so that redlockrun gives up by -timeout
		// and leaves no grant to block others for a TTL.
		var stop context.CancelFunc
		ctx, stop = context.WithDeadline(ctx, cfg.start.Add(max(cfg.timeout-cfg.callTO, cfg.timeout/2)))
		defer stop()
	}
	if cfg.try {
		lease, err = locker.TryLock(ctx, cfg.name)
	} else {
		lease, err = locker.Lock(ctx, cfg.name)
	}
	return lease, errors.Is(ctx.Err(), context.DeadlineExceeded), err
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

// closeAll closes the masters' clients, together: a close waits for the
// calls in flight on a connection, each up to a call timeout.
func closeAll(masters []redis.UniversalClient) {
	var wg sync.WaitGroup
	for _, m := range masters {
		wg.Go(func() { _ = m.Close() })
	}
	wg.Wait()
}
