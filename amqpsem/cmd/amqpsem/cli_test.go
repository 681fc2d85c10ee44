package main_test

import (
	"strings"
	"testing"

	"github.com/latchkey-go/latchkey/contracttest/cmdtest"
)

// TestCLI: the command-line convention every command keeps, and every
// bad command line refused in one line, exit 64, before any I/O
// (nothing listens on port 1: an amqpsem that dialled would exit 1).
func TestCLI(t *testing.T) {
	bin := cmdtest.Build(t, ".")
	down := []string{"--url", "amqp://guest:guest@127.0.0.1:1/"}
	with := func(args ...string) []string { return append(append([]string{}, down...), args...) }
	cmdtest.CheckConvention(t, bin, []cmdtest.Case{
		{Name: "no command", Args: with(), Want: "no command"},
		{Name: "unknown command", Args: with("stauts", "x"), Want: `unknown command "stauts"`},
		{Name: "no name", Args: with("status"), Want: "missing NAME"},
		{Name: "doubled plus", Args: with("resize", "x", "++2"), Want: `"++2"`},
		{Name: "two signs", Args: with("resize", "y", "-+2"), Want: `"-+2"`},
		{Name: "plus minus", Args: with("resize", "y", "+-2"), Want: `"+-2"`},
		{Name: "trailing text", Args: with("resize", "y", "2x"), Want: `"2x"`},
		{Name: "space", Args: with("resize", "y", " 2"), Want: `" 2"`},
		{Name: "empty count", Args: with("resize", "y", ""), Want: `""`},
		{Name: "add zero", Args: with("resize", "y", "+0"), Want: `"+0"`},
		{Name: "two counts", Args: with("resize", "y", "+1", "+1"), Want: "want one count"},
		{Name: "signed create", Args: with("create", "y", "+2"), Want: `"+2"`},
		{Name: "create zero", Args: with("create", "y", "0"), Want: `"0"`},
		{Name: "--create on create", Args: with("--create", "create", "y", "2"), Want: "--create"},
		{Name: "status arguments", Args: with("status", "y", "z"), Want: "unexpected arguments"},
		{Name: "acquire without --", Args: with("acquire", "y", "true"), Want: "want -- and a command"},
		{Name: "bad name", Args: with("create", "amq.nope", "2"), Want: "invalid name"},
		{Name: "long name cut", Args: with("status", "amq."+strings.Repeat("n", 300)), Want: "...(304 bytes)"},
		{Args: with("--layout", "cobol", "status", "y"), Want: "cobol"},
		{Args: with("--timeout", "-1s", "status", "y"), Want: "--timeout"},
		{Args: with("--heartbeat", "500ms", "status", "y"), Want: "heartbeat"},
		{Args: with("--log-format", "xml", "status", "y"), Want: "-log-format"},
		{Args: []string{"--url", "http://not-amqp/", "status", "y"}, Want: "--url"},
		{Args: []string{"--url", "amqp://127.0.0.1:99999/", "status", "y"}, Want: "bad port 99999"},
		{Args: []string{"--url", "amqp://u:pw@127.0.0.1:0/", "status", "y"}, Want: "u:xxxxx@127.0.0.1:0/: bad port 0"},
		{Name: "tls flag on amqp", Args: with("--tls-insecure", "status", "y"), Want: "amqps://"},
		// After I/O: one ERROR line, exit 1.
		{Name: "refused", Args: with("status", "y"), Exit: 1, Want: "level=ERROR", Lines: 1},
	})
}
