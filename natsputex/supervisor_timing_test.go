package natsputex

import (
	"testing"
	"time"
)

// TestSupervisorTimingFormat: an agent's advertised timing reads back as
// written; anything else is no timing.
func TestSupervisorTimingFormat(t *testing.T) {
	for _, want := range []timing{{time.Second, 0}, {1200 * time.Millisecond, 400 * time.Millisecond}, {3 * time.Nanosecond, time.Hour}} {
		if got, ok := parseTiming(want.String()); !ok || got != want {
			t.Errorf("parseTiming(%q) = %v, %t; want %v", want.String(), got, ok, want)
		}
	}
	for _, bad := range []string{"", "node-a", "T=1s", "T=0s C·R=1s", "T=1s C·R=-1s", "T=x C·R=1s"} {
		if got, ok := parseTiming(bad); ok {
			t.Errorf("parseTiming(%q) = %v, want no timing", bad, got)
		}
	}
	if k := timingKey("spof-service", "host a/ü"); keys.Check(k) != nil {
		t.Errorf("timingKey gives %q, not a valid key: %v", k, keys.Check(k))
	}
}
