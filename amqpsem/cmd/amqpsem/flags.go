package main

import (
	"crypto/tls"
	"crypto/x509"
	"flag"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/latchkey-go/latchkey/amqpsem"
	"github.com/latchkey-go/latchkey/locks/command"
)

// config is what the command line says.
type config struct {
	verb, name string
	rest       []string // the verb's arguments after NAME
	url        string
	lay        amqpsem.Layout
	opts       []amqpsem.Option
	timeout    time.Duration
	grace      time.Duration
	logFormat  string // text or json
	try        bool
	create     bool // resize: create a semaphore that does not exist
	slots      int  // create, resize: the count
	delta      byte // resize: '+', '-' or 0
}

// flags are the command line's flags.
type flags struct {
	url, layout, logFormat             *string
	timeout, connectTimeout            *time.Duration
	heartbeat, grace                   *time.Duration
	try, ascending, tlsNoCheck, create *bool
	overshoot                          *int
	tlsCA, tlsCert, tlsKey, tlsServer  *string
}

// newFlags defines the flags in fs.
func newFlags(fs *flag.FlagSet) *flags {
	defLayout := os.Getenv("AMQPSEM_LAYOUT")
	if defLayout == "" {
		defLayout = "default"
	}
	f := &flags{
		// The URL's default is not shown: $AMQPSEM_URL may hold a password.
		url:            fs.String("url", "", "broker URL, amqp:// or amqps:// (default $AMQPSEM_URL, else "+defaultURL+" as the guest user)"),
		layout:         fs.String("layout", defLayout, `queue layout: "default" (N-i-A, N-i-B) or "python" (N-A-i, N-B-i); default from $AMQPSEM_LAYOUT`),
		timeout:        fs.Duration("timeout", 0, "give up after this long, connecting included (0: no limit); exit code 3"),
		connectTimeout: fs.Duration("connect-timeout", 30*time.Second, "give up connecting to the broker after this long (TCP, TLS and AMQP handshakes); exit code 1"),
		try:            fs.Bool("try", false, "acquire: fail at once (exit code 3) when every slot is held"),
		heartbeat:      fs.Duration("heartbeat", 10*time.Second, "AMQP heartbeat asked for (a heartbeat in --url wins): a holder cut off without a close keeps its slot for 2 to 3 of these"),
		overshoot:      fs.Int("overshoot", 8, "admin changes first delete stray slot queues up to this far above the maximum"),
		ascending:      fs.Bool("ascending", false, `delete slot queues in ascending order ("Swiss cheese")`),
		tlsCA:          fs.String("tls-ca", "", "PEM file of CA certificates to trust (amqps)"),
		tlsCert:        fs.String("tls-cert", "", "PEM client certificate file (amqps)"),
		tlsKey:         fs.String("tls-key", "", "PEM client key file (amqps)"),
		tlsServer:      fs.String("tls-server-name", "", "server name to verify (amqps; default: the URL's host)"),
		tlsNoCheck:     fs.Bool("tls-insecure", false, "do not verify the server's certificate (amqps; testing only)"),
		grace:          fs.Duration("grace", 10*time.Second, "acquire: when the slot is lost, how long CMD has to exit after SIGTERM before SIGKILL"),
		logFormat:      fs.String("log-format", "text", "format of the messages on standard error (usage errors aside): text or json"),
		create:         fs.Bool("create", false, "resize: create the semaphore if it does not exist"),
	}
	_ = fs.Int("beyond", 0, "ignored: status and wait check every slot number (kept for old scripts)")
	return f
}

// parse reads the command line and checks it before any I/O. It returns
// nil and the exit code when amqpsem must not go on: --help, --version,
// or a usage error, reported with fail.
func parse(cli *command.CLI, args []string, fail func(int, string, ...any) int) (*config, int) {
	fs := flag.NewFlagSet("amqpsem", flag.ContinueOnError)
	f := newFlags(fs)
	if code, done := cli.Parse(fs, args); done {
		return nil, code
	}
	cfg, code := parseVerb(fs.Args(), fail)
	if cfg == nil {
		return nil, code
	}
	if code := cfg.apply(f, fail); code != exitOK {
		return nil, code
	}
	return cfg, exitOK
}

// parseVerb reads the verb and NAME.
func parseVerb(rest []string, fail func(int, string, ...any) int) (*config, int) {
	if len(rest) == 0 {
		return nil, fail(exitUsage, "no command: want %s", verbList)
	}
	verb := rest[0]
	synopsis, ok := verbs[verb]
	if !ok {
		return nil, fail(exitUsage, "unknown command %q: want %s", verb, verbList)
	}
	if len(rest) < 2 || rest[1] == "--" {
		return nil, fail(exitUsage, "%s: missing NAME: usage: amqpsem [flags] %s", verb, synopsis)
	}
	return &config{verb: verb, name: rest[1], rest: rest[2:]}, exitOK
}

