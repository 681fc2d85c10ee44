package tests

import (
	"context"
	"database/sql"
	"errors"
	"os"
	"testing"

	_ "github.com/go-sql-driver/mysql"
	_ "github.com/jackc/pgx/v5/stdlib"

	"github.com/latchkey-go/latchkey/contracttest"
	"github.com/latchkey-go/latchkey/fence"
	"github.com/latchkey-go/latchkey/fence/sqlfence"
	"github.com/latchkey-go/latchkey/locks"
)

// The databases of the tests: PostgreSQL and MariaDB on their standard
// local ports, or the addresses in LOCKS_POSTGRES_DSN and LOCKS_MYSQL_DSN.
const (
	postgresDSN = "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"
	mysqlDSN    = "root@tcp(127.0.0.1:3306)/test"
)

// sqlDB is one database the tests run on.
type sqlDB struct {
	dialect sqlfence.Dialect
	driver  string
	dsn     string
}

var (
	postgres = sqlDB{sqlfence.Postgres, "pgx", envOr("LOCKS_POSTGRES_DSN", postgresDSN)}
	mariadb  = sqlDB{sqlfence.MySQL, "mysql", envOr("LOCKS_MYSQL_DSN", mysqlDSN)}
)

func envOr(key, def string) string {
	if v := os.Getenv(key); v != "" {
		return v
	}
	return def
}

// open connects to d, skipping the test when the database does not
// answer (failing it under CI). The connection pool is closed at the
// test's end.
func (d sqlDB) open(ctx context.Context, t testing.TB) *sql.DB {
	t.Helper()
	db, err := sql.Open(d.driver, d.dsn)
	if err != nil {
		t.Fatalf("sql.Open(%s): %v", d.driver, err)
	}
	if err := db.PingContext(ctx); err != nil {
		_ = db.Close()
		if os.Getenv("CI") != "" {
			t.Fatalf("%v at %s does not answer (CI is set): %v", d.dialect, d.dsn, err)
		}
		t.Skipf("%v at %s does not answer: %v", d.dialect, d.dsn, err)
	}
	return db
}

// checkTable and checkData are the fencing checks' fence and data tables.
const (
	checkTable = "latchkey_fence_check"
	checkData  = "latchkey_fence_check_data"
)

// sqlStore is a contracttest.GuardedStore on a database table behind a
// sqlfence.Guard (or a defective stand-in, through admit).
type sqlStore struct {
	d     sqlDB
	db    *sql.DB
	guard *sqlfence.Guard
	// do runs a guarded write: guard.Do, or a defective guard's.
	do func(ctx context.Context, lease fence.Lease, fn func(*sql.Tx) error) error
}

// newSQLStore returns a NewGuardedStore on d through the real guard, or
// through defect when not nil.
func newSQLStore(d sqlDB, defect func(s *sqlStore) func(context.Context, fence.Lease, func(*sql.Tx) error) error) contracttest.NewGuardedStore {
	return func(ctx context.Context, t testing.TB) (contracttest.GuardedStore, error) {
		s := &sqlStore{d: d, db: d.open(ctx, t)}
		g, err := sqlfence.New(d.dialect, sqlfence.WithTable(checkTable))
		if err != nil {
			return nil, errors.Join(err, s.db.Close())
		}
		s.guard = g
		if err := g.EnsureSchema(ctx, s.db); err != nil {
			return nil, errors.Join(err, s.db.Close())
		}
		ddl := `CREATE TABLE IF NOT EXISTS ` + checkData + ` (k VARCHAR(200) PRIMARY KEY, v TEXT NOT NULL)`
		if _, err := s.db.ExecContext(ctx, ddl); err != nil {
			return nil, errors.Join(err, s.db.Close())
		}
		s.do = func(ctx context.Context, lease fence.Lease, fn func(*sql.Tx) error) error {
			return g.Do(ctx, s.db, lease, fn)
		}
		if defect != nil {
			s.do = defect(s)
		}
		return s, nil
	}
}

func (s *sqlStore) upsert() string {
	if s.d.dialect == sqlfence.Postgres {
		return `INSERT INTO ` + checkData + ` (k, v) VALUES ($1, $2) ON CONFLICT (k) DO UPDATE SET v = EXCLUDED.v`
	}
	return `INSERT INTO ` + checkData + ` (k, v) VALUES (?, ?) ON DUPLICATE KEY UPDATE v = VALUES(v)`
}

func (s *sqlStore) Write(ctx context.Context, lease locks.Lease, key, value string, inside func()) error {
	return s.do(ctx, lease, func(tx *sql.Tx) error {
		if inside != nil {
			inside()
		}
		_, err := tx.ExecContext(ctx, s.upsert(), key, value)
		return err
	})
}

func (s *sqlStore) Read(ctx context.Context, key string) (string, error) {
	q := `SELECT v FROM ` + checkData + ` WHERE k = ?`
	if s.d.dialect == sqlfence.Postgres {
		q = `SELECT v FROM ` + checkData + ` WHERE k = $1`
	}
	var v string
	err := s.db.QueryRowContext(ctx, q, key).Scan(&v)
	if errors.Is(err, sql.ErrNoRows) {
		return "", nil
	}
	return v, err
}

func (s *sqlStore) IsStale(err error) bool { return errors.Is(err, fence.ErrStale) }
func (s *sqlStore) Close() error           { return s.db.Close() }
