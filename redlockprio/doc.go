// Package redlockprio implements Redlock on N independent Redis masters,
// with fencing tokens, automatic batch renewal, priorities and lock theft,
// on github.com/redis/go-redis/v9.
//
// [New] takes one go-redis client per master (N ≥ 1, N = 2 only with
// [WithTwoMasters], since two masters tolerate no failure; each may be a
// *redis.Client or a *redis.ClusterClient, and a []*redis.Client is taken
// as it is) and returns a [Client]. [Client.Locker] returns its [Locker],
// which implements [locks.Locker]; [Client.Semaphore] returns a
// [Semaphore] ([locks.Semaphore]) of 1 to [MaxSemaphoreSize] slots per
// name. Leases are [*Lease] values, which implement [locks.SlotLease]
// (Slot is 0 for a Locker's lease, 1 to size for a Semaphore's). A
// Locker's lease holds the name's first slot at the masters: a Locker
// excludes other Lockers and Semaphores of size 1, but a Semaphore of
// size 2 or more may hold its other slots beside it. Use one kind per
// name. The
// Locker and Semaphores implement [driver.Observable]: they report
// [driver.EventQuorumError] (one per failing master of a step),
// [driver.EventTheft] and [driver.EventAckWait] besides the kit's renewal
// events. [Client.Close] ends and releases every lease, bounded by its
// context. Errors have the one shape of [driver.Errorf]
// ("redlockprio: lock \"jobs\": …"), and a closed Client's calls fail with
// an error matching [locks.ErrClosed]. Invalid names (empty, not UTF-8, control characters,
// '{' or '}', over 1024 bytes) give [locks.ErrInvalidName] and invalid
// options [locks.ErrInvalidOption], before any I/O; so does a TTL too
// short for a step's calls ((TTL − drift)/2 under 5ms, a TTL under about
// 12ms). Two masters that are one server (the same address twice,
// 127.0.0.1 and localhost) are found on first contact: each master
// writes its index to a key of the Client's own unless another master's
// index is there already, atomically, so two clients of one server (or
// of one cluster node) see each other's. Every acquisition then fails
// with an error matching [locks.ErrInvalidOption] naming both; until a
// master is so verified, its answers do not count. (A server that
// restarts empty between the two masters' first contacts is not caught.)
//
// # What it promises
//
// A lease is held on a majority (quorum N/2+1) of independent masters. It
// is valid until start + TTL − drift on the local monotonic clock, where
// start is taken before the requests of the step that last granted or
// renewed it and drift = TTL·driftFactor + 2ms ([WithDriftFactor]). Each
// step on a master is one Lua script, run by SHA (EVALSHA, falling back to
// EVAL on NOSCRIPT; a renewal tick's pipeline answered NOSCRIPT loads the
// script and is sent again once); requests to the masters go out in
// parallel, and a step returns as soon as its outcome is decided: a
// quorum granted (or released); or a quorum answered and so few granted
// that the masters yet to answer cannot make a quorum (the name is held:
// [locks.HeldError], naming the holder); or more than N − quorum failed,
// so that fewer than a quorum can answer at all ([*QuorumError]).
// Failures and "held" answers are never added up: with a dead or
// refusing minority a held name reads as held, TryLock returns
// ErrNotAcquired and Lock waits (TestRefusingMinorityIsContention). A
// master that has not answered within the per-master call timeout
// ([WithCallTimeout]; by default TTL/10, at least 200ms, at most 1s)
// counts as failed for that step. And once a majority of the masters
// called have answered, the others are waited for at most as long again
// as that took (2ms at least); their answers are seen to in the
// background (a grant deleted after a failed attempt, raised to the
// token after a won one). So a paused or hung minority costs a step
// nothing when the live masters agree, and a round trip or two when
// they split (TestPausedMinorityUnderContention; lockbench's
// hung-minority scenario). A semaphore's acquisition waits for every
// master but such stragglers, as they may pick different slots. The other masters' calls finish in the background, and at
// each master the Client's calls about a name are made in the order it
// issued them (a lease's release never overtakes its acquire there, nor
// the next acquire its release). An attempt
// that does not win a quorum deletes whatever it got, except where it
// displaced a lower priority (see Priorities and theft). Errors say which
// masters failed: a [*QuorumError] unwraps to one error per master.
//
// A call whose context ends while its attempt is in flight, or after the
// attempt won some masters but before it was granted (Lock, TryLock,
// Acquire, TryAcquire alike), deletes what the attempt may hold before it
// returns ctx's error, and so holds nothing when it returns: it waits for
// those deletions up to the call timeout past the context's end. Each
// deletion removes the key only where it is still the attempt's (checked
// in the same script), and at each master it runs after the attempt's
// acquire there has answered, so it also undoes a grant whose answer had
// not come when the context ended
// (TestCancelledAttemptHoldsNothingAtReturn). The limit: a call still
// unanswered at return — a master hung past the call timeout, or a
// straggler left after the grace once a majority had answered — cannot be
// undone before the return; a grant such a master makes after Lock
// returned (its request was already sent) is deleted in the background
// when its answer arrives, or expires after the TTL. Keys taken from
// another holder are the exception of Priorities and theft: they stay
// until that holder has let go or run out of validity (the name was not
// free then either), and a thief whose context ends while it waits for
// its victim releases its lease in the background once that wait is over.
//
// Every lease is renewed in the background: all the leases of one Client
// in one pipeline per master per tick ([WithRenewInterval]), from one
// goroutine that exits when no lease is held. Renewal extends a key only
// while it still holds the lease's unique holder id, so a stale holder
// never extends nor deletes a later holder's key. When a quorum cannot be
// renewed, the lease ends with [locks.ErrLost] before its validity runs
// out: at once when a quorum says the keys are gone, else at the first
// failed tick after which the next tick could come too late. That is why
// the renewal interval is at most (TTL − drift)/3: a round that hangs is
// given one interval, it may start one interval after the last successful
// one, and the lease must end before TTL − drift has passed since then.
// A round never runs past the earliest validity in its batch less the
// drift allowance, so that even a lease whose validity is nearer than one
// interval (a slow acquisition) ends with ErrLost before it runs out.
//
// Not safe against: clocks that jump or run faster than the drift factor
// allows (validity is local time; key expiry is the masters' time); and
// masters that restart empty (without persistence) inside the TTL: if
// the masters that still hold a lease's key fall below a quorum, a second
// client can win a quorum while the first still holds the lease
// (TestMajorityRestartedEmptyAllowsDoubleGrant shows it). A lease may sit
// on a bare quorum (exactly a quorum of masters hold its key) for its
// whole life: when a minority is unreachable from its holder while it
// acquires and renews, a live holder does not reach it. Then a single
// master of that quorum restarting empty is enough, and the second
// holder's token can equal the first's
// (TestAttack2BareQuorumSingleRestart shows it, with 1 of 3 masters
// refusing the holder and another restarted). Mitigation: keep
// a crashed master down for at least one TTL before it rejoins (its
// holders' leases have then ended, as the same test shows), or run the
// masters with AOF persistence and appendfsync always. Only the second
// keeps fencing tokens increasing: a master that comes back empty has
// forgotten its counters however long it was down, and a later quorum
// that meets it and masters whose counters lag (one the last holder
// could not reach, while another refuses) can repeat a token. The chaos
// run (TestChaos) kills and restarts masters that keep an append-only
// file.
//
// # Fencing tokens
//
// Lease.Token is strictly greater for every later holder of a name. Each
// master keeps a counter per name ({name}:fence, never expiring). The
// acquire script raises the counter to at least a floor the client passes
// (the largest counter it has seen for the name in this call), increments
// it, and returns it; the token T is the largest counter among the masters
// that granted. Before Lock returns, T must be recorded on a quorum of
// masters, each of which still held the attempt's key when its counter
// reached T. A granting master that returned a counter of at least T has
// it (its script raised the counter with the key in place). When fewer
// than a quorum did (the counters differ after failed attempts, split
// votes or a restart), a second step raises the other masters' counters
// to T, and counts a master only if that same script finds the
// attempt's key still there. An answer "held" never counts, whatever
// its counter: a thief may hold that master since before and have taken
// the attempt's keys elsewhere, where the counters were lower. An
// attempt robbed before its write-back reached a quorum fails with a
// [locks.HeldError] (Lock waits and tries again); one that could not
// reach a quorum fails with a [*QuorumError]. Renewals and releases raise every master's counter they reach to the
// lease's token too, and after a grant every master whose answer did not
// show a counter at least T (it failed, it answered lower, or its answer
// came after Lock returned) is raised in the background, unless the
// lease's release, which raises them all, is already under way.
//
// Why T increases: let A hold T_A, recorded (counter ≥ T_A) on a quorum
// Q_A before A used it, and let B be a later holder, granted by a quorum
// Q_B. Two quorums intersect: some master m is in both. B's grant on m
// happens after A's counter there reached T_A: A's key stood on m at that
// moment (the script that raised the counter checked it), and it stayed
// until A released it, it expired (after A's validity, which ends before
// B's critical section begins) or B displaced it — all after that
// moment. Counters never decrease (barring restarts), so B's script on m
// returns at least T_A + 1, and T_B, the maximum over Q_B, is > T_A.
// A master that restarts empty loses its counters: that is harmless while
// a quorum of masters still holds counters ≥ T_A, which is why T is the
// maximum over a quorum rather than one master's value, and why the
// counters are spread to every reachable master. The limit is the one
// above: a majority restarting empty — more precisely, the masters holding
// a counter ≥ T_A shrinking below a quorum before B's grant. Right after a
// grant T_A sits on a bare quorum until the background raise, the
// release or a renewal has reached the other masters — one renewal
// interval at most while every master answers the holder, for the
// lease's whole life while one does not: a single master restarting
// empty inside that window can let a later token repeat T_A (the limit
// above).
//
// # Priorities and theft
//
// With [WithPriority], the acquire script takes a slot when it is free or
// when the caller's priority is strictly higher than the holder's; equal
// priorities never steal. On a theft the script returns the displaced
// holder's id, priority, remaining PTTL and inbox channel. Having won a
// quorum, the thief publishes a notice on the victim's inbox (one Redis
// pub/sub connection per master per Client carries every inbox and release
// channel) naming its own inbox as the reply channel. The victim's lease
// context ends at once with [locks.ErrPreempted] (also matching
// [locks.ErrLost]), and it acknowledges once its holder has let go
// (below). The thief's Lock returns when the
// victim has acknowledged or when the victim's validity has provably run
// out — the largest PTTL the victim's keys had when displaced, plus the
// drift allowance over that time, counted from when the answers arrived —
// whichever comes first. So a theft never breaks mutual exclusion, even
// when the victim is unreachable
// (TestTheftFromUnreachableVictimWaitsOutItsValidity); the thief keeps
// renewing its keys while it waits.
//
// Leases of different TTLs and drift factors may share a name. A
// thief's key expires after its own TTL or the displaced key's PTTL,
// whichever is longer, and a renewal extends a key to the TTL only when
// that is longer than what it has left, never shorter. So a name's keys
// never expire before the validity of every holder displaced from them
// has run out, and the PTTL a thief reads bounds the validity of every
// earlier victim in the chain, not only its direct one's
// (TestChainOfThievesMixedTTLs: a 3s victim, a 600ms thief waiting for
// it, and a higher 600ms thief, or a priority-0 Lock after the waiting
// thief's Client closed, get the name only after the first victim's
// deadline). The drift allowance of a wait is the waiter's drift factor
// times the wait, plus 2ms (at least its own TTL's allowance), so a long
// wait gets a long allowance whatever the waiter's TTL. The cost: a
// thief that crashes holding keys it took from a longer TTL blocks the
// name until those keys expire, up to that TTL rather than its own.
//
// The acknowledgement means the victim's code has let go: it is sent
// when the victim calls [Lease.Release] (which [locks.Do] does when its
// function returns), when its Client closes, or when its validity runs
// out, whichever comes first — not when its context ends, since work
// under way (a write already sent, a step that does not check its
// context) may still run then (TestAcknowledgementWaitsForRelease). A
// victim whose holder never calls Release thus costs the thief its
// remaining validity, as an unreachable one does. [WithImmediateAck]
// restores the acknowledgement on the context's end, for holders that
// stop the moment it ends; it is unsafe otherwise, and mutual exclusion
// then rests on fencing tokens: the thief's token is greater than the
// victim's, so a resource that checks tokens refuses the victim's late
// writes once it has seen the thief's.
//
// An attempt that never held the name — it failed, and knows from every
// master's answer that it took nothing from a holder it did not tell —
// acknowledges a notice about its leftover keys at once, so a higher
// priority does not wait for it (TestFailedAttemptDoesNotStallThief).
// A master whose call was never sent counts as such an answer: it took
// nothing. That is a call the step ended before making (a master not yet
// verified, the wait for the Client's previous call there), and a call
// whose dial failed — refused, unreachable (a *net.OpError with Op
// "dial", which go-redis also returns at once while its pool remembers
// the last failed dial) — or that got no connection from the pool, when
// the client makes one attempt per command (MaxRetries: -1; MaxRedirects:
// -1 for a ClusterClient). So a master refusing connections changes
// nothing here either (TestFailedAttemptWithRefusedMasterAcknowledgesAtOnce,
// TestAttackRefusingMinorityStallsMixedContention). Any other error (a
// timeout, a lost answer), and every error of a client that retries —
// it may have sent the command on an earlier attempt whose error it does
// not return — leaves that master unknown: the attempt may have taken a
// key there from a holder it did not tell, and it then acknowledges no
// notice about its keys until such a key would have expired (below). With
// a retrying client a refusing minority can thus cost a higher priority
// up to a TTL behind each failed lower attempt.
//
// An attempt may displace holders and still not use the keys: it failed
// to win a quorum (thieves splitting the vote), it was robbed before it
// was granted, or, for a semaphore, the key is in a slot other than the
// one it keeps. It tells those victims all the same, and keeps each such
// key until its victim has acknowledged or run out of validity; only then
// does it delete it (TestFailedTheftTellsItsVictim,
// TestSemaphoreTheftInLosingSlotTellsVictim). Deleting it at once would
// let a third client take the name while the victim still runs. When the
// Client is closed meanwhile, such keys — and those of a thief still
// waiting — are left to expire: set after the victim's, they outlast its
// validity (TestCloseKeepsWaitingThiefKeys). An attempt whose context
// ended before the answers came cannot know whom it displaced: it keeps
// every key it took from another holder, to expire when that holder's
// lease would have, and it does not acknowledge a later thief's notice
// about them — for its TTL or the longest PTTL it has seen on another
// holder's key, whichever is longer, plus the drift allowance — so that
// thief waits them out (TestTimedOutTheftKeepsVictimsName). (A holder
// whose TTL is longer than any this Client has seen, displaced by an
// answer that was lost, is the one case this bound does not cover: the
// thief that displaces that key again still reads its PTTL, and waits
// it out unless acknowledged earlier.)
//
// Chain of thieves: an attempt or lease that is robbed while it is still
// waiting for its own victim ends at once but delays its acknowledgement
// until its own victim has acknowledged or run out, and the keys it
// leaves carry the first victim's PTTL (above), so that the highest
// thief never proceeds while the first victim may still run, whatever
// the links' TTLs.
//
// TryLock by a higher priority than the holder's takes the name and, like
// Lock, returns only once the displaced holder has acknowledged or its
// validity has run out (at most its remaining PTTL plus the drift
// allowance, or until ctx ends): the one case where TryLock waits. It
// does not wait for a holder of equal or higher priority.
//
// # Waiting
//
// A release publishes the holder id on the name's channel
// ({name}:released) at every master it reaches, whether or not the key
// was still there; waiting Locks subscribe to it (multiplexed on the
// Client's pub/sub connections, read without an intermediate goroutine)
// and retry at once when a quorum of masters has announced the same
// release: an attempt started on the first announcement would mostly find
// the name still held on the others. A subscription outlives its last
// waiter by a second, so that a name passed back and forth is not
// subscribed again each time. Polling with jitter ([WithBackoff]), bounded
// by the holder's remaining PTTL ([locks.HeldError.RetryAfter]), is the
// fallback for holders that expired without a release.
//
// # Where we differ from the spec
//
// The source document (shared/specs/priority-redlock-specs.md) is marked
// unfinished and partly wrong by its author. We implement its intent,
// differently where it was unsafe:
//
//   - Its stolenConsistencyFactor let a thief stop waiting for the victim's
//     acknowledgement after a fraction of the TTL, and its edge case 2 has
//     the thief "time out as though the lock was never acquired" while the
//     victim "proceeds unhindered" — both can leave two holders. We always
//     wait for the acknowledgement or the victim's provable end of
//     validity; the factor survives only as the explicit opt-in
//     [WithUnsafeStolenConsistencyFactor], documented as unsafe.
//   - Its edge case 1 (the thief crashes before the confirmation) lets the
//     victim "hum along as if nothing happened". Here it does not: the
//     victim's lease ends with ErrPreempted when the notice arrives, or at
//     its next renewal at the latest, which finds its keys taken (or
//     gone) on a quorum; the thief's keys, which outlast the victim's
//     validity, then expire and the name is free. Letting the victim run
//     on would need its renewals to take the keys back from a thief that
//     may be alive and merely slow, which could leave two holders; ending
//     it costs the victim its lease, never exclusion.
//   - Its edge case 3 (victim notified but silent) deadlocks both until the
//     thief's TTL; here the thief waits at most the victim's remaining
//     validity, and the victim's own lease ends by then anyway because it
//     can no longer renew a quorum (the thief holds it).
//   - Its confirmation is the victim's acknowledgement; ours is sent when
//     the victim's code lets go (Release), not when it is told, unless
//     [WithImmediateAck].
//   - Its chain-of-thieves probability argument and the planned auto-tuning
//     of the wait are not needed: the chain is bounded by each victim's
//     remaining validity, at most one TTL per link.
//   - Its "caveat" of a process pausing while it holds a lock is real for
//     every language: we do not hide it; the lease context ends at its
//     deadline and fencing tokens let resources refuse a stale holder.
//   - Fencing tokens, batch renewal, release notifications and semaphores
//     are not in the spec; they come from the latchkey contract.
//
// # Connections
//
// The Client never closes the clients it is given. Give them
// ContextTimeoutEnabled: true so that a hung master cannot hold a call
// beyond the call timeout ([WithCallTimeout]); without it, the Client
// still stops waiting at the call timeout, and the client's read timeout
// ends the call. Give them MaxRetries: -1 (MaxRedirects: -1 for a
// ClusterClient), as the tests do, so that a refused dial tells the
// Client that the master took nothing (see Priorities and theft). With one
// master whose client has ContextTimeoutEnabled, calls run on the calling
// goroutine (its answer is the outcome: there is nothing to wait for in
// parallel): a context's deadline still ends them, but a plain
// cancellation does not interrupt a call to a hung master, which then
// ends at the client's read timeout.
package redlockprio
