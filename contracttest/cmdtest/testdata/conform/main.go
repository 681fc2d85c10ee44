// Command conform is the program that cmdtest's TestCheckConvention
// builds: it keeps the command-line convention with locks/command's CLI,
// and wants one argument, a number.
package main

import (
	"flag"
	"fmt"
	"os"
	"strconv"

	"github.com/latchkey-go/latchkey/locks/command"
)

const help = `conform prints its argument.

Usage:
  conform [flags] N

Exit codes:
  0  printed
  64 usage error

Example:
  conform 3
`

func main() {
	c := &command.CLI{Name: "conform", Help: help, Stdout: os.Stdout, Stderr: os.Stderr}
	fs := flag.NewFlagSet("conform", flag.ContinueOnError)
	if code, done := c.Parse(fs, os.Args[1:]); done {
		os.Exit(code)
	}
	if fs.NArg() != 1 {
		os.Exit(c.Fail("want one argument, N; got %d", fs.NArg()))
	}
	n, err := strconv.Atoi(fs.Arg(0))
	if err != nil {
		os.Exit(c.Fail("N: %q is not a number", fs.Arg(0)))
	}
	fmt.Println(n)
}
