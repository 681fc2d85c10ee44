package natsputex

import (
	"testing"
	"time"
)

// TestClocksBlank: a blank seen by the watch may be written over once,
// and only while no other write has been seen.
func TestClocksBlank(t *testing.T) {
	const T = time.Hour
	base := time.Now()
	at := func(n int) time.Time { return base.Add(time.Duration(n) * time.Millisecond) }
	cl := newClocks(2)
	if _, ok := cl.takeBlank(0, T); ok {
		t.Fatal("a key never seen counts as blank")
	}
	cl.seeBlank(0, 7, at(7))
	if rev, ok := cl.takeBlank(0, T); !ok || rev != 7 {
		t.Fatalf("after a blank at 7: takeBlank = %d, %t; want 7, true", rev, ok)
	}
	if _, ok := cl.takeBlank(0, T); ok {
		t.Fatal("the same blank was handed out twice")
	}
	cl.seeBlank(0, 9, at(9))
	cl.see(0, 10, at(10)) // someone wrote over it
	if rev, ok := cl.takeBlank(0, T); ok {
		t.Fatalf("a blank at 9 overwritten at 10 is still handed out (%d)", rev)
	}
	cl.see(1, 12, at(12))
	cl.seeBlank(1, 11, at(11)) // a blank older than what was seen is no blank
	if _, ok := cl.takeBlank(1, T); ok {
		t.Fatal("a blank older than the last revision seen is handed out")
	}
	if cl.rebornHold(1, T) {
		t.Fatal("a late delivery of an older write marks the key reborn")
	}
}

// TestClocksReborn: any change of revision restarts the clock, a lower
// one too (TestLostMemoryBucketKeepsHolderT); a key that vanishes, or
// whose revision goes back to a write made later (a bucket made again),
// is held as reborn for T, and its blank is not handed out meanwhile.
func TestClocksReborn(t *testing.T) {
	const T = 50 * time.Millisecond
	base := time.Now()
	at := func(n int) time.Time { return base.Add(time.Duration(n) * time.Millisecond) }

	cl := newClocks(3)
	cl.see(0, 40, at(40))
	time.Sleep(2 * time.Millisecond)
	if q := cl.see(0, 3, at(41)); q != 0 {
		t.Fatalf("a lower revision did not restart the clock: quiet %v", q)
	}
	if !cl.rebornHold(0, T) {
		t.Fatal("a lower revision written later does not mark the key reborn")
	}
	cl.seeBlank(0, 4, at(42))
	if _, ok := cl.takeBlank(0, T); ok {
		t.Fatal("a blank of a reborn key is handed out before T")
	}
	time.Sleep(T)
	if cl.rebornHold(0, T) {
		t.Fatal("a key is still held as reborn after T")
	}

	cl.see(1, 40, at(40))
	cl.see(1, 0, time.Time{}) // the key vanished (missing)
	if !cl.rebornHold(1, T) {
		t.Fatal("a key that vanished is not held as reborn")
	}

	cl.noteTiming(2, timing{ttl: time.Hour})
	cl.see(2, 40, at(40))
	cl.see(2, 0, time.Time{})
	time.Sleep(T)
	if !cl.rebornHold(2, T) {
		t.Fatal("a reborn key is not held for the longest T its holders' values carried")
	}
	if got := cl.longest(2); got.ttl != time.Hour {
		t.Fatalf("longest = %v", got)
	}
}
