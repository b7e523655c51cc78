package push

import (
	"context"
	"net/http"
	"strings"

	"go.opentelemetry.io/contrib/instrumentation/net/http/otelhttp"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/ingestorhq/ingestor/internal/devicewire"
	"github.com/ingestorhq/ingestor/internal/telemetry"
)

// traced wraps the push listener's handler in otelhttp's (the HTTP server
// semantic conventions) when tracing is on: each request is a server span,
// a child of its traceparent header when it has one. WebSocket upgrades
// are left out: a device connection lives for hours, and each of its
// envelopes is traced on its own (envelopeSpan).
func traced(h http.Handler, tp trace.TracerProvider) http.Handler {
	if tp == nil {
		return h
	}
	return otelhttp.NewHandler(h, "push",
		otelhttp.WithTracerProvider(tp),
		otelhttp.WithPropagators(propagation.TraceContext{}),
		otelhttp.WithFilter(func(r *http.Request) bool { return !strings.EqualFold(r.Header.Get("Upgrade"), "websocket") }),
		otelhttp.WithSpanNameFormatter(func(_ string, r *http.Request) string { return r.Method + " /ingest/{name}" }))
}

// envelopeSpan starts the span of one device envelope, under the
// envelope's traceparent when it has one, else as the root of a trace the
// sampler decides on; a no-op span with tracing off.
func envelopeSpan(tp trace.TracerProvider, source string, env *devicewire.Envelope) trace.Span {
	if tp == nil {
		return trace.SpanFromContext(context.Background())
	}
	ctx := telemetry.WithParent(context.Background(), env.Traceparent, env.Tracestate)
	_, span := tp.Tracer(telemetry.ScopeName).Start(ctx, "device envelope", trace.WithSpanKind(trace.SpanKindServer),
		trace.WithAttributes(attribute.String("ingestor.source", source), attribute.String("ingestor.device", env.DeviceID),
			attribute.String("ingestor.event_id", env.EventID)))
	return span
}
