/*
 * amqpsem_semaphore.pml: the persistent semaphore of the amqp-locks
 * specification (amqpsem's Semaphore and Admin) on one name.
 *
 * Check:   spin -a amqpsem_semaphore.pml && cc -O2 -DSAFETY -DCOLLAPSE -o pan pan.c && ./pan -m200000
 * Seeded:  spin -DBUGGY -a amqpsem_semaphore.pml ...          (must report an error)
 *          spin -DBUGGY_LAYOUT -a amqpsem_semaphore.pml ...   (must report an error)
 * Trail:   spin -DBUGGY -t amqpsem_semaphore.pml
 *
 * What is modelled (amqpsem/doc.go, amqpsem/admin.go):
 *   - Queues on one broker: slot queues A[l][1..SMAX] and holder queues
 *     B[l][1..SMAX] in two layouts l (0: DefaultLayout "N-i-A"/"N-i-B",
 *     1: PythonLayout "N-A-i"/"N-B-i"). B queues are exclusive: a declare of
 *     one that exists fails (RESOURCE_LOCKED). SMAX stands for the name's
 *     SlotLimit: no slot number above it exists.
 *   - Two administrators, one per layout (the default-layout one makes up
 *     to OPS = 2 changes, the Python-layout one 1), each change made
 *     under the administration mutex N (one queue for both layouts): find
 *     the maximum C by probing A[1], A[2]... in order; create or grow to s
 *     (refused when the other layout's A[1] exists), declaring A[C+1..s] in
 *     order; shrink to s or destroy (s = 0), deleting A[C..s+1] in
 *     descending order, each delete a step of its own; then release the
 *     mutex. After a shrink it may wait for the holders of removed slots
 *     (WaitReleased: read C, probe every B above it, one probe a step;
 *     done when none was held, else poll again). It need not wait.
 *   - Two clients, each of a layout chosen at the start, acquiring in a
 *     loop: scan from slot 1 (probe A[L]: missing -> fail and retry later;
 *     probe B[L]: held -> next L; else declare B[L]; RESOURCE_LOCKED ->
 *     start again from 1, at most twice), verify A[L] before the lease is
 *     handed out (else delete B[L]), then hold: verify again at any time
 *     (A[L] gone -> the lease ends, ErrSlotRemoved, and B[L] is deleted
 *     after), or release (delete B[L]) at any time. A crash is a release
 *     (the broker deletes the exclusive queue).
 *   - At the start the semaphore exists with 2 slots in the default
 *     layout; a change picks any size 0..SMAX.
 *   - Every probe, declare and delete is one atomic step; steps of
 *     different processes interleave freely (untimed model).
 *
 * Properties (asserts):
 *   P1  at most N holders: the live leases of a layout never exceed the
 *       largest size an administrator has promised for it and not yet
 *       taken back: its current C, and the C before every shrink whose
 *       wait has not completed (holders of removed slots count until then);
 *   P2  WaitReleased reports done only when no lease on a removed slot
 *       (A[l][L] missing) of its layout is live;
 *   P3  one name, one layout: slot queues of both layouts never exist at
 *       once (issue 18 point 2).
 *
 * Seeded bugs:
 *   -DBUGGY         issue 18 point 1: wait probes only C+1 .. C+BEYOND (the
 *                   old --beyond), not every slot up to SlotLimit: a holder
 *                   of a higher removed slot is missed; P2 fails.
 *   -DBUGGY_LAYOUT  create/grow without the other-layout check; P3 fails.
 *
 * Not modelled: time, heartbeats and connections (a crash is a release;
 * a cut-off holder's lease ends by its own verification timeout before
 * the broker frees its queue, as the docs say); the wake exchange; probe
 * pipelining (probes are still made in order, one at a time); broker
 * clusters and partitions (documented as unsafe); overshooting and the
 * ascending ("Swiss cheese") delete order; the administration mutex's
 * own liveness. The state space is finite (no counters), so pan checks
 * every interleaving, including end states. It is compiled with
 * -DCOLLAPSE (lossless state compression: about 6 million states).
 * For the shortest counterexample, compile pan with -DBFS.
 */

#define SMAX    3
#define BEYOND  1
#define NCL     2
#define OPS     2
#define MAXTRY  2

#define IDX(l, i) ((l) * (SMAX + 1) + (i))

bool A[2 * (SMAX + 1)];
byte B[2 * (SMAX + 1)];   /* holder client id, 0 = no queue */

byte mutex;               /* the administration mutex: admin id + 1, 0 = free */
byte size[2];             /* C of each layout as its administrators made it */
byte pend[2 * 2];         /* [admin*2+l]: C before a shrink not yet waited for */

bool live[NCL + 1];       /* the client's lease is live */
byte lslot[NCL + 1];
byte llay[NCL + 1];

/* promised(l): the most holders layout l may have */
#define max2(x, y) ((x) > (y) -> (x) : (y))
#define promised(l) max2(size[l], max2(pend[(l)], pend[2 + (l)]))

/* checkHolders(l): P1 for layout l. */
inline checkHolders(l) {
	n = 0; k = 1;
	do
	:: k > NCL -> break
	:: k <= NCL ->
		if
		:: live[k] && llay[k] == l -> n++
		:: else
		fi;
		k++
	od;
	if
	:: n > promised(l) ->
		printf("P1: %d live leases in layout %d, promised %d\n", n, l, promised(l))
	:: else
	fi;
	assert(n <= promised(l));   /* P1 */
	n = 0; k = 0
}

