package natsenv

import "syscall"

// sysProcAttr puts a server process in a process group of its own, so that
// a ^C on the test does not reach it before the cleanup does, and kills it
// when the test process dies, so that no server outlives a crashed test.
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
}
