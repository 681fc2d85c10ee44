package sqlfence

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"regexp"

	"github.com/latchkey-go/latchkey/fence"
)

// Dialect is the SQL dialect of a database: [Postgres] or [MySQL].
type Dialect int

const (
	// Postgres is PostgreSQL (9.5 or later: INSERT ... ON CONFLICT).
	Postgres Dialect = iota + 1
	// MySQL is MySQL or MariaDB with InnoDB tables.
	MySQL
)

// String returns the dialect's name: "postgres" or "mysql".
func (d Dialect) String() string {
	switch d {
	case Postgres:
		return "postgres"
	case MySQL:
		return "mysql"
	}
	return fmt.Sprintf("Dialect(%d)", int(d))
}

// DefaultTable is the fence table's name unless [WithTable] says otherwise.
const DefaultTable = "latchkey_fence"

// MaxNameLen is the longest lease name, in bytes, the MySQL fence table
// holds (a VARBINARY(255) key). PostgreSQL takes any length.
const MaxNameLen = 255

// Option configures a [Guard].
type Option func(*Guard) error

var identifier = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]{0,62}$`)

// WithTable names the fence table: letters, digits and underscores, up to
// 63 bytes, not starting with a digit (it is written into the SQL as is).
// The default is [DefaultTable].
func WithTable(name string) Option {
	return func(g *Guard) error {
		if !identifier.MatchString(name) {
			return fmt.Errorf("sqlfence: %w: table name %q: want letters, digits and underscores, up to 63 bytes", fence.ErrInvalid, name)
		}
		g.table = name
		return nil
	}
}

// Guard makes a SQL database refuse writes with stale fencing tokens. It
// keeps one row per lease name in its fence table: the largest token that
// has written under that name. It holds no connection and is safe for
// concurrent use.
type Guard struct {
	dialect Dialect
	table   string
	raise   string // the conditional upsert
	newest  string // reads a name's token
}

// New returns a Guard for databases of dialect d. It makes no connection;
// call [Guard.EnsureSchema] or apply [Guard.Schema] as a migration before
// the first [Guard.Do].
func New(d Dialect, opts ...Option) (*Guard, error) {
	g := &Guard{dialect: d, table: DefaultTable}
	for _, opt := range opts {
		if opt == nil {
			return nil, fmt.Errorf("sqlfence: %w: nil option", fence.ErrInvalid)
		}
		if err := opt(g); err != nil {
			return nil, err
		}
	}
	switch d {
	case Postgres:
		// One statement raises the row or, when a larger token holds it,
		// returns nothing. Either way the row stays locked until the
		// transaction ends, so a concurrent writer of the name waits.
		g.raise = `INSERT INTO ` + g.table + ` AS f (name, token) VALUES ($1, $2)
ON CONFLICT (name) DO UPDATE SET token = EXCLUDED.token WHERE f.token <= EXCLUDED.token
RETURNING token`
		g.newest = `SELECT token FROM ` + g.table + ` WHERE name = $1`
	case MySQL:
		// InnoDB updates, and locking reads, see the latest committed
		// row, whatever the transaction's snapshot.
		g.raise = `INSERT INTO ` + g.table + ` (name, token) VALUES (?, ?)
