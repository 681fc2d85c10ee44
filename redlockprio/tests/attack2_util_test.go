package redlockprio_test

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/latchkey-go/latchkey/contracttest/testenv"
	"github.com/latchkey-go/latchkey/redlockprio"
)

// atk2Locker is a Locker whose link to each master goes through its own
// proxy. retries selects go-redis's default MaxRetries (3 retries) instead
// of the tests' MaxRetries: -1.
type atk2Locker struct {
	c       *redlockprio.Client
	l       *redlockprio.Locker // c's
	rcs     []*redis.Client
	proxies []*testenv.Proxy
}

func newAtk2Locker(t testing.TB, addrs []string, retries bool, opts ...redlockprio.Option) *atk2Locker {
	t.Helper()
	a := &atk2Locker{}
	var ms []redis.UniversalClient
	for _, addr := range addrs {
		px := testenv.NewProxy(t, addr)
		a.proxies = append(a.proxies, px)
		o := clientOptions(px.Addr()).Simple()
		if retries {
			o.MaxRetries = 0 // go-redis default: 3 retries
		}
		rc := redis.NewClient(o)
		a.rcs = append(a.rcs, rc)
		ms = append(ms, rc)
	}
	c, err := redlockprio.New(ms, opts...)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	a.c, a.l = c, c.Locker()
	t.Cleanup(func() {
		_ = c.Close(context.Background())
		for _, rc := range a.rcs {
			_ = rc.Close()
		}
	})
	return a
}

// bumpFence raises name's fence counter on the master at addr by d; errors
// (a master restarting) are ignored.
func bumpFence(addr, name string, d int64) {
	rc := newRedis(addr)
	defer rc.Close()
	_ = rc.IncrBy(context.Background(), "latchkey:{"+name+"}:fence", d).Err()
}

// slotKeys returns the name's slot keys (1..n) present on the master at addr.
func slotKeys(t testing.TB, addr, name string, n int) []string {
	t.Helper()
	rc := newRedis(addr)
	defer rc.Close()
	var got []string
	for s := 1; s <= n; s++ {
		k := "latchkey:{" + name + "}:" + strconv.Itoa(s)
		id, _ := rc.HGet(context.Background(), k, "id").Result()
		if id != "" {
			got = append(got, k+"="+id)
		}
	}
	return got
}

var _ = time.Second

// snap copies s under c's lock (its context-end time is written by another
// goroutine).
func (c *atkClock) snap(s *atkSection) atkSection {
	c.mu.Lock()
	defer c.mu.Unlock()
	return *s
}
