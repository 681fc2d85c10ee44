//go:build !unix

package command

import (
	"errors"
	"os"
	"os/exec"
)

// ownGroup leaves cmd as it is: no process groups here.
func ownGroup(*exec.Cmd) error { return nil }

// signalGroup signals p alone; only a kill is supported here.
func signalGroup(p *os.Process, sig os.Signal) error {
	err := p.Signal(sig)
	if errors.Is(err, os.ErrProcessDone) {
		return nil
	}
	return err
}

// killedBy reports no signal: exit codes say it all here.
func killedBy(*os.ProcessState) (int, bool) { return 0, false }

// forwarded are the signals a [Signals] catches.
var forwarded = []os.Signal{os.Interrupt}

// terminate is the signal that asks a process to end: here, a kill.
var terminate = os.Kill

// reaperGroup fails: the reaper needs Unix process groups.
func reaperGroup(*exec.Cmd) error {
	return errors.New("not supported on this system (it needs Unix process groups)")
}
