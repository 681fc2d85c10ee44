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
	"crypto/tls"
	"crypto/x509"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/latchkey-go/latchkey/amqpsem"
	"github.com/latchkey-go/latchkey/locks"
)

// Exit codes.
const (
	exitOK          = 0
	exitError       = 1
	exitUsage       = 2
	exitNotAcquired = 3 // not acquired, or --timeout passed
	exitLost        = 4 // acquire: the slot was lost while the command ran
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
                                         released when CMD exits; SIGINT/SIGTERM are
                                         forwarded to CMD (the slot is held until it
                                         exits); CMD gets AMQPSEM_NAME, AMQPSEM_SLOT

Examples:
  AMQPSEM_URL=amqp://user:password@rabbit:5672/ amqpsem create builds 4
  amqpsem resize builds +2
  amqpsem resize builds -1 && amqpsem wait builds
  amqpsem status builds
  amqpsem --timeout 10m acquire builds -- make -j8
  amqpsem --try acquire builds -- ./nightly.sh || echo "busy or failed: $?"

Environment:
  AMQPSEM_URL     the broker URL, when --url is not given
  AMQPSEM_LAYOUT  the layout, when --layout is not given

Exit codes:
  0  success (acquire: CMD succeeded)
  1  error (broker unreachable, refused; no such semaphore; a semaphore of the
     other layout in the way; ...)
  2  usage error (bad flags, arguments, names or sizes)
  3  not acquired: every slot held (--try), or --timeout passed (while
     connecting too)
  4  acquire: the slot was lost while CMD ran (CMD was sent SIGTERM, and
     SIGKILL if it had not exited after --grace)
  acquire otherwise exits with CMD's own exit status, or 128+N when CMD was
  killed by signal N.

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

func run(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("amqpsem", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprint(stderr, usage)
		fs.PrintDefaults()
	}
	defLayout := os.Getenv("AMQPSEM_LAYOUT")
	if defLayout == "" {
		defLayout = "default"
	}
	var (
		// The URL's default is not shown: $AMQPSEM_URL may hold a password.
		url            = fs.String("url", "", "broker URL, amqp:// or amqps:// (default $AMQPSEM_URL, else "+defaultURL+" as the guest user)")
		layout         = fs.String("layout", defLayout, `queue layout: "default" (N-i-A, N-i-B) or "python" (N-A-i, N-B-i); default from $AMQPSEM_LAYOUT`)
		timeout        = fs.Duration("timeout", 0, "give up after this long, connecting included (0: no limit); exit code 3")
		connectTimeout = fs.Duration("connect-timeout", 30*time.Second, "give up connecting to the broker after this long (TCP, TLS and AMQP handshakes); exit code 1")
		try            = fs.Bool("try", false, "acquire: fail at once (exit code 3) when every slot is held")
		heartbeat      = fs.Duration("heartbeat", 10*time.Second, "AMQP heartbeat asked for (a heartbeat in --url wins): a holder cut off without a close keeps its slot for 2 to 3 of these")
		overshoot      = fs.Int("overshoot", 8, "admin changes first delete stray slot queues up to this far above the maximum")
		ascending      = fs.Bool("ascending", false, `delete slot queues in ascending order ("Swiss cheese")`)
		beyond         = fs.Int("beyond", 0, "ignored: status and wait check every slot number (kept for old scripts)")
		tlsCA          = fs.String("tls-ca", "", "PEM file of CA certificates to trust (amqps)")
		tlsCert        = fs.String("tls-cert", "", "PEM client certificate file (amqps)")
		tlsKey         = fs.String("tls-key", "", "PEM client key file (amqps)")
		tlsServer      = fs.String("tls-server-name", "", "server name to verify (amqps; default: the URL's host)")
		tlsNoCheck     = fs.Bool("tls-insecure", false, "do not verify the server's certificate (amqps; testing only)")
		grace          = fs.Duration("grace", 10*time.Second, "acquire: when the slot is lost, how long CMD has to exit after SIGTERM before SIGKILL")
	)
	_ = beyond
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return exitOK
		}
		return exitUsage
	}
	fail := func(code int, format string, a ...any) int {
		fmt.Fprintln(stderr, "amqpsem: "+fmt.Sprintf(format, a...))
		return code
	}
	rest := fs.Args()
	if len(rest) == 0 {
		return fail(exitUsage, "no command: want %s (see amqpsem --help)", verbList)
	}
	verb := rest[0]
	synopsis, ok := verbs[verb]
	if !ok {
		return fail(exitUsage, "unknown command %q: want %s (see amqpsem --help)", verb, verbList)
	}
	if len(rest) < 2 || rest[1] == "--" {
		return fail(exitUsage, "%s: missing NAME: usage: amqpsem [flags] %s", verb, synopsis)
	}
	name, rest := rest[1], rest[2:]

	if *url == "" {
		*url = os.Getenv("AMQPSEM_URL")
	}
	if *url == "" {
		*url = defaultURL
	}
	opts := []amqpsem.Option{
		amqpsem.WithHeartbeat(*heartbeat), amqpsem.WithOvershoot(*overshoot),
		amqpsem.WithAscendingDelete(*ascending), amqpsem.WithConnectionName(connName("amqpsem " + verb + " " + name)),
	}
	lay := amqpsem.DefaultLayout
	switch *layout {
	case "default":
	case "python":
		lay = amqpsem.PythonLayout
		opts = append(opts, amqpsem.WithLayout(lay))
	default:
		return fail(exitUsage, "unknown layout %q: want \"default\" or \"python\"", *layout)
	}
	if err := lay.CheckName(name); err != nil {
		return fail(exitUsage, "%s", message(err))
	}
	switch {
	case *timeout < 0:
		return fail(exitUsage, "--timeout must not be negative, got %v", *timeout)
	case *connectTimeout <= 0:
		return fail(exitUsage, "--connect-timeout must be positive, got %v", *connectTimeout)
	case *grace < 0:
		return fail(exitUsage, "--grace must not be negative, got %v", *grace)
	}
	opts = append(opts, amqpsem.WithConnectTimeout(*connectTimeout))
	uri, err := amqp.ParseURI(*url)
	if err != nil {
		return fail(exitUsage, "--url %s: %s", amqpsem.RedactURL(*url), amqpsem.RedactURLsIn(err.Error(), *url))
	}
	if *tlsCA != "" || *tlsCert != "" || *tlsKey != "" || *tlsServer != "" || *tlsNoCheck {
		if uri.Scheme != "amqps" {
			return fail(exitUsage, "--tls-* flags need an amqps:// URL, got %s://", uri.Scheme)
		}
		if (*tlsCert == "") != (*tlsKey == "") {
			return fail(exitUsage, "--tls-cert and --tls-key go together")
		}
		cfg, err := tlsConfig(*tlsCA, *tlsCert, *tlsKey, *tlsServer, *tlsNoCheck)
		if err != nil {
			return fail(exitUsage, "%v", err)
		}
		opts = append(opts, amqpsem.WithTLS(cfg))
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if verb == "acquire" {
		stop() // acquire forwards signals to its command instead
		ctx = context.Background()
	}
	if *timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, *timeout)
		defer cancel()
	}

	// Check the arguments before connecting.
	var slots int
	var delta byte
	switch verb {
	case "create", "resize":
		if len(rest) != 1 {
			return fail(exitUsage, "%s: want one count: usage: amqpsem [flags] %s", verb, synopsis)
		}
		arg := rest[0]
		if verb == "resize" && (strings.HasPrefix(arg, "+") || strings.HasPrefix(arg, "-")) {
			delta, arg = arg[0], arg[1:]
		}
		n, err := strconv.Atoi(arg)
		if err != nil || n < 0 || n == 0 && (verb == "create" || delta != 0) {
			return fail(exitUsage, "%s: bad slot count %q", verb, rest[0])
		}
		if limit := lay.SlotLimit(name); n > limit && delta != '-' {
			return fail(exitUsage, "%s: %q can have at most %d slots in the %s layout, got %d", verb, name, limit, lay.Name, n)
		}
		slots = n
	case "destroy", "status", "wait":
		if len(rest) != 0 {
			return fail(exitUsage, "%s: unexpected arguments %q: usage: amqpsem [flags] %s", verb, rest, synopsis)
		}
	case "acquire":
		if len(rest) < 2 || rest[0] != "--" {
			return fail(exitUsage, "acquire: want -- and a command: usage: amqpsem [flags] %s", synopsis)
		}
		rest = rest[1:]
	}
	opts = append(opts, amqpsem.WithMutexWaitNotice(func(name string) {
		fmt.Fprintf(stderr, "amqpsem: waiting for the administration mutex of %s (the exclusive queue %q): another connection holds it, likely another amqpsem administering %s (\"rabbitmqctl list_queues name owner_pid\" or the management UI shows which)\n", name, lay.Mutex(name), name)
	}))

	c, err := amqpsem.Dial(ctx, *url, opts...)
	if err != nil {
		return fail(code(err), "%s", message(err))
	}
	defer func() {
		// As before the kit's Close(ctx): at most 2s for the AMQP close.
		cctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_ = c.Close(cctx)
	}()
	a, err := c.Admin()
	if err != nil {
		return fail(exitUsage, "%s", message(err))
	}
	// missing explains a name without slots in this layout.
	missing := func() string {
		msg := fmt.Sprintf("no semaphore %s in the %s layout (no slot queue %q)", name, lay.Name, lay.Slot(name, 1))
		if others, err := a.OtherLayouts(ctx, name); err == nil && len(others) > 0 {
			msg += fmt.Sprintf("; it is a semaphore of the %s layout: use --layout %s", strings.Join(others, " and "), others[0])
		}
		return msg
	}

	switch verb {
	case "create":
		err = a.Create(ctx, name, slots)
		if err == nil {
			fmt.Fprintf(stdout, "created %s with %s\n", name, count(slots))
		}
	case "resize":
		var ch amqpsem.Change
		switch delta {
		case '+':
			ch, err = a.Add(ctx, name, slots)
		case '-':
			ch, err = a.Remove(ctx, name, slots)
		default:
			ch, err = a.Resize(ctx, name, slots)
		}
		if err == nil {
			fmt.Fprintf(stdout, "resized %s from %d to %s\n", name, ch.Before, count(ch.After))
		}
	case "destroy":
		var n int
		n, err = a.Destroy(ctx, name)
		if err == nil && n == 0 {
			return fail(exitError, "%s", missing())
		}
		if err == nil {
			fmt.Fprintf(stdout, "destroyed %s (%s)\n", name, count(n))
		}
	case "status":
		var st amqpsem.Status
		st, err = a.Status(ctx, name)
		if err == nil && st.Slots == 0 && len(st.Removed) == 0 {
			return fail(exitError, "%s", missing())
		}
		if err == nil {
			printStatus(stdout, name, st)
		}
	case "wait":
		if err = a.WaitReleased(ctx, name); err == nil {
			fmt.Fprintf(stdout, "no removed slot of %s is held (every slot number checked)\n", name)
		}
	case "acquire":
		return acquire(ctx, c, name, *try, *grace, rest, stdout, stderr)
	}
	if err != nil {
		return fail(code(err), "%s", message(err))
	}
	return exitOK
}

