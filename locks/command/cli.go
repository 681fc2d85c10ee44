package command

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"runtime/debug"
	"strings"

	"github.com/latchkey-go/latchkey/locks"
	"github.com/latchkey-go/latchkey/locks/driver"
)

// A CLI is the command-line convention every latchkey command keeps
// (natslock, amqpsem, redlockrun):
//
//   - --help, -help and -h print the help on standard output and exit
//     [ExitOK]; the help is short: a synopsis, the flags, the exit codes
//     and one example.
//   - --version prints "NAME VERSION" on standard output and exits
//     [ExitOK] ([Version]).
//   - An unknown flag, a flag's bad value or a bad argument is ONE line on
//     standard error, "NAME: what is wrong (see NAME --help)", with
//     [ExitUsage], found before any I/O.
//
// A CLI is not safe for concurrent use; a command makes one in main.
type CLI struct {
	Name   string    // the command's name, "redlockrun"
	Help   string    // the help, printed before "Flags:" and the flags
	Stdout io.Writer // where --help and --version go
	Stderr io.Writer // where usage errors go
	// Aliases maps a flag's old name to its current name, both without
	// the dash: Parse takes the old name as the current one, so that
	// scripts written for it keep working, and the help lists only the
	// current name (say in Help that the old one is deprecated).
	Aliases map[string]string
}

// Parse parses args with fs, which has the command's flags defined; it
// defines --version itself. It returns done=false when the command is to
// go on with fs.Args(). Otherwise the command exits with code: --help
// and --version were answered (ExitOK), or a usage error was reported as
// one line (ExitUsage). fs must have been made with
// [flag.ContinueOnError]; Parse sets its output and Usage, and defines
// the old names of [CLI.Aliases] (it panics if a current name is not a
// flag of fs: a mistake in the command, not in its command line).
func (c *CLI) Parse(fs *flag.FlagSet, args []string) (code int, done bool) {
	version := fs.Bool("version", false, "print the version and exit")
	for old, cur := range c.Aliases {
		f := fs.Lookup(cur)
		if f == nil {
			panic(fmt.Sprintf("command: alias -%s of -%s, which is not a flag", old, cur))
		}
		fs.Var(f.Value, old, "deprecated: the old name of -"+cur)
	}
	fs.SetOutput(io.Discard) // errors are reported in one line below
	fs.Usage = func() {}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			c.PrintHelp(fs)
			return ExitOK, true
		}
		return c.Fail("%v", err), true
	}
	if *version {
		fmt.Fprintln(c.Stdout, c.Name, Version())
		return ExitOK, true
	}
	return ExitOK, false
}

// PrintHelp prints the help and fs's flags on standard output, but for
// the old names of [CLI.Aliases].
func (c *CLI) PrintHelp(fs *flag.FlagSet) {
	fmt.Fprint(c.Stdout, c.Help)
	if !strings.HasSuffix(c.Help, "\n") {
		fmt.Fprintln(c.Stdout)
	}
	fmt.Fprintln(c.Stdout, "\nFlags:")
	shown := flag.NewFlagSet(fs.Name(), flag.ContinueOnError)
	fs.VisitAll(func(f *flag.Flag) {
		if _, old := c.Aliases[f.Name]; !old {
			shown.Var(f.Value, f.Name, f.Usage)
			shown.Lookup(f.Name).DefValue = f.DefValue // not a value parsed before --help
		}
	})
	shown.SetOutput(c.Stdout)
	shown.PrintDefaults()
}

// Fail reports a usage error as one line on standard error, "NAME: what
// (see NAME --help)", line breaks in the message turned into spaces, and
// returns [ExitUsage].
func (c *CLI) Fail(format string, a ...any) int {
	msg := oneLine(fmt.Sprintf(format, a...))
	fmt.Fprintf(c.Stderr, "%s: %s (see %s --help)\n", c.Name, msg, c.Name)
	return ExitUsage
}

// oneLine turns the line breaks of s into spaces.
func oneLine(s string) string {
	s = strings.TrimRight(s, "\r\n")
	return strings.NewReplacer("\r\n", " ", "\n", " ", "\r", " ").Replace(s)
}

// Version returns the version the running program was built from: its
// main module's version ("(devel)" for a build in its source tree), its
// VCS revision when known, "+dirty" for a modified tree, and the Go
// version, as runtime/debug's build information says.
func Version() string {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return "(unknown)"
	}
	v := bi.Main.Version
	if v == "" {
		v = "(devel)"
	}
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

// MaxShownName is the longest name, in bytes, the commands show whole in
// their messages: [ShortName] cuts a longer one.
const MaxShownName = driver.MaxShownName

// ShortName returns name for a message: whole up to [MaxShownName] bytes;
// otherwise its first bytes up to that (not splitting a UTF-8 character)
// followed by "...(N bytes)", N being its length.
func ShortName(name string) string {
	head, n := driver.CutName(name)
	if n == 0 {
		return name
	}
	return fmt.Sprintf("%s...(%d bytes)", head, n)
}

// ShortenIn returns msg with every occurrence of name, if name is longer
// than [MaxShownName] bytes, replaced by [ShortName]'s cut: for the
// errors of a library, which quote the whole name.
func ShortenIn(msg, name string) string {
	if len(name) <= MaxShownName {
		return msg
	}
	return strings.ReplaceAll(msg, name, ShortName(name))
}

// sentinels are package locks' errors, whose "locks: " [Message] drops.
var sentinels = []error{
	locks.ErrNotAcquired, locks.ErrLost, locks.ErrReleased, locks.ErrPreempted,
	locks.ErrInvalidName, locks.ErrInvalidOption, locks.ErrClosed,
}

// Message returns err's text for a command's messages: the "locks: " of
// package locks' sentinel errors left out ("redlockprio: lock: invalid
// name ..."), since the command's own name is the line's one prefix, and
// name, if longer than [MaxShownName] bytes, cut as [ShortenIn] does.
// Every latchkey command reports a library's error through it.
func Message(err error, name string) string {
	msg := err.Error()
	for _, s := range sentinels {
		text := s.Error()
		msg = strings.ReplaceAll(msg, text, strings.TrimPrefix(text, "locks: "))
	}
	return ShortenIn(msg, name)
}
