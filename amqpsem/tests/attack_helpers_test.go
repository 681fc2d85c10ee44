package amqpsem_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/latchkey-go/latchkey/contracttest/testenv"

	"github.com/latchkey-go/latchkey/amqpsem"
)

// atkName returns a fresh semaphore name.
func atkName(prefix string) string {
	return fmt.Sprintf("atk.%s.%d.%d.x", prefix, time.Now().UnixNano()%1e9, rand.IntN(1e6))
}

// atkDial dials a library client straight to the broker (or through a
// proxy address when via is not "").
func atkDial(t *testing.T, url, via string, opts ...amqpsem.Option) *amqpsem.Client {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if via != "" {
		opts = append(opts, amqpsem.WithDial(func(ctx context.Context, network, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, network, via)
		}))
	}
	c, err := amqpsem.Dial(ctx, url, append(testOptions(), opts...)...)
	if err != nil {
		t.Fatalf("dial: %v", err)
	}
	t.Cleanup(func() { c.Close(context.Background()) })
	return c
}

func atkAdmin(t *testing.T, c *amqpsem.Client, opts ...amqpsem.Option) *amqpsem.Admin {
	t.Helper()
	a, err := c.Admin(opts...)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

// atkCleanup destroys name (both layouts) at the end of the test.
func atkCleanup(t *testing.T, url, name string) {
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		c, err := amqpsem.Dial(ctx, url, amqpsem.WithHeartbeat(time.Second))
		if err != nil {
			return
		}
		defer c.Close(context.Background())
		for _, l := range []amqpsem.Layout{amqpsem.DefaultLayout, amqpsem.PythonLayout} {
			if a, err := c.Admin(amqpsem.WithLayout(l)); err == nil {
				a.Destroy(ctx, name)
			}
		}
	})
}

// atkRawConn is a bare AMQP connection: a holder written against the
// specification only (another implementation, a non-linear scanner).
type atkRawConn struct {
	conn *amqp.Connection
}

func atkRaw(t *testing.T, url string) *atkRawConn {
	t.Helper()
	conn, err := amqp.DialConfig(url, amqp.Config{Heartbeat: time.Second})
	if err != nil {
		t.Fatalf("raw dial: %v", err)
	}
	t.Cleanup(func() { conn.Close() })
	return &atkRawConn{conn: conn}
}

var atkArgs = amqp.Table{"x-max-length": int32(0)}

// hold declares queue q exclusive on this connection.
func (r *atkRawConn) hold(q string) error {
	ch, err := r.conn.Channel()
	if err != nil {
		return err
	}
	defer ch.Close()
	_, err = ch.QueueDeclare(q, false, false, true, false, atkArgs)
	return err
}

// drop deletes queue q.
func (r *atkRawConn) drop(q string) error {
	ch, err := r.conn.Channel()
	if err != nil {
		return err
	}
	defer ch.Close()
	_, err = ch.QueueDelete(q, false, false, false)
	return err
}

// state says whether q is absent ("absent"), exists and is free to this
// connection ("exists"), or is an exclusive queue of another connection
// ("locked").
func (r *atkRawConn) state(q string) string {
	ch, err := r.conn.Channel()
	if err != nil {
		return "error: " + err.Error()
	}
	defer ch.Close()
	_, err = ch.QueueDeclarePassive(q, false, false, false, false, nil)
	var ae *amqp.Error
	switch {
	case err == nil:
		return "exists"
	case errors.As(err, &ae) && ae.Code == amqp.NotFound:
		return "absent"
	case errors.As(err, &ae) && ae.Code == amqp.ResourceLocked:
		return "locked"
	}
	return "error: " + err.Error()
}

var (
	atkBinOnce sync.Once
	atkBinPath string
	atkBinErr  error
)

// atkBin builds the amqpsem command once.
func atkBin(t *testing.T) string {
	t.Helper()
	atkBinOnce.Do(func() {
		dir, err := os.MkdirTemp("", "atkbin")
		if err != nil {
			atkBinErr = err
			return
		}
		atkBinPath = filepath.Join(dir, "amqpsem")
		out, err := exec.Command("go", "build", "-o", atkBinPath, "../cmd/amqpsem").CombinedOutput()
		if err != nil {
			atkBinErr = fmt.Errorf("build: %v: %s", err, out)
		}
	})
	if atkBinErr != nil {
		t.Fatal(atkBinErr)
	}
	return atkBinPath
}

// atkRun runs the command with env added, returning combined output and
// exit code.
func atkRun(t *testing.T, timeout time.Duration, env []string, args ...string) (string, int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, atkBin(t), args...)
	cmd.Env = append(os.Environ(), env...)
	out, err := cmd.CombinedOutput()
	code := 0
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatalf("run %v: %v", args, err)
	}
	return string(out), code
}

var _ = testenv.AMQPURL
