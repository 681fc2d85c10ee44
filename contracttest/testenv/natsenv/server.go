package natsenv

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nats-server/v2/server"

	"github.com/latchkey-go/latchkey/contracttest/testenv"
)

// A Server is one NATS server with JetStream, alone or a node of a
// [Cluster]: embedded, or a process of a nats-server program
// ([ServerConfig.Binary]). Its client port and store directory stay the
// same across [Server.Restart], so clients reconnect to the same URL and
// find their streams again. Its methods are safe to call from several
// goroutines; each waits for the previous one to finish.
type Server struct {
	name string
	url  string
	log  *logger
	bin  string // the program it runs from, "" when embedded
	env  Env    // where its store directory and ports come from

	mu      sync.Mutex
	opts    *server.Options // the client port is fixed after the first start
	scheme  string          // of URL: "nats", or "tls" with TLS
	ns      *server.Server  // nil while shut down (embedded)
	proc    *proc           // nil while shut down (a process)
	monitor int             // a process's monitoring port, fixed after the first start
	version string
	done    bool // shut down for good by the cleanup
}

// StartServer starts a single NATS server with JetStream on a free port of
// 127.0.0.1, storing in a temporary directory, and returns once it accepts
// clients. It runs as a process of [Env.ModuleBinary] (see
// [ServerConfig.Embedded]). It is shut down at the end of the test. The test fails if the
// server cannot start. StartServer must be called from the goroutine running
// the test.
func StartServer(t testing.TB) *Server {
	t.Helper()
	return StartServerWith(t, ServerConfig{})
}

// ServerConfig is what [StartServerWith] adds to a server.
type ServerConfig struct {
	// TLS, if set, makes the server require TLS with TLS's certificate
	// (clients trust TLS.CAFile); client certificates are verified if
	// given. URL then starts with tls://.
	TLS *testenv.TLS
	// User and Password, if set, are the one user clients must
	// authenticate as.
	User, Password string
	// Operator, if set, runs the server in operator (JWT) mode with
	// Operator's accounts in a memory resolver: clients authenticate
	// with the credentials of a user of Operator ([Operator.NewUser]),
	// and have JetStream. It excludes User and Password.
	Operator *Operator
	// Binary, if set, is the path of a nats-server program (see
	// [Binary]) to run the server from, as a separate process. Unset, the
	// server runs from [Env.ModuleBinary], the embedded version built as a
	// program, unless Embedded, TLS, User, Password or Operator is set:
	// those run in the test process. Binary excludes them.
	Binary string
	// Embedded runs the server in the test process (nats-server/v2 as a
	// library). The race detector then watches the server's code too,
	// and reports its data races (see [Env.ModuleBinary]).
	Embedded bool
}

// embedded reports whether cfg asks for what only an embedded server has.
func (cfg ServerConfig) embedded() bool {
	return cfg.Embedded || cfg.TLS != nil || cfg.User != "" || cfg.Password != "" || cfg.Operator != nil
}

// StartServerWith is [StartServer] with cfg.
func StartServerWith(t testing.TB, cfg ServerConfig) *Server {
	t.Helper()
	s, err := forTest(t).StartServer(t.Context(), cfg)
	testenv.Require(t, err)
	return s
}

