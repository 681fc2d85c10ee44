// Command amqpsem administers persistent semaphores on RabbitMQ and runs
// commands while holding one of their slots.
//
// Usage:
//
//	amqpsem [flags] create NAME SLOTS
//	amqpsem [flags] resize NAME +N|-N|N
//	amqpsem [flags] destroy NAME
//	amqpsem [flags] status NAME
//	amqpsem [flags] wait NAME
//	amqpsem [flags] acquire NAME -- CMD [ARG...]
//
// Run "amqpsem --help" for the flags, an example and the exit codes.
//
// A semaphore NAME with C slots is the slot queues NAME-1-A .. NAME-C-A;
// a client holds slot L while its connection owns the exclusive queue
// NAME-L-B. With --layout python, the Python client's layout, they are
// NAME-A-1 .. NAME-A-C and NAME-B-L. Slot queues are durable in the
// default layout: a semaphore survives a broker restart. The Python
// layout's are not (the Python client declares them transient): a broker
// restart deletes them, and RabbitMQ 4 refuses them unless its
// configuration has deprecated_features.permit.transient_nonexcl_queues =
// true. A name is one layout's semaphore: create and resize refuse a name
// that has slot queues in the other layout, and status says which layout
// it is in.
//
// resize takes one signed count (+2 adds two slots, -1 removes one) or a
// plain size (3), nothing else; it refuses a semaphore that does not
// exist unless --create is given. Removing slots does not take them from
// their holders: "amqpsem wait NAME" waits until no removed slot is held.
// Changes wait for the semaphore's administration mutex while another
// administrator holds it, and say so.
//
// acquire runs CMD in a process group of its own, forwards SIGINT,
// SIGTERM and SIGHUP to it (the slot is held until CMD exits), kills what
// CMD left in its group when it exits, and, through a reaper process,
// kills that group if amqpsem itself is killed outright.
//
// Messages go to standard error through log/slog (--log-format text or
// json), each line with the fields command and name; usage errors are one
// plain line "amqpsem: ... (see amqpsem --help)" with exit code 64.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/latchkey-go/latchkey/amqpsem"
	"github.com/latchkey-go/latchkey/locks"
	"github.com/latchkey-go/latchkey/locks/command"
)

// Exit codes: those of every command that runs a command under a lease.
const (
	exitOK          = command.ExitOK
	exitError       = command.ExitError
	exitUsage       = command.ExitUsage
	exitNotAcquired = command.ExitNotAcquired // not acquired, or --timeout passed
	exitLost        = command.ExitLost        // acquire: the slot was lost while the command ran
)

const help = `amqpsem administers persistent semaphores on RabbitMQ (a semaphore NAME of
C slots is the queues NAME-1-A .. NAME-C-A; --layout python: NAME-A-1 ..)
and runs a command while holding one of their slots.

Usage:
  amqpsem [flags] create NAME SLOTS
  amqpsem [flags] resize NAME +N|-N|N   add N slots, remove N, or set N
                                        (--create: also of a new semaphore)
  amqpsem [flags] destroy NAME
  amqpsem [flags] status NAME
  amqpsem [flags] wait NAME             until no removed slot is held
  amqpsem [flags] acquire NAME -- CMD [ARG...]
                                        run CMD holding a slot; CMD gets
                                        AMQPSEM_NAME, AMQPSEM_SLOT, LOCK_NAME,
                                        LOCK_SLOT and LOCK_TOKEN (0)
  amqpsem --help | --version

The broker URL is --url, else $AMQPSEM_URL, else amqp://localhost:5672/.

Exit codes:
  0   success (acquire: CMD succeeded)
  1   error (broker unreachable or refusing, no such semaphore, ...)
  3   not acquired: every slot held (--try), or --timeout passed
  4   acquire: the slot was lost while CMD ran
  64  usage error, found before any I/O
  acquire otherwise exits with CMD's own status, or 128+N if signal N
  killed it

Example:
  AMQPSEM_URL=amqps://user:password@rabbit:5671/ amqpsem create builds 4
  amqpsem --timeout 10m acquire builds -- make -j8
`

