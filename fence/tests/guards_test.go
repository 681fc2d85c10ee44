package tests

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/latchkey-go/latchkey/contracttest/testenv"
	"github.com/latchkey-go/latchkey/fence"
	"github.com/latchkey-go/latchkey/fence/natsfence"
	"github.com/latchkey-go/latchkey/fence/redisfence"
	"github.com/latchkey-go/latchkey/fence/sqlfence"
	"github.com/latchkey-go/latchkey/locks"
)

// uniqueName returns a lease name unique to the test and run.
func uniqueName(t testing.TB) string {
	return fmt.Sprintf("%s-%d", t.Name(), time.Now().UnixNano())
}

// expectStale checks that err matches fence.ErrStale and carries the
// name and both tokens.
func expectStale(t testing.TB, err error, name string, token, newest uint64) {
	t.Helper()
	if !errors.Is(err, fence.ErrStale) {
		t.Fatalf("got %v, want an error matching fence.ErrStale", err)
	}
	var se *fence.StaleError
	if !errors.As(err, &se) {
		t.Fatalf("%v is not a *fence.StaleError", err)
	}
	if se.Name != name || se.Token != token || se.Newest != newest {
		t.Errorf("StaleError{%q, %d, %d}, want {%q, %d, %d}", se.Name, se.Token, se.Newest, name, token, newest)
	}
}

// TestSQLGuard: on each database, a stale write is refused with the
// details and changes nothing, fn's error rolls the fence back too, and
// bad input fails before any I/O.
func TestSQLGuard(t *testing.T) {
	for _, d := range []sqlDB{postgres, mariadb} {
		t.Run(d.dialect.String(), func(t *testing.T) {
			ctx := t.Context()
			db := d.open(ctx, t)
			defer db.Close()
			g, err := sqlfence.New(d.dialect, sqlfence.WithTable(checkTable))
			if err != nil {
				t.Fatal(err)
			}
			if err := g.EnsureSchema(ctx, db); err != nil {
				t.Fatal(err)
			}
			if err := g.EnsureSchema(ctx, db); err != nil {
				t.Fatalf("EnsureSchema a second time: %v", err)
			}
			name := uniqueName(t)
			ran := 0
			count := func(*sql.Tx) error { ran++; return nil }
			if err := g.Do(ctx, db, fence.Token(name, 5), count); err != nil {
				t.Fatal(err)
			}
			boom := errors.New("boom")
			if err := g.Do(ctx, db, fence.Token(name, 9), func(*sql.Tx) error { return boom }); !errors.Is(err, boom) {
				t.Fatalf("a failing fn: got %v, want its error", err)
			}
			if n, err := g.Newest(ctx, db, name); err != nil || n != 5 {
				t.Fatalf("after a failing fn with token 9, the fence is %d (%v), want 5: the raise must roll back", n, err)
			}
			if err := g.Do(ctx, db, fence.Token(name, 7), count); err != nil {
				t.Fatal(err)
			}
			expectStale(t, g.Do(ctx, db, fence.Token(name, 6), count), name, 6, 7)
			if ran != 2 {
				t.Errorf("fn ran %d times, want 2 (never for a stale lease)", ran)
			}
			if n, _ := g.Newest(ctx, db, name); n != 7 {
				t.Errorf("the fence is %d after a stale write, want 7", n)
			}
			if err := g.Do(ctx, db, fence.Token("other-"+name, 1), count); err != nil {
				t.Errorf("another name with a smaller token: %v", err)
			}

			for _, tc := range []struct {
				what string
				err  error
				want error
			}{
				{"nil db", g.Do(ctx, nil, fence.Token(name, 8), count), fence.ErrInvalid},
				{"nil fn", g.Do(ctx, db, fence.Token(name, 8), nil), fence.ErrInvalid},
				{"nil lease", g.Do(ctx, db, nil, count), fence.ErrInvalid},
				{"empty name", g.Do(ctx, db, fence.Token("", 8), count), locks.ErrInvalidName},
				{"token 0", g.Do(ctx, db, fence.Token(name, 0), count), fence.ErrNoToken},
				{"token above int64", g.Do(ctx, db, fence.Token(name, 1<<63), count), fence.ErrInvalid},
				{"nil tx", g.Admit(ctx, nil, fence.Token(name, 8)), fence.ErrInvalid},
			} {
				if !errors.Is(tc.err, tc.want) {
					t.Errorf("%s: got %v, want %v", tc.what, tc.err, tc.want)
				}
			}
			if ran != 3 {
				t.Errorf("fn ran %d times, want 3: bad input must not run it", ran)
			}
		})
	}
	if _, err := sqlfence.New(sqlfence.Postgres, sqlfence.WithTable("x; DROP TABLE y")); !errors.Is(err, fence.ErrInvalid) {
		t.Errorf("an unsafe table name: got %v, want fence.ErrInvalid", err)
	}
	if _, err := sqlfence.New(0); !errors.Is(err, fence.ErrInvalid) {
		t.Errorf("no dialect: got %v, want fence.ErrInvalid", err)
	}
}

