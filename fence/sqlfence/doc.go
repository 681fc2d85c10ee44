// Package sqlfence makes a SQL database refuse writes with stale fencing
// tokens, through database/sql: PostgreSQL ([Postgres]) and MySQL or
// MariaDB with InnoDB ([MySQL]). Bring your own driver (pgx's stdlib,
// lib/pq, go-sql-driver/mysql); this package imports none.
//
// A [Guard] keeps a fence table with one row per lease name: the largest
// token that has written under it. [Guard.Do] runs your write in a
// transaction that first raises the name's row to the lease's token, if
// not lower, and then commits both together:
//
//	guard, err := sqlfence.New(sqlfence.Postgres)
//	...
//	err = guard.Do(ctx, db, lease, func(tx *sql.Tx) error {
//		_, err := tx.ExecContext(ctx, `UPDATE jobs SET state = $1 WHERE id = $2`, "done", id)
//		return err
//	})
//	if errors.Is(err, fence.ErrStale) {
//		// a later holder of the lease's name has written: nothing changed
//	}
//
// # Why it is race-free
//
// The raise is one statement that locks the name's row until the
// transaction ends: on PostgreSQL an INSERT ... ON CONFLICT DO UPDATE
// ... WHERE row.token <= new token RETURNING (no row back: stale); on
// InnoDB an INSERT ... ON DUPLICATE KEY UPDATE token = GREATEST(...)
// followed by a locking read of the row in the same transaction. Both
// act on the latest committed row, not the transaction's snapshot, so
// they hold at the default isolation (READ COMMITTED, REPEATABLE READ)
// and above. A second writer of the name waits for the first's commit or
// rollback, then sees its token: an older holder either committed before
// the newer one raised the row, or is refused. A write whose function
// fails rolls the raise back with it.
//
// # Migration
//
// [Guard.EnsureSchema] creates the table if it is missing. To manage it
// with your migrations instead, apply [Guard.Schema]; with the default
// table name it is, on PostgreSQL:
//
//	CREATE TABLE IF NOT EXISTS latchkey_fence (
//		name BYTEA PRIMARY KEY,
//		token BIGINT NOT NULL
//	)
//
// and on MySQL or MariaDB:
//
//	CREATE TABLE IF NOT EXISTS latchkey_fence (
//		name VARBINARY(255) NOT NULL PRIMARY KEY,
//		token BIGINT NOT NULL
//	) ENGINE=InnoDB
//
// Names are stored as bytes (byte-exact, any encoding); MySQL holds names
// up to [MaxNameLen] bytes. Tokens are BIGINT: a token above 2^63-1 is
// refused with [fence.ErrInvalid] (no backend makes one).
//
// # Cost
//
// A guarded write is the unguarded one plus one statement (two on
// InnoDB) in the same transaction, and the fence row's write at commit;
// the README gives the measured ratios.
package sqlfence
