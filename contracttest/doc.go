// Package contracttest is the conformance suite every latchkey backend
// runs: mutual exclusion, fencing, TryLock and Lock semantics,
// cancellation, release (also with a context already ended), closed
// clients, liveness after a crash, loss and preemption signals, semaphore
// limits and cancellation, bad input and goroutine leaks, all against a
// real broker.
//
// A backend supplies a [Harness] through a [NewHarness] function and calls
// [RunConformanceTests] from its tests, and [RunBenchmarks] from its
// benchmarks. Optional features are optional interfaces of the Harness
// ([Revoker], [PriorityHarness], [OptionChecker]) and fields of
// [Capabilities]; tests of missing features are skipped, saying why.
//
// The fencing checks prove the resource side of fencing tokens: a guard
// (such as module fence's) refuses a cut-off holder's late write after its
// successor wrote. The suite takes the guarded resource as an interface
// ([GuardedStore]), handed to [RunFencingTests] or by a [GuardHarness] to
// the conformance test FencedWrites, so that it depends on no guard or
// database driver; [MustCatchStale] shows the checks fail on a broken
// guard.
//
// The suite should not produce false positives (a correct backend fails
// nothing), may produce false negatives (a race may go unseen in one run),
// and is meant to run under -race. Its own tests run it against memlock and
// against deliberately broken lockers, to show each check can fail; a
// backend shows the same on its real broker with the [Defect]s the suite
// can plant in it ([Defective], [MustCatch], [RunDefectTests]). A check
// that skips part of itself, for a capability the backend lacks, says
// which part in the test's log.
//
// The package testenv finds or starts the real brokers the harnesses use.
package contracttest
