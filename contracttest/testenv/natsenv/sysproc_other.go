//go:build unix && !linux

package natsenv

import "syscall"

// sysProcAttr puts a server process in a process group of its own, so that
// a ^C on the test does not reach it before the cleanup does. (Only Linux
// can also kill it when the test process dies.)
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true}
}
