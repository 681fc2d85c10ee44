package natsenv

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/latchkey-go/latchkey/contracttest/testenv"
)

// BinaryEnv names the environment variable that gives the path of the
// nats-server program [Binary] returns, when it is not the one on PATH.
const BinaryEnv = "LOCKS_NATS_SERVER"

// Binary returns the path of the nats-server program to run as separate
// processes ([ServerConfig.Binary], [ClusterConfig.Binary]): the
// LOCKS_NATS_SERVER environment variable if set, or else nats-server on
// PATH. When there is none, the test is skipped, or fails when CI is set
// (see [testenv.Missing]). Binary must be called from the goroutine running
// the test.
func Binary(t testing.TB) string {
	t.Helper()
	p, err := forTest(t).Binary()
	testenv.Require(t, err)
	return p
}

// Binary is [Binary] returning a [*testenv.MissingError] when there is no
// nats-server program.
func (e Env) Binary() (string, error) {
	if p := strings.TrimSpace(os.Getenv(BinaryEnv)); p != "" {
		return p, nil
	}
	p, err := exec.LookPath("nats-server")
	if err != nil {
		return "", &testenv.MissingError{What: "the nats-server program", How: "install it on PATH or set " + BinaryEnv}
	}
	return p, nil
}

var versions sync.Map // binary path -> version string

// BinaryVersion returns the version bin reports with --version, without
// the leading "v" ("2.9.10"). The answer is cached per path.
func BinaryVersion(bin string) (string, error) {
	if v, ok := versions.Load(bin); ok {
		return v.(string), nil
	}
	out, err := exec.Command(bin, "--version").CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("natsenv: %s --version: %w: %s", bin, err, out)
	}
	// "nats-server: v2.9.10"
	f := strings.Fields(string(out))
	if len(f) == 0 {
		return "", fmt.Errorf("natsenv: %s --version: no output", bin)
	}
	v := strings.TrimPrefix(f[len(f)-1], "v")
	versions.Store(bin, v)
	return v, nil
}

// StartBinaryServer starts a single node from the nats-server program
// [Binary] finds, as a separate process, and returns it like
// [StartServer] does.
func StartBinaryServer(t testing.TB) *Server {
	t.Helper()
	return StartServerWith(t, ServerConfig{Binary: Binary(t)})
}

// StartBinaryCluster starts an n-node cluster of the nats-server program
// [Binary] finds, each node a separate process, and returns it like
// [StartCluster] does.
func StartBinaryCluster(t testing.TB, n int) *Cluster {
	t.Helper()
	return StartClusterWith(t, n, ClusterConfig{Binary: Binary(t)})
}

// proc is a nats-server running as a child process, configured from a
// Server's options.
type proc struct {
	cmd  *exec.Cmd
	done chan struct{} // closed once cmd has been waited for
	http string        // monitoring address, host:port
}

// binaryOptions checks that a server run from a binary needs nothing
// natsenv can only give an embedded one.
func binaryOptions(o *server.Options) error {
	switch {
	case o.TLS:
		return errors.New("TLS is only supported on embedded servers")
	case o.Username != "" || o.Password != "":
		return errors.New("users are only supported on embedded servers")
	case len(o.TrustedOperators) > 0:
		return errors.New("operator mode is only supported on embedded servers")
	}
	return nil
}

// config returns the configuration file of a server run from a binary.
func processConfig(o *server.Options, monitor int) string {
	var b strings.Builder
	q := strconv.Quote
	fmt.Fprintf(&b, "server_name: %s\nlisten: %s\nhttp: %s\n", q(o.ServerName),
		q(net.JoinHostPort("127.0.0.1", strconv.Itoa(o.Port))), q(net.JoinHostPort("127.0.0.1", strconv.Itoa(monitor))))
	fmt.Fprintf(&b, "jetstream {\n  store_dir: %s\n  max_memory_store: %d\n  max_file_store: %d\n}\n", q(o.StoreDir), o.JetStreamMaxMemory, o.JetStreamMaxStore)
	if o.Cluster.Port != 0 {
		fmt.Fprintf(&b, "cluster {\n  name: %s\n  listen: %s\n  routes: [\n", q(o.Cluster.Name), q(net.JoinHostPort("127.0.0.1", strconv.Itoa(o.Cluster.Port))))
		for _, r := range o.Routes {
			fmt.Fprintf(&b, "    %s\n", q(r.String()))
		}
		b.WriteString("  ]\n")
		if o.Cluster.Advertise != "" { // proxied routes (nats-server 2.10 or later)
			fmt.Fprintf(&b, "  advertise: %s\n", q(o.Cluster.Advertise))
		}
		if o.Cluster.PoolSize != 0 {
			fmt.Fprintf(&b, "  pool_size: %d\n", o.Cluster.PoolSize)
		}
		b.WriteString("}\n")
	}
	return b.String()
}

