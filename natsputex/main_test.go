package natsputex_test

import (
	"flag"
	"fmt"
	"net"
	"os"
	"testing"
	"time"
)

// exampleBroker is where the examples find NATS: its standard local port.
const exampleBroker = "127.0.0.1:4222"

// TestMain runs the examples against exampleBroker. Where nothing answers
// there they are skipped with a note, except when CI is set: then the run
// fails, as the suites do without their brokers.
func TestMain(m *testing.M) {
	flag.Parse()
	if c, err := net.DialTimeout("tcp", exampleBroker, time.Second); err == nil {
		_ = c.Close()
	} else if os.Getenv("CI") != "" {
		fmt.Fprintf(os.Stderr, "the examples need NATS on %s: %v\n", exampleBroker, err)
		os.Exit(1)
	} else {
		fmt.Fprintf(os.Stderr, "skipping the examples: no NATS on %s (%v)\n", exampleBroker, err)
		skip := "^Example"
		if s := flag.Lookup("test.skip").Value.String(); s != "" {
			skip = s + "|" + skip
		}
		_ = flag.Set("test.skip", skip)
	}
	os.Exit(m.Run())
}
