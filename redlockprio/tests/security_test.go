package redlockprio_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/latchkey-go/latchkey/contracttest/testenv"
	"github.com/latchkey-go/latchkey/locks"
	"github.com/latchkey-go/latchkey/redlockprio"
)

// TestTLSAndACLUser runs locks, contention and a theft over TLS as an ACL
// user limited to the library's keys and channels, on three masters; a
// wrong password fails without the password in the error.
func TestTLSAndACLUser(t *testing.T) {
	const user, password = "locker", "s3cret-Pw-4-test"
	certs := testenv.NewTLS(t)
	servers := testenv.StartRedisWith(t, 3, testenv.RedisConfig{
		TLS:  certs,
		Args: []string{"--user", user, "on", ">" + password, "~latchkey:*", "&latchkey:*", "+@all"},
	})
	newLocker := func(pw string, opts ...redlockprio.Option) *redlockprio.Locker {
		var ms []redis.UniversalClient
		for _, s := range servers {
			rc := redis.NewClient(&redis.Options{
				Addr: s.TLSAddr(), TLSConfig: certs.Client.Clone(),
				Username: user, Password: pw,
				ContextTimeoutEnabled: true, MaxRetries: -1,
			})
			t.Cleanup(func() { _ = rc.Close() })
			ms = append(ms, rc)
		}
		lc, err := redlockprio.New(ms, append([]redlockprio.Option{redlockprio.WithTTL(testTTL), redlockprio.WithRenewInterval(testRenew)}, opts...)...)
		if err != nil {
			t.Fatal(err)
		}
		l := lc.Locker()
		t.Cleanup(func() { _ = lc.Close(context.Background()) })
		return l
	}
	ctx := ctxFor(t, 10*time.Second)
	name := uniqueName(t)

	a, b := newLocker(password), newLocker(password, redlockprio.WithPriority(5))
	lease, err := a.Lock(ctx, name)
	if err != nil {
		t.Fatalf("Lock over TLS as %s: %v", user, err)
	}
	if lease.Token() == 0 {
		t.Errorf("no fencing token over TLS")
	}
	stolen, err := b.Lock(ctx, name) // a higher priority: a theft, notified over pub/sub
	if err != nil {
		t.Fatalf("theft over TLS: %v", err)
	}
	if !errors.Is(context.Cause(lease.Context()), locks.ErrPreempted) {
		t.Errorf("the victim's lease ended with %v, want ErrPreempted", context.Cause(lease.Context()))
	}
	if err := stolen.Release(ctx); err != nil {
		t.Fatalf("Release over TLS: %v", err)
	}

	_, err = newLocker("wrong-"+password).TryLock(ctx, name)
	if err == nil {
		t.Fatal("TryLock with a wrong password succeeded")
	}
	if strings.Contains(err.Error(), password) {
		t.Errorf("the error shows the password: %v", err)
	}
	t.Logf("wrong password: %v", err)
}

// TestWrongTypeAtKey: a lock's key that a stranger set to another type
// gives a clear error naming the masters, never a grant nor a panic.
func TestWrongTypeAtKey(t *testing.T) {
	addrs := addrsOf(testenv.StartRedis(t, 3))
	c := mustClient(t, addrs)
	name := uniqueName(t)
	ctx := ctxFor(t, 10*time.Second)
	for _, a := range addrs {
		rc := newRedis(a)
		if err := rc.Set(ctx, "latchkey:{"+name+"}:1", "not a lock", 0).Err(); err != nil {
			t.Fatal(err)
		}
		_ = rc.Close()
	}
	lease, err := c.l.TryLock(ctx, name)
	if err == nil {
		_ = lease.Release(ctx)
		t.Fatal("TryLock over keys of the wrong type succeeded")
	}
	var qe *redlockprio.QuorumError
	if !errors.As(err, &qe) || !strings.Contains(err.Error(), "WRONGTYPE") {
		t.Errorf("TryLock over keys of the wrong type: %v; want a QuorumError with WRONGTYPE", err)
	}
	t.Logf("wrong type: %v", err)
}
