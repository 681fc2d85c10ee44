//go:build mage

package main

import (
	"fmt"
	"os"
)

const (
	defaultChaosTime = "5m"
	chaosDurationEnv = "LOCKS_CHAOS_DURATION" // contracttest.ChaosDurationEnv
)

// Chaos runs the randomized fault run (TestChaos*) of every module for $CHAOS_DURATION (5m) per backend.
func Chaos() error {
	d := os.Getenv("CHAOS_DURATION")
	if d == "" {
		d = defaultChaosTime
	}
	// The tests read the duration from the environment of the go command.
	if err := os.Setenv(chaosDurationEnv, d); err != nil {
		return err
	}
	fmt.Printf("chaos: each backend for %s (%s); every run ends with its summary\n", d, chaosDurationEnv)
	return eachModule("chaos", nil, func(m module) error {
		return runV("go", m.goC("test", "-race", "-count=1", "-timeout=0", "-run=^TestChaos", "-v", "./...")...)
	})
}
