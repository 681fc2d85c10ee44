package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/latchkey-go/latchkey/natsputex"
)

// TestEventLevels: with -q (level NOTICE) a repeated phase without an
// error is left out, a change of phase is logged at NOTICE and a failure
// at WARN; every line carries its fields, not a formatted string.
func TestEventLevels(t *testing.T) {
	var buf bytes.Buffer
	logger, err := newLogger(&buf, "json", logLevel(false, true))
	if err != nil {
		t.Fatal(err)
	}
	observe := eventLogger(logger.With("key", "svc"))
	observe(natsputex.Event{Phase: natsputex.PhaseStandby, Msg: "standby: the key is held by another agent", Holder: "node-b", Revision: 7})
	observe(natsputex.Event{Phase: natsputex.PhaseStandby, Msg: "standby: the key is held by another agent", Holder: "node-b", Revision: 8})
	observe(natsputex.Event{Phase: natsputex.PhaseStandby, Msg: "health check failed", Err: errors.New("exit status 1")})
	observe(natsputex.Event{Phase: natsputex.PhaseActive, Msg: "active: service started with fencing token 9", Holder: "node-a", Revision: 9})

	var lines []map[string]any
	for l := range strings.Lines(buf.String()) {
		var m map[string]any
		if err := json.Unmarshal([]byte(l), &m); err != nil {
			t.Fatalf("not a JSON line: %q: %v", l, err)
		}
		lines = append(lines, m)
	}
	want := []map[string]any{
		{"level": "NOTICE", "phase": "standby", "holder": "node-b", "revision": 7.0, "key": "svc"},
		{"level": "WARN", "phase": "standby", "msg": "health check failed", "error": "exit status 1"},
		{"level": "NOTICE", "phase": "active", "holder": "node-a", "revision": 9.0},
	}
	if len(lines) != len(want) {
		t.Fatalf("%d lines, want %d (the repeated standby event left out with -q):\n%s", len(lines), len(want), buf.String())
	}
	for i, w := range want {
		for k, v := range w {
			if lines[i][k] != v {
				t.Errorf("line %d: %s = %v, want %v\n%v", i, k, lines[i][k], v, lines[i])
			}
		}
	}
	if _, err := newLogger(&buf, "xml", logLevel(false, false)); err == nil {
		t.Error("newLogger accepted the format xml")
	}
}
