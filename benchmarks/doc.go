// Package benchmarks compares the latchkey backends with each other and with their peers.
package benchmarks
