package natsputex

import (
	"testing"
	"time"
)

// TestSupervisorTimingFormat: an agent's timing, written in the key after
// its token, reads back as written with the token; a Locker's token
// carries its T; anything else is no timing, and the token is the whole
// value.
func TestSupervisorTimingFormat(t *testing.T) {
	for _, want := range []timing{{time.Second, 0}, {1200 * time.Millisecond, 400 * time.Millisecond}, {3 * time.Nanosecond, time.Hour}} {
		if got, ok := parseTiming(want.String()); !ok || got != want {
			t.Errorf("parseTiming(%q) = %v, %t; want %v", want.String(), got, ok, want)
		}
		for _, token := range []string{"node-a", "host a/ü", "a/0123456789abcdef/1s"} {
			v := valueOf(token, want)
			if got, tm, ok := parseValue(v); got != token || tm != want || !ok {
				t.Errorf("parseValue(%q) = %q, %v, %t; want %q, %v", v, got, tm, ok, token, want)
			}
		}
	}
	for _, bad := range []string{"", "node-a", "T=1s", "T=0s C·R=1s", "T=1s C·R=-1s", "T=x C·R=1s"} {
		if got, ok := parseTiming(bad); ok {
			t.Errorf("parseTiming(%q) = %v, want no timing", bad, got)
		}
		for _, v := range []string{bad, "node-a\n" + bad} {
			if got, tm, ok := parseValue(v); ok || got != v {
				t.Errorf("parseValue(%q) = %q, %v, %t; want the whole value and no timing", v, got, tm, ok)
			}
		}
	}
	if got, tm, ok := parseValue("id/0123456789abcdef/1.2s"); !ok || got != "id/0123456789abcdef/1.2s" || tm != (timing{ttl: 1200 * time.Millisecond}) {
		t.Errorf("a Locker's token: parseValue = %q, %v, %t", got, tm, ok)
	}
}
