//go:build !unix

package natsputex

import (
	"errors"
	"os/exec"
)

// killGroupOnCancel leaves cmd as exec.CommandContext made it: its
// context's end kills its process only.
func killGroupOnCancel(*exec.Cmd) {}

// ownProcessGroup fails: the reaper needs Unix process groups.
func ownProcessGroup(*exec.Cmd) error {
	return errors.New("not supported on this system (it needs Unix process groups)")
}
