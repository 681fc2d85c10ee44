// Package natsenv provides NATS servers with JetStream to tests, on
// loopback ports, so that tests need nothing installed: a single node or a
// cluster run as processes of the nats-server version the test links,
// built from that module once ([Env.ModuleBinary]), or embedded in the
// test process (nats-server/v2 as a library; [ServerConfig.Embedded],
// [ClusterConfig.Embedded]); or servers run from another nats-server
// program ([Binary], such as an older release) ([StartBinaryServer],
// [StartBinaryCluster]). [Server.Version] says which version each node
// runs. An embedded server may require TLS, a password or, in operator
// mode, JWT credentials ([ServerConfig]); an embedded cluster's routes may
// go through fault proxies, to partition nodes ([ClusterConfig]).
//
// It is a module of its own, separate from testenv, so that the NATS server
// is only in the module graph of the backends that use it.
//
// Servers log through the test (t.Log) when tests run with -v, and are silent
// otherwise. Everything started is shut down by [testing.TB.Cleanup].
//
// Programs that are not tests (lockbench) start the same servers through
// an [Env], a [testenv.Env] that also starts NATS: each helper taking a
// testing.TB is a thin wrapper over the Env method of the same name, which
// returns an error instead of stopping a test and leaves what it started
// to the testenv.Env's Close.
package natsenv

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/latchkey-go/latchkey/contracttest/testenv"
	"go.uber.org/goleak"
)

// ConsumerGoroutines returns goleak options matching the goroutines an
// embedded server runs for each JetStream consumer. A client that crashes
// (its connection cut, as tests do) leaves its ephemeral consumers, such as
// a KV watch's, on the server until their inactivity threshold passes:
// server state, not a leak of the client's, which leak checks of the client
// should ignore (see contracttest.LeakFilter). The options also match the
// goroutine natsenv waits for a server process with ([ServerConfig.Binary]),
// which a restart during a test starts, and the goroutines of the routes
// between a cluster's nodes, which a cluster re-creates when a route
// reconnects (seen during a conformance run on a loaded machine).
func ConsumerGoroutines() []goleak.Option {
	const consumer = "github.com/nats-io/nats-server/v2/server.(*consumer)."
	opts := []goleak.Option{
		goleak.IgnoreAnyFunction("github.com/latchkey-go/latchkey/contracttest/testenv/natsenv.(*proc).wait"),
		goleak.IgnoreAnyFunction("github.com/nats-io/nats-server/v2/server.(*Server).createRoute.func1"),
		goleak.IgnoreAnyFunction("github.com/nats-io/nats-server/v2/server.(*Server).createRoute.func2"),
	}
	for _, f := range []string{"loopAndGatherMsgs", "processInboundAcks", "processInboundNextMsgReqs", "loopAndForwardProposals"} {
		opts = append(opts, goleak.IgnoreAnyFunction(consumer+f))
	}
	return opts
}

const (
	// readyTimeout bounds how long a server may take to accept clients.
	readyTimeout = 10 * time.Second
	// clusterTimeout bounds how long a cluster may take to elect a
	// JetStream meta leader and bring every node up to date.
	clusterTimeout = 30 * time.Second
	// quiesceTimeout bounds how long the cleanup waits for a cluster to
	// settle before shutting it down.
	quiesceTimeout = 5 * time.Second
	// startAttempts is how many sets of free ports StartCluster tries, since
	// another program may bind a port testenv.FreePort chose before a node does.
	startAttempts = 3

	maxMemory = 256 << 20
	maxStore  = 1 << 30
)

// An Env is a [testenv.Env] that also starts NATS servers: the
// error-returning core of this package's helpers. What it starts is shut
// down at the testenv.Env's Close, and logs through its Logf. Make one
// with [In]; its methods are safe to call from several goroutines.
type Env struct{ *testenv.Env }

// In returns the Env that starts its servers in e.
func In(e *testenv.Env) Env { return Env{e} }

// forTest is the Env of the helpers taking t.
func forTest(t testing.TB) Env {
	t.Helper()
	return In(testenv.ForTest(t))
}

// URL returns the client URL of a NATS server with JetStream the test can use:
// the LOCKS_NATS_URL environment variable if it is set (it may list several
// URLs, comma-separated), or else the URL of a single server started
// for the test by [StartServer]. A server from the environment is shared, so
// tests use unique bucket and key names. URL must be called from the
// goroutine running the test.
func URL(t testing.TB) string {
	t.Helper()
	u, err := forTest(t).URL(t.Context())
	testenv.Require(t, err)
	return u
}

// URL is [URL] returning an error if the server cannot start.
func (e Env) URL(ctx context.Context) (string, error) {
	if u := strings.TrimSpace(os.Getenv("LOCKS_NATS_URL")); u != "" {
		return u, nil
	}
	s, err := e.StartServer(ctx, ServerConfig{})
	if err != nil {
		return "", err
	}
	return s.URL(), nil
}

// A final error from a probe ends waitFor at once: waiting cannot help.
type final struct{ error }

// waitFor calls probe until it returns nil or a final error, ctx ends or
// timeout passes, and returns its last error.
func waitFor(ctx context.Context, timeout time.Duration, probe func() error) error {
	deadline := time.Now().Add(timeout)
	delay := 10 * time.Millisecond
	for {
		err := probe()
		if err == nil {
			return nil
		}
		var f final
		if errors.As(err, &f) {
			return f.error
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%w (after %v)", err, timeout)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%w (last probe: %v)", ctx.Err(), err)
		case <-time.After(delay):
		}
		delay = min(2*delay, 250*time.Millisecond)
	}
}

// logger passes a server's notices, warnings and errors to an Env's Logf
// (t.Log while the test runs with -v). It is nil when the Env does not
// log, and its methods then do nothing.
type logger struct {
	logf func(format string, args ...any)
}

func newLogger(e Env) *logger {
	if f := e.LogFunc(); f != nil {
		return &logger{logf: f}
	}
	return nil
}

func (l *logger) log(level, format string, v ...any) {
	if l != nil {
		l.logf("nats-server: "+level+" "+format, v...)
	}
}

func (l *logger) Noticef(format string, v ...any) { l.log("[INF]", format, v...) }
func (l *logger) Warnf(format string, v ...any)   { l.log("[WRN]", format, v...) }
func (l *logger) Fatalf(format string, v ...any)  { l.log("[FTL]", format, v...) }
func (l *logger) Errorf(format string, v ...any)  { l.log("[ERR]", format, v...) }
func (l *logger) Debugf(format string, v ...any)  {}
func (l *logger) Tracef(format string, v ...any)  {}
