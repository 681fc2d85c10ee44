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

const usage = `amqpsem administers persistent semaphores on RabbitMQ: a semaphore NAME
with C slots is the durable queues NAME-1-A .. NAME-C-A; a client holds slot L
while its connection owns the exclusive queue NAME-L-B.

Usage:
  amqpsem [flags] create NAME SLOTS      create NAME with SLOTS slots
  amqpsem [flags] resize NAME [+|-]N     add N slots (+N), remove N (-N) or set N
  amqpsem [flags] destroy NAME           remove every slot
  amqpsem [flags] status NAME            print the slots and which are held
  amqpsem [flags] wait NAME              wait until holders of removed slots let go
  amqpsem [flags] acquire NAME -- CMD [ARG...]
                                         run CMD while holding a slot; the slot is
                                         released when CMD exits; SIGINT/SIGTERM are
                                         forwarded to CMD (the slot is held until it
                                         exits); CMD gets AMQPSEM_SLOT

Examples:
  amqpsem --url amqp://guest:guest@localhost:5672/ create builds 4
  amqpsem resize builds +2
  amqpsem resize builds -1 && amqpsem wait builds
  amqpsem status builds
  amqpsem --timeout 10m acquire builds -- make -j8
  amqpsem --try acquire builds -- ./nightly.sh || echo "busy or failed: $?"

Exit codes:
  0  success (acquire: CMD succeeded)
  1  error (broker unreachable, refused, ...)
  2  usage error (bad flags, arguments, names or sizes)
  3  not acquired: every slot held (--try), or --timeout passed
  4  acquire: the slot was lost while CMD ran (CMD was sent SIGTERM, and
     SIGKILL if it had not exited after --grace)
  acquire otherwise exits with CMD's own exit status, or 128+N when CMD was
  killed by signal N.

Flags:
`

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

