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
// The suite should not produce false positives (a correct backend fails
// nothing), may produce false negatives (a race may go unseen in one run),
// and is meant to run under -race. Its own tests run it against memlock and
// against deliberately broken lockers, to show each check can fail.
//
// The package testenv finds or starts the real brokers the harnesses use.
package contracttest