// verbs are the commands and their arguments, for messages.
var verbs = map[string]string{
	"create":  "create NAME SLOTS",
	"resize":  "resize NAME +N|-N|N",
	"destroy": "destroy NAME",
	"status":  "status NAME",
	"wait":    "wait NAME",
	"acquire": "acquire NAME -- CMD [ARG...]",
}

const verbList = "create, resize, destroy, status, wait or acquire"

// defaultURL is the broker URL without --url or $AMQPSEM_URL: the local
// broker, as the guest user.
const defaultURL = "amqp://localhost:5672/"

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

// message returns err's text for an operator: without the packages'
// internal "amqpsem: " and "locks: " prefixes, which the command adds
// once, and with a name over 200 bytes cut.
func (cfg *config) message(err error) string {
	s := err.Error()
	for _, p := range []string{"amqpsem: ", "locks: "} {
		s = strings.ReplaceAll(s, p, "")
	}
	return command.ShortenIn(s, cfg.name)
}

// run runs amqpsem with args and returns its exit code.
func run(args []string, stdout, stderr io.Writer) int {
	cli := &command.CLI{Name: "amqpsem", Help: help, Stdout: stdout, Stderr: stderr}
	var logger *slog.Logger // once the flags are read
	// fail reports a usage error as one plain line, before any I/O, and
	// any other failure through the logger.
	fail := func(code int, format string, a ...any) int {
		if code == exitUsage || logger == nil {
			cli.Fail(format, a...)
			return code
		}
		logger.Error("failed", slog.String("error", fmt.Sprintf(format, a...)))
		return code
	}
	cfg, exit := parse(cli, args, fail)
	if cfg == nil {
		return exit
	}
	if exit := cfg.checkVerbArgs(fail); exit != exitOK {
		return exit
	}
	base, err := command.NewLogger(stderr, cfg.logFormat, nil)
	if err != nil { // parse has checked the format
		return fail(exitUsage, "-%v", err)
	}
	logger = base.With(slog.String("command", cfg.verb), slog.String("name", command.ShortName(cfg.name)))
	slog.SetDefault(logger) // what the libraries log with the log package
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if cfg.verb == "acquire" {
		stop() // acquire forwards signals to its command instead
		ctx = context.Background()
	}
	if cfg.timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, cfg.timeout)
		defer cancel()
	}
	cfg.opts = append(cfg.opts, amqpsem.WithMutexWaitNotice(func(name string) {
		logger.Info("waiting for the administration mutex: another connection holds it, likely another amqpsem administering the semaphore (\"rabbitmqctl list_queues name owner_pid\" or the management UI shows which)",
			slog.String("mutex_queue", command.ShortName(cfg.lay.Mutex(name))))
	}))

	// Dial checks its URL and options before any I/O: those are usage
	// errors.
	c, err := amqpsem.Dial(ctx, cfg.url, cfg.opts...)
	if err != nil {
		return fail(code(err), "%s", cfg.message(err))
	}
	defer func() {
		// At most 2s for the AMQP close, as before Close took a context.
		cctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_ = c.Close(cctx)
	}()
	if cfg.verb == "acquire" {
		return acquire(ctx, c, cfg, stdout, stderr, logger)
	}
	a, err := c.Admin()
	if err != nil {
		return fail(exitError, "%s", cfg.message(err))
	}
	return administer(ctx, a, cfg, stdout, fail)
}

// code maps a library error to an exit code: an invalid name or option
// is a usage error (64) when found before any I/O, as Dial and the
// command line's checks find them; see [afterIO] for the rest.
func code(err error) int {
	switch {
	case errors.Is(err, locks.ErrInvalidName), errors.Is(err, locks.ErrInvalidOption):
		return exitUsage
	case errors.Is(err, locks.ErrNotAcquired), errors.Is(err, context.DeadlineExceeded):
		return exitNotAcquired
	}
	return exitError
}

// afterIO maps an error found after the broker answered to an exit
// code: as [code], but never a usage error, which is found before any
// I/O: a count the broker's state makes invalid (removing more slots
// than there are) is an error, exit 1.
func afterIO(err error) int {
	if c := code(err); c != exitUsage {
		return c
	}
	return exitError
}
