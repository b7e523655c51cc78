// Package otlp starts the daemon's OpenTelemetry tracing from [telemetry]:
// an OTLP exporter (gRPC or HTTP) behind a batch span processor, and a
// parent-based ratio sampler. The helpers every component uses are in the
// parent package, which the processor client imports without this one.
package otlp

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"log/slog"
	"net/url"
	"os"
	"strings"
	"sync"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"
	"google.golang.org/grpc/credentials"

	"github.com/ingestorhq/ingestor/config"
	"github.com/ingestorhq/ingestor/internal/telemetry"
)

// MaxQueuedSpans bounds the spans waiting for export: beyond it, new spans
// are dropped (and counted by the SDK), never held.
const MaxQueuedSpans = 2048

// Tracing is the daemon's tracer provider.
type Tracing struct {
	provider trace.TracerProvider
	shutdown func(context.Context) error
}

// Off is tracing off: a no-op provider.
func Off() *Tracing {
	return &Tracing{provider: noop.NewTracerProvider(), shutdown: func(context.Context) error { return nil }}
}

// Start returns the tracing cfg asks for, exporting over OTLP; Off when
// cfg has no endpoint. It reads the CA, client certificate and header
// files now, so a missing one fails the start.
func Start(ctx context.Context, cfg config.Telemetry, version string, log *slog.Logger) (*Tracing, error) {
	if !cfg.Enabled() {
		return Off(), nil
	}
	exp, err := exporter(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("telemetry: %w", err)
	}
	handleErrors(log)
	res := resource.NewSchemaless(attribute.String("service.name", cfg.ServiceName), attribute.String("service.version", version))
	tp := sdktrace.NewTracerProvider(
		sdktrace.WithBatcher(exp, sdktrace.WithMaxQueueSize(MaxQueuedSpans), sdktrace.WithExportTimeout(cfg.ExportTimeout)),
		sdktrace.WithSampler(sdktrace.ParentBased(sdktrace.TraceIDRatioBased(cfg.SamplingRatio))),
		sdktrace.WithResource(res))
	return &Tracing{provider: tp, shutdown: tp.Shutdown}, nil
}

// Provider returns the tracer provider.
func (t *Tracing) Provider() trace.TracerProvider { return t.provider }

// Tracer returns the daemon's tracer.
func (t *Tracing) Tracer() trace.Tracer { return t.provider.Tracer(telemetry.ScopeName) }

// Shutdown exports the spans still queued, within ctx.
func (t *Tracing) Shutdown(ctx context.Context) error { return t.shutdown(ctx) }

// exporter builds the OTLP exporter of cfg.
func exporter(ctx context.Context, cfg config.Telemetry) (sdktrace.SpanExporter, error) {
	headers, err := headers(cfg)
	if err != nil {
		return nil, err
	}
	tlsCfg, err := tlsConfig(cfg)
	if err != nil {
		return nil, err
	}
	if cfg.Protocol == "http/protobuf" {
		endpoint := cfg.Endpoint
		if u, err := url.Parse(endpoint); err == nil && (u.Path == "" || u.Path == "/") {
			endpoint = strings.TrimSuffix(endpoint, "/") + "/v1/traces"
		}
		opts := []otlptracehttp.Option{otlptracehttp.WithEndpointURL(endpoint), otlptracehttp.WithHeaders(headers),
			otlptracehttp.WithTimeout(cfg.ExportTimeout)}
		if tlsCfg != nil {
			opts = append(opts, otlptracehttp.WithTLSClientConfig(tlsCfg))
		}
		return otlptracehttp.New(ctx, opts...)
	}
	opts := []otlptracegrpc.Option{otlptracegrpc.WithEndpointURL(cfg.Endpoint), otlptracegrpc.WithHeaders(headers),
		otlptracegrpc.WithTimeout(cfg.ExportTimeout)}
	if tlsCfg != nil {
		opts = append(opts, otlptracegrpc.WithTLSCredentials(credentials.NewTLS(tlsCfg)))
	}
	return otlptracegrpc.New(ctx, opts...)
}

// headers returns cfg's export headers, those of header_files read now.
func headers(cfg config.Telemetry) (map[string]string, error) {
	h := make(map[string]string, len(cfg.Headers)+len(cfg.HeaderFiles))
	for k, v := range cfg.Headers {
		h[k] = v
	}
	for k, path := range cfg.HeaderFiles {
		data, err := os.ReadFile(path)
		if err != nil {
			return nil, fmt.Errorf("read header %s: %w", k, err)
		}
		v := strings.TrimSpace(string(data))
		if v == "" {
			return nil, fmt.Errorf("read header %s: %s is empty", k, path)
		}
		h[k] = v
	}
	return h, nil
}

// tlsConfig returns the TLS settings of an https endpoint with a CA or a
// client certificate, or nil for the defaults.
func tlsConfig(cfg config.Telemetry) (*tls.Config, error) {
	if cfg.CAFile == "" && cfg.CertFile == "" {
		return nil, nil
	}
	c := &tls.Config{MinVersion: tls.VersionTLS12}
	if cfg.CAFile != "" {
		pem, err := os.ReadFile(cfg.CAFile)
		if err != nil {
			return nil, fmt.Errorf("read ca_file: %w", err)
		}
		c.RootCAs = x509.NewCertPool()
		if !c.RootCAs.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("ca_file %s holds no PEM certificate", cfg.CAFile)
		}
	}
	if cfg.CertFile != "" {
		cert, err := tls.LoadX509KeyPair(cfg.CertFile, cfg.KeyFile)
		if err != nil {
			return nil, fmt.Errorf("load the client certificate: %w", err)
		}
		c.Certificates = []tls.Certificate{cert}
	}
	return c, nil
}

var errorsOnce sync.Once

// handleErrors sends the SDK's errors (an export that failed: the
// receiver is down) to log, at most one a minute: tracing must never
// flood the daemon's log.
func handleErrors(log *slog.Logger) {
	errorsOnce.Do(func() {
		var mu sync.Mutex
		var last time.Time
		var dropped int
		otel.SetErrorHandler(otel.ErrorHandlerFunc(func(err error) {
			mu.Lock()
			defer mu.Unlock()
			if time.Since(last) < time.Minute {
				dropped++
				return
			}
			last = time.Now()
			log.Warn("telemetry: exporting spans failed (spans are dropped, events are not)", "err", err, "errors_since_last", dropped)
			dropped = 0
		}))
	})
}
