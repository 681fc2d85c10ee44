// Package natsputex implements locks, semaphores and leader election
// (putex, a process mutex) on the keys of a NATS JetStream KV bucket.
//
// # Quick start
//
// doWork(ctx context.Context, token uint64) error is yours: it stops when
// ctx ends and passes token to what it writes.
//
//	ctx := context.Background()
//	nc, err := nats.Connect(nats.DefaultURL, natsputex.ConnectOptions()...)
//	if err != nil {
//		log.Fatal(err)
//	}
//	defer nc.Close()
//	js, err := jetstream.New(nc)
//	if err != nil {
//		log.Fatal(err)
//	}
//	client, err := natsputex.New(ctx, js, "locks") // makes the bucket if missing
//	if err != nil {
//		log.Fatal(err)
//	}
//	defer client.Close(ctx) // ends and releases every lease of the client
//
//	lease, err := client.Locker().Lock(ctx, "nightly-report") // waits its turn
//	if err != nil {
//		log.Fatal(err) // holds nothing; matches ctx.Err() when ctx ended
//	}
//	defer lease.Release(ctx)
//	// lease.Context() ends if the lock is lost; the token fences stale writers.
//	if err := doWork(lease.Context(), lease.Token()); err != nil {
//		log.Print(err)
//	}
//
// A [Client] works on one bucket. Its [Locker] holds a lock as one key
// named as the lock, its [Semaphore] one of the keys name.1 … name.N, and
// a [Supervisor] runs putex's pump on one key, so that at most one of
// several agents runs its [Service] (the command natslock wraps it).
//
// # Options
//
//   - [WithRenewInterval] sets R (1s): a holder checks its health and
//     rewrites its key every R.
//   - [WithFailureThreshold] sets F (3): T = F·R is the silence after which
//     a key held by another is taken over.
//   - [WithConfirmations] sets C (1): a taker-over rewrites the key for C·R
//     more before it hands out the lease or starts the service.
//   - [WithSafetyMargin] (R/2): a holder that cannot renew ends its lease T
//     minus the margin after its last successful write began.
//   - [WithHealthCheck] (none) runs before every renewal and takeover.
//   - [WithHolderID], [WithBackoff], [WithReplicas], [WithStorage] set the
//     holder's identity, the polling of a wait no notification wakes, and
//     the replicas and storage of a bucket New creates.
//   - [WithUnsafeServer] accepts a replicated bucket on a server older than
//     [MinClusterVersion]: nothing below is then promised.
//
// # What it promises
//
//   - Mutual exclusion: every write is a compare-and-set on the key's
//     revision, so two leases on one name are never granted at once while
//     the bucket's JetStream quorum is healthy.
//   - Fencing: [locks.Lease.Token] is the revision of the write that won
//     the key, greater for every later holder of the name while the bucket
//     lives; the fence module's guards make a resource refuse a stale one.
//   - A crashed holder's key is taken over T + C·R after its last write,
//     by the server's clock: within T + R + C·R of the crash. Waiting Locks
//     queue first come, first served; a release wakes the first alone.
//   - A holder learns it lost its key within R; one cut off from NATS ends
//     its lease T − margin after its last successful write began, before
//     anyone may take over. A cut-off [Supervisor] begins [Service.Stop]
//     then, which has at least margin + C·R before a standby starts.
//   - Errors: [locks.ErrInvalidName] and [locks.ErrInvalidOption] before any
//     I/O; a failed call holds nothing and matches ctx.Err() when ctx ended;
//     a lost lease's context ends with [locks.ErrLost]; a closed client's
//     calls fail with [locks.ErrClosed].
//
// # Limits
//
//   - Clocks: silence is measured from the server's timestamp, then by the
//     caller's monotonic clock; a server clock that steps forward by more
//     than T − R can let a live holder's key be taken (it learns within R).
//   - A process paused longer than T still believes it holds the key until
//     it runs again: only fencing tokens stop its writes.
//   - Do not delete a bucket in use (tokens count from 1 again, and a client
//     that never saw the key takes it at once), nor blank its keys by hand
//     (a waiter takes the key while its holder runs on for up to R). [New]
//     refuses a bucket whose TTL or limits would drop a held key.
//   - A stream leader's death stalls the whole bucket for its election (4
//     to 9 s) plus max(T, 1 s); holders with a shorter T − margin lose their
//     leases. Choose T above 10 s plus that bound to ride it out.
//   - Replicated buckets need [MinClusterVersion] on every node ([New]
//     checks the one it is connected to: [ErrUnsafeServer]); before 2.11 a
//     leader change may let two writers win, ordered by their tokens.
//   - A [Client] does not own its connection: make it with [ConnectOptions].
//     An agent killed outright cannot stop its service; a [CommandReaper]
//     can.
//
// The protocol, the bounds in detail, the Supervisor's pump, the waiting
// queue, where it differs from putex and what was measured are in the
// repository's docs/protocols/natsputex.md.
package natsputex