// StartServer is [StartServerWith] returning an error if the server
// cannot start. The server is shut down at the testenv.Env's Close. ctx
// bounds the server's start, not its life.
func (e Env) StartServer(ctx context.Context, cfg ServerConfig) (*Server, error) {
	if cfg.Operator != nil && (cfg.User != "" || cfg.Password != "") {
		return nil, errors.New("natsenv: a server in operator mode has no user and password of its own")
	}
	if cfg.Binary != "" && cfg.Embedded {
		return nil, errors.New("natsenv: a server is either embedded or run from a binary")
	}
	if cfg.Binary == "" && !cfg.embedded() {
		bin, err := e.ModuleBinary()
		if err != nil {
			return nil, err
		}
		cfg.Binary = bin
	}
	s, err := newServer(e, fmt.Sprintf("latchkey-%d", seq.Add(1)), nil)
	if err != nil {
		return nil, err
	}
	s.bin = cfg.Binary
	if op := cfg.Operator; op != nil {
		s.opts.TrustedOperators = []*jwt.OperatorClaims{op.claims}
		s.opts.AccountResolver = op.resolver
		s.opts.SystemAccount = op.claims.SystemAccount
	}
	if cfg.TLS != nil {
		s.opts.TLS = true
		s.opts.TLSConfig = cfg.TLS.Server.Clone()
		s.opts.TLSTimeout = 5
		s.scheme = "tls"
	}
	s.opts.Username, s.opts.Password = cfg.User, cfg.Password
	if err := s.start(ctx); err != nil {
		return nil, err
	}
	err = e.OnClose(func() error {
		if s.Running() { // settle first, as a cluster does
			_ = waitFor(context.Background(), quiesceTimeout, s.healthy)
		}
		s.close()
		return nil
	})
	if err != nil {
		return nil, err
	}
	return s, nil
}

var seq atomic.Uint64

func newServer(e Env, name string, cluster *server.ClusterOpts) (*Server, error) {
	dir, err := e.TempDir()
	if err != nil {
		return nil, err
	}
	opts := &server.Options{
		ServerName:             name,
		Host:                   "127.0.0.1",
		Port:                   server.RANDOM_PORT,
		NoLog:                  true,
		NoSigs:                 true,
		DisableJetStreamBanner: true,
		JetStream:              true,
		JetStreamMaxMemory:     maxMemory,
		JetStreamMaxStore:      maxStore,
		StoreDir:               filepath.Join(dir, "jetstream"), // a process's config and log beside it
	}
	if cluster != nil {
		opts.Cluster = *cluster
	}
	return &Server{name: name, opts: opts, log: newLogger(e), env: e}, nil
}

// URL returns the server's client URL, "nats://127.0.0.1:port".
func (s *Server) URL() string { return s.url }

// Name returns the server's name, as JetStream reports it (for example as
// the leader in a stream's cluster information).
func (s *Server) Name() string { return s.name }

// Version returns the version of nats-server the server runs, without a
// leading "v": the embedded library's, or the one the program reported
// when the server last started.
func (s *Server) Version() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.version
}

// Binary returns the path of the program the server runs from, or "" for
// an embedded server.
func (s *Server) Binary() string { return s.bin }

// Running reports whether the server is running.
func (s *Server) Running() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.ns != nil || s.proc != nil
}

// Kill stops a server process at once with SIGKILL, as a crash would: no
// leadership is handed over, nothing is flushed. It returns once the
// process has exited. For an embedded server, Kill is Shutdown. Killing a
// server that is not running does nothing.
func (s *Server) Kill() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.proc != nil {
		s.proc.stop(syscall.SIGKILL)
		s.proc = nil
		return
	}
	s.shutdownLocked()
}

// Shutdown stops the server, closing its client and route connections; a
// cluster node hands over its leaderships first, as a node being shut down
// cleanly does. It returns once the server is down. Shutting down a server
// that is not running does nothing.
func (s *Server) Shutdown() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.shutdownLocked()
}

func (s *Server) shutdownLocked() {
	if s.proc != nil {
		s.proc.stop(syscall.SIGTERM)
		s.proc = nil
	}
	if s.ns == nil {
		return
	}
	s.ns.Shutdown()
	s.ns.WaitForShutdown()
	s.ns = nil
}

// Restart shuts the server down if it is running, then starts it again on the
// same client (and cluster) port with the same store directory, and returns
// once it accepts clients and, for a cluster node, once its JetStream state is
// up to date: its JetStream state is current with the meta leader and every
// stream and consumer it holds runs and is current. It returns an error if the
// server cannot start or catch up, or at the end of the test.
func (s *Server) Restart() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.done {
		return fmt.Errorf("natsenv: restart %s: test is over", s.name)
	}
	s.shutdownLocked()
	if err := s.startLocked(context.Background()); err != nil {
		return err
	}
	return waitFor(context.Background(), clusterTimeout, s.healthyLocked)
}

