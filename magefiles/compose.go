//go:build mage

package main

import (
	"fmt"
	"path/filepath"

	"github.com/magefile/mage/mg"
)

const (
	composeFile      = "docker-compose.yml"
	composeEnvExport = `export LOCKS_AMQP_URL=amqp://guest:guest@127.0.0.1:5672/
export LOCKS_REDIS_ADDRS=127.0.0.1:6379,127.0.0.1:6380,127.0.0.1:6381
export LOCKS_NATS_URL=nats://127.0.0.1:4222`
)

// Compose runs the brokers of docker-compose.yml for a laptop.
type Compose mg.Namespace

// Up starts RabbitMQ, three Redis masters and NATS, and waits until they are healthy.
func (Compose) Up() error {
	file, err := composePath()
	if err != nil {
		return err
	}
	if err := runV("docker", "compose", "-f", file, "up", "-d", "--wait"); err != nil {
		return err
	}
	fmt.Printf("brokers are up; to point the tests at them:\n%s\n", composeEnvExport)
	return nil
}

// Down stops the brokers of docker-compose.yml and removes their volumes.
func (Compose) Down() error {
	file, err := composePath()
	if err != nil {
		return err
	}
	return runV("docker", "compose", "-f", file, "down", "-v")
}

func composePath() (string, error) {
	root, err := workspaceRoot()
	if err != nil {
		return "", err
	}
	return display(filepath.Join(root, composeFile)), nil
}
