// Package cmdtest has helpers for testing the commands built on
// locks/command: build, run, run in the background, wait for files and
// processes, and check the command-line convention every command keeps
// ([CheckConvention], [RunSplit]).
//
// A command's tests build it once with [Build], run it to its end with
// [Run], [RunEnv] or [Expect], or start it in the background with [Start]
// and then wait for what it does ([Process.WaitFile], [Process.ExitCode],
// [ReadPid], [WaitGone]). Every helper cleans up what it started with
// [testing.TB.Cleanup].
//
// The helpers that take a [testing.TB] may stop the test (they call its
// Fatal methods), so they must be called from the goroutine running the
// test. Their time limits are generous safety bounds, never performance
// claims. The package is for Unix: it uses process groups and signals.
package cmdtest
