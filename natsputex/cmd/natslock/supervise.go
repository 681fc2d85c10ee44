package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"

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
		return err
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
					attrs = append(attrs, slog.String("error", err.Error()))
				}
				logger.LogAttrs(ctx, slog.LevelWarn, "disconnected from NATS", attrs...)
			}
		}),
		nats.ReconnectHandler(func(nc *nats.Conn) {
			logger.Log(ctx, levelNotice, "reconnected to NATS", slog.String("url", nc.ConnectedUrlRedacted()))
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