// connName cuts s to the longest connection name, 255 bytes.
func connName(s string) string {
	if len(s) > 255 {
		s = s[:255]
	}
	return s
}

// count returns "1 slot" or "n slots".
func count(n int) string {
	if n == 1 {
		return "1 slot"
	}
	return strconv.Itoa(n) + " slots"
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

func printStatus(w io.Writer, name string, st amqpsem.Status) {
	held := map[int]bool{}
	for _, i := range st.Held {
		held[i] = true
	}
	fmt.Fprintf(w, "semaphore %s (%s layout): %s, %d held\n", name, st.Layout, count(st.Slots), len(st.Held))
	for _, o := range st.OtherLayouts {
		fmt.Fprintf(w, "warning: %s also has slot queues in the %s layout: two semaphores share the name\n", name, o)
	}
	for i := 1; i <= st.Slots; i++ {
		state := "free"
		if held[i] {
			state = "held"
		}
		fmt.Fprintf(w, "slot %d: %s\n", i, state)
	}
	for _, i := range st.Removed {
		fmt.Fprintf(w, "slot %d: removed, still held\n", i)
	}
}

// acquire runs argv while holding a slot of name.
func acquire(ctx context.Context, c *amqpsem.Client, name string, try bool, grace time.Duration, argv []string, stdout, stderr io.Writer) int {
	s, err := c.Semaphore(amqpsem.MaxSemaphoreSize) // any slot the broker has
	if err != nil {
		fmt.Fprintln(stderr, "amqpsem: "+message(err))
		return exitUsage
	}
	// Signals while waiting cancel the wait.
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, os.Interrupt, syscall.SIGTERM)
	defer signal.Stop(sigs)
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		select {
		case <-sigs:
			cancel()
		case <-wctx.Done():
		}
	}()
	var lease locks.Lease
	if try {
		lease, err = s.TryAcquire(wctx, name)
	} else {
		lease, err = s.Acquire(wctx, name)
	}
	cancel()
	if err != nil {
		if errors.Is(err, amqpsem.ErrNoSlots) {
			// The library's message speaks of Admins and WithCreate.
			msg := strings.SplitN(message(err), " (", 2)[0]
			fmt.Fprintf(stderr, "amqpsem: acquire %s: %s: create it first (amqpsem create %s SLOTS), or check the name and --layout\n", name, msg, name)
			return exitError
		}
		fmt.Fprintf(stderr, "amqpsem: acquire %s: %s\n", name, message(err))
		return code(err)
	}
	slot := lease.(*amqpsem.Lease).Slot()
	defer lease.Release(context.Background())

	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, stdout, stderr
	cmd.Env = append(os.Environ(), "AMQPSEM_NAME="+name, "AMQPSEM_SLOT="+strconv.Itoa(slot))
	if err := cmd.Start(); err != nil {
		fmt.Fprintln(stderr, "amqpsem: "+message(err))
		return exitError
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	lost := false
	leaseDone := lease.Context().Done()
	var kill <-chan time.Time
	for {
		select {
		case err := <-done:
			if lost {
				fmt.Fprintf(stderr, "amqpsem: slot %d of %s lost while the command ran: %s\n", slot, name, message(context.Cause(lease.Context())))
				return exitLost
			}
			var ee *exec.ExitError
			switch {
			case errors.As(err, &ee):
				if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
					return 128 + int(ws.Signal()) // as shells report it
				}
				return ee.ExitCode()
			case err != nil:
				fmt.Fprintln(stderr, "amqpsem: "+message(err))
				return exitError
			}
			return exitOK
		case sig := <-sigs:
			_ = cmd.Process.Signal(sig)
		case <-leaseDone:
			leaseDone, lost = nil, true
			_ = cmd.Process.Signal(syscall.SIGTERM)
			t := time.NewTimer(grace)
			defer t.Stop()
			kill = t.C
		case <-kill:
			kill = nil
			fmt.Fprintf(stderr, "amqpsem: the command did not exit %v after SIGTERM: killing it\n", grace)
			_ = cmd.Process.Kill()
		}
	}
}

func tlsConfig(ca, cert, key, server string, insecure bool) (*tls.Config, error) {
	cfg := &tls.Config{ServerName: server, InsecureSkipVerify: insecure, MinVersion: tls.VersionTLS12}
	if ca != "" {
		pem, err := os.ReadFile(ca)
		if err != nil {
			return nil, err
		}
		cfg.RootCAs = x509.NewCertPool()
		if !cfg.RootCAs.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("no certificates in %s", ca)
		}
	}
	if cert != "" || key != "" {
		pair, err := tls.LoadX509KeyPair(cert, key)
		if err != nil {
			return nil, err
		}
		cfg.Certificates = []tls.Certificate{pair}
	}
	return cfg, nil
}
