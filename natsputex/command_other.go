//go:build !unix

package natsputex

import "os/exec"

// killGroupOnCancel leaves cmd as exec.CommandContext made it: its
// context's end kills its process only.
func killGroupOnCancel(*exec.Cmd) {}