ON DUPLICATE KEY UPDATE token = GREATEST(token, VALUES(token))`
		g.newest = `SELECT token FROM ` + g.table + ` WHERE name = ?`
	default:
		return nil, fmt.Errorf("sqlfence: %w: unknown dialect %v", fence.ErrInvalid, d)
	}
	return g, nil
}

// Schema returns the statement creating the fence table (IF NOT EXISTS),
// for a migration tool.
func (g *Guard) Schema() string {
	if g.dialect == MySQL {
		return `CREATE TABLE IF NOT EXISTS ` + g.table + ` (
	name VARBINARY(255) NOT NULL PRIMARY KEY,
	token BIGINT NOT NULL
) ENGINE=InnoDB`
	}
	return `CREATE TABLE IF NOT EXISTS ` + g.table + ` (
	name BYTEA PRIMARY KEY,
	token BIGINT NOT NULL
)`
}

// EnsureSchema creates the fence table if it does not exist.
func (g *Guard) EnsureSchema(ctx context.Context, db *sql.DB) error {
	if db == nil {
		return fmt.Errorf("sqlfence: %w: nil *sql.DB", fence.ErrInvalid)
	}
	if _, err := db.ExecContext(ctx, g.Schema()); err != nil {
		return fmt.Errorf("sqlfence: creating table %s: %w", g.table, err)
	}
	return nil
}

// Do runs fn in a transaction of db that first raises lease's name to
// lease's token, and commits it. If a larger token has written under the
// name, Do returns an error matching [fence.ErrStale] (a
// [*fence.StaleError]) and rolls back: nothing changes and fn does not
// run. The same token may write any number of times. If fn fails, Do
// rolls back and returns fn's error, and the fence is not raised either.
//
// Because the name's fence row stays locked from the raise to the commit,
// guarded writes of one name are serialised: a stale writer either
// commits before the newer one raises the row, or is refused. This holds
// at the databases' default isolation (READ COMMITTED on PostgreSQL,
// REPEATABLE READ on InnoDB) and above.
//
// A lease with token 0 gets [fence.ErrNoToken]; a nil db, lease or fn, or
// an empty name, [fence.ErrInvalid]; both before any I/O. When ctx ends,
// the transaction is rolled back and Do returns an error wrapping ctx's.
// Do is safe for concurrent use.
func (g *Guard) Do(ctx context.Context, db *sql.DB, lease fence.Lease, fn func(tx *sql.Tx) error) error {
	if db == nil {
		return fmt.Errorf("sqlfence: %w: nil *sql.DB", fence.ErrInvalid)
	}
	if fn == nil {
		return fmt.Errorf("sqlfence: %w: nil function", fence.ErrInvalid)
	}
	if _, _, err := g.check(lease); err != nil {
		return err
	}
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("sqlfence: %q: begin: %w", lease.Name(), err)
	}
	if err := g.Admit(ctx, tx, lease); err != nil {
		_ = tx.Rollback()
		return err
	}
	if err := fn(tx); err != nil {
		_ = tx.Rollback()
		return err
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("sqlfence: %q: commit: %w", lease.Name(), err)
	}
	return nil
}

// Admit raises lease's name to lease's token inside tx, the caller's own
// transaction, for callers that manage it themselves: the writes tx makes
// after Admit returns nil are fenced once tx commits. A stale lease gets
// an error matching [fence.ErrStale]; the caller must then roll tx back
// (Admit changed nothing, but tx may hold other writes). The row stays
// locked until tx ends: commit or roll back promptly.
func (g *Guard) Admit(ctx context.Context, tx *sql.Tx, lease fence.Lease) error {
	if tx == nil {
		return fmt.Errorf("sqlfence: %w: nil *sql.Tx", fence.ErrInvalid)
	}
	name, token, err := g.check(lease)
	if err != nil {
		return err
	}
	key := []byte(name)
	switch g.dialect {
	case Postgres:
		var got int64
		err := tx.QueryRowContext(ctx, g.raise, key, token).Scan(&got)
		if errors.Is(err, sql.ErrNoRows) {
			return g.stale(ctx, tx, name, token)
		}
		if err != nil {
			return fmt.Errorf("sqlfence: %q: raising the fence: %w", name, err)
		}
		return nil
	default:
		if _, err := tx.ExecContext(ctx, g.raise, key, token); err != nil {
			return fmt.Errorf("sqlfence: %q: raising the fence: %w", name, err)
		}
		newest, err := g.read(ctx, tx, name, " FOR UPDATE")
		if err != nil {
			return err
		}
		if newest > token {
			return fmt.Errorf("sqlfence: %w", &fence.StaleError{Name: name, Token: uint64(token), Newest: uint64(newest)})
		}
		return nil
	}
}

// Newest returns the largest token that has written under name, or 0 if
// none has.
func (g *Guard) Newest(ctx context.Context, db *sql.DB, name string) (uint64, error) {
	if db == nil {
		return 0, fmt.Errorf("sqlfence: %w: nil *sql.DB", fence.ErrInvalid)
	}
	var t int64
	err := db.QueryRowContext(ctx, g.newest, []byte(name)).Scan(&t)
	if errors.Is(err, sql.ErrNoRows) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("sqlfence: %q: reading the fence: %w", name, err)
	}
	return uint64(t), nil
}

func (g *Guard) check(lease fence.Lease) (string, int64, error) {
	name, token, err := fence.CheckInt64("sqlfence", lease)
	if err != nil {
		return "", 0, err
	}
	if g.dialect == MySQL && len(name) > MaxNameLen {
		return "", 0, fmt.Errorf("sqlfence: %w: lease name of %d bytes: the MySQL fence table holds up to %d", fence.ErrInvalid, len(name), MaxNameLen)
	}
	return name, token, nil
}

// stale reads the token that beat token, for the error.
func (g *Guard) stale(ctx context.Context, tx *sql.Tx, name string, token int64) error {
	newest, err := g.read(ctx, tx, name, "")
	if err != nil {
		return err
	}
	return fmt.Errorf("sqlfence: %w", &fence.StaleError{Name: name, Token: uint64(token), Newest: uint64(newest)})
}

func (g *Guard) read(ctx context.Context, tx *sql.Tx, name, suffix string) (int64, error) {
	var t int64
	if err := tx.QueryRowContext(ctx, g.newest+suffix, []byte(name)).Scan(&t); err != nil {
		return 0, fmt.Errorf("sqlfence: %q: reading the fence: %w", name, err)
	}
	return t, nil
}