// TestRedisGuard: Set, HSet and a user's script are fenced; a stale one
// is refused with the details and writes nothing; tokens compare exactly
// beyond 2^53; bad input fails before any I/O.
func TestRedisGuard(t *testing.T) {
	ctx := t.Context()
	rc := redis.NewClient(&redis.Options{Addr: testenv.RedisAddr(t)})
	defer rc.Close()
	g, err := redisfence.New(rc)
	if err != nil {
		t.Fatal(err)
	}
	name := uniqueName(t)
	key := "data-" + name
	big := uint64(1)<<53 + 1
	if err := g.Set(ctx, fence.Token(name, big), key, "new"); err != nil {
		t.Fatal(err)
	}
	expectStale(t, g.Set(ctx, fence.Token(name, big-1), key, "old"), name, big-1, big)
	if v, _ := rc.Get(ctx, key).Result(); v != "new" {
		t.Errorf("%q holds %q after a stale Set, want %q", key, v, "new")
	}
	if err := g.HSet(ctx, fence.Token(name, big), key+"-h", "f", "1"); err != nil {
		t.Fatal(err)
	}
	incr := redisfence.NewScript(`return redis.call('INCRBY', KEYS[1], ARGV[1])`)
	if v, err := g.Run(ctx, fence.Token(name, big+1), incr, []string{key + "-n"}, 3); err != nil || v != int64(3) {
		t.Fatalf("a fenced script: got %v, %v, want 3", v, err)
	}
	_, err = g.Run(ctx, fence.Token(name, big), incr, []string{key + "-n"}, 3)
	expectStale(t, err, name, big, big+1)
	if n, err := g.Newest(ctx, name, key); err != nil || n != big+1 {
		t.Errorf("Newest = %d, %v, want %d", n, err, big+1)
	}
	if got, want := g.FenceKey(name, "{orders}:1"), redisfence.DefaultPrefix+"{orders}"+name; got != want {
		t.Errorf("FenceKey of a tagged key = %q, want %q", got, want)
	}
	for _, tc := range []struct {
		what string
		err  error
		want error
	}{
		{"token 0", g.Set(ctx, fence.Token(name, 0), key, "x"), fence.ErrNoToken},
		{"nil lease", g.Set(ctx, nil, key, "x"), fence.ErrInvalid},
		{"empty name", g.Set(ctx, fence.Token("", 1), key, "x"), locks.ErrInvalidName},
		{"odd HSet", g.HSet(ctx, fence.Token(name, big+1), key, "f"), fence.ErrInvalid},
	} {
		if !errors.Is(tc.err, tc.want) {
			t.Errorf("%s: got %v, want %v", tc.what, tc.err, tc.want)
		}
	}
	if _, err := redisfence.New(nil); !errors.Is(err, fence.ErrInvalid) {
		t.Errorf("nil client: got %v, want fence.ErrInvalid", err)
	}
	cc := redis.NewClusterClient(&redis.ClusterOptions{Addrs: []string{"127.0.0.1:1"}})
	defer cc.Close()
	cg, _ := redisfence.New(cc)
	if err := cg.Set(ctx, fence.Token(name, 1), "untagged", "x"); !errors.Is(err, fence.ErrInvalid) {
		t.Errorf("an untagged key on a Cluster: got %v, want fence.ErrInvalid before any I/O", err)
	}
}

// TestNATSGuard: Put, Update and Delete are fenced; a guarded delete
// keeps the token, so a stale Put cannot bring the key back; Update keeps
// its compare-and-set; another name's lease is refused.
func TestNATSGuard(t *testing.T) {
	ctx := t.Context()
	url := natsURL(t)
	kv := natsKV(t, url)
	g, err := natsfence.New(kv)
	if err != nil {
		t.Fatal(err)
	}
	name := "n1"
	if _, err := g.Put(ctx, fence.Token(name, 3), "k", []byte("v3")); err != nil {
		t.Fatal(err)
	}
	_, err = g.Put(ctx, fence.Token(name, 2), "k", []byte("v2"))
	expectStale(t, err, name, 2, 3)
	e, err := g.Get(ctx, "k")
	if err != nil || string(e.Value) != "v3" || e.Token != 3 || e.Name != name {
		t.Fatalf("Get = %+v, %v, want v3 by token 3 of %q", e, err, name)
	}
	if _, err := g.Update(ctx, fence.Token(name, 4), "k", []byte("v4"), e.Revision+100); err == nil {
		t.Errorf("Update with a wrong revision succeeded")
	}
	if _, err := g.Update(ctx, fence.Token(name, 4), "k", []byte("v4"), e.Revision); err != nil {
		t.Fatalf("Update with the right revision: %v", err)
	}
	if err := g.Delete(ctx, fence.Token(name, 5), "k"); err != nil {
		t.Fatal(err)
	}
	if _, err := g.Get(ctx, "k"); err == nil {
		t.Errorf("Get after a guarded Delete found the key")
	}
	_, err = g.Put(ctx, fence.Token(name, 4), "k", []byte("zombie"))
	expectStale(t, err, name, 4, 5)
	if _, err := g.Put(ctx, fence.Token("n2", 9), "k", []byte("x")); !errors.Is(err, natsfence.ErrOtherName) {
		t.Errorf("another name's lease: got %v, want natsfence.ErrOtherName", err)
	}
	if _, err := g.Put(ctx, fence.Token(name, 0), "k", nil); !errors.Is(err, fence.ErrNoToken) {
		t.Errorf("token 0: got %v, want fence.ErrNoToken", err)
	}
	if _, err := natsfence.New(nil); !errors.Is(err, fence.ErrInvalid) {
		t.Errorf("nil bucket: got %v, want fence.ErrInvalid", err)
	}
}

// TestMemoryGuard: the in-process guard refuses a stale lease and does
// not raise on fn's error.
func TestMemoryGuard(t *testing.T) {
	m := fence.NewMemory()
	ctx := context.Background()
	if err := m.Do(ctx, fence.Token("n", 2), func() error { return nil }); err != nil {
		t.Fatal(err)
	}
	_ = m.Do(ctx, fence.Token("n", 5), func() error { return errors.New("boom") })
	expectStale(t, m.Do(ctx, fence.Token("n", 1), func() error { return nil }), "n", 1, 2)
	if m.Newest("n") != 2 {
		t.Errorf("Newest = %d, want 2", m.Newest("n"))
	}
}
