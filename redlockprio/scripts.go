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
// KEYS[1] is the fence counter, KEYS[2..] the slot keys in slot order.
// ARGV: id, ttl ms, priority, inbox, fence floor, first slot to try (from 0).
//
// It takes the first free slot trying from the given one; failing that,
// the slot of the lowest priority below the caller's (stealing it). A
// stolen slot's key expires after the caller's TTL or the displaced
// key's PTTL, whichever is longer: the key never expires before the
// validity of any holder displaced from it has run out, whatever their
// TTLs (a chain of thieves with mixed TTLs). On a
// grant it raises the counter to at least the floor, increments it and
// returns {1, slot, counter} for a free slot, or {2, slot, counter,
// victim id, victim priority, victim pttl, victim inbox} for a theft.
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
// the token, like renewScript. It publishes the id on the channel whether or
// not the key was still there: either way this master no longer holds
// the name for the caller, and waiters wake once a quorum of masters has
// said so (see Client.dispatch). It returns 1 when it deleted the key, 0
// otherwise.
var releaseScript = redis.NewScript(scripts.Release)

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
