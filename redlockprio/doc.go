// Package redlockprio implements Redlock on independent Redis masters, with priorities and lock theft.
package redlockprio
