package redlockprio_test

import (
	"crypto/sha1"
	"encoding/hex"

	"github.com/latchkey-go/latchkey/redlockprio/internal/scripts"
)

// scriptNames names redlockprio's Lua scripts by their SHA1, for the
// tests that record what a Client sends to its masters.
var scriptNames = func() map[string]string {
	m := map[string]string{}
	for name, src := range map[string]string{
		"acquire": scripts.Acquire, "release": scripts.Release, "renew": scripts.Renew, "raise": scripts.Raise,
	} {
		sum := sha1.Sum([]byte(src))
		m[hex.EncodeToString(sum[:])] = name
	}
	return m
}()
