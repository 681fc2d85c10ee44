/*
 * natsputex_takeover.pml: putex's takeover (natsputex.Supervisor, and the
 * Locker's lease, which follows the same rules) on one NATS KV key.
 *
 * Check:   spin -a natsputex_takeover.pml && cc -O2 -DSAFETY -o pan pan.c && ./pan -E -m100000
 * Seeded:  spin -DBUGGY -a natsputex_takeover.pml ...   (must report an error; so must -DBUGGY2)
 * Trail:   spin -DBUGGY -t natsputex_takeover.pml   (one line per event; -p -g for every step)
 *
 * What is modelled (natsputex/doc.go, natsputex/supervisor.go):
 *   - Two agents (tokens 1 and 2) on one key, each running the pump: read
 *     the key; free or its own token -> health check, write at the revision
 *     read, start the service; another token -> stop, health check, wait
 *     until the key has gone T = F*R without a write by its own clock,
 *     health check, take over at the revision read, confirm with C*R of
 *     rewrites, and the next stroke starts the service. A stroke lasts at
 *     least R.
 *   - The expiry timer: a holder stops its service by itself once
 *     T - margin has passed since the start of its last successful write.
 *   - The Supervisor's Start and Stop: Start is instantaneous (the service
 *     counts as running from the moment Start begins); Stop takes 0 or
 *     STOPMAX ticks (the extremes) and the service runs until it returns.
 *     Start and Stop exclude each other (svcMu). A failed health check or write stops the service,
 *     then makes one attempt to blank the key at the agent's last revision.
 *   - Health checks may fail (they take no time: a slow check only delays
 *     the writes, whose own timing is modelled).
 *   - Every write is a compare-and-set on the key's revision (create of a
 *     missing key, update at the revision read). Each write may, within a
 *     fault budget of MAXF: succeed; land but lose its reply (the caller
 *     times out); be lost; be replayed later (the caller times out, the
 *     request lands 1..REPLAYMAX ticks after it was sent if the revision
 *     still matches, as nats.go's re-sent request did); or cut its agent off
 *     for good (this and every later write of that agent is lost).
 *   - A paused holder: a pump may stall for PAUSE ticks at the start of a
 *     stroke, and the expiry timer may fire LATE ticks late.
 *   - Time is discrete: one global tick counter `now`, advanced only when
 *     no process can move (Promela's timeout), so every agent acts as soon
 *     as its timers allow; all clocks run at the same rate (the one
 *     assumption the docs make), but an agent only measures intervals from
 *     what it saw itself: the waiter's T is counted from the moment the
 *     key's current revision landed, which is the earliest it could see it
 *     (the watch delivers at once: the adversarial case).
 *
 * Parameters (ticks): R = 2, F = 3 (T = 6), margin = 1 (validity 5),
 * C = 2 (the confirmation writes are R apart), STOPMAX = 3, LATE = 1.
 * The documented bound is that Stop has margin + C*R = 5 ticks from the
 * end of the hold: here the slowest stop plus a late timer takes 4. The
 * bound is tight: with -DSTOPMAX=4 (stop and late timer use all 5 ticks)
 * the fixed rule fails too, the successor starting in the tick the Stop
 * returns. STOPMAX, LATE, HMAX and MAXF may be set with -D.
 *
 * Within the fault budget of 2, a late timer matters only when the pump
 * is not already stopping the service (a pump whose write is bounded by
 * the hold's deadline aborts at that deadline itself): after a pump pause.
 *
 * Properties (asserts, checked whenever a service starts):
 *   P1  never two services running at once (the Supervisor's promise);
 *   P2  a service never starts while the other agent is active and still
 *       within the validity of its last successful write (two leases
 *       believed valid at once).
 *
 * Seeded bug (-DBUGGY): issue 15 point 2. An agent whose takeover write
 * landed but whose reply was lost (or whose request was replayed late) sees
 * "takeover failed"; its next stroke finds its own token in the key, takes
 * the "mine" branch and starts the service at once, without the C
 * confirmations, while the cut-off holder's Stop may still run: P1 fails.
 * The fixed rule: an agent that finds its own token while it does not
 * believe it holds the key (phase standby) confirms for C*R like any
 * takeover before it starts; it may start at once only on a free key.
 *
 * Seeded bug (-DBUGGY2): a taker-over that gives up while it confirms
 * (Run's context ends, natslock gets SIGTERM, a Lock's context is
 * cancelled) blanks the key; the next agent finds it free and starts at
 * once, while the cut-off holder's Stop, which counts on margin + C*R,
 * still runs: P1 fails (TestConfirmerThatGivesUpLeavesItsLastWrite). The fixed rule: a
 * hold whose confirmations did not finish is never blanked; the key keeps
 * its last write, so the next agent waits T without a write (here: finds
 * its own token and confirms, which starts no sooner) and confirms. Only
 * holds that finished confirming (or took a free key) blank on the way
 * out.
 *
 * Not modelled: more than two agents; read failures (an agent that holds
 * renews at its last revision, the same write); the cluster's own
 * consistency (the CAS is assumed linearizable: issue 15 point 1 is about
 * servers where it is not); clock rate differences; Run's shutdown by an
 * active agent (it blanks after Stop returned, as abort does); the timing
 * carried in the key's value (one R, F and C here: the carried maximum is
 * tested by TestConfirmerCrashKeepsCutOffHoldersBound); duplicate tokens; pauses longer than the documented bound (the docs say
 * fencing tokens are then what protects); the time writes take when they
 * succeed (they land at once, the adversarial case for the waiter). The
 * time horizon is HMAX ticks: runs end there, so pan runs with -E (no
 * end-state check).
 */

