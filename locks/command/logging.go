package command

import (
	"fmt"
	"io"
	"log/slog"
)

// CheckLogFormat returns an error unless format is a value of the
// commands' -log-format flag: "text" (slog's time=... level=... msg=...
// lines) or "json" (one JSON object a line). The commands call it while
// they read their flags, before any I/O, and report its error as a usage
// error ([ExitUsage]).
func CheckLogFormat(format string) error {
	if format != "text" && format != "json" {
		return fmt.Errorf("-log-format must be text or json, got %q", format)
	}
	return nil
}

// NewLogger returns a logger writing to w in format, "text" or "json",
// with the handler options opts (nil for slog's defaults). Any other
// format gives the error of [CheckLogFormat].
func NewLogger(w io.Writer, format string, opts *slog.HandlerOptions) (*slog.Logger, error) {
	if err := CheckLogFormat(format); err != nil {
		return nil, err
	}
	if format == "json" {
		return slog.New(slog.NewJSONHandler(w, opts)), nil
	}
	return slog.New(slog.NewTextHandler(w, opts)), nil
}
