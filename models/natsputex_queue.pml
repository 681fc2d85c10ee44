/*
 * natsputex_queue.pml: the waiting queue of a natsputex lock
 * (natsputex/queue.go, docs/protocols/natsputex.md).
 *
 * Check:   spin -a natsputex_queue.pml && cc -O2 -DSAFETY -o pan pan.c && ./pan -E -m100000
 * Seeded:  spin -DBUGGY -a natsputex_queue.pml ...   (must report an error; so must -DBUGGY2, -DBUGGY3)
 *
 * What is modelled:
 *   - A holder (H) holds the key and releases it at a time of its choosing,
 *     leaving it reserved.
 *   - N waiters join the queue in order 1..N (a pull request each, FIFO at
 *     the consumer) and sleep. The consumer hands the baton to the oldest
 *     request whose waiter is still there (the server drops a request
 *     whose reply subject lost its interest).
 *   - The head (the waiter holding the baton) waits until the key is free
 *     (blank or reserved), takes it with a conditional write, passes the
 *     baton on (NAK), holds the key for a while and releases it, reserved.
 *     Every write bumps the key's revision. A release, once its write is
 *     answered, says at which revision it left the key free (the word on
 *     the knock subject); the head may write at a revision it was told,
 *     conditional on it, without reading: the word may be stale (an
 *     earlier release's, the key taken since).
 *   - Faults, within a budget of one: a waiter dies (a head's baton comes
 *     back to the consumer T ticks after the death: AckWait, renewed by
 *     the head's +WPI while it lived), or is cancelled (a cancelled head
 *     NAKs at once); either may happen while the waiter waits or while it
 *     is the head.
 *   - Time is discrete: `now` advances only when no process can move, so
 *     every process acts as soon as it may.
 *
 * Properties (asserts):
 *   MUTEX    a waiter takes the key only while it is free;
 *   FIFO     a waiter gets the key only when every live waiter that joined
 *            before it already had it;
 *   BOUNDED  while the key is free and a live waiter has not had it, no
 *            more than T + 1 ticks pass (the AckWait of a dead head, and
 *            one tick for the delivery).
 *
 * Seeded bugs:
 *   BUGGY    a waiter that is not the head takes a free key (skips the
 *            waiters before it): FIFO fails.
 *   BUGGY2   a dead head's baton never comes back (no AckWait): BOUNDED
 *            fails.
 *   BUGGY3   the head writes at a told revision without the condition
 *            (a stale word takes a held key): MUTEX fails.
 */

#define N     3
#define T     3    /* AckWait, ticks */
#define HOLD  1    /* how long a waiter holds the key */
#define MAXT  12   /* the horizon */

byte now = 0;
byte key = 9;            /* 0: free (reserved); 9: H; i: waiter i */
byte rev = 1;            /* the revision of the key's last write */
byte told = 0;           /* the revision the last release said it freed at (0: none) */
byte freeSince = 0;

chan pulls = [N] of { byte };
byte baton = 0;           /* 0: with the consumer; i: delivered to waiter i */
bool there[N + 1];        /* the waiter still waits (not dead, cancelled, or done) */
bool dead[N + 1];
bool cancel[N + 1];
byte diedAt[N + 1];
bool granted[N + 1];

/* take: the conditional write that wins a free key, with the FIFO check:
 * every live waiter that joined before i had the key. */
inline take(i) {
	assert(key == 0);
	j = 1;
	do
	:: j < i -> assert(granted[j] || !there[j]); j++
	:: else -> break
	od;
	key = i;
	rev++;
	granted[i] = true;
	there[i] = false
}

proctype Holder() {
	byte t, r;
	do
	:: atomic { key = 0; rev++; r = rev; freeSince = now }; break   /* release, reserved */
	:: now < 4 -> t = now; (now > t)                                /* or hold one more tick */
	od;
	told = r   /* its word, once the write is answered */
}

/* Fault: at most one waiter dies or is cancelled, at a tick of its
 * choosing (or none). */
proctype Fault() {
	byte i, when, t;
	if
	:: i = 1 :: i = 2 :: i = 3 :: skip
	fi;
	if
	:: i == 0 -> goto done
	:: else -> skip
	fi;
	do
	:: break
	:: now < MAXT -> t = now; (now > t)
	od;
	if
	:: atomic { dead[i] = true; diedAt[i] = now; there[i] = false }
	:: cancel[i] = true
	fi;
done:
	skip
}

proctype Waiter(byte i) {
	byte start, j, r;
	/* joined in order by init; sleeps until it gets the baton */
	do
	:: baton == i -> break
	:: atomic { dead[i] -> goto out }
	:: atomic { cancel[i] && baton != i -> there[i] = false; goto out }
#ifdef BUGGY
	:: atomic { i == N && key == 0 && !dead[i] && !cancel[i] -> take(i) }; goto hold
#endif
	od;
	/* the head */
	do
	:: atomic { key == 0 && !dead[i] && !cancel[i] -> take(i); baton = 0 }; break   /* read, won, then NAK */
#ifndef BUGGY3
	:: atomic { told != 0 && told == rev && !dead[i] && !cancel[i] -> take(i); baton = 0 }; break   /* told: written at that revision */
#else
	:: atomic { told != 0 && !dead[i] && !cancel[i] -> take(i); baton = 0 }; break
#endif
	:: atomic { dead[i] -> goto out }   /* the baton comes back after AckWait */
	:: atomic { cancel[i] && !dead[i] -> there[i] = false; baton = 0; goto out }   /* NAK */
	od;
hold:
	start = now;
	atomic { (now >= start + HOLD) -> key = 0; rev++; r = rev; freeSince = now };
	told = r;
out:
	skip
}

/* The consumer: hands the baton to the oldest live pull request; takes a
 * dead head's back after AckWait. */
proctype Consumer() {
	byte r;
	do
	:: atomic { baton == 0 && nempty(pulls) -> pulls ? r; if :: there[r] -> baton = r :: else -> skip fi }
#ifndef BUGGY2
	:: atomic { baton != 0 && dead[baton] && now >= diedAt[baton] + T -> baton = 0 }
#endif
	od
}

/* The clock: advances when nothing else can move, and checks BOUNDED. */
proctype Clock() {
	byte j;
	bool waiting;
	do
	:: timeout ->
		atomic {
			if
			:: now >= MAXT -> break
			:: else -> skip
			fi;
			j = 1;
			waiting = false;
			do
			:: j <= N -> waiting = waiting || there[j]; j++
			:: else -> break
			od;
			if
			:: key == 0 && waiting -> assert(now - freeSince <= T + 1)
			:: else -> skip
			fi;
			now++
		}
	od
}

init {
	byte i;
	atomic {
		i = 1;
		do
		:: i <= N -> there[i] = true; pulls ! i; i++
		:: else -> break
		od;
		run Holder();
		run Consumer();
		run Clock();
		run Fault();
		i = 1;
		do
		:: i <= N -> run Waiter(i); i++
		:: else -> break
		od
	}
}