proctype Client(byte c) {
	byte L, tries, n, k, lay;
	if
	:: lay = 0
	:: lay = 1
	fi;
	llay[c] = lay;
end:
	do
	:: /* acquire: scan from slot 1 */
		L = 1; tries = 0;
		do
		:: L > SMAX -> break                  /* no free slot: fail */
		:: L <= SMAX && !A[IDX(lay, L)] -> break   /* first missing A: fail */
		:: L <= SMAX && A[IDX(lay, L)] ->
			if
			:: B[IDX(lay, L)] != 0 -> L++     /* probe B: held, next */
			:: B[IDX(lay, L)] == 0 ->
				atomic {                       /* declare B[L], exclusive */
					if
					:: B[IDX(lay, L)] == 0 -> B[IDX(lay, L)] = c; lslot[c] = L
					:: else -> tries++; L = 1  /* RESOURCE_LOCKED: again from 1 */
					fi
				};
				if
				:: lslot[c] != 0 -> break
				:: lslot[c] == 0 && tries >= MAXTRY -> L = SMAX + 1
				:: else
				fi
			fi
		od;
		L = 0; tries = 0;
		if
		:: lslot[c] != 0 ->
			/* verify A[L] before handing the lease out */
			atomic {
				if
				:: A[IDX(lay, lslot[c])] ->
					live[c] = 1;
					printf("client %d holds slot %d of layout %d\n", c, lslot[c], lay);
					checkHolders(lay)
				:: else
				fi
			};
			if
			:: live[c] ->
				/* hold until it releases or a verification fails */
				do
				:: atomic { live[c] && !A[IDX(lay, lslot[c])] -> live[c] = 0;
					printf("client %d: slot %d removed, lets go\n", c, lslot[c]) };
					break
				:: atomic { live[c] -> live[c] = 0;
					printf("client %d releases slot %d\n", c, lslot[c]) };
					break
				od
			:: else
			fi;
			atomic { B[IDX(lay, lslot[c])] = 0; lslot[c] = 0 }   /* delete B[L] */
		:: else
		fi
	od
}

/* max: the first missing A of layout l, minus one (one atomic step: only
 * administrators change A, and they hold the mutex while they do). */
inline readMax(l) {
	d_step {
		C = 1;
		do
		:: C <= SMAX && A[IDX(l, C)] -> C++
		:: else -> break
		od;
		C--
	}
}

proctype Admin(byte a; byte l) {
	byte C, s, i, ops, n, k, hi;
	bool held;
	do
	:: ops == OPS - a -> break
	:: ops < OPS - a ->
		ops++;
		atomic { mutex == 0 -> mutex = a + 1 };
		readMax(l);
		select (s : 0 .. SMAX);
		if
		:: s > C ->
#ifndef BUGGY_LAYOUT
			if
			:: A[IDX(1 - l, 1)] -> goto unlock   /* ErrOtherLayout */
			:: else
			fi;
#endif
			size[l] = s;
			printf("admin %d: layout %d from %d to %d slots\n", a, l, C, s);
			i = C + 1;
			do
			:: i > s -> break
			:: i <= s ->
				atomic {
					assert(i != 1 || !A[IDX(1 - l, 1)]);   /* P3 */
					A[IDX(l, i)] = 1
				};
				i++
			od
		:: s < C ->
			atomic {
				if
				:: C > pend[a * 2 + l] -> pend[a * 2 + l] = C
				:: else
				fi;
				size[l] = s;
				printf("admin %d: layout %d from %d to %d slots\n", a, l, C, s)
			};
			i = C;
			do
			:: i <= s -> break
			:: i > s -> A[IDX(l, i)] = 0; i--
			od
		:: s == C
		fi;
unlock:
		i = 0; s = 0;
		mutex = 0;
		/* WaitReleased, if it shrank and chooses to wait */
		if
		:: pend[a * 2 + l] != 0 ->
			do
			:: readMax(l);
#ifdef BUGGY
				hi = (C + BEYOND < SMAX -> C + BEYOND : SMAX);
#else
				hi = SMAX;
#endif
				held = 0; i = C + 1;
				do
				:: i > hi -> break
				:: i <= hi ->
					if
					:: B[IDX(l, i)] != 0 -> held = 1
					:: else
					fi;
					i++
				od;
				if
				:: !held -> break
				:: else            /* still held: poll again */
				fi
			od;
			atomic {
				printf("admin %d: wait says no removed slot of layout %d is held (C = %d)\n", a, l, C);
				k = 1;
				do
				:: k > NCL -> break
				:: k <= NCL ->
					if
					:: live[k] && llay[k] == l && !A[IDX(l, lslot[k])] ->
						printf("P2: client %d still holds removed slot %d\n", k, lslot[k])
					:: else
					fi;
					assert(!(live[k] && llay[k] == l && !A[IDX(l, lslot[k])]));   /* P2 */
					k++
				od;
				pend[a * 2 + l] = 0;
				checkHolders(l)
			};
			i = 0; hi = 0; held = 0
		:: skip
		fi;
		C = 0
	od
}

init {
	atomic {
		/* the semaphore exists with 2 slots in the default layout */
		A[IDX(0, 1)] = 1; A[IDX(0, 2)] = 1; size[0] = 2;
		run Admin(0, 0); run Admin(1, 1);
		run Client(1); run Client(2)
	}
}
