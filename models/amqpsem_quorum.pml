/*
 * amqpsem_quorum.pml: the quorum layout of amqpsem (amqpsem/quorum*.go):
 * a lock is one token message on a quorum queue, held unacknowledged.
 *
 * Check:   spin -a amqpsem_quorum.pml && cc -O2 -DSAFETY -o pan pan.c && ./pan -m100000
 * Seeded:  spin -DBUGGY -a amqpsem_quorum.pml ...   (must report an error;
 *          so must -DBUGGY_NACK and -DBUGGY_NOCANCEL)
 * Trail:   spin -DBUGGY -t amqpsem_quorum.pml
 *
 * What is modelled:
 *   - The broker's queue (rabbit_fifo, one Raft state machine, so each of
 *     its steps is atomic here): the token is ready, or held
 *     unacknowledged by one client's channel; a count `dc` of its returns
 *     (x-delivery-count on RabbitMQ 3.x; x-acquired-count counts the same
 *     acquisitions on 4.3); subscriptions with a prefetch of one, served
 *     in the order they were made. A returned token goes, in the same
 *     step, to the oldest open subscription with credit, or back to the
 *     ready queue. A subscription whose token was rejected gets its
 *     credit back and joins the back of the order.
 *   - N clients, each doing ROUNDS acquisitions on a channel of its own:
 *     basic.get (TryLock, and the first step of Lock); if empty, Lock
 *     subscribes and waits for a delivery; on a delivery it cancels the
 *     subscription (no-wait: the cancel is ordered before anything else
 *     the channel sends). The lease's token is 1 + the count on the
 *     delivery. Release is a reject with requeue (a return).
 *   - Faults, within a budget of MAXCRASH: a client's channel closes at
 *     any moment (crash, lost connection, the broker's consumer timeout):
 *     the broker returns a token it held and drops its subscription. The
 *     client learns of it later; it then starts its next round afresh.
 *
 * Properties:
 *   (one token, held by at most one channel, is structural here: the
 *   token's place is one variable, as it is one entry of the queue's
 *   Raft-replicated state);
 *   P2  every token handed out is greater than every one before it (the
 *       fencing promise), asserted at each hand-out;
 *   P3  no deadlock: a client waiting for the token is served (pan's
 *       invalid end states: the token lost while clients wait).
 *
 * Seeded bugs:
 *   BUGGY           release cancels and does not reject: the token stays
 *                   unacknowledged on an open (pooled) channel (P3);
 *   BUGGY_NACK      a return that the broker does not count (RabbitMQ
 *                   4.3's basic.nack with requeue, or a version whose
 *                   channel close does not count) (P2);
 *   BUGGY_NOCANCEL  a woken waiter keeps its subscription: with no other
 *                   waiter, its release hands the token back to the
 *                   subscription nobody reads (P3).
 */

#ifndef N
#define N 3
#endif
#ifndef ROUNDS
#define ROUNDS 2
#endif
#ifndef MAXCRASH
#define MAXCRASH 1
#endif

byte holder = 0;        /* 0: ready; i: held unacknowledged by client i's channel */
byte dc = 0;            /* the broker's count of returns */
bool open[N+1];         /* client i has a subscription, with credit or not */
bool sub[N+1];          /* client i has an open subscription with credit */
byte order[N+1];        /* when it subscribed (or got credit back): lower is older */
byte clock = 1;
bool delivered[N+1];    /* a delivery to client i's subscription not read yet */
byte lastToken = 0;     /* the greatest token handed out */
byte crashes = 0;
byte finished = 0;       /* clients done with their rounds (for trails) */
byte best, k;           /* dispatch's scratch, used only inside d_steps */

/* dispatch: the ready token goes to the oldest subscription with credit. */
inline dispatch() {
	if
	:: holder == 0 ->
		best = 0; k = 1;
		do
		:: k <= N ->
			if
			:: sub[k] && (best == 0 || order[k] < order[best]) -> best = k
			:: else -> skip
			fi;
			k++
		:: else -> break
		od;
		if
		:: best != 0 -> holder = best; sub[best] = false; delivered[best] = true
		:: else -> skip
		fi
	:: else -> skip
	fi
}

/* giveBack: the broker returns the token held by client i; a
 * subscription of i still open gets its credit back, last in order. */
inline giveBack(i) {
#ifdef BUGGY_NACK
	skip;
#else
	dc++;
#endif
	holder = 0;
	if
	:: open[i] -> sub[i] = true; order[i] = clock; clock++
	:: else -> skip
	fi;
	dispatch()
}

proctype client(byte i) {
	byte round = 0;
	byte token;
	bool crashed;
	do
	:: round < ROUNDS ->
		crashed = false; token = 0;
		/* basic.get */
		d_step {
			if
			:: holder == 0 -> holder = i; token = dc + 1
			:: else -> skip
			fi
		};
		if
		:: token == 0 ->
			if
			:: true ->  /* TryLock: not acquired */
				crashed = true  /* nothing held this round */
			:: true ->  /* Lock: subscribe and wait for a delivery */
				d_step { open[i] = true; sub[i] = true; order[i] = clock; clock++; dispatch() };
				if
				:: d_step { delivered[i] -> delivered[i] = false; token = dc + 1 };
#ifndef BUGGY_NOCANCEL
					d_step { open[i] = false; sub[i] = false }  /* cancelled on receipt */
#else
					skip
#endif
				:: d_step { crashes < MAXCRASH -> crashes++; crashed = true; open[i] = false; sub[i] = false;
					if
					:: holder == i -> delivered[i] = false; giveBack(i)
					:: else -> skip
					fi }
				fi
			fi
		:: else -> skip
		fi;
		if
		:: !crashed ->
			/* holding: the lease's token is handed out */
			d_step { assert(token > lastToken); lastToken = token };
			if
			:: d_step { crashes < MAXCRASH -> crashes++; open[i] = false; sub[i] = false;
				if
				:: holder == i -> giveBack(i)
				:: else -> skip
				fi }
			:: true ->
#ifdef BUGGY
				skip   /* cancel only: the token stays on the channel */
#else
				d_step {
					if
					:: holder == i -> giveBack(i)
					:: else -> skip
					fi
				}
#endif
			fi
		:: else -> skip
		fi;
		round++
	:: else -> break
	od;
	/* The channel stays open (pooled) with whatever subscription it has. */
	skip;
	d_step { finished++ }
}

/* P3: every client finishes its rounds (a waiter blocked forever is an
 * invalid end state of its process, which pan reports). */
init {
	byte i = 1;
	atomic {
		do
		:: i <= N -> run client(i); i++
		:: else -> break
		od
	}
}
