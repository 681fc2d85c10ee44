// Package fence makes resources refuse stale fencing tokens: the other
// half of a lock's fencing token ([locks.Lease.Token]). A lease's token
// is strictly greater for every later holder of its name, but a token
// protects data only if the resource checks it: a holder that was paused
// or cut off past its validity still believes it holds the name, and its
// late write must be refused, not applied on top of its successor's.
//
// A guard takes a lease (its name and token) and runs a write only if no
// larger token has written under that name; it raises the name's fence to
// the lease's token in the same atomic step as the write. A stale write
// fails with an error matching [ErrStale] (a [*StaleError] naming the
// name, the refused token and the newest) and changes nothing. The same
// lease may write any number of times. Guards:
//
//   - package sqlfence (this module, database/sql): PostgreSQL and
//     MySQL/MariaDB; a fence table, and the write in the transaction that
//     raised it.
//   - module fence/redisfence (go-redis): SET, HSET or a Lua script of
//     yours, in one script that checks and raises the fence first.
//   - module fence/natsfence (nats.go): Put, Update and Delete on a KV
//     bucket's key that carries the token with its value.
//   - [Memory] here: in process, for tests of your own code with memlock.
//
// Each guard needing a client is a module of its own: importing one pulls
// in only its client. This module imports the standard library and locks.
//
// # Quick start
//
//	guard, err := sqlfence.New(sqlfence.Postgres)
//	if err != nil { ... }
//	if err := guard.EnsureSchema(ctx, db); err != nil { ... } // or a migration: guard.Schema()
//	lease, err := locker.Lock(ctx, "invoice-42")
//	if err != nil { ... }
//	defer lease.Release(ctx)
//	err = guard.Do(lease.Context(), db, lease, func(tx *sql.Tx) error {
//		_, err := tx.ExecContext(ctx, `UPDATE invoices SET state = 'paid' WHERE id = 42`)
//		return err
//	})
//	switch {
//	case errors.Is(err, fence.ErrStale):
//		// A later holder of "invoice-42" has written: this process lost
//		// the lock while it worked. Nothing was written; stop.
//	case err != nil:
//		// The write or the database failed.
//	}
//
// # Leases without tokens
//
// Every guard refuses a lease whose Token is 0 with [ErrNoToken], before
// any I/O: amqpsem makes no tokens (a slot is held while the broker sees
// the holder's connection; there is no counter to fence with). Users of
// amqpsem can fence with a counter of their own in the resource, taken
// when the slot is: in one transaction, increment a per-name row and read
// it back, and use [Token](name, thatValue) as the lease for the guard;
// or use a backend with tokens (natsputex, redlockprio) for the writer
// that must be fenced.
//
// # What a fence does not do
//
// A guard refuses a write by an older holder after a newer one has
// written through the same guard. Writes that bypass the guard are not
// fenced; a newer holder that has not written yet does not stop an older
// one (the older one's write simply comes first); and tokens of different
// names do not compare, so each resource is written under one name. Fence
// rows and keys are kept forever, one per name: names that are never
// used again can be deleted once no holder of them can be alive.
package fence
