package testenv

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ory/dockertest/v3"
	dc "github.com/ory/dockertest/v3/docker"
)

// dockerPingTimeout bounds the probe for a Docker engine, so that machines
// without one (or with only the docker client installed) fall through to the
// next step at once.
const dockerPingTimeout = 500 * time.Millisecond

// containerReadyTimeout bounds how long a started container may take to
// answer on its port, after its image was pulled.
const containerReadyTimeout = 90 * time.Second

// dockerPool returns a pool on the Docker engine, computed once per test
// binary by probeDocker.
var dockerPool = sync.OnceValues(probeDocker)

// probeDocker returns a pool on the Docker engine named by the environment
// (DOCKER_HOST...) or the platform default, once it answered a ping within
// dockerPingTimeout.
func probeDocker() (*dockertest.Pool, error) {
	pool, err := dockertest.NewPool("")
	if err != nil {
		return nil, fmt.Errorf("docker: %w", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), dockerPingTimeout)
	defer cancel()
	err = pool.Client.PingWithContext(ctx)
	if pool.Client.HTTPClient != nil {
		pool.Client.HTTPClient.CloseIdleConnections()
	}
	if err != nil {
		return nil, fmt.Errorf("docker: no engine answers at %s: %w", pool.Client.Endpoint(), err)
	}
	pool.MaxWait = containerReadyTimeout
	return pool, nil
}

var containerSeq atomic.Uint64

// runContainer starts a container from opts, with the given container ports
// published on 127.0.0.1 (hostPorts maps a container port such as "6379/tcp"
// to a host port, "" for any free one). The container is removed at
// [Env.Close]. It returns an error (and leaves nothing behind) when the
// container cannot be started.
func (e *Env) runContainer(pool *dockertest.Pool, opts *dockertest.RunOptions, hostPorts map[string]string) (*dockertest.Resource, error) {
	opts.Name = fmt.Sprintf("latchkey-testenv-%d-%d", time.Now().UnixNano(), containerSeq.Add(1))
	opts.Labels = map[string]string{"latchkey-testenv": "1"}
	opts.PortBindings = map[dc.Port][]dc.PortBinding{}
	for cport, hport := range hostPorts {
		opts.ExposedPorts = append(opts.ExposedPorts, cport)
		opts.PortBindings[dc.Port(cport)] = []dc.PortBinding{{HostIP: "127.0.0.1", HostPort: hport}}
	}
	res, err := pool.RunWithOptions(opts, func(hc *dc.HostConfig) {
		hc.AutoRemove = false
		hc.PublishAllPorts = false
		hc.RestartPolicy = dc.NeverRestart()
	})
	if err != nil {
		// RunWithOptions may fail after creating the container.
		_ = pool.RemoveContainerByName(opts.Name)
		return nil, fmt.Errorf("docker: run %s:%s: %w", opts.Repository, opts.Tag, err)
	}
	err = e.OnClose(func() error {
		if err := pool.Purge(res); err != nil {
			return fmt.Errorf("testenv: remove container %s: %w", opts.Name, err)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return res, nil
}

// hostAddr returns the loopback address the container port cport is
// published on.
func hostAddr(res *dockertest.Resource, cport string) (string, error) {
	p := res.GetPort(cport)
	if _, err := strconv.Atoi(p); err != nil {
		return "", errors.New("docker: container port " + cport + " is not published")
	}
	return net.JoinHostPort("127.0.0.1", p), nil
}
