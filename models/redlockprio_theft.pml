/*
 * redlockprio_theft.pml: Redlock with priorities and lock theft
 * (redlockprio's Lock on one name, with its chain of thieves).
 *
 * Check:   spin -a redlockprio_theft.pml && cc -O2 -DSAFETY -DCOLLAPSE -o pan pan.c && ./pan -E -m100000
 * Seeded:  spin -DBUGGY -a redlockprio_theft.pml ...   (must report an error)
 * Trail:   spin -DBUGGY -t redlockprio_theft.pml
 *
 * What is modelled (redlockprio/doc.go, "Priorities and theft"):
 *   - NM = 3 masters, quorum 2; one master may be dead from the start (a
 *     dead minority: every call to it fails).
 *   - Three clients with priorities 1, 2 and 3 (a client's id is its
 *     priority), each with its own TTL, SHORT or LONG, chosen at the start;
 *     each makes one Lock at a tick of its choosing (0..STARTMAX-1).
 *   - The acquire script, one atomic step per master, the masters visited
 *     in turn (other clients' scripts interleave between them): it takes a
 *     free or expired key, or steals a key of a strictly lower priority and
 *     returns the displaced holder and the key's remaining PTTL. A quorum of
 *     grants and thefts wins; the lease is valid until start + TTL (drift is
 *     0 in ticks). An attempt without a quorum deletes the keys it took
 *     free, leaves those it stole to expire and never acknowledges a notice
 *     about them (it "kept" them), and tells its victims.
 *   - A winner that displaced holders tells each victim (a notice that may
 *     be lost) and waits until each has acknowledged or its bound has
 *     passed: the largest PTTL the victim's keys had when displaced. Only
 *     then does it proceed (its critical section).
 *   - A victim's lease ends at its next step after the notice (its code
 *     lets go at once) and it acknowledges, unless it is itself a thief
 *     still waiting for its own victims (the chain of thieves): then it
 *     acknowledges only when that wait is over. Acknowledgements may be
 *     lost.
 *   - Every tick a holder or waiting thief renews the keys it still holds;
 *     fewer than a quorum ends its lease. A holder may release (delete its
 *     keys) at any tick.
 *   - Faults (at most MAXF in a run): a client cut off for good (its
 *     renewals fail, it hears no notice, sends no acknowledgement: it runs
 *     until its validity ends), a lost notice, a lost acknowledgement, a
 *     waiting thief's Locker closed (it stops renewing and never
 *     acknowledges; its keys are left to expire).
 *   - Time is discrete: one tick counter, advanced only when no process can
 *     move (Promela's timeout). A tick is one renewal interval; TTLs are
 *     SHORT = 3 or LONG = 6 ticks.
 *
 * Property (assert when a client proceeds): no other client may still run,
 * i.e. has proceeded, has not let go, and is within its validity. This is
 * the promise "the highest thief never proceeds while the first victim may
 * still run", for any chain, and plain Redlock mutual exclusion.
 *
 * Seeded bug (-DBUGGY): issue 16 point 1. A thief's key gets the thief's own
 * TTL (and renewals set it to now + TTL), so the top thief's wait bound, the
 * PTTL of the key it displaced (the middle thief's), can end before the
 * first victim's validity: with p1 on LONG cut off, p2 on SHORT stealing
 * from p1 and p3 stealing from p2, p3 proceeds while p1 still runs. The
 * same when the waiting p2 is closed or cut off instead: its keys expire
 * at its own TTL, and a later client takes the name free, without any
 * wait, while p1 still runs (both are in issue 16).
 * The fixed rule: a thief's key never expires before the key it displaced
 * would have (max of the two), and renewals never shorten a key, so every
 * displaced holder's validity is covered by the keys that displaced it.
 *
 * Not modelled: clock drift and clock jumps (every clock is the one tick
 * counter); masters restarting empty (documented as unsafe); semaphores
 * (one slot); fencing tokens; the release notice's wake-ups (waiters
 * retry by polling here: each client makes one attempt); an acquisition
 * that spans ticks (all of an attempt's scripts run in one tick, in any
 * interleaving with the others); a failed attempt deleting its stolen keys
 * once their victims acknowledged (it leaves them to expire, which only
 * waits longer); WithImmediateAck and WithUnsafeStolenConsistencyFactor.
 * Runs end at the horizon HMAX, so pan runs with -E (no end-state check).
 * pan is compiled with -DCOLLAPSE (lossless state compression: about 7
 * million states); -DBFS gives the shortest counterexample.
 */

#define NM     3
#define Q      2
#define NC     3
#define SHORT  3
#define LONG   6
#define STARTMAX 5
#define HMAX   8
#define MAXF   2

#define IDLE    0
#define WAITING 1
#define RUNNING 2
#define DONE    3

byte now;

