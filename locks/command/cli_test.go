package command_test

import (
	"bytes"
	"flag"
	"fmt"
	"strings"
	"testing"

	"github.com/latchkey-go/latchkey/locks"
	"github.com/latchkey-go/latchkey/locks/command"
)

// parse runs CLI.Parse on a flag set with one flag, -n.
func parse(args ...string) (stdout, stderr string, code int, done bool) {
	var o, e bytes.Buffer
	c := &command.CLI{Name: "demo", Help: "demo does nothing.\n\nUsage:\n  demo [flags] NAME\n", Stdout: &o, Stderr: &e}
	fs := flag.NewFlagSet("demo", flag.ContinueOnError)
	fs.Int("n", 1, "how many")
	code, done = c.Parse(fs, args)
	return o.String(), e.String(), code, done
}

// The convention: help and version on standard output with exit 0; an
// unknown flag or a bad value as one line naming the flag and pointing
// to --help, with exit 64; anything else goes on.
func TestCLIParse(t *testing.T) {
	for _, help := range []string{"--help", "-help", "-h"} {
		out, errOut, code, done := parse(help, "x")
		if !done || code != command.ExitOK || errOut != "" || !strings.Contains(out, "Usage:") || !strings.Contains(out, "Flags:\n") || !strings.Contains(out, "-n int") || !strings.Contains(out, "-version") {
			t.Errorf("%s: done %v, exit %d, stdout %q, stderr %q; want the help and flags on stdout, exit 0", help, done, code, out, errOut)
		}
	}
	out, errOut, code, done := parse("--version")
	if !done || code != command.ExitOK || errOut != "" || !strings.HasPrefix(out, "demo ") || strings.Count(out, "\n") != 1 {
		t.Errorf("--version: done %v, exit %d, stdout %q, stderr %q; want one line \"demo VERSION\", exit 0", done, code, out, errOut)
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"-nosuch", "x"}, "-nosuch"},
		{[]string{"--nosuch=1", "x"}, "-nosuch"},
		{[]string{"-n", "many", "x"}, "-n"},
		{[]string{"-n"}, "-n"},
	} {
		out, errOut, code, done := parse(tc.args...)
		if !done || code != command.ExitUsage || out != "" || strings.Count(errOut, "\n") != 1 ||
			!strings.HasPrefix(errOut, "demo: ") || !strings.Contains(errOut, tc.want) || !strings.HasSuffix(errOut, "(see demo --help)\n") {
			t.Errorf("%q: done %v, exit %d, stdout %q, stderr %q; want one line naming %s and --help, exit 64", tc.args, done, code, out, errOut, tc.want)
		}
	}
	if out, errOut, code, done := parse("-n", "2", "x"); done || code != command.ExitOK || out+errOut != "" {
		t.Errorf("good flags: done %v, exit %d, output %q; want to go on silently", done, code, out+errOut)
	}
}

// An alias: the old name sets the current flag, its errors name the
// flag as given, and the help lists the current name only, with the
// default it had before the command line.
func TestCLIAliases(t *testing.T) {
	run := func(args ...string) (ca, stdout, stderr string, code int, done bool) {
		var o, e bytes.Buffer
		c := &command.CLI{Name: "demo", Help: "demo.\n", Stdout: &o, Stderr: &e, Aliases: map[string]string{"tlsca": "tls-ca"}}
		fs := flag.NewFlagSet("demo", flag.ContinueOnError)
		v := fs.String("tls-ca", "system.pem", "CA file")
		code, done = c.Parse(fs, args)
		return *v, o.String(), e.String(), code, done
	}
	for _, args := range [][]string{{"-tlsca", "ca.pem", "x"}, {"--tlsca=ca.pem", "x"}, {"-tls-ca", "ca.pem", "x"}} {
		if ca, out, errOut, code, done := run(args...); ca != "ca.pem" || done || code != command.ExitOK || out+errOut != "" {
			t.Errorf("%q: -tls-ca %q, done %v, exit %d, output %q; want ca.pem, going on silently", args, ca, done, code, out+errOut)
		}
	}
	_, out, _, code, _ := run("-tlsca", "other.pem", "--help")
	if code != command.ExitOK || !strings.Contains(out, "-tls-ca string") || !strings.Contains(out, `(default "system.pem")`) || strings.Contains(out, "-tlsca") {
		t.Errorf("--help after -tlsca: exit %d, stdout %q; want -tls-ca with its default, and no -tlsca", code, out)
	}
	if _, _, errOut, code, _ := run("-tlsca"); code != command.ExitUsage || !strings.Contains(errOut, "-tlsca") {
		t.Errorf("-tlsca without a value: exit %d, stderr %q; want 64 naming -tlsca", code, errOut)
	}
}

func TestCLIFailOneLine(t *testing.T) {
	var e bytes.Buffer
	c := &command.CLI{Name: "demo", Stderr: &e}
	if code := c.Fail("bad %s", "a\nb\r\n"); code != command.ExitUsage {
		t.Errorf("Fail returned %d, want 64", code)
	}
	if got, want := e.String(), "demo: bad a b (see demo --help)\n"; got != want {
		t.Errorf("Fail wrote %q, want %q", got, want)
	}
}

func TestShortName(t *testing.T) {
	if got := command.ShortName("short"); got != "short" {
		t.Errorf("ShortName(short) = %q", got)
	}
	exact := strings.Repeat("a", command.MaxShownName)
	if got := command.ShortName(exact); got != exact {
		t.Errorf("a name of %d bytes was cut: %q", len(exact), got)
	}
	long := strings.Repeat("a", 199) + "é" + strings.Repeat("b", 300) // é spans bytes 199-200
	got := command.ShortName(long)
	if want := strings.Repeat("a", 199) + "...(501 bytes)"; got != want {
		t.Errorf("ShortName of 501 bytes = %q, want %q", got, want)
	}
	msg := command.ShortenIn(`invalid name "`+long+`": too long`, long)
	if strings.Contains(msg, long) || !strings.Contains(msg, "(501 bytes)") || !strings.HasSuffix(msg, `": too long`) {
		t.Errorf("ShortenIn: %q", msg)
	}
}

// Message drops the "locks: " of the sentinels, keeps the backend's
// prefix and a "locks: " that is not a sentinel's, and cuts a long name.
func TestMessage(t *testing.T) {
	long := strings.Repeat("n", 300)
	for _, tc := range []struct {
		err  error
		name string
		want string
	}{
		{fmt.Errorf("redlockprio: lock: %w %q: too long", locks.ErrInvalidName, "x"), "x", `redlockprio: lock: invalid name "x": too long`},
		{fmt.Errorf("redlockprio: new: %w: two masters", locks.ErrInvalidOption), "", "redlockprio: new: invalid option: two masters"},
		{fmt.Errorf("natsputex: trylock: %w", &locks.HeldError{Name: "job", Holder: "node-b"}), "job", `natsputex: trylock: not acquired: "job" is held by node-b`},
		{fmt.Errorf("amqpsem: lock %q: %w", "my locks: x", locks.ErrClosed), "my locks: x", `amqpsem: lock "my locks: x": closed`},
		{fmt.Errorf("redlockprio: lock %q: %w", long, locks.ErrLost), long, `redlockprio: lock "` + strings.Repeat("n", 200) + `...(300 bytes)": lease lost`},
	} {
		if got := command.Message(tc.err, tc.name); got != tc.want {
			t.Errorf("Message(%q) = %q, want %q", tc.err, got, tc.want)
		}
	}
}
