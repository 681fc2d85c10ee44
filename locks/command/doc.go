// Package command runs a command under a lease: the one runner behind
// natslock, "amqpsem acquire" and redlockrun.
//
// [Run] starts a command in a process group of its own, forwards the
// signals a [Signals] catches (SIGINT, SIGTERM, SIGHUP) to that group
// while it runs, and when its context ends (for [RunLease], the lease's:
// it was lost) sends the group SIGTERM, then SIGKILL after a grace
// period. Once the command has exited, what it left running in its group
// is killed, so that nothing it started outlives the lease (unless
// [Options.KeepGroup]). A [Reaper] is a small process that kills the
// groups of the commands still running should this process die (kill -9,
// a crash), before their lease runs out at the broker.
//
// The exit codes of the commands built on this package are the constants
// [ExitOK], [ExitError], [ExitUsage] (64, sysexits' EX_USAGE: 2 is the Go
// runtime's on a panic or SIGQUIT), [ExitNotAcquired] and [ExitLost];
// otherwise a command run under a lease passes on the exit status of what
// it ran, 128+N when that was killed by signal N, as shells report it
// ([ExitCode]).
//
// Process groups, signals and the reaper need Unix; elsewhere the command
// alone is signalled and [StartReaper] returns an error. A command run in
// a group of its own is in the background as a terminal sees it: one that
// reads from the terminal is stopped (SIGTTIN), so give it other input.
//
// [NewLogger] makes the logger of the commands' -log-format flag (text or
// json), so that every command logs alike.
//
// This package uses the standard library only.
package command
