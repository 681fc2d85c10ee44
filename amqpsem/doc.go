// Package amqpsem implements latchkey's locks on RabbitMQ with
// github.com/rabbitmq/amqp091-go: the persistent semaphore of the
// amqp-locks specification, and the exclusive-queue mutex it is built on.
//
// # Quick start
//
// doWork(ctx context.Context) error is yours: it stops when ctx ends.
//
//	ctx := context.Background()
//	client, err := amqpsem.Dial(ctx, "amqp://guest:guest@127.0.0.1:5672/")
//	if err != nil {
//		log.Fatal(err)
//	}
//	defer client.Close(ctx) // ends and releases every lease of the client
//
//	lease, err := client.Locker().Lock(ctx, "nightly-report") // waits its turn
//	if err != nil {
//		log.Fatal(err) // holds nothing; matches ctx.Err() when ctx ended
//	}
//	defer lease.Release(ctx)
//	// lease.Context() ends if the lock is lost (no fencing token: Token() is 0).
//	if err := doWork(lease.Context()); err != nil {
//		log.Print(err)
//	}
//
// A semaphore must exist before it is acquired: an administrator makes
// it ([Client.Admin], [Admin.Create], or the amqpsem command), or a
// client dialed [WithCreate] makes it on first use. Then
// [Client.Semaphore] gives a [Semaphore] that holds at most its size of
// the semaphore's slots:
//
//	sem, err := client.Semaphore(3)
//	lease, err := sem.Acquire(ctx, "builds") // lease.(*amqpsem.Lease).Slot() is 1..3
//
// Every lease is a *[Lease], a [locks.SlotLease] whose Slot is 0 for a
// lock. [Locker] and [Semaphore] implement [driver.Observable], reporting
// [driver.EventVerifyFailed] and [driver.EventResourceLocked] besides the
// kit's events. Errors read "amqpsem: op \"name\": cause" (the name left
// out when the cause names it: an invalid name, a name held) and match
// the sentinels of package locks and this package with [errors.Is].
//
// # What it promises
//
// A slot or lock is held exactly as long as the broker sees the holder's
// connection alive:
//   - a holder whose process dies or whose socket closes lets go at once;
//   - a holder cut off without a close keeps its slot until the broker's
//     heartbeat check gives up: up to three heartbeat intervals
//     ([WithHeartbeat], 10s by default, so up to 30s);
//   - the holder's lease ends with [locks.ErrLost] before then: when its
//     connection closes, or when no verification ([WithVerifyInterval])
//     succeeded for one heartbeat interval, so a cut-off holder stops
//     before anyone else starts; a slot removed by an administrator ends
//     its lease with [ErrSlotRemoved]. When the socket closes, the broker
//     and the client each hear of it on their own: another client may
//     take the slot a moment (milliseconds) before the old lease's
//     context ends.
//
// Waiting Locks take turns: a release wakes one waiting client, through a
// shared wake queue per name, not all of them; a client that releases and
// locks again waits for its turn too. A crashed holder's lock is noticed
// by polling with [WithBackoff].
//
// # Options
//
// [Dial] takes the connection's options ([WithHeartbeat], [WithTLS],
// [WithDial], [WithConnectTimeout], [WithConnectionName],
// [WithReconnect], [WithConnectionNotice]), the acquisition's
// ([WithVerifyInterval], [WithBackoff], [WithMaxAttempts], [WithSkew],
// [WithCreate], [WithWakeExchange], [WithMutexWaitNotice]) and the
// administrator's ([WithLayout], [WithOvershoot], [WithAscendingDelete]).
// Each option's doc gives its default; a value out of range gives an
// error matching [locks.ErrInvalidOption] before any I/O, and an invalid
// name one matching [locks.ErrInvalidName].
//
// [PythonLayout] shares semaphores with the Python implementation of the
// specification; [DefaultLayout] is the default. A name is one layout's
// semaphore: [Admin] refuses to mix them ([ErrOtherLayout]).
//
// [Client.Quorum] is a faster layout for Go clients only: a lock or
// semaphore is a RabbitMQ quorum queue of token messages, a slot is a
// token held unacknowledged, a release hands it to the longest-waiting
// client, its leases carry fencing tokens ([QuorumLease.Token], from the
// broker's delivery count; reset by [Quorum.Destroy]) and it is
// replicated on a cluster. Make it with [Quorum.Create] or [WithCreate].
// A hold longer than the broker's consumer timeout (30 minutes by
// default; per queue with [WithConsumerTimeout] on RabbitMQ 3.12+) ends
// with [locks.ErrLost].
//
// # Limits
//
//   - No fencing tokens in the specification's layouts: [Lease.Token] is
//     always 0 (the quorum layout has them). Guard a resource with the
//     lease's context, or use a layout or backend with tokens.
//   - The specification's layouts are not partition-safe on a RabbitMQ
//     cluster: exclusive queues live on
//     one node, and a partition can let two connections each believe they
//     own a queue of the same name. Use a single node, or a cluster that
//     pauses its minority.
//   - Removing slots does not take them from their holders:
//     [Admin.WaitReleased] waits until no removed slot is held.
//   - A lost connection ends every lease on it ([ErrConnectionClosed]);
//     the Client dials again with back-off ([WithReconnect]).
//   - A nil ctx is an error, not a panic: [Dial], Lock, TryLock, Acquire,
//     TryAcquire, Release, Close and the [Admin]'s methods return an
//     error matching [locks.ErrInvalidOption] naming ctx, and do nothing.
//   - RabbitMQ 4.3 refuses the transient slot queues of [PythonLayout] by
//     default ([ErrTransientRefused] names the setting that allows them);
//     the default layout's queues are all durable or exclusive.
//
// The protocol, its argument and where it departs from the specification
// are in the repository's docs/protocols/amqpsem.md.
package amqpsem
