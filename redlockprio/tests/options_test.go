package redlockprio_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/latchkey-go/latchkey/locks"
	"github.com/latchkey-go/latchkey/redlockprio"
)

// offline returns a client that is never dialled: New does no I/O.
func offline(t testing.TB) *redis.Client {
	rc := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"})
	t.Cleanup(func() { _ = rc.Close() })
	return rc
}

// valueClient is a client of a type that is not comparable (a slice
// field), which a map keyed by client cannot hold.
type valueClient struct {
	*redis.Client
	tags []string
}

func TestNewRejectsKeyPrefixWithBar(t *testing.T) {
	ms := []redis.UniversalClient{offline(t)}
	// '|' separates the fields of the inbox messages, whose reply channel
	// carries the prefix.
	for _, p := range []string{"a|b", "|", "latchkey|"} {
		if _, err := redlockprio.New(ms, redlockprio.WithKeyPrefix(p)); !errors.Is(err, locks.ErrInvalidOption) {
			t.Errorf("WithKeyPrefix(%q): %v, want ErrInvalidOption", p, err)
		}
	}
	lc, err := redlockprio.New(ms, redlockprio.WithKeyPrefix("app/locks:"))
	if err != nil {
		t.Fatalf("a valid prefix: %v", err)
	}
	_ = lc.Close(context.Background())
}

func TestNewWithNonComparableClient(t *testing.T) {
	a, b := offline(t), offline(t)
	call := func(ms ...redis.UniversalClient) (err error) {
		defer func() {
			if r := recover(); r != nil {
				err = fmt.Errorf("New panicked: %v", r)
			}
		}()
		lc, err := redlockprio.New(ms)
		if err == nil {
			_ = lc.Close(context.Background())
		}
		return err
	}
	if err := call(valueClient{Client: a}, valueClient{Client: b, tags: []string{"b"}}, a); err != nil {
		t.Errorf("New with non-comparable clients: %v", err)
	}
	if err := call(valueClient{Client: a}, nil); !errors.Is(err, locks.ErrInvalidOption) {
		t.Errorf("New with a nil client among non-comparable ones: %v, want ErrInvalidOption", err)
	}
	if err := call(valueClient{Client: a}, b, b); !errors.Is(err, locks.ErrInvalidOption) {
		t.Errorf("New with a repeated client: %v, want ErrInvalidOption", err)
	}
}

func TestNewRejectsRenewIntervalTooLong(t *testing.T) {
	ms := []redis.UniversalClient{offline(t)}
	const ttl = 600 * time.Millisecond
	drift := time.Duration(float64(ttl)*0.01) + 2*time.Millisecond
	limit := (ttl - drift) / 3
	// A hung renewal round may take one interval, and the next round can
	// start one interval after the last successful one: past (TTL−drift)/3
	// the lease could outlive its validity.
	for _, renew := range []time.Duration{limit + time.Millisecond, (ttl - drift) / 2, ttl - time.Millisecond} {
		if _, err := redlockprio.New(ms, redlockprio.WithTTL(ttl), redlockprio.WithRenewInterval(renew)); !errors.Is(err, locks.ErrInvalidOption) {
			t.Errorf("renew %v with TTL %v: %v, want ErrInvalidOption", renew, ttl, err)
		}
	}
	for _, opts := range [][]redlockprio.Option{
		{redlockprio.WithTTL(ttl), redlockprio.WithRenewInterval(limit)},
		{redlockprio.WithTTL(ttl)}, // the default interval
		{redlockprio.WithTTL(20 * time.Millisecond)},
		{},
	} {
		lc, err := redlockprio.New(ms, opts...)
		if err != nil {
			t.Errorf("valid options: %v", err)
			continue
		}
		_ = lc.Close(context.Background())
	}
}

// TestNewRefusesTwoMastersAndShortTTL: two masters tolerate no failure,
// so New refuses them without WithTwoMasters; a TTL too short for a
// step's per-master calls ((TTL − drift)/2 under 5ms), and a call
// timeout outside [5ms, (TTL − drift)/2], are refused too; all before
// any I/O (the masters are offline).
func TestNewRefusesTwoMastersAndShortTTL(t *testing.T) {
	one := []redis.UniversalClient{offline(t)}
	two := []redis.UniversalClient{offline(t), offline(t)}
	for _, c := range []struct {
		what string
		ms   []redis.UniversalClient
		opts []redlockprio.Option
	}{
		{"two masters", two, nil},
		{"TTL 5ms", one, []redlockprio.Option{redlockprio.WithTTL(5 * time.Millisecond)}},
		{"TTL 10ms", one, []redlockprio.Option{redlockprio.WithTTL(10 * time.Millisecond)}},
		{"call timeout over (TTL − drift)/2", one, []redlockprio.Option{redlockprio.WithTTL(time.Second), redlockprio.WithCallTimeout(500 * time.Millisecond)}},
		{"call timeout under 5ms", one, []redlockprio.Option{redlockprio.WithCallTimeout(time.Millisecond)}},
		{"call timeout 0", one, []redlockprio.Option{redlockprio.WithCallTimeout(0)}},
	} {
		if lc, err := redlockprio.New(c.ms, c.opts...); !errors.Is(err, locks.ErrInvalidOption) {
			if err == nil {
				_ = lc.Close(context.Background())
			}
			t.Errorf("%s: New = %v, want ErrInvalidOption", c.what, err)
		} else {
			t.Logf("%s: %v", c.what, err)
		}
	}
	for _, c := range []struct {
		what string
		ms   []redis.UniversalClient
		opts []redlockprio.Option
	}{
		{"two masters with WithTwoMasters", two, []redlockprio.Option{redlockprio.WithTwoMasters()}},
		{"TTL 20ms", one, []redlockprio.Option{redlockprio.WithTTL(20 * time.Millisecond)}},
		{"call timeout (TTL − drift)/2", one, []redlockprio.Option{redlockprio.WithTTL(time.Second), redlockprio.WithCallTimeout(489 * time.Millisecond)}},
	} {
		lc, err := redlockprio.New(c.ms, c.opts...)
		if err != nil {
			t.Errorf("%s: New = %v, want it accepted", c.what, err)
			continue
		}
		_ = lc.Close(context.Background())
	}
}
