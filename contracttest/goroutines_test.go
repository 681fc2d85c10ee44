package contracttest

import (
	"testing"
	"time"
)

// parkHere blocks until stop is closed; the test counts its callers.
//
//go:noinline
func parkHere(stop <-chan struct{}) { <-stop }

// TestGoroutinesIn: GoroutinesIn counts the goroutines blocked in a
// function, not those it created, and none once they have returned.
func TestGoroutinesIn(t *testing.T) {
	const fn = "github.com/latchkey-go/latchkey/contracttest.parkHere("
	stop := make(chan struct{})
	done := make(chan struct{})
	for range 3 {
		go func() { parkHere(stop); done <- struct{}{} }()
	}
	for start := time.Now(); GoroutinesIn(fn) != 3; time.Sleep(time.Millisecond) {
		if time.Since(start) > 5*time.Second {
			t.Fatalf("GoroutinesIn = %d after 5s, want 3", GoroutinesIn(fn))
		}
	}
	close(stop)
	for range 3 {
		<-done
	}
	if n := GoroutinesIn(fn); n != 0 {
		t.Fatalf("GoroutinesIn = %d after they returned, want 0", n)
	}
}