// apply checks the flags and turns them into options.
func (cfg *config) apply(f *flags, fail func(int, string, ...any) int) int {
	cfg.url = *f.url
	if cfg.url == "" {
		cfg.url = os.Getenv("AMQPSEM_URL")
	}
	if cfg.url == "" {
		cfg.url = defaultURL
	}
	cfg.timeout, cfg.grace, cfg.try, cfg.create = *f.timeout, *f.grace, *f.try, *f.create
	cfg.opts = []amqpsem.Option{
		amqpsem.WithHeartbeat(*f.heartbeat), amqpsem.WithOvershoot(*f.overshoot),
		amqpsem.WithAscendingDelete(*f.ascending), amqpsem.WithConnectionName(connName("amqpsem " + cfg.verb + " " + cfg.name)),
	}
	cfg.lay = amqpsem.DefaultLayout
	switch *f.layout {
	case "default":
	case "python":
		cfg.lay = amqpsem.PythonLayout
		cfg.opts = append(cfg.opts, amqpsem.WithLayout(cfg.lay))
	default:
		return fail(exitUsage, "unknown layout %q: want \"default\" or \"python\"", *f.layout)
	}
	if err := cfg.lay.CheckName(cfg.name); err != nil {
		return fail(exitUsage, "%s", cfg.message(err))
	}
	switch {
	case *f.timeout < 0:
		return fail(exitUsage, "--timeout must not be negative, got %v", *f.timeout)
	case *f.connectTimeout <= 0:
		return fail(exitUsage, "--connect-timeout must be positive, got %v", *f.connectTimeout)
	case *f.grace < 0:
		return fail(exitUsage, "--grace must not be negative, got %v", *f.grace)
	}
	if err := command.CheckLogFormat(*f.logFormat); err != nil {
		return fail(exitUsage, "-%v", err)
	}
	cfg.logFormat = *f.logFormat
	cfg.opts = append(cfg.opts, amqpsem.WithConnectTimeout(*f.connectTimeout))
	return cfg.applyTLS(f, fail)
}

// applyTLS checks the URL and the --tls-* flags.
func (cfg *config) applyTLS(f *flags, fail func(int, string, ...any) int) int {
	uri, err := amqp.ParseURI(cfg.url)
	if err != nil {
		return fail(exitUsage, "--url %s: %s", amqpsem.RedactURL(cfg.url), amqpsem.RedactURLsIn(err.Error(), cfg.url))
	}
	if uri.Port < 1 || uri.Port > 65535 {
		return fail(exitUsage, "--url %s: bad port %d", amqpsem.RedactURL(cfg.url), uri.Port)
	}
	if *f.tlsCA == "" && *f.tlsCert == "" && *f.tlsKey == "" && *f.tlsServer == "" && !*f.tlsNoCheck {
		return exitOK
	}
	if uri.Scheme != "amqps" {
		return fail(exitUsage, "--tls-* flags need an amqps:// URL, got %s://", uri.Scheme)
	}
	if (*f.tlsCert == "") != (*f.tlsKey == "") {
		return fail(exitUsage, "--tls-cert and --tls-key go together")
	}
	tc, err := tlsConfig(*f.tlsCA, *f.tlsCert, *f.tlsKey, *f.tlsServer, *f.tlsNoCheck)
	if err != nil {
		return fail(exitUsage, "%v", err)
	}
	cfg.opts = append(cfg.opts, amqpsem.WithTLS(tc))
	return exitOK
}

// checkVerbArgs checks the verb's arguments after NAME.
func (cfg *config) checkVerbArgs(fail func(int, string, ...any) int) int {
	verb, rest, synopsis := cfg.verb, cfg.rest, verbs[cfg.verb]
	switch verb {
	case "create", "resize":
		if len(rest) != 1 {
			return fail(exitUsage, "%s: want one count: usage: amqpsem [flags] %s", verb, synopsis)
		}
		n, delta, ok := parseCount(rest[0], verb == "resize")
		if !ok || n == 0 && (verb == "create" || delta != 0) {
			want := "a positive number of slots"
			if verb == "resize" {
				want = "+N (add N), -N (remove N) or N (set N), N a number"
			}
			return fail(exitUsage, "%s: bad slot count %q: want %s", verb, rest[0], want)
		}
		if limit := cfg.lay.SlotLimit(cfg.name); n > limit && delta != '-' {
			return fail(exitUsage, "%s: %q can have at most %d slots in the %s layout, got %d", verb, command.ShortName(cfg.name), limit, cfg.lay.Name, n)
		}
		cfg.slots, cfg.delta = n, delta
	case "destroy", "status", "wait":
		if len(rest) != 0 {
			return fail(exitUsage, "%s: unexpected arguments %q: usage: amqpsem [flags] %s", verb, rest, synopsis)
		}
	case "acquire":
		if len(rest) < 2 || rest[0] != "--" {
			return fail(exitUsage, "acquire: want -- and a command: usage: amqpsem [flags] %s", synopsis)
		}
		cfg.rest = rest[1:]
	}
	if cfg.create && verb != "resize" {
		return fail(exitUsage, "--create is for resize, not %s", verb)
	}
	return exitOK
}

// parseCount parses a slot count: digits only, and with signed, one
// leading '+' or '-' (the delta it returns). A second sign, spaces or
// anything else make ok false.
func parseCount(arg string, signed bool) (n int, delta byte, ok bool) {
	digits := arg
	if signed && len(arg) > 0 && (arg[0] == '+' || arg[0] == '-') {
		delta, digits = arg[0], arg[1:]
	}
	if digits == "" || len(digits) > 9 || strings.TrimLeft(digits, "0123456789") != "" {
		return 0, 0, false
	}
	n, err := strconv.Atoi(digits)
	return n, delta, err == nil
}

// connName cuts s to the longest connection name, 255 bytes.
func connName(s string) string {
	if len(s) > 255 {
		s = s[:255]
	}
	return s
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
