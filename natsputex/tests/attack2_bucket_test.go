package natsputex_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/latchkey-go/latchkey/contracttest/testenv/natsenv"
	"github.com/latchkey-go/latchkey/locks"
	"github.com/latchkey-go/latchkey/natsputex"
)

// TestAttack2BucketLimits: "[New] refuses an existing bucket that drops a
// key's last write by itself, with an error matching
// [locks.ErrInvalidOption] that names the bucket: a TTL (max age) shorter
// than the client's T + C·R, or limits on its messages or bytes that
// discard the oldest messages". Cases the first round did not try: a
// byte limit that discards old messages, a TTL 1ms short of T + C·R, and
// the same bucket opened by a client whose T + C·R is shorter (accepted)
// and longer (refused).
func TestAttack2BucketLimits(t *testing.T) {
	url := natsenv.StartServer(t).URL()
	js := mustJS(t, url)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	opts := []natsputex.Option{natsputex.WithRenewInterval(200 * time.Millisecond), natsputex.WithFailureThreshold(3), natsputex.WithConfirmations(1)} // T + C·R = 800ms
	refuse := func(bucket, what string, o ...natsputex.Option) {
		t.Helper()
		c, err := natsputex.New(ctx, js, bucket, o...)
		if err == nil {
			_ = c.Close(context.Background())
			t.Errorf("New accepted bucket %q (%s)", bucket, what)
			return
		}
		t.Logf("%s: %v", what, err)
		if !errors.Is(err, locks.ErrInvalidOption) || !strings.Contains(err.Error(), bucket) {
			t.Errorf("New's refusal of %s does not match ErrInvalidOption or name the bucket: %v", what, err)
		}
	}
	bytesOld := uniqueBucket("atk2bytes")
	if _, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: bytesOld}); err != nil {
		t.Fatal(err)
	}
	s, err := js.Stream(ctx, "KV_"+bytesOld)
	if err != nil {
		t.Fatal(err)
	}
	cfg := s.CachedInfo().Config
	cfg.Discard, cfg.MaxBytes = jetstream.DiscardOld, 4096
	if _, err := js.UpdateStream(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	refuse(bytesOld, "MaxBytes 4096 with DiscardOld", opts...)

	short := uniqueBucket("atk2ttl")
	if _, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: short, TTL: 799 * time.Millisecond}); err != nil {
		t.Fatal(err)
	}
	refuse(short, "TTL 799ms < T + C·R = 800ms", opts...)
	// The same bucket with a shorter timing (T + C·R = 400ms) is fine.
	if c, err := natsputex.New(ctx, js, short, natsputex.WithRenewInterval(100*time.Millisecond)); err != nil {
		t.Errorf("New refused bucket with TTL 799ms for T + C·R = 400ms: %v", err)
	} else {
		_ = c.Close(context.Background())
	}
	// A longer C alone (T = 600ms, C·R = 400ms) must be refused.
	refuse(short, "TTL 799ms < T + C·R = 1s (C = 2)", natsputex.WithRenewInterval(200*time.Millisecond), natsputex.WithConfirmations(2))
}
