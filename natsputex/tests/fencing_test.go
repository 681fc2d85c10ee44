package natsputex_test

import (
	"context"
	"errors"
	"testing"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/latchkey-go/latchkey/contracttest"
	"github.com/latchkey-go/latchkey/contracttest/testenv/natsenv"
	"github.com/latchkey-go/latchkey/fence"
	"github.com/latchkey-go/latchkey/fence/natsfence"
	"github.com/latchkey-go/latchkey/locks"
)

// TestFencedWrites runs the contract suite's fencing checks with
// natsputex leases writing to another bucket of the same server through
// natsfence: a holder cut off past its validity is refused once its
// successor wrote (the KV revision is the token), racing first writes
// keep the successor's data.
func TestFencedWrites(t *testing.T) {
	url := natsenv.StartServer(t).URL()
	bucket := uniqueBucket("fence")
	prepareBucket(t, url, bucket)
	data := uniqueBucket("fence-data")
	// The data bucket is made before the checks, whose leak checks would
	// blame its stream's goroutines on the store.
	nc, js, err := connect(url)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	if _, err := js.CreateKeyValue(t.Context(), jetstream.KeyValueConfig{Bucket: data, Storage: jetstream.MemoryStorage}); err != nil {
		t.Fatal(err)
	}
	contracttest.RunFencingTests(t, newHarnessFunc(url, bucket), func(ctx context.Context, t testing.TB) (contracttest.GuardedStore, error) {
		nc, js, err := connect(url)
		if err != nil {
			return nil, err
		}
		kv, err := js.KeyValue(ctx, data)
		if err != nil {
			nc.Close()
			return nil, err
		}
		g, err := natsfence.New(kv)
		if err != nil {
			nc.Close()
			return nil, err
		}
		return &fencedKV{close: nc.Close, guard: g}, nil
	})
}

// fencedKV is a contracttest.GuardedStore on a KV bucket behind a
// natsfence.Guard.
type fencedKV struct {
	close func()
	guard *natsfence.Guard
}

func (s *fencedKV) Write(ctx context.Context, lease locks.Lease, key, value string, inside func()) error {
	if inside != nil {
		inside()
	}
	_, err := s.guard.Put(ctx, lease, key, []byte(value))
	return err
}

func (s *fencedKV) Read(ctx context.Context, key string) (string, error) {
	e, err := s.guard.Get(ctx, key)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return "", nil
	}
	return string(e.Value), err
}

func (s *fencedKV) IsStale(err error) bool { return errors.Is(err, fence.ErrStale) }

func (s *fencedKV) Close() error {
	s.close()
	return nil
}
