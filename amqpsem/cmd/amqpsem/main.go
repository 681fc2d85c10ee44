// Command amqpsem administers persistent semaphores on RabbitMQ and runs
// commands while holding one of their slots.
//
// Usage:
//
//	amqpsem [flags] create NAME SLOTS
//	amqpsem [flags] resize NAME [+|-]N
//	amqpsem [flags] destroy NAME
//	amqpsem [flags] status NAME
//	amqpsem [flags] wait NAME
//	amqpsem [flags] acquire NAME -- CMD [ARG...]
//
// Run "amqpsem --help" for the flags, examples and exit codes.
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

const usage = `amqpsem administers persistent semaphores on RabbitMQ and runs commands
while holding one of their slots. A semaphore NAME with C slots is the slot
queues NAME-1-A .. NAME-C-A; a client holds slot L while its connection owns
the exclusive queue NAME-L-B. With --layout python, the Python client's
layout, they are NAME-A-1 .. NAME-A-C and NAME-B-L.

Slot queues are durable in the default layout: a semaphore survives a broker
restart. The Python layout's slot queues are not (the Python client declares
them transient): a broker restart deletes them, and RabbitMQ 4 refuses them
unless its configuration has
  deprecated_features.permit.transient_nonexcl_queues = true
A name is one layout's semaphore: create and resize refuse a name that has
slot queues in the other layout, and status says which layout it is in.

Usage:
  amqpsem [flags] create NAME SLOTS      create NAME with SLOTS slots
  amqpsem [flags] resize NAME [+|-]N     add N slots (+N), remove N (-N) or set N;
                                         waits for the semaphore's administration
                                         mutex if another administrator holds it
  amqpsem [flags] destroy NAME           remove every slot
  amqpsem [flags] status NAME            print the slots, which are held, and which
                                         removed slots are still held (every slot
                                         number is checked: about a second)
  amqpsem [flags] wait NAME              wait until no removed slot is held, whatever
                                         its number (removing slots does not take
                                         them from their holders); it checks every
                                         slot number holding the administration
                                         mutex before it says none is held
  amqpsem [flags] acquire NAME -- CMD [ARG...]
                                         run CMD while holding a slot; the slot is
                                         released when CMD exits; SIGINT, SIGTERM and
                                         SIGHUP are forwarded to CMD (the slot is held
                                         until it exits); CMD gets AMQPSEM_NAME and
                                         AMQPSEM_SLOT (and LOCK_NAME, LOCK_SLOT and
                                         LOCK_TOKEN, always 0 here, as every command
                                         run under a lease does). CMD runs in a process
                                         group of its own, killed when CMD exits and,
                                         by a reaper process, if amqpsem is killed

Examples:
  AMQPSEM_URL=amqp://user:password@rabbit:5672/ amqpsem create builds 4
  amqpsem resize builds +2
  amqpsem resize builds -1 && amqpsem wait builds
  amqpsem status builds
  amqpsem --timeout 10m acquire builds -- make -j8
  amqpsem --try acquire builds -- ./nightly.sh || echo "busy or failed: $?"

Messages:
  amqpsem writes what the commands print (created, status, ...) on standard
  output, and its messages on standard error through log/slog, one line
  each: --log-format text (the default: time=... level=... msg=...
  key=value) or json (one JSON object a line). Every line has the fields
  command (the verb) and name (the semaphore's), and, where they apply,
  slot and error. Usage errors (exit code 64), found before any I/O, are
  plain lines "amqpsem: ...".

Environment:
  AMQPSEM_URL     the broker URL, when --url is not given
  AMQPSEM_LAYOUT  the layout, when --layout is not given

Exit codes:
  0  success (acquire: CMD succeeded)
  1  error (broker unreachable, refused; no such semaphore; a semaphore of the
     other layout in the way; ...)
  3  not acquired: every slot held (--try), or --timeout passed (while
     connecting too)
  4  acquire: the slot was lost while CMD ran (CMD was sent SIGTERM, and
     SIGKILL if it had not exited after --grace)
  64 usage error (bad flags, arguments, names or sizes; sysexits' EX_USAGE)
  acquire otherwise exits with CMD's own exit status, or 128+N when CMD was
  killed by signal N. These are the codes of every command that runs a
  command under a lease (redlockrun's too); 0, 1 and 64 are natslock's too.
  amqpsem's own codes avoid 2, which the Go runtime exits with on a panic
  or SIGQUIT (a CMD that exits 2 still has its 2 passed on).

Flags:
`

// verbs are the commands and their arguments, for messages.
var verbs = map[string]string{
	"create":  "create NAME SLOTS",
	"resize":  "resize NAME [+|-]N",
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
// once.
func message(err error) string {
	s := err.Error()
	for _, p := range []string{"amqpsem: ", "locks: "} {
		s = strings.ReplaceAll(s, p, "")
	}
	return s
}

// run runs amqpsem with args and returns its exit code.
func run(args []string, stdout, stderr io.Writer) int {
	var logger *slog.Logger // once the flags are read
	// fail reports a usage error as a plain line, before any I/O, and
	// any other failure through the logger.
	fail := func(code int, format string, a ...any) int {
		msg := fmt.Sprintf(format, a...)
		if code == exitUsage || logger == nil {
			fmt.Fprintln(stderr, "amqpsem: "+msg)
			return code
		}
		logger.Error("failed", slog.String("error", msg))
		return code
	}
	cfg, exit := parse(args, stderr, fail)
	if cfg == nil {
		return exit
	}
	base, err := command.NewLogger(stderr, cfg.logFormat, nil)
	if err != nil { // parse has checked the format
		return fail(exitUsage, "-%v", err)
	}
	logger = base.With(slog.String("command", cfg.verb), slog.String("name", cfg.name))
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
	if exit := cfg.checkVerbArgs(fail); exit != exitOK {
		return exit
	}
	cfg.opts = append(cfg.opts, amqpsem.WithMutexWaitNotice(func(name string) {
		logger.Info("waiting for the administration mutex: another connection holds it, likely another amqpsem administering the semaphore (\"rabbitmqctl list_queues name owner_pid\" or the management UI shows which)",
			slog.String("mutex_queue", cfg.lay.Mutex(name)))
	}))

	c, err := amqpsem.Dial(ctx, cfg.url, cfg.opts...)
	if err != nil {
		return fail(code(err), "%s", message(err))
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
		return fail(exitUsage, "%s", message(err))
	}
	return administer(ctx, a, cfg, stdout, fail)
}

// code maps a library error to an exit code.
func code(err error) int {
	switch {
	case errors.Is(err, locks.ErrInvalidName), errors.Is(err, locks.ErrInvalidOption):
		return exitUsage
	case errors.Is(err, locks.ErrNotAcquired), errors.Is(err, context.DeadlineExceeded):
		return exitNotAcquired
	}
	return exitError
}