// healthy reports whether the server runs and passes its own health check
// (see [healthy]).
func (s *Server) healthy() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.healthyLocked()
}

func (s *Server) healthyLocked() error {
	switch {
	case s.ns != nil:
		return healthy(s.ns)
	case s.proc != nil:
		return s.proc.healthy(s.name)
	}
	return fmt.Errorf("natsenv: %s is not running", s.name)
}

// meta returns whether the server is the JetStream meta leader and how
// many peers of the meta group, itself included, it sees online.
// errNotRunning is the error of asking a node that is not running.
var errNotRunning = errors.New("not running")

// routes returns the node's routes (its /routez).
func (s *Server) routes() (*server.Routez, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	switch {
	case s.ns != nil:
		return s.ns.Routez(nil)
	case s.proc != nil:
		var rz server.Routez
		return &rz, s.proc.get("/routez", &rz)
	}
	return nil, errNotRunning
}

func (s *Server) meta() (leader bool, peers int, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	switch {
	case s.ns != nil:
		return s.ns.JetStreamIsLeader(), len(s.ns.JetStreamClusterPeers()), nil
	case s.proc != nil:
		l, n, err := s.proc.meta()
		return l == s.name, n, err
	}
	return false, 0, fmt.Errorf("natsenv: %s is not running", s.name)
}

// healthy reports whether ns passes its own health check (/healthz): it
// accepts clients, its JetStream is current with the meta leader, and every
// stream and consumer assigned to it runs and is current.
func healthy(ns *server.Server) error {
	if h := ns.Healthz(nil); h.StatusCode != http.StatusOK {
		return fmt.Errorf("natsenv: %s: unhealthy: %s %s", ns.Name(), h.Status, h.Error)
	}
	return nil
}

func (s *Server) start(ctx context.Context) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.startLocked(ctx)
}

func (s *Server) startLocked(ctx context.Context) error {
	if s.opts.Port == server.RANDOM_PORT {
		// A port of its own, kept across restarts (see testenv.Env.FreePort).
		port, err := s.env.FreePort()
		if err != nil {
			return fmt.Errorf("natsenv: %s: %w", s.name, err)
		}
		s.opts.Port = port
		s.url = cmp.Or(s.scheme, "nats") + "://" + net.JoinHostPort("127.0.0.1", strconv.Itoa(s.opts.Port))
	}
	if s.bin != "" {
		if err := s.startProcess(ctx); err != nil {
			return err
		}
		v, err := s.proc.version()
		if err != nil {
			v, err = BinaryVersion(s.bin)
		}
		if err != nil {
			return err
		}
		s.version = strings.TrimPrefix(v, "v")
		return nil
	}
	ns, err := server.NewServer(s.opts.Clone())
	if err != nil {
		return fmt.Errorf("natsenv: %s: %w", s.name, err)
	}
	if s.log != nil {
		ns.SetLoggerV2(s.log, false, false, false)
	}
	ns.Start()
	if !ns.ReadyForConnections(readyTimeout) {
		ns.Shutdown()
		ns.WaitForShutdown()
		return fmt.Errorf("natsenv: %s: not ready for connections after %v", s.name, readyTimeout)
	}
	if !ns.JetStreamEnabled() {
		ns.Shutdown()
		ns.WaitForShutdown()
		return fmt.Errorf("natsenv: %s: JetStream did not start", s.name)
	}
	s.ns = ns
	s.version = server.VERSION
	return nil
}

// close shuts the server down for good, at the end of the test.
func (s *Server) close() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.done = true
	s.shutdownLocked()
}

// server returns the running server, or nil.
func (s *Server) server() *server.Server {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.ns
}
