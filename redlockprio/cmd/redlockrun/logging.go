package main

import (
	"context"
	"fmt"
	"log/slog"
)

// redisLogger passes go-redis's messages (failed dials, say) to a
// logger at Debug, with the field source=go-redis: redlockrun's own
// error line says what failed, and -v shows go-redis's detail.
type redisLogger struct{ logger *slog.Logger }

// Printf logs one message of go-redis.
func (l redisLogger) Printf(ctx context.Context, format string, v ...any) {
	l.logger.DebugContext(ctx, fmt.Sprintf(format, v...), slog.String("source", "go-redis"))
}
