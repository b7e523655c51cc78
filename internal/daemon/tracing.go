package daemon

import (
	"context"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/ingestorhq/ingestor/internal/buildinfo"
	"github.com/ingestorhq/ingestor/internal/telemetry/otlp"
)

// tracingShutdownWait bounds the export of the spans still queued when the
// daemon stops.
const tracingShutdownWait = 5 * time.Second

// startTracing starts OpenTelemetry tracing as [telemetry] says (a no-op
// when it is off). It is the first component started, so it stops last
// and exports the spans of the whole shutdown.
func (d *Daemon) startTracing(ctx context.Context) error {
	t, err := otlp.Start(ctx, d.cfg.Telemetry, buildinfo.Read().String(), d.log)
	if err != nil {
		return err
	}
	d.tracing = t
	if d.cfg.Telemetry.Enabled() {
		d.log.Info("tracing on", "endpoint", d.cfg.Telemetry.Endpoint, "protocol", d.cfg.Telemetry.Protocol,
			"sampling_ratio", d.cfg.Telemetry.SamplingRatio)
	}
	d.stops.add("tracing", func() error {
		sctx, cancel := context.WithTimeout(context.Background(), tracingShutdownWait)
		defer cancel()
		return t.Shutdown(sctx)
	})
	return nil
}

// tracer is the daemon's tracer, nil with tracing off: components given
// nil trace nothing and pay nothing.
func (d *Daemon) tracer() trace.Tracer {
	if !d.cfg.Telemetry.Enabled() {
		return nil
	}
	return d.tracing.Tracer()
}

// tracingProvider is the tracer provider, nil with tracing off.
func (d *Daemon) tracingProvider() trace.TracerProvider {
	if !d.cfg.Telemetry.Enabled() {
		return nil
	}
	return d.tracing.Provider()
}
