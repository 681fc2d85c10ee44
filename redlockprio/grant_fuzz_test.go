package redlockprio

import (
	"testing"
	"time"
)

// FuzzParseGrant feeds acquire-script answers, well-formed and not, to the
// decoder: a grant or an error, never a panic; a grant's slot is within
// the name's slots, and a theft never waits less than nothing.
func FuzzParseGrant(f *testing.F) {
	f.Add(uint8(3), int64(1), int64(1), int64(7), "", int64(0), int64(0), "", 1)
	f.Add(uint8(7), int64(2), int64(1), int64(9), "victim", int64(1), int64(250), "inbox", 1)
	f.Add(uint8(5), int64(0), int64(0), int64(4), "holder", int64(120), int64(0), "", 2)
	f.Add(uint8(7), int64(2), int64(3), int64(-5), "v", int64(-1), int64(-1), "", 2)
	f.Add(uint8(7), int64(9), int64(1), int64(1), "v", int64(0), int64(1)<<62, "", 1)
	f.Fuzz(func(t *testing.T, n uint8, status, slot, counter int64, holder string, a, b int64, inbox string, size int) {
		if size < 1 || size > 1<<12 {
			return
		}
		// An answer of n values, the later ones of the types a script
		// returns or of the wrong types.
		all := []any{status, slot, counter, holder, a, b, inbox, "x", int64(1)}
		vals := all[:min(int(n), len(all))]
		if n%11 == 10 {
			vals = []any{holder, slot, nil}
		}
		g, err := parseGrant(answer{val: vals}, size, time.Second)
		if err != nil {
			return
		}
		if g.status < 0 || g.status > 2 {
			t.Fatalf("status %d accepted", g.status)
		}
		if g.status != 0 && (g.slot < 1 || g.slot > size) {
			t.Fatalf("slot %d of %d accepted", g.slot, size)
		}
		if g.pttl < 0 {
			t.Fatalf("negative remaining time %v", g.pttl)
		}
	})
}
