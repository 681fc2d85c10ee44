package command_test

import (
	"bytes"
	"encoding/json"
	"log/slog"
	"strings"
	"testing"

	"github.com/latchkey-go/latchkey/locks/command"
)

// TestNewLogger: text gives key=value lines, json one object a line, with
// the handler options given; any other format is refused.
func TestNewLogger(t *testing.T) {
	var buf bytes.Buffer
	logger, err := command.NewLogger(&buf, "text", nil)
	if err != nil {
		t.Fatal(err)
	}
	logger.Info("hello", slog.String("name", "n1"))
	if out := buf.String(); !strings.Contains(out, "level=INFO msg=hello name=n1") {
		t.Errorf("text: %q", out)
	}

	buf.Reset()
	logger, err = command.NewLogger(&buf, "json", &slog.HandlerOptions{Level: slog.LevelWarn})
	if err != nil {
		t.Fatal(err)
	}
	logger.Info("left out")
	logger.Warn("kept", slog.Int("n", 3))
	lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
	if len(lines) != 1 {
		t.Fatalf("json at Warn: %d lines, want 1: %q", len(lines), buf.String())
	}
	var line map[string]any
	if err := json.Unmarshal([]byte(lines[0]), &line); err != nil {
		t.Fatalf("json: not an object: %v: %q", err, lines[0])
	}
	if line["msg"] != "kept" || line["level"] != "WARN" || line["n"] != float64(3) {
		t.Errorf("json: %v", line)
	}

	for _, f := range []string{"", "xml", "JSON", " text"} {
		if l, err := command.NewLogger(&buf, f, nil); err == nil || l != nil {
			t.Errorf("NewLogger(%q) = %v, %v; want an error", f, l, err)
		} else if !strings.Contains(err.Error(), "-log-format must be text or json") {
			t.Errorf("NewLogger(%q): %v", f, err)
		}
		if err := command.CheckLogFormat(f); err == nil {
			t.Errorf("CheckLogFormat(%q) = nil", f)
		}
	}
}
