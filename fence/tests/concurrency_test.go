package tests

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"testing"

	"github.com/latchkey-go/latchkey/fence"
	"github.com/latchkey-go/latchkey/fence/natsfence"
	"github.com/latchkey-go/latchkey/fence/sqlfence"
)

// TestSQLGuardConcurrentWriters: writers with tokens 1..n of one name
// write at once, several rounds, on a fresh name each round (first writes
// race on the row's insert): each gets nil or the stale error (never a
// deadlock or another failure), the largest token always succeeds, and
// its value is what stays.
func TestSQLGuardConcurrentWriters(t *testing.T) {
	const writers, rounds = 8, 5
	for _, d := range []sqlDB{postgres, mariadb} {
		t.Run(d.dialect.String(), func(t *testing.T) {
			ctx := t.Context()
			db := d.open(ctx, t)
			defer db.Close()
			db.SetMaxOpenConns(writers + 1)
			st, err := newSQLStore(d, nil)(ctx, t)
			if err != nil {
				t.Fatal(err)
			}
			s := st.(*sqlStore)
			g, _ := sqlfence.New(d.dialect, sqlfence.WithTable(checkTable))
			for r := range rounds {
				name := fmt.Sprintf("%s-%d", uniqueName(t), r)
				errs := make([]error, writers+1)
				var wg sync.WaitGroup
				for tok := 1; tok <= writers; tok++ {
					wg.Go(func() {
						errs[tok] = g.Do(ctx, db, fence.Token(name, uint64(tok)), func(tx *sql.Tx) error {
							_, err := tx.ExecContext(ctx, s.upsert(), name, strconv.Itoa(tok))
							return err
						})
					})
				}
				wg.Wait()
				for tok := 1; tok <= writers; tok++ {
					if errs[tok] != nil && !errors.Is(errs[tok], fence.ErrStale) {
						t.Errorf("round %d: token %d failed with %v, want nil or fence.ErrStale", r, tok, errs[tok])
					}
				}
				if errs[writers] != nil {
					t.Errorf("round %d: the largest token %d failed: %v", r, writers, errs[writers])
				}
				got, err := s.Read(context.Background(), name)
				if err != nil {
					t.Fatal(err)
				}
				if got != strconv.Itoa(writers) {
					t.Errorf("round %d: %q holds %q, want the largest token's %d", r, name, got, writers)
				}
			}
			_ = s.Close()
		})
	}
}

// TestNATSGuardConcurrentWriters: as TestSQLGuardConcurrentWriters, on a
// KV key: compare-and-set conflicts are retried, never reported.
func TestNATSGuardConcurrentWriters(t *testing.T) {
	const writers, rounds = 8, 5
	kv := natsKV(t, natsURL(t))
	g, err := natsfence.New(kv)
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	for r := range rounds {
		key := fmt.Sprintf("k%d", r)
		errs := make([]error, writers+1)
		var wg sync.WaitGroup
		for tok := 1; tok <= writers; tok++ {
			wg.Go(func() {
				_, errs[tok] = g.Put(ctx, fence.Token("n", uint64(tok)), key, []byte(strconv.Itoa(tok)))
			})
		}
		wg.Wait()
		for tok := 1; tok <= writers; tok++ {
			if errs[tok] != nil && !errors.Is(errs[tok], fence.ErrStale) {
				t.Errorf("round %d: token %d failed with %v, want nil or fence.ErrStale", r, tok, errs[tok])
			}
		}
		if errs[writers] != nil {
			t.Errorf("round %d: the largest token %d failed: %v", r, writers, errs[writers])
		}
		e, err := g.Get(ctx, key)
		if err != nil || string(e.Value) != strconv.Itoa(writers) {
			t.Errorf("round %d: %q holds %q (%v), want the largest token's %d", r, key, e.Value, err, writers)
		}
	}
}
