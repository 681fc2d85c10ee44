//go:build unix

package command

import (
	"errors"
	"os"
	"os/exec"
	"syscall"
)

// ownGroup makes cmd start in a process group of its own, whose id is
// its process id.
func ownGroup(cmd *exec.Cmd) error {
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	cmd.SysProcAttr.Setpgid = true
	cmd.SysProcAttr.Pgid = 0
	return nil
}

// signalGroup sends sig to the process group led by p. A group already
// gone is not an error.
func signalGroup(p *os.Process, sig os.Signal) error {
	s, ok := sig.(syscall.Signal)
	if !ok {
		return p.Signal(sig)
	}
	err := syscall.Kill(-p.Pid, s)
	if errors.Is(err, syscall.ESRCH) {
		return nil
	}
	return err
}

// killedBy returns the signal that killed the process, if one did.
func killedBy(state *os.ProcessState) (int, bool) {
	ws, ok := state.Sys().(syscall.WaitStatus)
	if !ok || !ws.Signaled() {
		return 0, false
	}
	return int(ws.Signal()), true
}

// forwarded are the signals a [Signals] catches.
var forwarded = []os.Signal{syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP}

// terminate is the signal that asks a group to end.
var terminate os.Signal = syscall.SIGTERM

// reaperGroup runs the reaper in a process group of its own.
func reaperGroup(cmd *exec.Cmd) error { return ownGroup(cmd) }