// startProcess runs s from its binary, on its fixed ports, and waits until
// it accepts clients with JetStream enabled.
func (s *Server) startProcess(ctx context.Context) error {
	if err := binaryOptions(s.opts); err != nil {
		return fmt.Errorf("natsenv: %s: %w", s.name, err)
	}
	if s.monitor == 0 {
		port, err := s.env.FreePort()
		if err != nil {
			return fmt.Errorf("natsenv: %s: %w", s.name, err)
		}
		s.monitor = port
	}
	// In the server's own temporary directory: a name such as
	// latchkey-9-n2 is unique within one test process only.
	conf := filepath.Join(filepath.Dir(s.opts.StoreDir), s.name+".conf")
	if err := os.WriteFile(conf, []byte(processConfig(s.opts, s.monitor)), 0o600); err != nil {
		return fmt.Errorf("natsenv: %s: %w", s.name, err)
	}
	logPath := filepath.Join(filepath.Dir(s.opts.StoreDir), s.name+".log")
	logf, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return fmt.Errorf("natsenv: %s: %w", s.name, err)
	}
	defer logf.Close() // the child has its own descriptor
	cmd := exec.Command(s.bin, "-c", conf)
	cmd.Stdout, cmd.Stderr = logf, logf // files: no copying goroutine
	cmd.SysProcAttr = sysProcAttr()
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("natsenv: %s: start %s: %w", s.name, s.bin, err)
	}
	p := &proc{cmd: cmd, done: make(chan struct{}), http: net.JoinHostPort("127.0.0.1", strconv.Itoa(s.monitor))}
	go p.wait()
	err = waitFor(ctx, readyTimeout, func() error {
		select {
		case <-p.done:
			return final{fmt.Errorf("exited: %s", cmd.ProcessState)}
		default:
		}
		var h struct {
			Status string `json:"status"`
			Error  string `json:"error"`
		}
		if err := p.get("/healthz?js-enabled-only=true", &h); err != nil {
			return err
		}
		if h.Status != "ok" {
			return fmt.Errorf("%s: %s", h.Status, h.Error)
		}
		return nil
	})
	if err != nil {
		p.stop(syscall.SIGKILL)
		return fmt.Errorf("natsenv: %s (%s): not ready: %w; log:\n%s", s.name, s.bin, err, tail(logPath, 2048))
	}
	s.proc = p
	s.log.log("[INF]", "%s: started %s (pid %d), config %s, log %s", s.name, s.bin, cmd.Process.Pid, conf, logPath)
	return nil
}

func (p *proc) wait() {
	_ = p.cmd.Wait()
	close(p.done)
}

// stop sends sig, then SIGKILL if the process has not exited within 10
// seconds, and returns once it has exited.
func (p *proc) stop(sig syscall.Signal) {
	_ = p.cmd.Process.Signal(sig)
	select {
	case <-p.done:
		return
	case <-time.After(10 * time.Second):
	}
	_ = p.cmd.Process.Kill()
	<-p.done
}

// get decodes the JSON the monitoring endpoint path answers into v.
func (p *proc) get(path string, v any) error {
	// No kept connection: its reader goroutine would outlive the call,
	// and leak checks would see it.
	c := http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	resp, err := c.Get("http://" + p.http + path)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return err
	}
	return json.Unmarshal(b, v)
}

// healthy is healthy for a process: its /healthz.
func (p *proc) healthy(name string) error {
	var h struct {
		Status string `json:"status"`
		Error  string `json:"error"`
	}
	if err := p.get("/healthz", &h); err != nil {
		return fmt.Errorf("natsenv: %s: %w", name, err)
	}
	if h.Status != "ok" {
		return fmt.Errorf("natsenv: %s: unhealthy: %s %s", name, h.Status, h.Error)
	}
	return nil
}

// meta returns what the process knows of the JetStream meta group: the
// leader's name and the number of peers, the process included, that are
// online.
func (p *proc) meta() (leader string, peers int, err error) {
	var jsz struct {
		Meta *struct {
			Leader   string `json:"leader"`
			Replicas []struct {
				Offline bool `json:"offline"`
				Current bool `json:"current"`
			} `json:"replicas"`
		} `json:"meta_cluster"`
	}
	if err := p.get("/jsz", &jsz); err != nil {
		return "", 0, err
	}
	if jsz.Meta == nil {
		return "", 0, errors.New("no JetStream meta group")
	}
	peers = 1
	for _, r := range jsz.Meta.Replicas {
		if !r.Offline && r.Current {
			peers++
		}
	}
	return jsz.Meta.Leader, peers, nil
}

// version asks the running process for its version.
func (p *proc) version() (string, error) {
	var varz struct {
		Version string `json:"version"`
	}
	if err := p.get("/varz", &varz); err != nil {
		return "", err
	}
	return varz.Version, nil
}

// tail returns the last n bytes of the file at path.
func tail(path string, n int64) string {
	f, err := os.Open(path)
	if err != nil {
		return err.Error()
	}
	defer f.Close()
	if st, err := f.Stat(); err == nil && st.Size() > n {
		_, _ = f.Seek(-n, io.SeekEnd)
	}
	b, _ := io.ReadAll(f)
	return string(b)
}
