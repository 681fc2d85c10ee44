package natsenv_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/latchkey-go/latchkey/contracttest/testenv"
	"github.com/latchkey-go/latchkey/contracttest/testenv/natsenv"
)

// TestEnvStartServer starts a server and a cluster outside any test's
// cleanup, as lockbench does, and checks that closing the Env shuts them
// down and removes their store directories.
func TestEnvStartServer(t *testing.T) {
	leakCheck(t)
	env := new(testenv.Env)
	nenv := natsenv.In(env)
	s, err := nenv.StartServer(t.Context(), natsenv.ServerConfig{})
	if err != nil {
		t.Fatal(err)
	}
	c, err := nenv.StartCluster(t.Context(), 3, natsenv.ClusterConfig{})
	if err != nil {
		t.Fatal(err)
	}
	js := connect(t, s.URL()+","+c.URLs())
	if _, err := js.AccountInfo(testContext(t)); err != nil {
		t.Fatalf("JetStream: %v", err)
	}
	if err := env.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	for _, srv := range append([]*natsenv.Server{s}, c.Servers()...) {
		if srv.Running() {
			t.Errorf("%s still runs after the Env's Close", srv.Name())
		}
		if err := srv.Restart(); err == nil {
			t.Errorf("Restart of %s after the Env's Close succeeded; want an error", srv.Name())
		}
	}
	if _, err := nenv.StartServer(t.Context(), natsenv.ServerConfig{}); !errors.Is(err, testenv.ErrClosed) {
		t.Errorf("StartServer after Close = %v, want testenv.ErrClosed", err)
	}
}

// TestEnvErrors checks the errors the Env gives for bad arguments and a
// missing program.
func TestEnvErrors(t *testing.T) {
	env := new(testenv.Env)
	defer env.Close()
	nenv := natsenv.In(env)
	if _, err := nenv.StartCluster(context.Background(), 1, natsenv.ClusterConfig{}); err == nil || !strings.Contains(err.Error(), "at least 2 nodes") {
		t.Errorf("StartCluster(1) = %v, want an error saying a cluster needs 2 nodes", err)
	}
	if _, err := nenv.StartServer(context.Background(), natsenv.ServerConfig{User: "u", Operator: &natsenv.Operator{}}); err == nil {
		t.Errorf("StartServer with a user and an operator succeeded; want an error")
	}
	t.Setenv(natsenv.BinaryEnv, "")
	t.Setenv("PATH", t.TempDir())
	_, err := nenv.Binary()
	if m, ok := errors.AsType[*testenv.MissingError](err); !ok || !strings.Contains(m.How, natsenv.BinaryEnv) {
		t.Errorf("Binary without nats-server = %v, want a *testenv.MissingError naming %s", err, natsenv.BinaryEnv)
	}
}
