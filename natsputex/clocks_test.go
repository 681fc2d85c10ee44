package natsputex

import "testing"

// TestClocksBlank: a blank seen by the watch may be written over once,
// and only while no newer write has been seen.
func TestClocksBlank(t *testing.T) {
	cl := newClocks(2)
	if _, ok := cl.takeBlank(0); ok {
		t.Fatal("a key never seen counts as blank")
	}
	cl.seeBlank(0, 7)
	if rev, ok := cl.takeBlank(0); !ok || rev != 7 {
		t.Fatalf("after a blank at 7: takeBlank = %d, %t; want 7, true", rev, ok)
	}
	if _, ok := cl.takeBlank(0); ok {
		t.Fatal("the same blank was handed out twice")
	}
	cl.seeBlank(0, 9)
	cl.see(0, 10) // someone wrote over it
	if rev, ok := cl.takeBlank(0); ok {
		t.Fatalf("a blank at 9 overwritten at 10 is still handed out (%d)", rev)
	}
	cl.seeBlank(1, 3)
	cl.see(1, 2) // a stale read from a replica changes nothing
	if rev, ok := cl.takeBlank(1); !ok || rev != 3 {
		t.Fatalf("a stale older revision hid the blank at 3: %d, %t", rev, ok)
	}
	cl.see(1, 12)
	cl.seeBlank(1, 11) // a blank older than what was seen is no blank
	if _, ok := cl.takeBlank(1); ok {
		t.Fatal("a blank older than the last revision seen is handed out")
	}
}
