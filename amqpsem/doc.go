// Package amqpsem implements the persistent semaphore of the amqp-locks
// specification on RabbitMQ, and the exclusive-queue mutex it is built on,
// with github.com/rabbitmq/amqp091-go.
//
// [Dial] returns a [Client]: [Client.Locker] is its mutex (a
// [locks.Locker]), [Client.Semaphore] a semaphore of a given size (a
// [locks.Semaphore]), [Client.Admin] its administrator, and
// [Client.Close] ends its leases, bounded by its ctx. Every lease is a
// *[Lease], a [locks.SlotLease] whose Slot is 0 for a lock and the slot
// L for a semaphore. Locker and Semaphore implement the optional
// [driver.Observable]: besides the kit's renewal events, they report
// [driver.EventVerifyFailed] (a verification found a lease's queue gone)
// and [driver.EventResourceLocked] (an acquire lost the race for a slot
// and scans again).
//
// # The semaphore
//
// A semaphore named N with C slots is C durable slot queues A[1..C]
// (named "N-1-A" .. "N-C-A" by [DefaultLayout]); a client holds slot L
// while its connection owns the exclusive holder queue B[L] ("N-L-B").
// [Semaphore] (a [locks.Semaphore]) acquires by scanning from slot 1 for
// the first L whose A[L] exists and whose B[L] does not, and declaring
// B[L]; a client that loses that race (RESOURCE_LOCKED) reopens its
// channel, waits a random skew and scans again, up to [WithMaxAttempts].
// [Admin] creates, resizes and destroys semaphores under the
// administration mutex N, as the specification says (descending deletes,
// overshooting, waiting for holders of removed slots, and the ascending
// "Swiss cheese" variant). Queue existence is checked by publishing with
// the mandatory flag on a confirm channel, pipelined, never by passive
// declares, which break channels. [PythonLayout] shares semaphores with
// the existing Python implementation ("N-A-i", "N-B-i"). A name is one
// layout's semaphore: [Admin] refuses to create or grow a semaphore whose
// name has slot queues in the other layout ([ErrOtherLayout]), so that a
// mistake cannot make two semaphores of one name, and [Admin.Status]
// says which layout a name is in.
//
// A semaphore must exist before it is acquired: [Semaphore.Acquire] on a
// name without slots fails at once with [ErrNoSlots] instead of waiting
// (a misspelt name would otherwise wait forever), unless the client was
// dialed [WithCreate], which creates it with the Semaphore's size. The
// size never resizes a semaphore that exists: it caps the slots the
// Semaphore takes, so its leases are at most min(C, size) (see
// [Client.Semaphore]); [MaxSemaphoreSize] takes any slot C has.
//
// Removing slots does not take them from their holders (see [Admin]).
// [Admin.Status] and [Admin.WaitReleased] find every held removed slot
// whatever its number: they check the holder queue of every slot number
// up to the name's [Layout.SlotLimit] (65535 probes, pipelined, about a
// second on a local broker and a few under the race detector), on a
// short-lived connection of their own, so that the probes do not delay
// the verifications of the client's leases (without one, when the broker
// refuses it, on the client's connection).
// WaitReleased returns nil only after such a check made holding the
// administration mutex, so that no administrator can change C during it:
// also when, during the wait, the semaphore grew, a client took one of
// the new slots, and it shrank back between two of its polls. So
// WaitReleased never returns nil while a removed slot is held, by this
// package's clients or any other's. What no check can see is a slot
// taken after it: a holder that declares its holder queue just after the
// check, for a slot it found before the removal (this package's clients
// then find the slot gone when they verify, and let go without using
// it; a client of another implementation that does not verify keeps
// it), or a client of another implementation that scans non-linearly and
// takes a slot whose slot queue was left above C, above a gap (ascending
// deletes that failed half-way, a queue made by hand; [WithOvershoot]
// deletes such strays). Administrators that change a semaphore without
// its mutex are not seen either.
//
// [Locker] (a [locks.Locker]) is one exclusive queue per name. A lock on
// N is the semaphore N's administration mutex.
//
// # What it promises
//
// A slot or mutex is held exactly as long as the broker sees the holder's
// connection alive. When the holder's process dies or its socket closes,
// the broker frees its queues at once. When the holder is cut off without
// a close (a black-holed network, a frozen or powered-off host), the
// broker frees them once its heartbeat check gives up on the connection.
// RabbitMQ calls this "two missed heartbeats", but it checks for incoming
// data once per interval and gives up after two checks in a row found
// none: between two and three intervals after the last frame it received.
// So a holder cut off keeps its slot for up to three heartbeat intervals
// (the negotiated interval, [Client.Heartbeat]: what [WithHeartbeat]
// asks for, 10s by default, so up to 30s, unless the broker lowers it or
// a heartbeat in the URL replaces it; heartbeat=0 there takes the
// broker's interval), not two, plus
// the moment it takes to delete its queues. On the holder's side, its
// lease ends with [locks.ErrLost] when its connection closes, or when
// no verification ([WithVerifyInterval]; one pipelined probe for all of
// a client's leases) has succeeded for one heartbeat interval: before the broker can free its slot, so a cut-off holder stops
// before anyone else starts. A lease also ends with [locks.ErrLost] and
// [ErrSlotRemoved] when a verification finds its slot removed by an
// administrator. Whenever a lease ends with [locks.ErrLost] while its
// connection is still open (its slot removed, its verifications failing
// or too slow), the client deletes its queue in the background without
// waiting for Release, letting go as the specification requires of
// holders of removed slots.
//
// A clean release deletes the queue and publishes to the wake exchange
// ([WithWakeExchange], amq.direct), which wakes waiting clients at once;
// a crashed holder is noticed by polling with [locks.Backoff].
//
// Waiting [Locker.Lock] calls take turns. A waiting client consumes the shared
// queue "amqpsem.wake.<name>" (durable, with x-expires: the broker
// deletes it after a minute without consumers; bound to the wake
// exchange; names of more than 242 bytes use
// "amqpsem.wake-sha256.<hex>"). Lock and semaphore
// names whose queue would start with these prefixes are refused with
// [locks.ErrInvalidName]; do not give other queues such names. The
// broker hands each release's wake-up to one waiting client, in turn,
// which declares at once, instead of waking them all to race. A client
// that releases a name another client waits for does not take it straight
// back on its next Lock: it waits for its turn too. While turns work, a
// poll that finds the queue free declares only if it is still free at
// the next poll, so a crashed holder's mutex is taken over one back-off
// delay later than it could be.
//
// So there is one such queue for every name some Lock waited for in the
// last minute: a workload that contends for many distinct names keeps as
// many queues, and each client declares and binds a name's queue when it
// starts waiting for it, unless it used the queue in the last 30s.
// [Admin.Destroy] leaves it to
// expire. The broker user needs configure, read and write permission on
// these names; without it, or when the queue cannot be declared, Locks
// fall back to waking every waiter.
//
// No fencing tokens: Token is always 0 (RabbitMQ has no counter to build
// one from). Not partition-safe on a RabbitMQ cluster: exclusive queues
// live on one node, and a partition can let two connections on two sides
// each believe they own a queue of the same name; use it on a single node
// or a cluster that pauses its minority.
//
// # Where this package differs from the specification
//
//   - Relinquishing by closing the channel, which the specification
//     lists, does not free a slot on RabbitMQ: exclusive queues belong to
//     the connection. Leases are released by deleting B[L].
//   - Adding X slots declares every A queue from A[C+1] to A[C+X], not
//     only A[C+X], so that the maximum stays well defined.
//   - The specification counts slots "from 0" in places and from 1 in
//     others; slots are numbered from 1, A[0] never exists.
//   - Queue names are checked before any I/O: an AMQP short string of at
//     most 255 bytes for the mutex and slot 1, not starting with the
//     reserved "amq.", and, for the default layout, not ending like a
//     slot or holder queue of another semaphore. A long name has fewer
//     slots than [MaxSemaphoreSize]: as many as its queue names fit
//     ([Layout.SlotLimit]; a 251-byte name in [PythonLayout] has 9).
//   - [Admin.Remove] of more slots than there are returns
//     [ErrInvalidSlots] and changes nothing, where the specification
//     clamps to 0 (max(0, C - X)): a count larger than the semaphore is
//     more likely a mistake than a wish to destroy it; [Admin.Destroy]
//     and [Admin.Resize] to 0 remove every slot.
//   - Acquiring a semaphore without slots is an error ([ErrNoSlots]),
//     not "every slot is held": it does not match [locks.ErrNotAcquired].
//   - Every slot and holder queue is declared with x-max-length 0 and
//     probes expire at once, so probe messages never pile up (the shared
//     wake queues hold at most one message, for a second).
//   - The verification the specification recommends after acquiring is
//     also repeated periodically, and bounds the lease's validity.
//   - [locks.Semaphore] has a fixed N; here C is what the broker holds and
//     administrators may change it at any time, and a [Semaphore]'s size
//     caps the slots it takes. [WithCreate] creates a missing semaphore
//     with that size on first use.
//
// # Connections and RabbitMQ 4
//
// A [Client] holds one connection at a time. When it is lost, the leases
// on it end ([locks.ErrLost], [ErrConnectionClosed]) and stay ended, and
// the Client dials again with back-off ([WithReconnect]); new calls wait
// for the new connection until their ctx ends, and
// [WithConnectionNotice] and [Client.Connected] report the connection's
// health. Error texts say "amqpsem:" once.
//
// RabbitMQ 4 deprecates queues that are neither durable nor exclusive,
// and from 4.3 refuses them by default with a connection error, which
// would end every lease on the connection. Of amqpsem's own queues, none
// is such a queue: slot queues of [DefaultLayout] are durable, holder and
// mutex queues exclusive, the fan-out wake queue exclusive, and the
// shared wake queues durable with x-expires. The slot queues of
// [PythonLayout] are transient and non-exclusive, as the Python client
// declares them (declaring them otherwise would break sharing): [Admin]
// declares them on a short-lived connection of its own, so a refusal
// ends no lease, and reports it as [ErrTransientRefused], naming the
// broker setting the Python layout needs there
// (deprecated_features.permit.transient_nonexcl_queues = true).
package amqpsem
