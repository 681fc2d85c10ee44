package tests

import (
	"context"
	"errors"
	"testing"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/redis/go-redis/v9"

	"github.com/latchkey-go/latchkey/contracttest"
	"github.com/latchkey-go/latchkey/contracttest/testenv/natsenv"
	"github.com/latchkey-go/latchkey/fence"
	"github.com/latchkey-go/latchkey/fence/natsfence"
	"github.com/latchkey-go/latchkey/fence/redisfence"
	"github.com/latchkey-go/latchkey/locks"
)

// redisStore is a contracttest.GuardedStore on Redis strings behind a
// redisfence.Guard.
type redisStore struct {
	rc    *redis.Client
	guard *redisfence.Guard
}

// newRedisStore returns a NewGuardedStore on the Redis at addr.
func newRedisStore(addr string) contracttest.NewGuardedStore {
	return func(ctx context.Context, t testing.TB) (contracttest.GuardedStore, error) {
		rc := redis.NewClient(&redis.Options{Addr: addr, ContextTimeoutEnabled: true})
		g, err := redisfence.New(rc)
		if err != nil {
			return nil, errors.Join(err, rc.Close())
		}
		return &redisStore{rc: rc, guard: g}, nil
	}
}

func (s *redisStore) Write(ctx context.Context, lease locks.Lease, key, value string, inside func()) error {
	if inside != nil {
		inside()
	}
	return s.guard.Set(ctx, lease, key, value)
}

func (s *redisStore) Read(ctx context.Context, key string) (string, error) {
	v, err := s.rc.Get(ctx, key).Result()
	if errors.Is(err, redis.Nil) {
		return "", nil
	}
	return v, err
}

func (s *redisStore) IsStale(err error) bool { return errors.Is(err, fence.ErrStale) }
func (s *redisStore) Close() error           { return s.rc.Close() }

// natsStore is a contracttest.GuardedStore on a NATS KV bucket behind a
// natsfence.Guard.
type natsStore struct {
	nc    *nats.Conn
	guard *natsfence.Guard
}

// natsBucket is the data bucket of the NATS checks.
const natsBucket = "fence-data"

// newNATSStore creates the data bucket on the NATS server at url (before
// the checks, whose leak checks would blame the stream's goroutines on the
// store), and returns a NewGuardedStore on it.
func newNATSStore(t testing.TB, url string) contracttest.NewGuardedStore {
	t.Helper()
	natsKV(t, url)
	return func(ctx context.Context, t testing.TB) (contracttest.GuardedStore, error) {
		nc, err := nats.Connect(url)
		if err != nil {
			return nil, err
		}
		js, err := jetstream.New(nc)
		if err != nil {
			nc.Close()
			return nil, err
		}
		kv, err := js.KeyValue(ctx, natsBucket)
		if err != nil {
			nc.Close()
			return nil, err
		}
		g, err := natsfence.New(kv)
		if err != nil {
			nc.Close()
			return nil, err
		}
		return &natsStore{nc: nc, guard: g}, nil
	}
}

func (s *natsStore) Write(ctx context.Context, lease locks.Lease, key, value string, inside func()) error {
	if inside != nil {
		inside()
	}
	_, err := s.guard.Put(ctx, lease, key, []byte(value))
	return err
}

func (s *natsStore) Read(ctx context.Context, key string) (string, error) {
	e, err := s.guard.Get(ctx, key)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return "", nil
	}
	return string(e.Value), err
}

func (s *natsStore) IsStale(err error) bool { return errors.Is(err, fence.ErrStale) }

func (s *natsStore) Close() error {
	s.nc.Close()
	return nil
}

// natsURL starts an embedded NATS server for the test.
func natsURL(t testing.TB) string { return natsenv.StartServer(t).URL() }

// natsKV creates the data bucket on the server at url and returns it, on
// a connection closed at the test's end.
func natsKV(t testing.TB, url string) jetstream.KeyValue {
	t.Helper()
	nc, err := nats.Connect(url)
	if err != nil {
		t.Fatalf("connecting to NATS: %v", err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	kv, err := js.CreateOrUpdateKeyValue(t.Context(), jetstream.KeyValueConfig{Bucket: natsBucket, Storage: jetstream.MemoryStorage})
	if err != nil {
		t.Fatalf("creating the data bucket: %v", err)
	}
	return kv
}
