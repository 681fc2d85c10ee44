package tests

import (
	"context"
	"database/sql"
	"errors"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/latchkey-go/latchkey/contracttest/cmdtest"
	"github.com/latchkey-go/latchkey/contracttest/testenv"
	"github.com/latchkey-go/latchkey/fence"
	"github.com/latchkey-go/latchkey/fence/sqlfence"
)

// TestFencedWriteScript runs the shell example fence/examples/psql under
// redlockrun against the real PostgreSQL: each holder's write lands with
// the token redlockrun gave it; a write with an older holder's token is
// refused (exit 5) and changes nothing; token 0 (amqpsem acquire's) is
// refused (exit 65); and the script and Go's sqlfence guard share the
// fence: a Go write with the older token is refused too.
func TestFencedWriteScript(t *testing.T) {
	if _, err := exec.LookPath("psql"); err != nil {
		t.Skip("psql is not on the PATH")
	}
	db := postgres.open(t.Context(), t)
	script, err := filepath.Abs("../examples/psql/fenced-write.sh")
	if err != nil {
		t.Fatal(err)
	}
	redlockrun := cmdtest.Build(t, "../../redlockprio/cmd/redlockrun")
	addr := testenv.StartRedis(t, 1)[0].Addr()
	name := cmdtest.UniqueName("fenced-write-")
	key := name + "-data"
	pg := "DATABASE_URL=" + postgres.dsn
	t.Cleanup(func() {
		ctx := context.Background()
		_, _ = db.ExecContext(ctx, `DELETE FROM fenced_example WHERE key = $1`, key)
		_, _ = db.ExecContext(ctx, `DELETE FROM latchkey_fence WHERE name = $1`, []byte(name))
	})

	// run runs the script under redlockrun and returns the token it wrote
	// with.
	run := func(value string) uint64 {
		t.Helper()
		out, code := cmdtest.RunEnv(t, redlockrun, []string{pg}, "-addrs", addr, "-ttl", "2s", name, "--", script, key, value)
		if code != 0 {
			t.Fatalf("redlockrun ... fenced-write.sh %s: exit %d:\n%s", value, code, out)
		}
		_, rest, ok := strings.Cut(out, "with token ")
		token, err := strconv.ParseUint(strings.TrimSpace(strings.SplitN(rest, "\n", 2)[0]), 10, 64)
		if !ok || err != nil {
			t.Fatalf("fenced-write.sh did not say its token: %q", out)
		}
		return token
	}
	// direct runs the script with a token of the caller's.
	direct := func(token, value string) (string, int) {
		return cmdtest.RunEnv(t, "/bin/sh", []string{pg, "LOCK_NAME=" + name, "LOCK_TOKEN=" + token}, script, key, value)
	}
	expect := func(value string, token uint64, why string) {
		t.Helper()
		var v string
		var tok uint64
		err := db.QueryRowContext(t.Context(), `SELECT value, token FROM fenced_example WHERE key = $1`, key).Scan(&v, &tok)
		if err != nil {
			t.Fatalf("reading %s: %v", key, err)
		}
		if v != value || tok != token {
			t.Errorf("%s holds %q (token %d) %s, want %q (token %d)", key, v, tok, why, value, token)
		}
	}

	first := run("first")
	expect("first", first, "after the first holder's write")
	second := run("second")
	if second <= first {
		t.Fatalf("redlockrun gave token %d after %d", second, first)
	}
	expect("second", second, "after the second holder's write")

	out, code := direct(strconv.FormatUint(first, 10), "stale")
	if code != 5 || !strings.Contains(out, "is stale") {
		t.Errorf("the first holder's token after the second wrote: exit %d, %q; want exit 5, stale", code, out)
	}
	expect("second", second, "after a write with the first holder's token")

	out, code = direct("0", "zero")
	if code != 65 {
		t.Errorf("token 0: exit %d, %q; want 65", code, out)
	}
	out, code = direct("x1", "bad")
	if code != 64 {
		t.Errorf("token x1: exit %d, %q; want 64", code, out)
	}
	expect("second", second, "after refused writes")

	// Go's guard on the same fence table refuses the first token too, and
	// takes the second.
	guard, err := sqlfence.New(sqlfence.Postgres)
	if err != nil {
		t.Fatal(err)
	}
	write := func(token uint64) error {
		return guard.Do(t.Context(), db, fence.Token(name, token), func(tx *sql.Tx) error {
			_, err := tx.ExecContext(t.Context(), `UPDATE fenced_example SET value = 'go' WHERE key = $1`, key)
			return err
		})
	}
	if err := write(first); !errors.Is(err, fence.ErrStale) {
		t.Errorf("sqlfence with the first holder's token after the script wrote with the second's: %v, want ErrStale", err)
	}
	if err := write(second); err != nil {
		t.Errorf("sqlfence with the newest token: %v", err)
	}
}
