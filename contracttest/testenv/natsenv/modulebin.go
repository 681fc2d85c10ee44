package natsenv

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"syscall"

	"github.com/nats-io/nats-server/v2/server"
)

// serverModule is the module natsenv embeds, and builds a program from
// for clusters (see [Env.ModuleBinary]).
const serverModule = "github.com/nats-io/nats-server/v2"

var moduleBinary struct {
	once sync.Once
	path string
	err  error
}

// ModuleBinary returns the path of a nats-server program built from the
// version of the nats-server/v2 module this test binary links (the one
// natsenv embeds), building it once into the user's cache directory
// ($XDG_CACHE_HOME/latchkey, with go install; a few minutes the first
// time on a small machine, nothing after). Test processes that build it
// at once wait for one another. Servers and clusters' nodes run from it
// as separate processes (see [ServerConfig.Embedded] and
// [ClusterConfig.Embedded]): the race detector then watches the code
// under test, not the server's, which has data races it reports
// (nats-server 2.11.17: a clustered stream's expected-last-sequence map,
// checked without its lock after each leader change, still so in 2.14;
// a consumer's configuration, written while a consumer-names request
// reads it).
func (e Env) ModuleBinary() (string, error) {
	moduleBinary.once.Do(func() {
		moduleBinary.path, moduleBinary.err = buildModuleBinary()
	})
	return moduleBinary.path, moduleBinary.err
}

func buildModuleBinary() (string, error) {
	version, err := linkedServerVersion()
	if err != nil {
		return "", err
	}
	cache, err := os.UserCacheDir()
	if err != nil {
		return "", fmt.Errorf("natsenv: building nats-server %s: %w", version, err)
	}
	dir := filepath.Join(cache, "latchkey", "nats-server-"+version)
	bin := filepath.Join(dir, "nats-server")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", fmt.Errorf("natsenv: building nats-server %s: %w", version, err)
	}
	lock, err := os.OpenFile(filepath.Join(dir, "build.lock"), os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return "", fmt.Errorf("natsenv: building nats-server %s: %w", version, err)
	}
	defer lock.Close()
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX); err != nil {
		return "", fmt.Errorf("natsenv: building nats-server %s: lock: %w", version, err)
	}
	defer syscall.Flock(int(lock.Fd()), syscall.LOCK_UN)
	if _, err := os.Stat(bin); err == nil {
		return bin, nil
	}
	tmp, err := os.MkdirTemp(dir, "build-")
	if err != nil {
		return "", fmt.Errorf("natsenv: building nats-server %s: %w", version, err)
	}
	defer os.RemoveAll(tmp)
	cmd := exec.Command("go", "install", serverModule+"@"+version)
	cmd.Dir = tmp // outside any module or workspace
	cmd.Env = append(os.Environ(), "GOBIN="+tmp, "GOFLAGS=", "GOWORK=off", "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("natsenv: go install %s@%s: %w\n%s", serverModule, version, err, out)
	}
	if err := os.Rename(filepath.Join(tmp, "nats-server"), bin); err != nil {
		return "", fmt.Errorf("natsenv: building nats-server %s: %w", version, err)
	}
	return bin, nil
}

// linkedServerVersion returns the version of the nats-server/v2 module
// linked into this binary, as a module version ("v2.11.17"). (Test
// binaries carry no module list in their build information: the
// server's own VERSION says it.)
func linkedServerVersion() (string, error) {
	if server.VERSION == "" {
		return "", errors.New("natsenv: the linked nats-server reports no version")
	}
	return "v" + server.VERSION, nil
}