#define R        2
#define F        3
#define T        (F * R)
#define MARGIN   1
#define VALID    (T - MARGIN)
#define EVERY    2   /* min(R, VALID/2) */
#define STEPS    2   /* C*R / EVERY with C = 2 */
#ifndef STOPMAX
#define STOPMAX 3
#endif
#ifndef LATE
#define LATE 1
#endif
#define PAUSE    4
#define REPLAYMAX 4
#ifndef HMAX
#define HMAX 14
#endif
#ifndef MAXF
#define MAXF 2
#endif

#define STANDBY    0
#define CONFIRMING 1
#define ACTIVE     2

/* write outcomes: mtype, so that trails print them by name */
mtype = { REPLAYED, LOSTREQ, LOSTREPLY, CONFLICT, OK };

byte now;                 /* the one clock, in ticks */
byte krev;                /* the key's revision: 0 = missing */
byte kholder;             /* its token: 0 = free (missing or blank) */
byte kstamp;              /* when the current revision landed */

byte phase[2];
byte lastRev[2];          /* revision of the agent's last successful write */
byte deadline[2];         /* start of that write + VALID */
bool up[2];               /* the service may be running (Start .. Stop returned) */
bool svcBusy[2];          /* svcMu */
bool cut[2];
byte faults;

bool pend;                /* one replayed request in flight */
byte pExp, pVal, pAt;

active proctype Clock() {
	do
	:: atomic { timeout && now < HMAX -> now++ }
	od
}

active proctype Net() {
end:
	do
	:: atomic {
		pend && now >= pAt ->
		if
		:: krev == pExp -> krev++; kholder = pVal; kstamp = now;
			printf("t=%d net: replayed write of %d lands as rev %d\n", now, pVal, krev)
		:: else
		fi;
		pend = 0
	   }
	od
}

#define other(i) (1 - (i))

/* waitUntil: block until the clock reaches t (a variable), then forget t. */
inline waitUntil(t) {
	atomic { now >= t -> t = 0 }
}

/* stopService: Stop runs (0..STOPMAX ticks) if the service may be up. */
inline stopService(i) {
	atomic { !svcBusy[i] -> svcBusy[i] = 1 };
	if
	:: up[i] ->
		printf("t=%d agent %d: Stop begins\n", now, i + 1);
		if
		:: skip
		:: sEnd = now + STOPMAX; waitUntil(sEnd)
		fi;
		up[i] = 0;
		printf("t=%d agent %d: Stop returned, service down\n", now, i + 1)
	:: else
	fi;
	svcBusy[i] = 0
}

