package main

import (
	"context"
	"io"
	"log/slog"
	"sync"
	"time"

	"github.com/latchkey-go/latchkey/locks/command"
	"github.com/latchkey-go/latchkey/natsputex"
)

// levelNotice ranks between Info and Warn: changes of phase and of the
// connection, which -q keeps.
const levelNotice = slog.LevelInfo + 2

// logLevel maps -v and -q onto a slog level: -v shows Debug (each
// command with its duration), the default Info (every event), -q Notice
// (changes of phase, failures).
func logLevel(verbose, quiet bool) slog.Level {
	switch {
	case verbose:
		return slog.LevelDebug
	case quiet:
		return levelNotice
	}
	return slog.LevelInfo
}

// newLogger returns a logger writing to w in format, "text" or "json",
// lines below level left out. It names levelNotice NOTICE.
func newLogger(w io.Writer, format string, level slog.Level) (*slog.Logger, error) {
	opts := &slog.HandlerOptions{
		Level: level,
		ReplaceAttr: func(groups []string, a slog.Attr) slog.Attr {
			if len(groups) == 0 && a.Key == slog.LevelKey {
				if l, ok := a.Value.Any().(slog.Level); ok && l == levelNotice {
					a.Value = slog.StringValue("NOTICE")
				}
			}
			return a
		},
	}
	return command.NewLogger(w, format, opts)
}

// eventLogger logs the Supervisor's events: a failure at Warn, a change
// of phase at Notice, any other event at Info.
func eventLogger(logger *slog.Logger) func(natsputex.Event) {
	var mu sync.Mutex
	last := natsputex.Phase(-1)
	return func(e natsputex.Event) {
		mu.Lock()
		changed := e.Phase != last
		last = e.Phase
		mu.Unlock()
		level := slog.LevelInfo
		switch {
		case e.Err != nil:
			level = slog.LevelWarn
		case changed:
			level = levelNotice
		}
		attrs := []slog.Attr{slog.String("phase", e.Phase.String())}
		if e.Holder != "" {
			attrs = append(attrs, slog.String("holder", e.Holder))
		}
		if e.Revision != 0 {
			attrs = append(attrs, slog.Uint64("revision", e.Revision))
		}
		if e.Err != nil {
			attrs = append(attrs, slog.String("error", connCause(e.Err)))
		}
		logger.LogAttrs(context.Background(), level, e.Msg, attrs...)
	}
}

// timedCheck is check, logged at Debug with its duration (-v).
func timedCheck(check natsputex.HealthCheck, logger *slog.Logger) natsputex.HealthCheck {
	return func(ctx context.Context, s natsputex.State) error {
		begin := time.Now()
		err := check(ctx, s)
		logCommand(logger, "health check", begin, err, slog.String("state", s.String()))
		return err
	}
}

// timedService logs each start and stop command at Debug with its
// duration (-v).
func timedService(svc natsputex.Service, logger *slog.Logger) natsputex.Service {
	if start := svc.Start; start != nil {
		svc.Start = func(ctx context.Context, token uint64) error {
			begin := time.Now()
			err := start(ctx, token)
			logCommand(logger, "start command", begin, err, slog.Uint64("fencing_token", token))
			return err
		}
	}
	if stop := svc.Stop; stop != nil {
		svc.Stop = func(ctx context.Context) error {
			begin := time.Now()
			err := stop(ctx)
			logCommand(logger, "stop command", begin, err)
			return err
		}
	}
	return svc
}

// logCommand logs that the command what, begun at begin, succeeded or
// failed with err.
func logCommand(logger *slog.Logger, what string, begin time.Time, err error, attrs ...slog.Attr) {
	attrs = append(attrs, slog.Duration("duration", time.Since(begin).Round(time.Millisecond)))
	if err != nil {
		attrs = append(attrs, slog.String("error", err.Error()))
		logger.LogAttrs(context.Background(), slog.LevelDebug, what+" failed", attrs...)
		return
	}
	logger.LogAttrs(context.Background(), slog.LevelDebug, what+" succeeded", attrs...)
}
