package testenv

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/ory/dockertest/v3"
	dc "github.com/ory/dockertest/v3/docker"
)

// redisProc runs redis-server as a child process.
type redisProc struct {
	bin     string
	dir     string
	port    int
	tlsPort int // 0 for none
	cfg     RedisConfig

	cmd  *exec.Cmd
	done chan struct{} // closed once cmd has been waited for
	out  *tailBuffer
}

func (p *redisProc) start(ctx context.Context) error {
	p.out = &tailBuffer{max: 4096}
	p.cmd = exec.Command(p.bin,
		"--port", strconv.Itoa(p.port),
		"--bind", "127.0.0.1",
		"--save", "",
		"--appendonly", "no",
		"--daemonize", "no",
		"--dir", p.dir,
		"--logfile", "",
	)
	if p.tlsPort != 0 {
		p.cmd.Args = append(p.cmd.Args,
			"--tls-port", strconv.Itoa(p.tlsPort),
			"--tls-cert-file", p.cfg.TLS.CertFile,
			"--tls-key-file", p.cfg.TLS.KeyFile,
			"--tls-ca-cert-file", p.cfg.TLS.CAFile,
			"--tls-auth-clients", "optional",
		)
	}
	p.cmd.Args = append(p.cmd.Args, p.cfg.Args...)
	p.cmd.Stdout = p.out
	p.cmd.Stderr = p.out
	// Its own process group, so that a ^C on the test does not reach it
	// before cleanup does.
	p.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := p.cmd.Start(); err != nil {
		return err
	}
	done := make(chan struct{})
	p.done = done
	cmd := p.cmd
	go func() {
		_ = cmd.Wait()
		close(done)
	}()
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(p.port))
	exited := func() error {
		select {
		case <-done:
			return fmt.Errorf("redis-server on port %d exited: %s; output:\n%s", p.port, cmd.ProcessState, p.out)
		default:
			return nil
		}
	}
	err := waitFor(ctx, redisReadyTimeout, exited, func() error { return redisPing(addr, 500*time.Millisecond) })
	if err != nil {
		_ = p.kill()
		return err
	}
	return nil
}

func (p *redisProc) kill() error {
	if p.cmd == nil {
		return nil
	}
	if err := p.cmd.Process.Kill(); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return err
	}
	select {
	case <-p.done:
	case <-time.After(10 * time.Second):
		return fmt.Errorf("redis-server pid %d did not exit after SIGKILL", p.cmd.Process.Pid)
	}
	p.cmd = nil
	return nil
}

func (p *redisProc) pause() error  { return p.cmd.Process.Signal(syscall.SIGSTOP) }
func (p *redisProc) resume() error { return p.cmd.Process.Signal(syscall.SIGCONT) }

// redisContainer runs Redis in a Docker container whose port 6379 is
// published on 127.0.0.1:port, so that it keeps its address across restarts.
type redisContainer struct {
	env  *Env
	pool *dockertest.Pool
	port int
	res  *dockertest.Resource
}

func (c *redisContainer) start(ctx context.Context) error {
	if c.res == nil {
		res, err := c.env.runContainer(c.pool, &dockertest.RunOptions{
			Repository: redisRepo,
			Tag:        redisTag,
			Cmd:        []string{"redis-server", "--save", "", "--appendonly", "no", "--protected-mode", "no"},
		}, map[string]string{"6379/tcp": strconv.Itoa(c.port)})
		if err != nil {
			return err
		}
		c.res = res
	} else if err := c.pool.Client.StartContainer(c.res.Container.ID, nil); err != nil {
		return err
	}
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(c.port))
	return waitFor(ctx, containerReadyTimeout, nil, func() error { return redisPing(addr, time.Second) })
}

func (c *redisContainer) kill() error {
	if err := c.pool.Client.KillContainer(dc.KillContainerOptions{ID: c.res.Container.ID, Signal: dc.SIGKILL}); err != nil {
		return err
	}
	return waitFor(context.Background(), 30*time.Second, nil, func() error {
		ctr, err := c.pool.Client.InspectContainer(c.res.Container.ID)
		if err != nil {
			return err
		}
		if ctr.State.Running {
			return errors.New("container still running")
		}
		return nil
	})
}

func (c *redisContainer) pause() error  { return c.pool.Client.PauseContainer(c.res.Container.ID) }
func (c *redisContainer) resume() error { return c.pool.Client.UnpauseContainer(c.res.Container.ID) }

// tailBuffer is an io.Writer keeping the last max bytes written, safe for
// concurrent use.
type tailBuffer struct {
	mu  sync.Mutex
	max int
	b   []byte
}

func (b *tailBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.b = append(b.b, p...)
	if over := len(b.b) - b.max; over > 0 {
		b.b = append(b.b[:0], b.b[over:]...)
	}
	return len(p), nil
}

func (b *tailBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return string(b.b)
}