/* healthCheck: may fail within the fault budget. */
inline healthCheck() {
	atomic {
		if
		:: hcok = 1
		:: faults < MAXF -> faults++; hcok = 0;
			printf("t=%d agent %d: health check fails\n", now, me)
		fi
	}
}

/*
 * write: compare-and-set val over revision exp, bounded by tmo ticks
 * (writeContext: the hold's deadline when holding, else R). Sets wres and,
 * on success, nrev; wstart is when it began.
 */
inline write(i, exp, val, tmo) {
	wstart = now;
	atomic {
		if
		:: cut[i] -> wres = LOSTREQ
		:: !cut[i] && krev != exp -> wres = CONFLICT
		:: !cut[i] && krev == exp ->
			if
			:: wres = OK
			:: faults < MAXF -> faults++; wres = LOSTREPLY
			:: faults < MAXF -> faults++; wres = LOSTREQ
			:: faults < MAXF -> faults++; wres = LOSTREQ; cut[i] = 1
			:: faults < MAXF && !pend -> faults++; wres = REPLAYED;
				pend = 1; pExp = exp; pVal = val;
				if :: pAt = now + 1 :: pAt = now + REPLAYMAX fi
			fi
		fi;
		if
		:: wres == OK || wres == LOSTREPLY ->
			krev++; kholder = val; kstamp = now; nrev = krev
		:: else
		fi;
		printf("t=%d agent %d: write %d at rev %d: %e (key: rev %d holder %d)\n",
			now, i + 1, val, exp, wres, krev, kholder)
	};
	if
	:: wres == LOSTREPLY || wres == LOSTREQ || wres == REPLAYED ->
		sEnd = wstart + tmo;
		waitUntil(sEnd)   /* the caller learns nothing before its timeout */
	:: else
	fi
}

/* writeTimeout: writeContext's bound, in ticks from now. */
inline writeTimeout(i) {
	if
	:: (phase[i] == ACTIVE || phase[i] == CONFIRMING) && deadline[i] > now ->
		tmo = deadline[i] - now
	:: else -> tmo = R
	fi
}

inline wrote(i) {
	lastRev[i] = nrev;
	deadline[i] = wstart + VALID
}

/* lose: the key was taken away (or a confirmation failed): stop. */
inline lose(i) {
	phase[i] = STANDBY;
	stopService(i)
}

/* abort: stop the service, then one attempt to blank the key at the last revision. */
inline abort(i) {
	x = lastRev[i];
	phase[i] = STANDBY;
	stopService(i);
	if
	:: x != 0 -> write(i, x, 0, R)
	:: else
	fi
}

inline activate(i) {
	atomic {
		!svcBusy[i] ->
		up[i] = 1;
		printf("t=%d agent %d: Start: service running (agent %d: up %d)\n", now, i + 1, other(i) + 1, up[other(i)]);
		assert(!up[other(i)]);                                            /* P1 */
		assert(!(phase[other(i)] == ACTIVE && now < deadline[other(i)])); /* P2 */
		if
		:: phase[i] != STANDBY || deadline[i] >= now -> phase[i] = ACTIVE; held = 1
		:: else -> held = 0
		fi
	};
	if
	:: !held -> stopService(i)
	:: else
	fi
}

/*
 * confirm: C*R of rewrites after a takeover; the next stroke starts.
 * Before each rewrite the agent may give up (within the fault budget):
 * Run's context ends (shutdown, natslock's SIGTERM), or a Lock's context
 * is cancelled. It then stops (its service is not running) and, fixed,
 * leaves its last write in the key; -DBUGGY2 blanks it, as Run's shutdown
 * and the Locker's abandon did. Its next stroke is that of the agent run
 * again (or of any agent that did not see the key: a restarted Run
 * counts the key from its first read).
 */
