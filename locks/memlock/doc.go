// Package memlock implements the latchkey contract in memory, for one
// process: the reference backend, and the one to plug into the unit tests
// of code that takes a [locks.Locker] or [locks.Semaphore].
//
// A [Store] plays the broker; each [Client] made from it
// ([Store.NewClient]) plays a process, with a [Client.Locker], its
// [Client.Semaphore]s (1 to [MaxSemaphoreSize] slots) and
// [Client.Close]. A lock's lease has Slot 0, a semaphore's 1 to N; the
// Locker and Semaphores implement driver.Observable.
//
// Leases carry fencing tokens (per name, strictly increasing), have a TTL
// renewed in the background (a client renews all its leases in one
// round), and end with the right cause: [Store.Revoke] takes a lease away
// at once, [Store.Expire] lets it lapse so the holder finds out at its
// next renewal, [Client.Kill] crashes a client, and a client with a
// higher priority ([WithPriority]) preempts a lower one.
//
// memlock passes the full conformance suite (contracttest). It promises
// what a perfect broker would: mutual exclusion, fencing, and recovery from
// a killed client within one TTL.
package memlock