byte kh[NM];             /* holder of the name's key at each master: 0 = none */
byte kexp[NM];           /* when it expires */
bool dead[NM];

byte ttl[NC + 1];        /* per client, index 1..3 (= priority) */
byte st[NC + 1];
byte dl[NC + 1];         /* validity: the lease may be used while now < dl */
bool ended[NC + 1];      /* the lease ended (robbed, lost, released) */
bool ran[NC + 1];        /* it proceeded */
bool settled[NC + 1];    /* not waiting for victims (any more) */
bool nomore[NC + 1];     /* never acknowledges (closed, or kept stolen keys) */
bool cut[NC + 1];
byte victims[NC + 1];    /* bit v: client v was displaced by this one */
byte untilv[(NC + 1) * (NC + 1)]; /* [c*4+v]: bound of c's wait for v */
byte acks[NC + 1];       /* bit v: v acknowledged this client */
byte notes[NC + 1];      /* bit t: a notice from thief t arrived */
byte owed[NC + 1];       /* bit t: t is owed an acknowledgement */
byte faults;

#define bit(x)    (1 << (x))
#define mayRun(o) (ran[o] && !ended[o] && now < dl[o])

active proctype Clock() {
	do
	:: atomic { timeout && now < HMAX -> now++ }
	od
}

/* tell: c's notices to its victims; each may be lost. */
inline tell(c) {
	v = 1;
	do
	:: v > NC -> break
	:: v <= NC ->
		if
		:: victims[c] & bit(v) ->
			if
			:: cut[v] -> skip
			:: !cut[v] -> notes[v] = notes[v] | bit(c)
			:: !cut[v] && faults < MAXF -> faults++;
				printf("t=%d notice from %d to %d lost\n", now, c, v)
			fi
		:: else
		fi;
		v++
	od;
	v = 0
}

/* script: the acquire script of client c on master m. */
inline script(c, m) {
	atomic {
		if
		:: dead[m] -> skip
		:: !dead[m] && (kh[m] == 0 || now >= kexp[m]) ->
			kh[m] = c; kexp[m] = now + ttl[c]; got++
		:: !dead[m] && kh[m] != 0 && now < kexp[m] && kh[m] < c ->
			v = kh[m];
			victims[c] = victims[c] | bit(v);
			if
			:: kexp[m] > untilv[c * 4 + v] -> untilv[c * 4 + v] = kexp[m]
			:: else
			fi;
			stole = stole | bit(m);
			kh[m] = c;
#ifdef BUGGY
			kexp[m] = now + ttl[c];
#else
			if
			:: now + ttl[c] > kexp[m] -> kexp[m] = now + ttl[c]
			:: else
			fi;
#endif
			printf("t=%d client %d steals master %d from %d (its key's PTTL %d, new expiry %d)\n",
				now, c, m, v, untilv[c * 4 + v] - now, kexp[m]);
			got++; v = 0
		:: !dead[m] && kh[m] != 0 && now < kexp[m] && kh[m] >= c -> skip
		fi
	}
}

inline proceed(c) {
	ran[c] = 1; st[c] = RUNNING;
	printf("t=%d client %d proceeds (valid until %d)\n", now, c, dl[c]);
	v = 1;
	do
	:: v > NC -> break
	:: v <= NC ->
		if
		:: v != c && mayRun(v) ->
			printf("t=%d client %d proceeds while client %d may still run (until %d)\n", now, c, v, dl[v])
		:: else
		fi;
		assert(v == c || !mayRun(v));
		v++
	od;
	v = 0
}

