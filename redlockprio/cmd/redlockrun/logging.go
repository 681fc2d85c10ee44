package main

import (
	"context"
	"fmt"
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

// redisLogger passes go-redis's messages (failed dials, say) to a
// logger, at Warn, with the field source=go-redis.
type redisLogger struct{ logger *slog.Logger }

// Printf logs one message of go-redis.
func (l redisLogger) Printf(ctx context.Context, format string, v ...any) {
	l.logger.WarnContext(ctx, fmt.Sprintf(format, v...), slog.String("source", "go-redis"))
}
