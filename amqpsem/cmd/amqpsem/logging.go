package main

import (
	"io"
	"log/slog"
)

// newLogger returns a logger writing to w in format, "json" or (any
// other) "text"; parse has checked format.
func newLogger(w io.Writer, format string) *slog.Logger {
	if format == "json" {
		return slog.New(slog.NewJSONHandler(w, nil))
	}
	return slog.New(slog.NewTextHandler(w, nil))
}
