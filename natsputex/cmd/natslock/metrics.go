package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.opentelemetry.io/otel/attribute"
	otelprom "go.opentelemetry.io/otel/exporters/prometheus"
	"go.opentelemetry.io/otel/metric"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"

	"github.com/latchkey-go/latchkey/natsputex"
)

// meterName is the instrumentation scope of natslock's metrics.
const meterName = "github.com/latchkey-go/latchkey/natsputex/cmd/natslock"

// phases are the phases the phase gauge reports, one series each.
var phases = []natsputex.Phase{natsputex.PhaseStandby, natsputex.PhaseConfirming, natsputex.PhaseActive, natsputex.PhaseStopped}

// newMeterProvider returns a meter provider whose instruments report st,
// exported to a Prometheus registry, and the handler serving that
// registry.
func newMeterProvider(st *status) (*sdkmetric.MeterProvider, http.Handler, error) {
	reg := prometheus.NewRegistry()
	exp, err := otelprom.New(otelprom.WithRegisterer(reg), otelprom.WithoutScopeInfo())
	if err != nil {
		return nil, nil, err
	}
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(exp))
	if err := registerInstruments(mp.Meter(meterName), st); err != nil {
		_ = mp.Shutdown(context.Background())
		return nil, nil, err
	}
	return mp, promhttp.HandlerFor(reg, promhttp.HandlerOpts{}), nil
}

// registerInstruments makes natslock's instruments, observed from st at
// each collection.
func registerInstruments(m metric.Meter, st *status) error {
	phase, err1 := m.Int64ObservableGauge("latchkey.natslock.phase", metric.WithUnit("{phase}"),
		metric.WithDescription("1 for the phase natslock is in (standby, confirming, active, stopped), 0 for the others"))
	renewal, err2 := m.Float64ObservableGauge("latchkey.natslock.last_renewal.timestamp", metric.WithUnit("s"),
		metric.WithDescription("when the broker stored this node's last write of the key (Unix time); absent before the first"))
	takeovers, err3 := m.Int64ObservableCounter("latchkey.natslock.takeovers", metric.WithUnit("{takeover}"),
		metric.WithDescription("times this node took the key, free or from a holder silent for T (entries into confirming or active)"))
	starts, err4 := m.Int64ObservableCounter("latchkey.natslock.service.starts", metric.WithUnit("{command}"),
		metric.WithDescription("start commands run, by outcome (ok, failed)"))
	stops, err5 := m.Int64ObservableCounter("latchkey.natslock.service.stops", metric.WithUnit("{command}"),
		metric.WithDescription("stop commands run, by outcome (ok, failed)"))
	failures, err6 := m.Int64ObservableCounter("latchkey.natslock.health_check.failures", metric.WithUnit("{check}"),
		metric.WithDescription("health checks that failed (not counting one cut short by natslock's exit)"))
	if err := errors.Join(err1, err2, err3, err4, err5, err6); err != nil {
		return err
	}
	_, err := m.RegisterCallback(func(_ context.Context, o metric.Observer) error {
		snap := st.snapshot()
		for _, p := range phases {
			v := int64(0)
			if p.String() == snap.Phase {
				v = 1
			}
			o.ObserveInt64(phase, v, metric.WithAttributes(attribute.String("phase", p.String())))
		}
		if snap.LastRenewal != nil {
			o.ObserveFloat64(renewal, float64(snap.LastRenewal.UnixNano())/1e9)
		}
		o.ObserveInt64(takeovers, snap.Takeovers)
		for _, oc := range []string{outcomeOK, outcomeFailed} {
			o.ObserveInt64(starts, snap.Starts[oc], metric.WithAttributes(attribute.String("outcome", oc)))
			o.ObserveInt64(stops, snap.Stops[oc], metric.WithAttributes(attribute.String("outcome", oc)))
		}
		o.ObserveInt64(failures, snap.HealthCheckFailures)
		return nil
	}, phase, renewal, takeovers, starts, stops, failures)
	return err
}

// metricsServer serves /metrics (Prometheus exposition) and /state (st
// as JSON) on addr until it is closed.
type metricsServer struct {
	srv *http.Server
	mp  *sdkmetric.MeterProvider
	ln  net.Listener
}

// serveMetrics listens on addr and serves st's metrics and state.
func serveMetrics(addr string, st *status, logger *slog.Logger) (*metricsServer, error) {
	mp, metrics, err := newMeterProvider(st)
	if err != nil {
		return nil, fmt.Errorf("--metrics-addr: %w", err)
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		_ = mp.Shutdown(context.Background())
		return nil, fmt.Errorf("--metrics-addr: %w", err)
	}
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", metrics)
	mux.HandleFunc("GET /state", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		_ = enc.Encode(st.snapshot())
	})
	m := &metricsServer{srv: &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}, mp: mp, ln: ln}
	go func() {
		if err := m.srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			logger.Error("serving metrics failed", slog.String("addr", ln.Addr().String()), slog.String("error", err.Error()))
		}
	}()
	logger.Log(context.Background(), levelNotice, "serving metrics and state", slog.String("addr", ln.Addr().String()),
		slog.String("metrics", "http://"+ln.Addr().String()+"/metrics"), slog.String("state", "http://"+ln.Addr().String()+"/state"))
	return m, nil
}

// Close stops serving, waiting up to a second for requests under way.
func (m *metricsServer) Close() error {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	return errors.Join(m.srv.Shutdown(ctx), m.mp.Shutdown(ctx))
}
