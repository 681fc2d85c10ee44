//go:build mage

package main

import (
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"

	"github.com/magefile/mage/mg"
	"github.com/magefile/mage/sh"
)

// outputIn runs a command in dir quietly and returns its stdout and
// stderr together, echoing it and showing them when it fails or with -v.
func outputIn(dir, cmd string, args ...string) (string, error) {
	line := "(cd " + shellQuote(dir) + " && " + cmdline(cmd, args) + ")"
	if mg.Verbose() {
		fmt.Println("+ " + line)
	}
	var buf strings.Builder
	c := exec.Command(cmd, args...)
	c.Dir, c.Stdout, c.Stderr = dir, &buf, &buf
	err := c.Run()
	if err != nil || mg.Verbose() {
		if err != nil && !mg.Verbose() {
			fmt.Println("+ " + line)
		}
		fmt.Print(buf.String())
	}
	if err != nil {
		if sh.CmdRan(err) {
			return buf.String(), mg.Fatalf(sh.ExitStatus(err), "%s: exit code %d", line, sh.ExitStatus(err))
		}
		return buf.String(), fmt.Errorf("%s: %w", line, err)
	}
	return buf.String(), nil
}

// runV echoes a command and runs it with its output streamed.
func runV(cmd string, args ...string) error {
	echo(cmd, args...)
	return exitErr(cmd, args, execCmd(os.Stdout, os.Stderr, cmd, args...))
}

// run echoes a command and runs it, showing its output only when it fails or
// with -v.
func run(cmd string, args ...string) error {
	echo(cmd, args...)
	if mg.Verbose() {
		return exitErr(cmd, args, execCmd(os.Stdout, os.Stderr, cmd, args...))
	}
	var buf strings.Builder
	err := execCmd(&buf, &buf, cmd, args...)
	if err != nil {
		fmt.Print(buf.String())
	}
	return exitErr(cmd, args, err)
}

// output runs a command quietly and returns its stdout, echoing it and
// showing its stderr when it fails or with -v.
func output(cmd string, args ...string) (string, error) {
	if mg.Verbose() {
		echo(cmd, args...)
	}
	var stdout, stderr strings.Builder
	err := execCmd(&stdout, &stderr, cmd, args...)
	if err != nil || mg.Verbose() {
		if err != nil && !mg.Verbose() {
			echo(cmd, args...)
		}
		fmt.Fprint(os.Stderr, stderr.String())
	}
	return stdout.String(), exitErr(cmd, args, err)
}

// execCmd runs cmd with exactly args. (sh.Exec would expand $NAME in them,
// which can change a regexp such as -run 'Test$1'.)
func execCmd(stdout, stderr io.Writer, cmd string, args ...string) error {
	c := exec.Command(cmd, args...)
	c.Stdout, c.Stderr, c.Stdin = stdout, stderr, os.Stdin
	return c.Run()
}

// exitErr turns a failed command into an error that makes mage exit with the
// command's exit code.
func exitErr(cmd string, args []string, err error) error {
	if err == nil {
		return nil
	}
	if sh.CmdRan(err) {
		return mg.Fatalf(sh.ExitStatus(err), "%s: exit code %d", cmdline(cmd, args), sh.ExitStatus(err))
	}
	return fmt.Errorf("%s: %w", cmdline(cmd, args), err)
}

func echo(cmd string, args ...string) {
	fmt.Println("+ " + cmdline(cmd, args))
}

// cmdline renders a command as a line to paste into a shell.
func cmdline(cmd string, args []string) string {
	words := make([]string, 0, len(args)+1)
	for _, w := range append([]string{cmd}, args...) {
		words = append(words, shellQuote(w))
	}
	return strings.Join(words, " ")
}

var shellSafe = regexp.MustCompile(`^[\w@%+=:,./-]+$`)

func shellQuote(s string) string {
	if shellSafe.MatchString(s) {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

// display returns path relative to the current directory when it is inside
// it, for shorter command lines; else path.
func display(path string) string {
	wd, err := os.Getwd()
	if err != nil {
		return path
	}
	rel, err := filepath.Rel(wd, path)
	if err != nil || rel == ".." || strings.HasPrefix(rel, ".."+string(filepath.Separator)) {
		return path
	}
	if rel == "." {
		return "."
	}
	return "." + string(filepath.Separator) + rel
}

func isCI() bool {
	v := os.Getenv("CI")
	return v != "" && v != "0" && !strings.EqualFold(v, "false")
}

// envArgs splits the environment variable name into arguments as a shell
// would: blanks separate them, and '...', "..." and \ quote.
func envArgs(name string) ([]string, error) {
	args, err := splitArgs(os.Getenv(name))
	if err != nil {
		return nil, fmt.Errorf("$%s: %w", name, err)
	}
	return args, nil
}

func splitArgs(s string) ([]string, error) {
	var args []string
	var cur strings.Builder
	inWord := false
	var quote rune
	escaped := false
	for _, r := range s {
		switch {
		case escaped:
			cur.WriteRune(r)
			escaped = false
		case quote == '\'':
			if r == '\'' {
				quote = 0
			} else {
				cur.WriteRune(r)
			}
		case r == '\\':
			escaped, inWord = true, true
		case quote == '"':
			if r == '"' {
				quote = 0
			} else {
				cur.WriteRune(r)
			}
		case r == '\'' || r == '"':
			quote, inWord = r, true
		case r == ' ' || r == '\t' || r == '\n':
			if inWord {
				args = append(args, cur.String())
				cur.Reset()
				inWord = false
			}
		default:
			cur.WriteRune(r)
			inWord = true
		}
	}
	if quote != 0 || escaped {
		return nil, fmt.Errorf("unterminated quote or escape in %q", s)
	}
	if inWord {
		args = append(args, cur.String())
	}
	return args, nil
}