inline confirm(i) {
	step = 1;
	do
	:: atomic { faults < MAXF -> faults++;
			printf("t=%d agent %d: gives up while confirming\n", now, me) };
		x = lastRev[i];
		phase[i] = STANDBY;
		stopService(i);
#ifdef BUGGY2
		write(i, x, 0, R);
#endif
		break
	:: sEnd = now + EVERY;
		waitUntil(sEnd);
		if
		:: step == STEPS -> break
		:: else
		fi;
		writeTimeout(i);
		write(i, lastRev[i], me, tmo);
		if
		:: wres != OK -> lose(i); break
		:: else -> wrote(i); step++
		fi
	od
}

/* The expiry timer: the hold runs out T - margin after the last write began. */
proctype Expiry(byte i) {
	byte d, sEnd;
	bool x;
end:
	do
	:: atomic { phase[i] != STANDBY && now >= deadline[i] -> phase[i] = STANDBY;
			printf("t=%d agent %d: hold ran out\n", now, i + 1) };
		stopService(i)
	:: atomic { phase[i] != STANDBY && now >= deadline[i] && faults < MAXF -> faults++ };
		/* paused: the timer fires LATE ticks late */
		sEnd = now + LATE;
		waitUntil(sEnd);
		atomic {
			if
			:: phase[i] != STANDBY && now >= deadline[i] -> phase[i] = STANDBY; x = 1;
				printf("t=%d agent %d: hold ran out (the timer fired late)\n", now, i + 1)
			:: else -> x = 0
			fi
		};
		if
		:: x -> stopService(i)
		:: else
		fi
	od
}

proctype Agent(byte i) {
	byte me = i + 1;
	byte begin, rrev, rholder, d, sEnd, wstart, nrev, tmo, x, step;
	mtype wres;
	bool hcok, held;
end:
	do
	:: begin = now;
		if
		:: skip
		:: atomic { faults < MAXF -> faults++;   /* a paused pump */
			printf("t=%d agent %d: pump paused\n", now, me) };
			sEnd = now + PAUSE;
			waitUntil(sEnd)
		fi;
		atomic { rrev = krev; rholder = kholder };
		if
		:: rholder != 0 && rholder != me -> goto standby
		:: else
		fi;
		/* sunny: the key is free or holds our token */
		healthCheck();
		if
		:: !hcok -> abort(i); goto endstroke
		:: else
		fi;
		writeTimeout(i);
		write(i, rrev, me, tmo);
		if
		:: wres != OK -> abort(i); goto endstroke
		:: else
		fi;
#ifdef BUGGY
		/* today's rule: mine is mine, start at once */
		atomic { wrote(i) };
		if
		:: phase[i] != ACTIVE -> activate(i)
		:: else
		fi;
#else
		/* the fixed rule: our token found while not holding is a takeover */
		if
		:: phase[i] == STANDBY && rholder == me ->
			atomic { phase[i] = CONFIRMING; wrote(i);
				printf("t=%d agent %d: own token while standby: confirming\n", now, me) };
			confirm(i)
		:: else ->
			atomic { wrote(i) };
			if
			:: phase[i] != ACTIVE -> activate(i)
			:: else
			fi
		fi;
#endif
		goto endstroke;
standby:
		if
		:: phase[i] != STANDBY -> lose(i)
		:: else
		fi;
		healthCheck();
		if
		:: !hcok -> goto endstroke
		:: else
		fi;
		/* T of silence by our clock, or a change (the watch) */
		(krev != rrev || now >= kstamp + T);
		if
		:: krev != rrev -> goto endstroke
		:: else
		fi;
		healthCheck();
		if
		:: !hcok -> goto endstroke
		:: else
		fi;
		write(i, rrev, me, R);
		if
		:: wres != OK -> goto endstroke   /* "takeover failed" */
		:: else
		fi;
		atomic { phase[i] = CONFIRMING; wrote(i);
			printf("t=%d agent %d: took over, confirming\n", now, me) };
		confirm(i);
endstroke:
		atomic { sEnd = begin + EVERY; rrev = 0; rholder = 0; wstart = 0; wres = OK; nrev = 0; tmo = 0; x = 0; step = 0; hcok = 0; held = 0 };
		waitUntil(sEnd); begin = 0
	od
}

init {
	atomic {
		run Agent(0); run Agent(1);
		run Expiry(0); run Expiry(1)
	}
}