func run(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("amqpsem", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprint(stderr, usage)
		fs.PrintDefaults()
	}
	defURL := os.Getenv("AMQPSEM_URL")
	if defURL == "" {
		defURL = "amqp://guest:guest@localhost:5672/"
	}
	var (
		url        = fs.String("url", defURL, "broker URL, amqp:// or amqps:// (default from $AMQPSEM_URL)")
		layout     = fs.String("layout", "default", `queue layout: "default" (N-i-A, N-i-B) or "python" (N-A-i, N-B-i)`)
		timeout    = fs.Duration("timeout", 0, "give up after this long (0: no limit); exit code 3")
		try        = fs.Bool("try", false, "acquire: fail at once (exit code 3) when every slot is held")
		heartbeat  = fs.Duration("heartbeat", 10*time.Second, "AMQP heartbeat asked for (a heartbeat in --url wins): a holder cut off without a close keeps its slot for 2 to 3 of these")
		overshoot  = fs.Int("overshoot", 8, "admin changes first delete stray slot queues up to this far above the maximum")
		ascending  = fs.Bool("ascending", false, `delete slot queues in ascending order ("Swiss cheese")`)
		beyond     = fs.Int("beyond", 64, "status, wait: look this many slots above the maximum for holders of removed slots")
		tlsCA      = fs.String("tls-ca", "", "PEM file of CA certificates to trust (amqps)")
		tlsCert    = fs.String("tls-cert", "", "PEM client certificate file (amqps)")
		tlsKey     = fs.String("tls-key", "", "PEM client key file (amqps)")
		tlsServer  = fs.String("tls-server-name", "", "server name to verify (amqps; default: the URL's host)")
		tlsNoCheck = fs.Bool("tls-insecure", false, "do not verify the server's certificate (amqps; testing only)")
		grace      = fs.Duration("grace", 10*time.Second, "acquire: when the slot is lost, how long CMD has to exit after SIGTERM before SIGKILL")
	)
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return exitOK
		}
		return exitUsage
	}
	rest := fs.Args()
	if len(rest) < 2 {
		fs.Usage()
		return exitUsage
	}
	verb, name, rest := rest[0], rest[1], rest[2:]
	fail := func(code int, format string, a ...any) int {
		// Library errors already say "amqpsem: "; say it once.
		fmt.Fprintln(stderr, "amqpsem: "+strings.TrimPrefix(fmt.Sprintf(format, a...), "amqpsem: "))
		return code
	}

	opts := []amqpsem.Option{
		amqpsem.WithHeartbeat(*heartbeat), amqpsem.WithOvershoot(*overshoot),
		amqpsem.WithAscendingDelete(*ascending), amqpsem.WithConnectionName("amqpsem " + verb + " " + name),
	}
	lay := amqpsem.DefaultLayout
	switch *layout {
	case "default":
	case "python":
		lay = amqpsem.PythonLayout
		opts = append(opts, amqpsem.WithLayout(lay))
	default:
		return fail(exitUsage, "unknown layout %q", *layout)
	}
	if err := lay.CheckName(name); err != nil {
		return fail(exitUsage, "%v", err)
	}
	switch {
	case *timeout < 0:
		return fail(exitUsage, "--timeout must not be negative, got %v", *timeout)
	case *grace < 0:
		return fail(exitUsage, "--grace must not be negative, got %v", *grace)
	case *beyond < 0 || *beyond > amqpsem.MaxSlots:
		return fail(exitUsage, "--beyond must be in 0..%d, got %d", amqpsem.MaxSlots, *beyond)
	}
	uri, err := amqp.ParseURI(*url)
	if err != nil {
		return fail(exitUsage, "--url: %v", err)
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
			return fail(exitUsage, "%s NAME N: want one count", verb)
		}
		arg := rest[0]
		if verb == "resize" && (strings.HasPrefix(arg, "+") || strings.HasPrefix(arg, "-")) {
			delta, arg = arg[0], arg[1:]
		}
		n, err := strconv.Atoi(arg)
		if err != nil || n < 0 || n == 0 && (verb == "create" || delta != 0) {
			return fail(exitUsage, "%s: bad slot count %q", verb, rest[0])
		}
		slots = n
	case "destroy", "status", "wait":
		if len(rest) != 0 {
			return fail(exitUsage, "%s NAME: unexpected arguments %q", verb, rest)
		}
	case "acquire":
		if len(rest) < 2 || rest[0] != "--" {
			return fail(exitUsage, "acquire NAME -- CMD [ARG...]")
		}
		rest = rest[1:]
	default:
		fs.Usage()
		return exitUsage
	}

	c, err := amqpsem.Dial(ctx, *url, opts...)
	if err != nil {
		return fail(code(err), "%v", err)
	}
	defer c.Close()
	a, err := c.Admin()
	if err != nil {
		return fail(exitUsage, "%v", err)
	}

	switch verb {
	case "create":
		err = a.Create(ctx, name, slots)
		if err == nil {
			fmt.Fprintf(stdout, "created %s with %d slots\n", name, slots)
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
			fmt.Fprintf(stdout, "resized %s from %d to %d slots\n", name, ch.Before, ch.After)
		}
	case "destroy":
		var n int
		n, err = a.Destroy(ctx, name)
		if err == nil {
			fmt.Fprintf(stdout, "destroyed %s (%d slots)\n", name, n)
		}
	case "status":
		var st amqpsem.Status
		st, err = a.Status(ctx, name, *beyond)
		if err == nil {
			printStatus(stdout, name, st)
		}
	case "wait":
		var n int
		if n, err = a.Max(ctx, name); err == nil {
			err = a.WaitReleased(ctx, name, min(n+*beyond, amqpsem.MaxSlots))
		}
		if err == nil {
			fmt.Fprintf(stdout, "no removed slot of %s is held\n", name)
		}
	case "acquire":
		return acquire(ctx, c, name, *try, *grace, rest, stdout, stderr)
	}
	if err != nil {
		return fail(code(err), "%v", err)
	}
	return exitOK
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
	fmt.Fprintf(w, "semaphore %s: %d slots, %d held\n", name, st.Slots, len(st.Held))
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
	s, err := c.Semaphore()
	if err != nil {
		fmt.Fprintln(stderr, "amqpsem: "+strings.TrimPrefix(err.Error(), "amqpsem: "))
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
		fmt.Fprintf(stderr, "amqpsem: acquire %s: %v\n", name, err)
		return code(err)
	}
	slot := lease.(*amqpsem.Lease).Slot()
	defer lease.Release(context.Background())

	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, stdout, stderr
	cmd.Env = append(os.Environ(), "AMQPSEM_NAME="+name, "AMQPSEM_SLOT="+strconv.Itoa(slot))
	if err := cmd.Start(); err != nil {
		fmt.Fprintln(stderr, "amqpsem: "+strings.TrimPrefix(err.Error(), "amqpsem: "))
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
				fmt.Fprintf(stderr, "amqpsem: slot %d of %s lost while the command ran: %v\n", slot, name, context.Cause(lease.Context()))
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
				fmt.Fprintln(stderr, "amqpsem: "+strings.TrimPrefix(err.Error(), "amqpsem: "))
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
