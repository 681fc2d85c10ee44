package natsputex_test

// Bad input: options, names, holder ids and buckets refused before any
// harm.

import (
	"context"
	"errors"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/latchkey-go/latchkey/contracttest/cmdtest"
	"github.com/latchkey-go/latchkey/contracttest/testenv/natsenv"
	"github.com/latchkey-go/latchkey/locks"
	"github.com/latchkey-go/latchkey/natsputex"
)

// TestNewRefusesBucketThatDropsLastWrite: "[New] refuses an existing bucket
// that drops a key's last write by itself, with an error matching
// [locks.ErrInvalidOption] that names the bucket: a TTL (max age) shorter
// than the client's T + C·R, or limits on its messages or bytes that discard
// the oldest messages". Cases beyond the regression scenario
// bucket-with-short-ttl (TestRegressions): a byte limit that discards old
// messages, a TTL 1ms short of T + C·R, and the same bucket opened by a
// client whose T + C·R is shorter (accepted) and longer (refused).
func TestNewRefusesBucketThatDropsLastWrite(t *testing.T) {
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
	bytesOld := uniqueBucket("bytes")
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

	short := uniqueBucket("ttl")
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

// TestClockKeyNameRefused: "an empty message to the bucket's key
// "natsputex:clock", which no lock can be named": Lock, TryLock, a
// Semaphore and a Supervisor on that name fail with ErrInvalidName.
func TestClockKeyNameRefused(t *testing.T) {
	url, bucket := promiseEnv(t, "clockname")
	c := newTestClient(t, url, bucket)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	const name = "natsputex:clock"
	if _, err := c.Locker().TryLock(ctx, name); !errors.Is(err, locks.ErrInvalidName) {
		t.Errorf("TryLock(%q): %v, want ErrInvalidName", name, err)
	}
	if _, err := c.Locker().Lock(ctx, name); !errors.Is(err, locks.ErrInvalidName) {
		t.Errorf("Lock(%q): %v, want ErrInvalidName", name, err)
	}
	if _, err := c.Supervisor(name, "node-a", natsputex.Service{}); !errors.Is(err, locks.ErrInvalidName) {
		t.Errorf("Supervisor(%q): %v, want ErrInvalidName", name, err)
	}
	if err := natsputex.CheckSupervisor(bucket, name, "node-a"); !errors.Is(err, locks.ErrInvalidName) {
		t.Errorf("CheckSupervisor(%q): %v, want ErrInvalidName", name, err)
	}
	s, err := c.Semaphore(1)
	if err != nil {
		t.Fatal(err)
	}
	if l, err := s.TryAcquire(ctx, "natsputex:clock"); err == nil {
		t.Logf("a Semaphore named %q uses the slot key %q.1, not the clock key: token %d", name, name, l.Token())
		_ = l.Release(ctx)
	}
}

// TestOptionLimits: values whose products overflow a time.Duration, and
// semaphores too large to try slot by slot, are invalid options.
func TestOptionLimits(t *testing.T) {
	url := natsenv.StartServer(t).URL()
	bucket := uniqueBucket("limits")
	nc, js, err := connect(url)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	ctx := context.Background()
	for _, opts := range [][]natsputex.Option{
		// 5·2⁶² wraps around to 2⁶², a plausible T.
		{natsputex.WithRenewInterval(1 << 62), natsputex.WithFailureThreshold(5)},
		{natsputex.WithRenewInterval(1 << 62), natsputex.WithFailureThreshold(1), natsputex.WithConfirmations(5)},
	} {
		c, err := natsputex.New(ctx, js, bucket, opts...)
		if err == nil {
			_ = c.Close(context.Background())
		}
		if !errors.Is(err, locks.ErrInvalidOption) {
			t.Errorf("New with an overflowing F·R or C·R = %v, want ErrInvalidOption", err)
		}
	}
	c := newTestClient(t, url, bucket)
	if _, err := c.Semaphore(natsputex.MaxSemaphoreSize); err != nil {
		t.Errorf("Semaphore(%d) = %v", natsputex.MaxSemaphoreSize, err)
	}
	for _, size := range []int{natsputex.MaxSemaphoreSize + 1, 1 << 40, math.MaxInt} {
		if _, err := c.Semaphore(size); !errors.Is(err, locks.ErrInvalidOption) {
			t.Errorf("Semaphore(%d) = %v, want ErrInvalidOption", size, err)
		}
	}
}

// TestNatslockBadInput: natslock checks every argument before it connects
// and exits with status 64 and a message naming the problem. Nothing
// listens on its NATS URL: a natslock that connected first would fail
// with status 1.
func TestNatslockBadInput(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs natslock")
	}
	bin := buildNatslock(t)
	const url = "nats://127.0.0.1:1"
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"-r", "0", url, "b", "k", "tok"}, "renew interval"},
		{[]string{"-f", "0", url, "b", "k", "tok"}, "failure threshold"},
		{[]string{"-c", "-1", url, "b", "k", "tok"}, "confirmation count"},
		{[]string{"-r", "1s", "-margin", "3s", url, "b", "k", "tok"}, "safety margin"},
		{[]string{"-r", "2562047h", "-f", "3", url, "b", "k", "tok"}, "overflows"},
		{[]string{"-replicas", "9", url, "b", "k", "tok"}, "replicas"},
		{[]string{url, "a.b", "k", "tok"}, "bucket"},
		{[]string{url, "b", "a b", "tok"}, "key"},
		{[]string{url, "b", "k", ""}, "token"},
		{[]string{"", "b", "k", "tok"}, "URL"},
	} {
		out, code := cmdtest.Run(t, bin, tc.args...)
		if code != 64 {
			t.Errorf("natslock %q: exit %d, want exit status 64\n%s", tc.args, code, out)
			continue
		}
		if !strings.Contains(out, tc.want) {
			t.Errorf("natslock %q said %q, want a message about the %s", tc.args, out, tc.want)
		}
	}
}

func TestSupervisorBadInput(t *testing.T) {
	url, bucket, _ := supervisorEnv(t)
	nc, js, err := connect(url)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	c, err := natsputex.New(context.Background(), js, bucket)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close(context.Background())
	for _, key := range []string{"", "a b", ".a", "a..b", "a*"} {
		if _, err := c.Supervisor(key, "tok", natsputex.Service{}); !errors.Is(err, locksErrInvalidName) {
			t.Errorf("Supervisor(%q) = %v, want ErrInvalidName", key, err)
		}
	}
	for _, tok := range []string{"", "a\x00b"} {
		if _, err := c.Supervisor("k", tok, natsputex.Service{}); !errors.Is(err, locksErrInvalidOption) {
			t.Errorf("Supervisor token %q = %v, want ErrInvalidOption", tok, err)
		}
	}
	for _, b := range []string{"", "a.b", "a b", "a*"} {
		if _, err := natsputex.New(context.Background(), js, b); !errors.Is(err, locksErrInvalidName) {
			t.Errorf("New(bucket %q) = %v, want ErrInvalidName", b, err)
		}
	}
	s, err := c.Supervisor("k", "tok", natsputex.Service{})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := s.Run(ctx); !errors.Is(err, context.Canceled) {
		t.Errorf("Run with a cancelled context = %v, want context.Canceled", err)
	}
}
