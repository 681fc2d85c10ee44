package benchmarks

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/latchkey-go/latchkey/locks"
	"github.com/latchkey-go/latchkey/locks/driver"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// natsBase is what the NATS systems share: the server URL(s), the TTL, and
// the connections their clients made, whose OutMsgs count round trips
// (every KV write or read is one request with one reply; watches add none).
type natsBase struct {
	url      string
	ttl      time.Duration
	replicas int
	joined   bool // built on another process's bucket (see Env.Join)

	mu    sync.Mutex
	conns []*nats.Conn
}

func (b *natsBase) connect() (*nats.Conn, jetstream.JetStream, error) {
	nc, err := nats.Connect(b.url, nats.Name("lockbench"), nats.MaxReconnects(-1))
	if err != nil {
		return nil, nil, fmt.Errorf("nats %s: %w", b.url, err)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		nc.Close()
		return nil, nil, err
	}
	b.mu.Lock()
	b.conns = append(b.conns, nc)
	b.mu.Unlock()
	return nc, js, nil
}

// roundTrips counts the messages published by every connection the system
// opened, closed ones included.
func (b *natsBase) roundTrips() uint64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	var n uint64
	for _, nc := range b.conns {
		n += nc.Stats().OutMsgs
	}
	return n
}

// brokerOps counts the messages this process's connections of the system
// published (requests, and the odd ack) and received (replies, watch and
// subscription updates): the server's in_msgs and out_msgs for these
// connections, counted at the client (the server's own statistics mix
// every system's connections). Each worker process counts its own.
func (b *natsBase) brokerOps(context.Context) (brokerOps, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	o := brokerOps{HasOut: true}
	for _, nc := range b.conns {
		st := nc.Stats()
		o.Ops += st.OutMsgs
		o.Out += st.InMsgs
	}
	return o, nil
}

func (b *natsBase) wideOps() bool { return false }

// uniqueBucket returns a fresh bucket name with prefix.
func uniqueBucket(prefix string) string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	return prefix + "_" + hex.EncodeToString(b[:])
}

// --- floor: KV create + delete ---

// natsFloor is the least a JetStream KV lock can cost with the obvious
// calls: kv.Create to take (it fails when the key holds a value), kv.Delete
// to free. Note that nats.go's Create over a delete marker costs three
// round trips (update, get, update with the marker's revision). No
// ownership check, no renewal; waiting is plain polling with a short
// jittered back-off.
type natsFloor struct {
	natsBase
	bucket string
}

func newNATSFloor(ctx context.Context, env Env) (System, error) {
	if err := env.need(NATS, 0); err != nil {
		return nil, err
	}
	s := &natsFloor{natsBase: natsBase{url: env.NATS, ttl: env.ttl(), replicas: 1, joined: env.Join != ""}, bucket: uniqueBucket("lockbench_floor")}
	if s.joined {
		s.bucket = env.Join
		return s, nil
	}
	nc, js, err := s.connect()
	if err != nil {
		return nil, err
	}
	defer nc.Close()
	if _, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: s.bucket, Replicas: s.replicas}); err != nil {
		return nil, fmt.Errorf("nats: create bucket %s: %w", s.bucket, err)
	}
	return s, nil
}

func (s *natsFloor) NewClient(ctx context.Context) (Client, error) {
	nc, js, err := s.connect()
	if err != nil {
		return nil, err
	}
	kv, err := js.KeyValue(ctx, s.bucket)
	if err != nil {
		nc.Close()
		return nil, err
	}
	return &natsFloorClient{nc: nc, kv: kv}, nil
}

func (s *natsFloor) joinKey() string { return s.bucket }

func (s *natsFloor) Close() error {
	if s.joined {
		return nil
	}
	nc, js, err := s.connect()
	if err != nil {
		return err
	}
	defer nc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	return js.DeleteKeyValue(ctx, s.bucket)
}

type natsFloorClient struct {
	nc *nats.Conn
	kv jetstream.KeyValue
}

func (c *natsFloorClient) Lock(ctx context.Context, name string) (Held, error) {
	return driver.Wait(ctx, nil, floorBackoff, func(ctx context.Context) (Held, error) {
		_, err := c.kv.Create(ctx, name, []byte("1"))
		switch {
		case errors.Is(err, jetstream.ErrKeyExists):
			return nil, locks.ErrNotAcquired
		case err != nil:
			return nil, err
		}
		return natsFloorHeld{c.kv, name}, nil
	})
}

func (c *natsFloorClient) Close() error { c.nc.Close(); return nil }

type natsFloorHeld struct {
	kv   jetstream.KeyValue
	name string
}

func (h natsFloorHeld) Release(ctx context.Context) error { return h.kv.Delete(ctx, h.name) }