proctype Client(byte c) {
	byte nxt, got, stole, v, m, n, start;
	bool over;

	/* idle until a tick of its choosing */
	do
	:: atomic { now >= nxt && now < STARTMAX -> nxt = now + 1 }
	:: atomic { now >= nxt -> break }
	od;
	start = now;
	m = 0;
	do
	:: m < NM -> script(c, m); m++
	:: m == NM -> break
	od;
	atomic {
		m = 0;
		if
		:: got >= Q ->
			dl[c] = start + ttl[c]; start = 0;
			if
			:: victims[c] == 0 -> settled[c] = 1; proceed(c)
			:: else -> st[c] = WAITING;
				printf("t=%d client %d wins by theft: waits\n", now, c);
				tell(c)
			fi
		:: else ->
			/* failed: delete the free keys, keep the stolen ones */
			do
			:: m == NM -> break
			:: m < NM ->
				if
				:: !dead[m] && kh[m] == c && !(stole & bit(m)) -> kh[m] = 0
				:: else
				fi;
				m++
			od;
			tell(c);
			if
			:: stole != 0 -> nomore[c] = 1
			:: else
			fi;
			st[c] = DONE; ended[c] = 1; settled[c] = 1; start = 0;
			printf("t=%d client %d fails (%d of %d)\n", now, c, got, NM)
		fi;
		m = 0; got = 0; stole = 0;
		nxt = now + 1
	};
	do
	:: st[c] == DONE || cut[c] -> break
	:: atomic {
		st[c] != DONE && !cut[c] && now >= nxt ->
		/* renew what it still holds */
		if
		:: (st[c] == WAITING || st[c] == RUNNING) && !ended[c] && !cut[c] ->
			n = 0; m = 0;
			do
			:: m == NM -> break
			:: m < NM ->
				if
				:: !dead[m] && kh[m] == c ->
#ifdef BUGGY
					kexp[m] = now + ttl[c];
#else
					if
					:: now + ttl[c] > kexp[m] -> kexp[m] = now + ttl[c]
					:: else
					fi;
#endif
					n++
				:: else
				fi;
				m++
			od;
			if
			:: n >= Q -> dl[c] = now + ttl[c];
				printf("t=%d client %d renews on %d of %d: valid until %d\n", now, c, n, NM, dl[c])
			:: else -> ended[c] = 1;
				printf("t=%d client %d: renewal on %d of %d: lease lost\n", now, c, n, NM)
			fi;
			n = 0; m = 0
		:: else
		fi;
		/* notices: the lease ends at once */
		if
		:: notes[c] != 0 ->
			ended[c] = 1; owed[c] = owed[c] | notes[c]; notes[c] = 0;
			printf("t=%d client %d preempted\n", now, c)
		:: else
		fi;
		/* a waiting thief: every victim acknowledged or past its bound */
		if
		:: st[c] == WAITING ->
			over = 1; v = 1;
			do
			:: v > NC -> break
			:: v <= NC ->
				if
				:: (victims[c] & bit(v)) && !(acks[c] & bit(v)) && now < untilv[c * 4 + v] -> over = 0
				:: else
				fi;
				v++
			od;
			v = 0;
			if
			:: over ->
				settled[c] = 1;
				if
				:: !ended[c] && now < dl[c] -> proceed(c)
				:: else -> st[c] = DONE
				fi
			:: else
			fi;
			over = 0
		:: else
		fi;
		/* acknowledgements owed, once settled */
		if
		:: owed[c] != 0 && settled[c] && !nomore[c] && !cut[c] ->
			v = 1;
			do
			:: v > NC -> break
			:: v <= NC ->
				if
				:: owed[c] & bit(v) ->
					if
					:: acks[v] = acks[v] | bit(c)
					:: faults < MAXF -> faults++;
						printf("t=%d ack from %d to %d lost\n", now, c, v)
					fi
				:: else
				fi;
				v++
			od;
			v = 0; owed[c] = 0
		:: else
		fi;
		/* the client's own moves */
		if
		:: skip
		:: st[c] == RUNNING && !ended[c] && !cut[c] ->   /* release */
			m = 0;
			do
			:: m == NM -> break
			:: m < NM ->
				if
				:: !dead[m] && kh[m] == c -> kh[m] = 0
				:: else
				fi;
				m++
			od;
			m = 0; ended[c] = 1; st[c] = DONE;
			printf("t=%d client %d releases\n", now, c)
		:: (st[c] == WAITING || st[c] == RUNNING) && !cut[c] && faults < MAXF ->
			faults++; cut[c] = 1;
			printf("t=%d client %d cut off\n", now, c)
		:: st[c] == WAITING && faults < MAXF ->   /* its Locker closes */
			faults++; ended[c] = 1; nomore[c] = 1; st[c] = DONE; settled[c] = 1;
			printf("t=%d client %d closed while waiting\n", now, c)
		fi;
		if
		:: st[c] == RUNNING && ended[c] && owed[c] == 0 -> st[c] = DONE
		:: else
		fi;
		nxt = now + 1
	   }
	od;
	nxt = 0;
	/* done (or cut off, hearing nothing): answer late notices at once */
end:
	do
	:: atomic {
		notes[c] != 0 && !cut[c] ->
		owed[c] = notes[c]; notes[c] = 0;
		if
		:: !nomore[c] ->
			v = 1;
			do
			:: v > NC -> break
			:: v <= NC ->
				if
				:: owed[c] & bit(v) -> acks[v] = acks[v] | bit(c)
				:: else
				fi;
				v++
			od;
			v = 0
		:: else
		fi;
		owed[c] = 0
	   }
	od
}

init {
	atomic {
		if
		:: skip
		:: dead[NM - 1] = 1
		fi;
		if :: ttl[1] = SHORT :: ttl[1] = LONG fi;
		if :: ttl[2] = SHORT :: ttl[2] = LONG fi;
		if :: ttl[3] = SHORT :: ttl[3] = LONG fi;
		run Client(1); run Client(2); run Client(3)
	}
}
