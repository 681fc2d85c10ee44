// Package redlockprio implements Redlock on N independent Redis masters,
// with fencing tokens, automatic batch renewal, priorities and lock theft,
// on github.com/redis/go-redis/v9.
//
// # Quick start
//
// doWork(ctx context.Context, token uint64) error is yours: it stops when
// ctx ends and passes token to what it writes.
//
//	ctx := context.Background()
//	addrs := []string{"127.0.0.1:6379"} // independent masters: 1, 3 or 5
//	var masters []*redis.Client
//	for _, addr := range addrs {
//		rc := redis.NewClient(&redis.Options{Addr: addr, ContextTimeoutEnabled: true, MaxRetries: -1})
//		defer rc.Close()
//		masters = append(masters, rc)
//	}
//	client, err := redlockprio.New(masters) // no I/O yet
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
//	// lease.Context() ends if the lock is lost or taken; the token fences stale writers.
//	if err := doWork(lease.Context(), lease.Token()); err != nil {
//		log.Print(err)
//	}
//
// A [Client] holds leases on a quorum (N/2+1) of its masters: its [Locker]
// holds a name, a [Semaphore] one of 1 to [MaxSemaphoreSize] slots of a
// name. Give the masters' clients ContextTimeoutEnabled: true and
// MaxRetries: -1, as above: a hung master then cannot hold a call past the
// call timeout, and a refused dial counts as a master that took nothing.
//
// # Options
//
//   - [WithTTL] (10s): how long a master keeps a key its holder stopped
//     renewing, so the longest a crashed holder blocks a name.
//   - [WithRenewInterval] ((TTL − drift)/3, the most it may be): how often
//     all the Client's leases are renewed, in one batch.
//   - [WithDriftFactor] (0.01): the share of the TTL, plus 2ms, taken off
//     each lease's validity for clock drift.
//   - [WithCallTimeout] (TTL/10, from 200ms to 1s): how long a step waits
//     for one master before counting it failed.
//   - [WithPriority] (0): a Client takes a name from a holder of strictly
//     lower priority, which is told and must let go.
//   - [WithHolderID], [WithKeyPrefix], [WithBackoff]: the readable holder
//     identity, the prefix of every key ("latchkey:"), and a Semaphore's
//     polling when no release wakes it.
//   - [WithTwoMasters] allows N = 2, which tolerates no failure.
//   - [WithImmediateAck] and [WithUnsafeStolenConsistencyFactor] are UNSAFE:
//     a thief may then run beside its victim, fenced only by tokens.
//
// # What it promises
//
//   - Mutual exclusion: a lease is held on a quorum of masters, valid until
//     TTL − drift after its last grant or renewal began, by the local
//     monotonic clock; it ends with [locks.ErrLost] before then when a
//     quorum cannot be renewed. A dead or hung minority costs a step at
//     most the call timeout, and a held name still reads as held.
//   - Fencing: [Lease.Token] is greater for every later holder of a name.
//   - Theft: a higher priority takes a held name; the holder's context ends
//     with [locks.ErrPreempted], and the thief's Lock returns only when the
//     holder has let go (Release, or Close) or its validity has provably
//     run out. TryLock waits for that too: the one case where it waits.
//   - Waiting Locks queue on the masters, FIFO among equal priorities and
//     higher priorities first; a release wakes the head alone, and TryLock
//     does not jump the queue. A dead waiter holds the queue up for at most
//     a TTL and a half.
//   - Errors: [locks.ErrInvalidName] and [locks.ErrInvalidOption] before any
//     I/O ([locks.ErrInvalidOption] also, on first contact, for two masters
//     that are one server); a held name gives
//     a [locks.HeldError], fewer than a quorum of answers a [*QuorumError]
//     (one error per master). A call whose ctx ends returns an error
//     matching ctx.Err() and holds nothing; a closed Client's calls fail
//     with [locks.ErrClosed].
//
// # Limits
//
//   - Clocks that jump or run faster than the drift factor allows break
//     validity, which is measured by the local clock.
//   - Masters that restart empty inside the TTL can let two holders in (one
//     such master is enough when a lease sits on a bare quorum) and repeat a
//     token: keep a crashed master down for a TTL, or run AOF with
//     appendfsync always (the only way to keep tokens increasing).
//   - A process paused past its validity still believes it holds the name
//     until it runs again: only fencing tokens stop its writes.
//   - A waiting Lock whose attempt meets fewer than a quorum of answers
//     within the call timeout fails with a [*QuorumError] and leaves the
//     queue: a waiter cut off from the masters when its turn comes, or one
//     whose calls time out on a machine starved of CPU. Many Locks of one
//     name through one Client wait their turn inside the Client first.
//   - A Locker and a Semaphore of size 2 or more on one name do not
//     exclude each other: use one kind per name.
//
// The protocol, its proofs, theft in detail, the waiter queue, where it
// departs from the priority-Redlock spec and what was measured are in the
// repository's docs/protocols/redlockprio.md.
package redlockprio
