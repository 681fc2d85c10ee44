// Package natsputex implements locks, semaphores and leader election
// (putex, a process mutex) on the keys of a NATS JetStream KV bucket.
//
// A [Client] works on one bucket, created by [New] if missing. Its
// [Locker] is a [locks.Locker] (a lock is one key, named as the lock), its
// [Semaphore] a [locks.Semaphore] (the N slots of a name are the keys
// name.1 … name.N), and its [Supervisor] runs putex's pump on one key to
// start and stop a service on at most one of several nodes; the command
// natslock (cmd/natslock) wraps it. Leases implement [locks.SlotLease]
// (Slot is 0 for a lock, 1 to N for a semaphore) and have a Deadline
// method: when the lease ends by itself unless a renewal lands first.
//
// The client is built on the backend kit (locks/driver): its leases are
// registered with a [driver.Registry], which renews them together: every
// renewal interval one round runs the health check once, then rewrites
// the key of every live lease, the writes sent at once (NATS KV has no
// multi-key compare-and-set). [Client.Close] ends and releases them all,
// bounded by its context. [Locker] and [Semaphore] implement
// [driver.Observable]: besides the kit's renewal events, a client reports
// [driver.EventTakeover] when one of its calls (or Supervisors) takes a
// key over from a silent holder, and [driver.EventConfirmation] when that
// takeover is confirmed (Duration: the time since the takeover write was
// answered, from which the confirmation counts).
// The Supervisor is built on the Locker's lease: its strokes are a
// Lock's attempts with putex's parts added, and its hold is one of the
// client's leases, renewed in the same rounds.
//
// # Protocol
//
// The value of a key is the holder's token and its timing: for a Locker,
// the client's holder id, a random suffix per lease and the client's T;
// for a Supervisor, the token its operator gives (the host name), a
// newline and its T and C·R ("node-a\nT=3s C·R=1s"). An empty value, a
// missing key or a deleted key is free. Every write is conditional on the key's revision:
// a create when the key does not exist, an update at the revision last
// read otherwise, so of several agents racing only one can win. Timing is
// putex's:
//   - R, the renew interval ([WithRenewInterval]): the holder rewrites its
//     token every R, after its health check ([WithHealthCheck]) passes.
//   - F, the failure threshold ([WithFailureThreshold]): T = F·R is the
//     lock timeout. A key held by another token is taken over only after it
//     has gone T without any write. A call measures that silence from the
//     key's last write, as the stream leader's clock stamped it, to the
//     time the same server stamps on a write of its own made when the call
//     first reads that revision (an empty message to the bucket's key
//     "natsputex:clock", which no lock can be named), then on its own
//     monotonic clock; so a TryLock, or a process started after the
//     holder crashed, takes a key silent for T at once. The client's clock
//     is never compared with a server's; the assumptions are that clocks
//     run at about the same rate, that the server's clock does not step
//     forward by more than T − R between two stamps, and, when a stream
//     leader changes between the two, that the nodes' clocks agree to well
//     within T − R. Should those fail, a live holder's key may be taken
//     over: the holder's next renewal then fails and ends its lease,
//     within R, before a taker-over with C >= 1 hands out its own. A call
//     whose server cannot tell (the clock write fails) watches the key for
//     a full T itself. The clock restarts whenever the key's revision
//     changes, to a lower one too (a bucket made again counts from 1).
//     Clients of one name may have different timing: a call waits for the
//     longer of its own T and the T its holder's value carries, and
//     confirms for the longer of its own C·R and the holder's (a
//     Supervisor's value carries it), so a client with a shorter T never
//     takes a live holder's key between two of its renewals. The timing
//     is read with the holder, in the same write: no other key holds it,
//     so nothing can overwrite or lose it apart from the holder's own
//     write.
//   - C, the confirmation count ([WithConfirmations]): after a takeover, the
//     new holder rewrites its token for C intervals, counted from the
//     answer to its takeover write (which may land well after it was
//     begun, when it waited for a reconnect), before the lease is handed
//     to the caller (or the Supervisor starts the service); a free key is
//     held at once. A Supervisor also confirms for C intervals when it
//     finds its own token in the key while it does not hold it (its own
//     last write, or a write whose answer was lost): it starts the
//     service only after C·R of its own writes that it saw succeed, on
//     every path. While it confirms, a taker-over writes its token with
//     the longer T and C·R of its own and of the value it displaced (a
//     Locker too, on a second line after its token, until its last
//     confirmation), so a chain of confirmers inherits the longest
//     (TestAttack2MixedChainConfirmerDies). A taker-over that gives up
//     before its confirmations are done (Run's context ends, natslock's
//     SIGTERM, a Lock's context cancelled, a failed check or write) never
//     blanks the key: it leaves its last write, and the next taker waits
//     T without a write and confirms, as for a dead holder
//     (TestAttack2ConfirmerGivesUp, TestAttack2LockerConfirmCancelled,
//     TestAttack2NatslockSIGTERMWhileConfirming). That costs the next
//     taker T, in that case only; a holder that finished confirming (or
//     took a free key) still blanks on its way out.
//
// A holder's lease ends at once, with [locks.ErrLost], when a write fails
// (a write that nats.go refused to send while it reconnects has not
// failed: it is sent again once the connection is back, see
// [ConnectOptions]) or its health check fails (it then blanks the key,
// one attempt, so that a waiter takes over at once; the lease has ended
// before the blank is sent). A holder that cannot renew ends its lease by itself at the start
// of its last successful write plus T minus a safety margin
// ([WithSafetyMargin], R/2 by default, at least 1ms shorter than T): a
// holder cut off from NATS stops before anyone may take over. This
// validity is always shorter than T, so a holder renews every R only when
// that leaves room for two attempts within it (T − margin >= 2·R, true
// for F >= 3 with the default margin); otherwise it renews every
// (T − margin)/2, and a taker-over confirms with writes that far apart
// for the same C·R. Release blanks the key,
// conditioned on the lease's last revision (and, if a renewal whose answer
// was lost moved the revision, on a fresh read still showing the lease's
// own token): a stale release never frees a successor.
//
// Waiting calls are woken by a KV watch on their key (one per waiting
// call, stopped when it returns), with the takeover timer firing at T
// after the last change seen, and polling ([WithBackoff]) only as a
// fallback.
//
// # What it promises
//
//   - Linearizable compare-and-set on one key's revision while the JetStream
//     quorum of the bucket is healthy, on the servers of "NATS versions"
//     below: two leases on one name are never granted at once by the
//     broker.
//   - The fencing token of a lease ([locks.Lease.Token]) is the revision of
//     the write that won the key. Revisions are stream sequences, strictly
//     increasing across the whole bucket, so a later holder of a name
//     always has a greater token. Pass it to the resources you protect.
//     This holds for the life of the bucket's stream: a bucket deleted and
//     made again (New creates a missing one), or a memory-stored bucket
//     ([WithStorage]) whose servers all restarted, counts from 1 again, so
//     a resource that outlives the bucket must be told (reset its highest
//     token) or keyed by more than the token.
//   - A dead holder's key is taken over after about T + C·R of silence
//     (T = F·R), by the server's clock and then the successor's own, plus
//     up to one interval of alignment: a waiting Lock takes it then, and
//     so does any Lock or TryLock made later, at once (after C·R of
//     confirmation). A crashed holder wrote at most R before it crashed,
//     so its key comes back within T + R + C·R of the crash.
//   - A holder learns it lost its key at its next renewal, within R; one
//     cut off from NATS ends its lease by itself once T − margin has
//     passed since its last successful write began, before anyone may
//     take over.
//   - A Supervisor cut off from NATS begins [Service.Stop] at that same
//     moment; a standby starts its service no earlier than T + C·R after
//     that write, so Stop has margin + C·R to finish before the two could
//     overlap. Choose C (and the margin) for the slowest Stop you have.
//     The same bound holds whenever the agent stops its service itself (a
//     failed health check or write, or [Client.Close]): it blanks the key
//     only once Stop has returned, so no standby starts at once, and
//     never while it was still confirming a takeover (see C above), which
//     keeps the bound of the holder it displaced; but its hold has ended,
//     so it does not renew while Stop runs, and a standby may take the
//     silent key over T + C·R after the agent's last write (the blank
//     then finds the key written by the standby, and leaves it). Stop
//     then has at least margin + C·R (after a failed write, whose hold
//     ran to its end), and about T − R + C·R after a failed health check
//     or on Close. When Run's context ends (natslock's SIGTERM), the
//     agent still holds the key while Stop runs, and renews it, so no
//     standby takes it before the blank.
//     Stop's context ends after T + C·R, never sooner. A Stop that fails
//     or overruns that is reported as failed, never as done: the key is
//     then not blanked, and Stop is called again every stroke until it
//     succeeds; a standby may start T + C·R after the agent's last write
//     whatever Stop does, which is the limit of what the agent can keep.
//   - A Supervisor renews at the revision of its own last write, so two
//     agents given the same token by mistake do not both hold the key: an
//     agent that finds its token written by someone else stops its
//     service and says so, and one that finds its token at a revision it
//     did not write waits for T without a write, as for any other token
//     (unless a write of its own lost its answer: see C above).
//   - Supervisors on one key with different R, F or C (a rolling change),
//     or given the same token by mistake, keep these bounds: each writes
//     its T and C·R in the key's value, after its token, and a standby
//     waits for the longer T and confirms for the longer C·R of its own
//     and the holder's, writing that longer timing while it confirms
//     (TestSupervisorMixedTiming, TestAttackDuplicateTokenMixedTiming,
//     TestAttack2MixedChainConfirmerDies). Earlier versions advertised
//     them in keys of their own, which two agents of one token, a Locker
//     or a lost bucket could overwrite or drop
//     (TestAttackTimingKeyTakenByLocker,
//     TestAttackTimingLostWithMemoryBucket); agents of those versions and
//     of this one must share R, F and C during an upgrade.
//   - A key that vanishes, or whose revision goes back to a later write
//     (its bucket deleted and made again, a memory bucket whose servers
//     all restarted, the stream purged, a TTL) is not free at once to a
//     caller that saw it before: a waiting call, or a running Supervisor,
//     that saw the key counts it as held for T (or the longest T a
//     holder's value it read carried), and takes it only after T of
//     silence and C·R of confirmation, as a dead holder's
//     (TestAttackRecreatedBucketSupervisor,
//     TestAttackTimingLostWithMemoryBucket). The old holder's next
//     renewal fails (a write at its revision, which the new bucket does
//     not have), so it learns within R. What remains: a client that never
//     saw the key (a process started after the bucket was made again, a
//     TryLock, the first attempt of a Lock) finds it missing and takes it
//     at once, while the old holder may hold it for up to R more (and a
//     Supervisor's service run until its Stop ends); fencing tokens count
//     from 1 again, so they do not order the two; and a holder's write,
//     conditional on a revision of the old bucket, would land should the
//     new bucket's key reach that very revision first. Do not delete a
//     bucket in use: stop its clients first, or wait T + C·R after the
//     last of them stopped.
//   - Writes to a held key by anything but natsputex (nats kv put, del or
//     purge, a blank by hand) are outside the protocol. A blank or a
//     delete frees the key at once: a waiter takes it and starts, while
//     the holder learns at its next renewal, within R (a Supervisor then
//     stops its service), so the two overlap for up to R, plus Stop's
//     time (TestAttack6ForeignWrite). A value written by hand is taken as
//     a holder's: the holder stops within R, and waiters wait T for it.
//     Change a key in use only with its holders stopped.
//   - [New] refuses an existing bucket that drops a key's last write by
//     itself, with an error matching [locks.ErrInvalidOption] that names
//     the bucket: a TTL (max age) shorter than the client's T + C·R, or
//     limits on its messages or bytes that discard the oldest messages
//     (TestAttackBucketWithTTL). Such a bucket would free a quiet
//     holder's key, missing, to a client that takes it at once. New
//     checks the bucket when it opens it only: a bucket changed later is
//     not checked again.
//   - The fencing token of a Supervisor's hold is the revision of the
//     write that won the key; [Service.Start] gets it (natslock's start
//     command as $NATSLOCK_TOKEN).
//   - An agent killed outright (kill -9, a crash) cannot stop its
//     service. A [CommandReaper], which natslock starts, can: it runs the
//     stop command and kills the start commands' process groups as soon
//     as the agent's process is gone (see its doc for what it cannot
//     reach).
//   - What remains: a process paused longer than T (GC, SIGSTOP) still
//     believes it holds the key until it runs again; its lease's context
//     then ends at once, but work it does in that instant is only stopped
//     by fencing tokens. The Supervisor's services run outside the agent:
//     putex's advice to fence the others when a node starts its service is
//     what protects them.
//
// # Where it differs from putex
//
//   - putex's key holds the agent's token. A Supervisor writes its T and
//     C·R after it, on a second line, so that agents with different
//     timing, or with the same token, wait as long as the holder counts
//     on (see above); [Event.Holder] and natslock's log show the token
//     alone.
//   - putex renews every R even with F = 1, when a renewal is due just as
//     a waiter may take over. Here a holder trusts its hold for T minus the
//     margin only, and renews twice within that when R would not fit (see
//     Protocol): with F = 1 and the default margin, every R/4.
//   - putex's chart blanks the key, then kills the service, when a health
//     check or a write fails. The Supervisor runs [Service.Stop] first and
//     blanks the key only when Stop has returned (also when [Service.Start]
//     failed): a blank key is taken at once, and the two services must
//     not overlap (within the bound on Stop's time given above). The
//     blank is one
//     update at the agent's last revision; on shutdown too, it never re-reads
//     the key, as tokens (host names) are shared by an agent's restarts.
//   - putex re-runs the kill and start actions on every stroke; the
//     Supervisor runs [Service.Stop] once when Run begins, once each time
//     the agent stops being active and when Run returns (again each
//     stroke while it fails), and [Service.Start] when it becomes active.
//   - putex's "lk empty or mine?" takes the sunny path, and starts the
//     service, whenever the key holds the agent's token. The Supervisor
//     renews at its own last revision, not the one just read; its token
//     at another revision means another agent's write (a duplicate
//     token), unless a write of its own lost its answer, after which it
//     confirms for C intervals before it starts.
//   - An agent whose [Service.Start] failed leaves a free key to the
//     other agents for T (doubling with each further failure in a row, up
//     to 8·T) before taking it again: putex would take it back on its
//     next stroke, before a healthy standby's health check has run.
//   - putex may keep a holder's renewal trying for up to F·R; here a renewal
//     is bounded by the holder's own validity (T minus the margin), so the
//     service stops before a standby may take over.
//   - The confirmation wait is C full intervals after the takeover write, as
//     putex's prose says; its flowchart's "Wait R (C−1 times)" followed by
//     the rest of a stroke that already lasted T would start at once.
//   - Reads go to the stream's leader (STREAM.MSG.GET), not to direct gets
//     any replica may answer: a replica behind the leader would show a key
//     just released as still held.
//
// # Connections, restarts and leader changes
//
// A [Client] does not own its NATS connection: make it with
// [ConnectOptions] (reconnect forever and quickly, no writes buffered
// while reconnecting). While the connection is down, holders cannot
// renew: one cut off for T − margin loses its lease (ErrLost), as in a
// partition. Waiting calls look at their keys again as soon as the
// connection is back, and make their KV watches again (the old one's
// consumer may have gone with the server: nats.go would notice only after
// missing its heartbeats for 5–10 s); a release made after a restart of
// the server wakes a waiter at once (TestWatchAfterRestart: within 1 ms,
// on the embedded server and NATS 2.9.10). A watch whose consumer ran on
// another node of a cluster, one that died, comes back only when nats.go
// notices (5–10 s); meanwhile the waiter polls ([WithBackoff]: at most
// every second by default) and its takeover timer runs.
//
// A stream leader that dies (a crash, kill -9, a partition) leaves the
// bucket without a leader until its followers elect one: nats-server
// waits for its election timeout, randomized between 4 and 9 s (2.9 to
// 2.11), after the dead leader's last heartbeat. Until then no read or
// write of the bucket is answered: every name of the bucket stalls, no
// holder can renew, waiting calls wait and New waits. A request sent then
// is not answered even after the election, so each is bounded (by
// max(T, 1 s); New's by 2 s) and made again. The stall is thus at most
// about 9 s, plus that bound, plus the reconnect wait of a client that was
// connected to the dead node; on a 3-node NATS 2.9.10 cluster we measured
// 5.3 s before a lock was taken again (TestStreamLeaderKillStall) and
// 6.2 s before New returned (TestNewSaysWhatItWaitedFor). Holders whose T
// − margin is shorter than the stall lose their leases, safely; to ride a
// leader's death out, choose T (F·R) above 10 s plus that bound. New,
// when its context ends before JetStream answers, says what it waited
// for.
//
// # NATS versions
//
// A single-replica bucket works on NATS 2.9 and later: nothing depends on
// per-key TTLs or other newer features. A replicated bucket needs
// [MinClusterVersion] (2.9.21) or later on every node: before it, a
// replicated stream checked a write's expected revision before proposing
// it to its Raft group, not in order with the other writes, so concurrent
// conditional writes could all succeed (nats-server issue #4320). On a
// 3-node NATS 2.9.10 cluster with an R3 bucket, 4 clients × 2 goroutines
// locking 3 names for 15 s got 4701 grants, 1787 of them while another
// lease on the name was live and 753 with a token below an earlier
// grant's (TestBinaryClusterContention); on a cluster of 2.9.21 (run by
// hand with LOCKS_NATS_SERVER, not by CI) the same workload had 3413
// grants, none overlapping, none out of order, and the conformance suite
// passed on its R3 bucket. [New] refuses such a bucket with
// an error matching [ErrUnsafeServer], unless [WithUnsafeServer] lets it
// through with a warning: then nothing here is promised. It checks the
// version of the server its connection is on only, so it may miss an
// older node in a cluster that mixes releases: upgrade every node.
//
// What remains during a stream leader change: the check of a write's
// expected revision is made by the stream leader, from state that is its
// own (the writes it has applied and those it has proposed and not yet
// applied), not by every replica when the write is applied. A new leader
// starts with no writes in flight. Since nats-server 2.11.0 (pull request
// #6194) it refuses conditional writes until it has applied its whole log,
// so a write conditional on a revision already replaced is refused;
// nats-server issue #8469 (2026) asked for the check to move into the
// replicated apply because the in-flight state is cleared during a leader
// change, and was withdrawn after the maintainers explained that guarantee:
// no stale write was reproduced on current servers. Releases from 2.9.21
// to 2.10.x lack that guard: a leader elected with writes it has not
// applied yet may accept a write conditional on a revision one of them
// replaces, and two clients may then both believe they won the key. What
// bounds the damage then is the fencing token: each accepted write has a
// revision of its own, and the one applied later is higher, so a resource
// that keeps the highest token it has seen refuses the earlier holder's
// writes once the later one has written; and the earlier holder's next
// renewal, conditional on its own revision, fails, so its lease ends
// within R. The tests run the conformance suite on an embedded current
// server (single node and a 3-node cluster with an R3 bucket) and on a
// single node of the nats-server program on PATH (2.9.10 on the
// reference machine); a cluster of that program only when it is 2.9.21 or
// later.
package natsputex
