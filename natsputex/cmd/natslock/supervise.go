package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/latchkey-go/latchkey/natsputex"
)

// supervise connects and runs the Supervisor until ctx ends. Its error
// matches [natsputex.ErrStopFailed] when the last stop failed.
func supervise(ctx context.Context, cfg *config, logger *slog.Logger) error {
	// A connection that gives up reconnecting (-max-reconnects) ends the
	// run: the Supervisor stops the service, and natslock exits 1.
	ctx, closed := context.WithCancelCause(ctx)
	defer closed(nil)
	var st *status
	if cfg.metricsAddr != "" {
		st = newStatus(cfg.key, cfg.token)
		srv, err := serveMetrics(cfg.metricsAddr, st, logger)
		if err != nil {
			return err
		}
		defer srv.Close()
	}
	var reaper *natsputex.CommandReaper
	if cfg.start != "" {
		var err error
		if reaper, err = natsputex.StartCommandReaper(cfg.stop); err != nil {
			logger.Warn("no reaper: a natslock killed outright leaves its service running", slog.String("error", err.Error()))
			reaper = nil
		} else {
			defer func() {
				if err := reaper.Close(); err != nil {
					logger.Warn("closing the reaper failed", slog.String("error", err.Error()))
				}
			}()
		}
	}
	nc, err := nats.Connect(cfg.url, connHandlers(ctx, cfg, logger, closed)...)
	if err != nil {
		// nats.go's "no servers available for connection" names none.
		return fmt.Errorf("connect to %s: %w", redactURLs(cfg.url), err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return err
	}
	client, err := natsputex.New(ctx, js, cfg.bucket, supervisorOptions(ctx, cfg, st, logger)...)
	if err != nil {
		return err
	}
	defer client.Close(context.WithoutCancel(ctx))
	if st != nil {
		if err := watchKey(ctx, js, cfg, st); err != nil {
			logger.Warn("no watch of the key: the metrics will not show the last renewal", slog.String("error", err.Error()))
		}
	}
	sup, err := client.Supervisor(cfg.key, cfg.token, service(cfg, reaper, st, logger))
	if err != nil {
		return err
	}
	logger.Log(ctx, levelNotice, "running", slog.Duration("ttl", client.TTL()))
	err = sup.Run(ctx)
	cause := context.Cause(ctx)
	switch {
	case errors.Is(err, natsputex.ErrStopFailed):
		return err
	case err != nil && ctx.Err() == nil:
		return err
	case cause != nil && !errors.Is(cause, context.Canceled):
		return cause
	}
	return nil
}

// connHandlers are cfg's NATS options with handlers that log
// disconnections and reconnections and end ctx (with closed) when the
// connection closes before it ended.
func connHandlers(ctx context.Context, cfg *config, logger *slog.Logger, closed context.CancelCauseFunc) []nats.Option {
	return append(cfg.natsOpts[:len(cfg.natsOpts):len(cfg.natsOpts)],
		nats.DisconnectErrHandler(func(_ *nats.Conn, err error) {
			if ctx.Err() == nil {
				attrs := []slog.Attr{}
				if err != nil {
					attrs = append(attrs, slog.String("error", disconnectCause(err)))
				}
				logger.LogAttrs(ctx, slog.LevelWarn, "disconnected from NATS", attrs...)
			}
		}),
		nats.ReconnectHandler(func(nc *nats.Conn) {
			logger.Log(ctx, levelNotice, "reconnected to NATS", slog.String("url", nc.ConnectedUrlRedacted()))
		}),
		// nats.go writes asynchronous errors (a slow consumer, a
		// permission violation) straight to standard error by default:
		// they go through the logger instead.
		nats.ErrorHandler(func(_ *nats.Conn, sub *nats.Subscription, err error) {
			attrs := []slog.Attr{slog.String("source", "nats.go"), slog.String("error", err.Error())}
			if sub != nil {
				attrs = append(attrs, slog.String("subject", sub.Subject))
			}
			logger.LogAttrs(ctx, slog.LevelWarn, "NATS asynchronous error", attrs...)
		}),
		nats.ClosedHandler(func(nc *nats.Conn) {
			if ctx.Err() == nil {
				closed(fmt.Errorf("the NATS connection closed (it stopped reconnecting): %v", nc.LastError()))
			}
		}),
	)
}

// supervisorOptions are cfg's options with the health check, if any,
// timed (-v) and counted (st, if not nil).
func supervisorOptions(ctx context.Context, cfg *config, st *status, logger *slog.Logger) []natsputex.Option {
	opts := cfg.opts
	if cfg.health == "" {
		return opts
	}
	check := natsputex.CommandHealthCheck(cfg.health)
	if cfg.verbose {
		check = timedCheck(check, logger)
	}
	if st != nil {
		check = st.healthCheck(ctx, check)
	}
	return append(opts[:len(opts):len(opts)], natsputex.WithHealthCheck(check))
}

// service is the Supervisor's service: cfg's commands, tracked by
// reaper, logged, timed (-v) and counted (st, if not nil).
func service(cfg *config, reaper *natsputex.CommandReaper, st *status, logger *slog.Logger) natsputex.Service {
	observe := eventLogger(logger)
	if st != nil {
		logEvent := observe
		observe = func(e natsputex.Event) {
			st.observe(e)
			logEvent(e)
		}
	}
	svc := reaper.Service(cfg.start, cfg.stop, observe)
	if cfg.verbose {
		svc = timedService(svc, logger)
	}
	if st != nil {
		svc = st.service(svc)
	}
	return svc
}

// watchKey has st watch the key for this node's writes.
func watchKey(ctx context.Context, js jetstream.JetStream, cfg *config, st *status) error {
	kv, err := js.KeyValue(ctx, cfg.bucket)
	if err != nil {
		return err
	}
	return st.watchRenewals(ctx, kv)
}

// disconnectCause says why the connection was lost, for the log. A write
// that found the connection gone gives nats.go's "outbound buffer limit
// exceeded", as natslock buffers no write while reconnecting
// (ReconnectBufSize -1): that is the write's failure, not the cause.
func disconnectCause(err error) string {
	if errors.Is(err, nats.ErrReconnectBufExceeded) {
		return "the connection was lost (a write found it gone)"
	}
	return err.Error()
}

// connCause is err's text for the log, with nats.go's "outbound buffer
// limit exceeded" said as what it means here: natsputex's connections
// keep no reconnect buffer, so a write gets that error whenever the
// connection is gone.
func connCause(err error) string {
	msg := err.Error()
	if errors.Is(err, nats.ErrReconnectBufExceeded) || strings.Contains(msg, nats.ErrReconnectBufExceeded.Error()) {
		msg = strings.Replace(msg, nats.ErrReconnectBufExceeded.Error(), "not connected to NATS (the connection was lost)", 1)
	}
	return msg
}

// redactURLs returns the comma-separated URLs with their passwords
// replaced by "xxxxx".
func redactURLs(urls string) string {
	var out []string
	for u := range strings.SplitSeq(urls, ",") {
		out = append(out, redactURL(strings.TrimSpace(u)))
	}
	return strings.Join(out, ",")
}
