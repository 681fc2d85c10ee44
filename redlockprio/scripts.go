package redlockprio

import (
	"github.com/redis/go-redis/v9"

	"github.com/latchkey-go/latchkey/redlockprio/internal/scripts"
)

// Each step on a master is one of these scripts, run by SHA (EVALSHA,
// falling back to EVAL, which also loads it, on NOSCRIPT). Every key a
// script touches carries the name's hash tag, so a master may be a Redis
// Cluster.
//
// A slot key is a hash: id (the lease's unique holder id), p (priority),
// ch (the holder's inbox channel) and, after a theft, from (the id of the
// holder it displaced). The fence key is the name's counter; it never
// expires and only grows.

// acquireScript takes one slot of a name on this master.
//
// KEYS[1] is the fence counter, KEYS[2..] the slot keys in slot order,
// then, for a Locker, the name's waiter queue and its expiries (see
// queue.go). ARGV: id, ttl ms, priority, inbox, fence floor, first slot
// to try (from 0), and for a Locker the caller's queue member ("-" when
// it has none).
//
// A Locker's call first looks at the queue: when its head is another
// waiter of a priority at least the caller's, the answer is "held" by
// that member, for as long as its entry has left. The caller's member
// leaves the queue at its lease's release (releaseScript), or when the
// Lock returns (dequeueScript), not on a grant: a grant on a minority of
// masters must not lose its place there, which would order the queue
// differently on different masters.
//
// It takes the first free slot trying from the given one; failing that,
// the slot of the lowest priority below the caller's (stealing it). A
// stolen slot's key expires after the caller's TTL or the displaced
// key's PTTL, whichever is longer: the key never expires before the
// validity of any holder displaced from it has run out, whatever their
// TTLs (a chain of thieves with mixed TTLs). On a
// grant it raises the counter to at least the floor, increments it and
// returns {1, slot, counter} for a free slot, or {2, slot, counter,
// victim id, victim priority, victim pttl, victim inbox, the id the
// victim's key was taken from ("" if none)} for a theft.
// When every slot is held it returns {0, 0, counter, holder id, smallest
// pttl}.
var acquireScript = redis.NewScript(scripts.Acquire)

// renewScript extends one slot key if it is still the caller's.
//
// KEYS[1] is the slot key, KEYS[2] the fence counter. ARGV: id, ttl ms,
// token. It first raises the counter to the lease's token (so that the
// token reaches every master it can), then returns 1 when the key is the
// caller's (it extends it to the TTL, never shortens it: a thief's key
// keeps the longer PTTL of the key it displaced), -1 when a higher
// priority took it from this id, 0 when it is gone or someone else's.
var renewScript = redis.NewScript(renewSource)

const renewSource = scripts.Renew

// releaseScript deletes one slot key if it is still the caller's and then
// tells the name's waiters.
//
// KEYS[1] is the slot key, KEYS[2] the fence counter. ARGV: id, token,
// release channel ("" for none: a failed attempt tells nobody, so that
// waiters do not wake each other in a loop), and optionally "1" to keep
// the key if the caller took it from another holder (its 'from' field):
// a failed attempt cleaning up where it did not see the answer, so that
// a victim it never told is not left without its key while it still runs
// (set after the victim's, the key outlasts its validity, and the
// victim's renewals see that it was displaced). It raises the counter to
// the token, like renewScript. With KEYS[3] and KEYS[4] (the name's
// queue and its expiries: a release, or a failed attempt's deletion, of
// the first slot), it takes the member ARGV[5] (the lease's, if it
// waited in the queue; a failed attempt passes none: its waiter keeps
// its place) out of the queue and, when the slot is then free, wakes the
// queue's head: "W|member" on its inbox — unless the head is ARGV[6], the
// failed attempt's own waiter, which knows from the attempt's answers
// that it got this master (see Client.grantedBy): woken by its own
// deletions, a head with a wake-up standing from a master whose answers
// do not come in time would count them as a quorum and try again at
// once, in a loop, while the name is held. It publishes the id on the channel whether or
// not the key was still there: either way this master no longer holds
// the name for the caller, and waiters wake once a quorum of masters has
// said so (see Client.dispatch). It returns 1 when it deleted the key, 0
// otherwise.
var releaseScript = redis.NewScript(scripts.Release)

// ticketScript increments the name's ticket counter (KEYS[1]) and
// returns it: a waiter's ticket is the largest over a quorum (queue.go).
var ticketScript = redis.NewScript(scripts.Ticket)

// enqueueScript puts (or puts back) a waiter in the name's queue.
//
// KEYS: the queue, its expiries, the ticket counter, the name's first
// slot key. ARGV: member, priority, entry lifetime ms, ticket. It raises
// the counter to the ticket, sets the entry to expire after the lifetime
// by the master's clock, and returns {1, 0, 0} when the member is the
// head and the slot is free (the waiter should try now), else {0, its
// rank in the queue (0 for the head), ms the head's entry has left}.
var enqueueScript = redis.NewScript(scripts.Enqueue)

// dequeueScript takes a waiter out of the name's queue: KEYS the queue,
// its expiries and the name's first slot key, ARGV[1] the member. When
// it was there and the slot is free, it wakes the new head. It returns
// 1 when it removed the member.
var dequeueScript = redis.NewScript(scripts.Dequeue)

// raiseScript raises the fence counter KEYS[1] to at least ARGV[1] and
// returns its value. With a slot key KEYS[2] and a holder id ARGV[2] (an
// acquisition writing its token back), it returns -1 instead when that
// key is not the holder's (a thief took it, or it is gone): the counter
// then does not record the token for the holder, since a thief's grant
// may have read it before it was raised.
var raiseScript = redis.NewScript(scripts.Raise)

// identScript tells whether this server already answered to another of
// the Client's masters: KEYS[1] is the Client's own identity key, ARGV
// the master's index and the key's lifetime in ms. It returns the index
// of the first master that reached this server: a different index means
// two masters are the same server (or the same cluster node).
var identScript = redis.NewScript(scripts.Ident)
