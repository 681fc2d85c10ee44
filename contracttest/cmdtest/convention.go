//go:build unix

package cmdtest

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// RunSplit runs the program bin with args and env (KEY=value entries
// added to the test's environment, as [RunEnv] does) and returns its
// standard output and standard error apart, and its exit code.
func RunSplit(t testing.TB, bin string, env []string, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	cmd := exec.Command(bin, args...)
	if env != nil {
		cmd.Env = append(os.Environ(), env...)
	}
	var o, e bytes.Buffer
	cmd.Stdout, cmd.Stderr = &o, &e
	code = ExitCode(t, cmd.Run())
	return o.String(), e.String(), code
}

// A Case is a command line and what a command must answer to it: the
// exit code, and text its standard error contains. Cases are the rows
// of [CheckConvention]'s table.
type Case struct {
	Name string   // the row's name, for the subtest; the arguments if empty
	Args []string // the command line
	Env  []string // KEY=value entries added to the environment

	// Exit is the exit code wanted; 0 stands for 64 (usage), the code of
	// nearly every row.
	Exit int
	// Want is text standard error must contain (a flag's name, an
	// argument).
	Want string
	// Lines, if not 0, is the number of lines standard error must have.
	// A usage error (exit 64) is always one line.
	Lines int
}

// CheckConvention checks that the command bin keeps latchkey's
// command-line convention (package locks/command's CLI):
//
//   - --help, -help and -h print the help on standard output, with
//     "Usage:", "Flags:", "Exit codes:" and an example ("Example"), and
//     nothing on standard error, exit 0;
//   - --version prints one line "NAME VERSION" on standard output, exit 0;
//   - an unknown flag is one line on standard error naming it and "see
//     NAME --help", nothing on standard output, exit 64;
//
// and then every row of cases: its exit code, its text on standard
// error, and for a usage error (exit 64) the one line "NAME: ... (see
// NAME --help)" with nothing on standard output. NAME is bin's base
// name. Rows that must fail before any I/O should name unreachable
// brokers (port 1): a command that tried to connect would exit 1.
func CheckConvention(t *testing.T, bin string, cases []Case) {
	t.Helper()
	name := filepath.Base(bin)
	for _, help := range []string{"--help", "-help", "-h"} {
		out, errOut, code := RunSplit(t, bin, nil, help)
		if code != 0 || errOut != "" {
			t.Errorf("%s %s: exit %d, stderr %q; want 0 and nothing on stderr", name, help, code, errOut)
		}
		for _, want := range []string{"Usage:", "Flags:", "Exit codes:", "Example", "-version"} {
			if !strings.Contains(out, want) {
				t.Errorf("%s %s: the help on stdout does not say %q:\n%s", name, help, want, out)
			}
		}
	}
	out, errOut, code := RunSplit(t, bin, nil, "--version")
	if code != 0 || errOut != "" || !strings.HasPrefix(out, name+" ") || strings.Count(out, "\n") != 1 {
		t.Errorf("%s --version: exit %d, stdout %q, stderr %q; want 0 and one line %q on stdout", name, code, out, errOut, name+" VERSION")
	}
	cases = append([]Case{{Name: "unknown flag", Args: []string{"--no-such-flag", "x"}, Want: "-no-such-flag"}}, cases...)
	for _, c := range cases {
		label := c.Name
		if label == "" {
			label = strings.Join(c.Args, " ")
		}
		t.Run(label, func(t *testing.T) {
			want := c.Exit
			if want == 0 {
				want = 64
			}
			out, errOut, code := RunSplit(t, bin, c.Env, c.Args...)
			lines := strings.Count(errOut, "\n")
			switch {
			case code != want:
				t.Errorf("%s %q: exit %d, want %d\nstdout: %s\nstderr: %s", name, c.Args, code, want, out, errOut)
			case !strings.Contains(errOut, c.Want):
				t.Errorf("%s %q: stderr does not say %q:\n%s", name, c.Args, c.Want, errOut)
			case c.Lines != 0 && lines != c.Lines:
				t.Errorf("%s %q: %d lines on stderr, want %d:\n%s", name, c.Args, lines, c.Lines, errOut)
			case want == 64 && (out != "" || lines != 1 || !strings.HasPrefix(errOut, name+": ") || !strings.HasSuffix(errOut, "(see "+name+" --help)\n")):
				t.Errorf("%s %q: stdout %q, stderr %q; want nothing on stdout and one line %q on stderr", name, c.Args, out, errOut, name+": ... (see "+name+" --help)")
			}
		})
	}
}
