package sqlfence_test

import (
	"context"
	"database/sql"
	"errors"
	"log"

	"github.com/latchkey-go/latchkey/fence"
	"github.com/latchkey-go/latchkey/fence/sqlfence"
	"github.com/latchkey-go/latchkey/locks"
)

// Guard a write with the lease of a lock: a holder that lost the lock
// before it wrote is refused, and nothing it did in the transaction
// stays. db is opened with any driver (pgx's stdlib: sql.Open("pgx", dsn)).
func ExampleGuard_Do() {
	ctx := context.Background()
	var db *sql.DB          // sql.Open("pgx", "postgres://...")
	var locker locks.Locker // any backend with tokens: natsputex, redlockprio
	if db == nil || locker == nil {
		return // this example needs a database and a lock service
	}
	guard, err := sqlfence.New(sqlfence.Postgres)
	if err != nil {
		log.Fatal(err)
	}
	if err := guard.EnsureSchema(ctx, db); err != nil {
		log.Fatal(err)
	}
	lease, err := locker.Lock(ctx, "invoice-42")
	if err != nil {
		log.Fatal(err)
	}
	defer lease.Release(ctx)
	err = guard.Do(lease.Context(), db, lease, func(tx *sql.Tx) error {
		_, err := tx.ExecContext(ctx, `UPDATE invoices SET state = 'paid' WHERE id = 42`)
		return err
	})
	if errors.Is(err, fence.ErrStale) {
		log.Print("a later holder of invoice-42 has written; nothing changed")
	}
}
