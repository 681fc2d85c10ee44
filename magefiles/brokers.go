//go:build mage

package main

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"os/exec"
	"strings"
	"time"
)

// BrokerVersions prints the broker versions the tests will find.
func BrokerVersions() { printBrokerVersions() }

// printBrokerVersions says which broker versions the tests will find: the
// embedded NATS server, the nats-server and redis-server programs the tests
// start, and the RabbitMQ broker they use. What it cannot learn it says so;
// the tests themselves decide whether a missing broker fails the run.
func printBrokerVersions() {
	fmt.Println("brokers this run tests:")
	if v, err := output("go", "-C", "contracttest/testenv/natsenv", "list", "-m", "-f", "{{.Version}}", "github.com/nats-io/nats-server/v2"); err == nil {
		fmt.Printf("  NATS, embedded: nats-server %s\n", strings.TrimSpace(v))
	}
	for _, prog := range []string{"nats-server", "redis-server"} {
		if _, err := exec.LookPath(prog); err != nil {
			fmt.Printf("  %s: not on PATH\n", prog)
			continue
		}
		v, _ := output(prog, "--version")
		fmt.Printf("  %s\n", strings.TrimSpace(v))
	}
	addr := "127.0.0.1:5672"
	if u, err := url.Parse(os.Getenv("LOCKS_AMQP_URL")); err == nil && u.Host != "" {
		addr = u.Host
	}
	v, err := rabbitVersion(addr)
	if err != nil {
		fmt.Printf("  RabbitMQ on %s: %v\n", addr, err)
		return
	}
	fmt.Printf("  RabbitMQ on %s: %s\n", addr, v)
}

// rabbitVersion reads the "version" server property from the
// connection.start frame an AMQP 0-9-1 broker on addr sends first.
func rabbitVersion(addr string) (string, error) {
	c, err := net.DialTimeout("tcp", addr, 2*time.Second)
	if err != nil {
		return "", err
	}
	defer c.Close()
	if err := c.SetDeadline(time.Now().Add(2 * time.Second)); err != nil {
		return "", err
	}
	if _, err := c.Write([]byte("AMQP\x00\x00\x09\x01")); err != nil {
		return "", err
	}
	var hdr [7]byte
	if _, err := io.ReadFull(c, hdr[:]); err != nil {
		return "", fmt.Errorf("no AMQP reply: %w", err)
	}
	frame := make([]byte, min(binary.BigEndian.Uint32(hdr[3:]), 1<<16))
	if _, err := io.ReadFull(c, frame); err != nil {
		return "", fmt.Errorf("short AMQP reply: %w", err)
	}
	// The property table holds the field "version" as a long string:
	// name length, name, 'S', a 4-byte length, the value.
	key := []byte("\x07versionS")
	i := bytes.Index(frame, key)
	if i < 0 || i+len(key)+4 > len(frame) {
		return "", errors.New("the broker names no version")
	}
	rest := frame[i+len(key):]
	n := int(binary.BigEndian.Uint32(rest))
	if 4+n > len(rest) {
		return "", errors.New("a malformed version property")
	}
	return string(rest[4 : 4+n]), nil
}
