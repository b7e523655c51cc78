// Package telemetry holds the OpenTelemetry helpers the pipeline and the
// processor client share: the W3C trace context an event carries through
// the queue and in frames, child spans only under sampled parents, and
// trace ids in logs. Package otlp starts the exporter from [telemetry].
//
// Tracing off is a no-op TracerProvider: spans are never recorded, and the
// event path checks SpanContext.IsSampled before any per-batch work, so
// the cost is a few nanoseconds per poll and per frame.
package telemetry

import (
	"context"
	"errors"

	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"
)

// ScopeName is the instrumentation scope of every span the daemon makes.
const ScopeName = "github.com/ingestorhq/ingestor"

// Parent returns the W3C traceparent and tracestate of sc, or "" when sc
// is not sampled: only sampled traces travel with events.
func Parent(sc trace.SpanContext) (parent, state string) {
	if !sc.IsValid() || !sc.IsSampled() {
		return "", ""
	}
	c := propagation.MapCarrier{}
	propagation.TraceContext{}.Inject(trace.ContextWithSpanContext(context.Background(), sc), c)
	return c["traceparent"], c["tracestate"]
}

// ErrBadTraceparent is returned by ParseParent for a traceparent that is
// not W3C Trace Context.
var ErrBadTraceparent = errors.New("not a W3C traceparent")

// ParseParent returns the remote span context of a W3C traceparent and
// tracestate (an invalid tracestate is dropped, as the spec says).
func ParseParent(parent, state string) (trace.SpanContext, error) {
	c := propagation.MapCarrier{"traceparent": parent}
	if state != "" {
		c["tracestate"] = state
	}
	sc := trace.SpanContextFromContext(propagation.TraceContext{}.Extract(context.Background(), c))
	if !sc.IsValid() {
		return trace.SpanContext{}, ErrBadTraceparent
	}
	return sc, nil
}

// WithParent returns ctx carrying the remote span context of parent and
// state, or ctx unchanged when parent is empty or not a traceparent.
func WithParent(ctx context.Context, parent, state string) context.Context {
	if parent == "" {
		return ctx
	}
	sc, err := ParseParent(parent, state)
	if err != nil {
		return ctx
	}
	return trace.ContextWithRemoteSpanContext(ctx, sc)
}

// Child starts the span name under ctx's span when that is sampled; else
// it returns ctx and a no-op span, so that work outside a sampled trace
// (every event with tracing off) starts nothing. t may be nil: no span.
func Child(ctx context.Context, t trace.Tracer, name string, opts ...trace.SpanStartOption) (context.Context, trace.Span) {
	if t == nil || !trace.SpanContextFromContext(ctx).IsSampled() {
		return ctx, noop.Span{}
	}
	return t.Start(ctx, name, opts...)
}

// End records err on span, if any, and ends it.
func End(span trace.Span, err error) {
	if err != nil && span.IsRecording() {
		span.RecordError(err)
		span.SetStatus(codes.Error, err.Error())
	}
	span.End()
}
