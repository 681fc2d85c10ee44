package tests

import (
	"context"
	"database/sql"
	"fmt"
	"testing"

	"github.com/latchkey-go/latchkey/contracttest"
	"github.com/latchkey-go/latchkey/fence"
	"github.com/latchkey-go/latchkey/fence/sqlfence"
)

// Two SQL guards broken on purpose, each of which the fencing checks must
// catch on the real databases: the checks can fail.

// checksWithoutRaising reads the name's fence in the transaction and
// refuses a smaller token, but never raises the fence: a later holder's
// writes leave no trace, so an earlier holder's late write passes.
func checksWithoutRaising(s *sqlStore) func(context.Context, fence.Lease, func(*sql.Tx) error) error {
	return func(ctx context.Context, lease fence.Lease, fn func(*sql.Tx) error) error {
		tx, err := s.db.BeginTx(ctx, nil)
		if err != nil {
			return err
		}
		defer func() { _ = tx.Rollback() }()
		var newest uint64
		q := `SELECT COALESCE(MAX(token), 0) FROM ` + checkTable + ` WHERE name = ` + s.placeholder()
		if err := tx.QueryRowContext(ctx, q, []byte(lease.Name())).Scan(&newest); err != nil {
			return err
		}
		if lease.Token() < newest {
			return &fence.StaleError{Name: lease.Name(), Token: lease.Token(), Newest: newest}
		}
		if err := fn(tx); err != nil {
			return err
		}
		return tx.Commit()
	}
}

// raisesOutsideTransaction raises the fence in a statement of its own,
// committed at once, then runs the write in a transaction of its own: a
// stale holder that raised first and writes last overwrites its
// successor.
func raisesOutsideTransaction(s *sqlStore) func(context.Context, fence.Lease, func(*sql.Tx) error) error {
	return func(ctx context.Context, lease fence.Lease, fn func(*sql.Tx) error) error {
		raise := fmt.Sprintf(`INSERT INTO %s (name, token) VALUES ($1, $2) ON CONFLICT (name) DO UPDATE SET token = GREATEST(%[1]s.token, EXCLUDED.token)`, checkTable)
		if s.d.dialect == sqlfence.MySQL {
			raise = `INSERT INTO ` + checkTable + ` (name, token) VALUES (?, ?) ON DUPLICATE KEY UPDATE token = GREATEST(token, VALUES(token))`
		}
		if _, err := s.db.ExecContext(ctx, raise, []byte(lease.Name()), int64(lease.Token())); err != nil {
			return err
		}
		newest, err := s.guard.Newest(ctx, s.db, lease.Name())
		if err != nil {
			return err
		}
		if lease.Token() < newest {
			return &fence.StaleError{Name: lease.Name(), Token: lease.Token(), Newest: newest}
		}
		tx, err := s.db.BeginTx(ctx, nil)
		if err != nil {
			return err
		}
		defer func() { _ = tx.Rollback() }()
		if err := fn(tx); err != nil {
			return err
		}
		return tx.Commit()
	}
}

func (s *sqlStore) placeholder() string {
	if s.d.dialect == sqlfence.Postgres {
		return "$1"
	}
	return "?"
}

func TestFencingCatchesDefectiveGuards(t *testing.T) {
	for _, d := range []sqlDB{postgres, mariadb} {
		t.Run(d.dialect.String(), func(t *testing.T) {
			t.Run("checks without raising", func(t *testing.T) {
				contracttest.MustCatchStale(t, newMemHarness, newSQLStore(d, checksWithoutRaising), "StaleHolderRefused")
			})
			t.Run("raises outside the transaction", func(t *testing.T) {
				contracttest.MustCatchStale(t, newMemHarness, newSQLStore(d, raisesOutsideTransaction), "FirstWritesRace")
			})
		})
	}
}
