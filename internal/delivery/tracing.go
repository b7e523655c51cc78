package delivery

import (
	"context"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/ingestorhq/ingestor/internal/queue"
	"github.com/ingestorhq/ingestor/internal/telemetry"
)

// traceSend records a "send" span, just sent, in each trace that events of
// f belong to, and returns their contexts; nil when none is traced (every
// frame with tracing off: one string comparison per event).
func (s *Sender) traceSend(f *queue.Frame, delivery int) []trace.SpanContext {
	if s.o.Tracer == nil {
		return nil
	}
	var sends []trace.SpanContext
	var last *queue.Trace
	for i := range f.Events {
		e := &f.Events[i]
		if e.Trace == nil || e.Trace == last || last != nil && *e.Trace == *last {
			continue // the events of one batch are together in a frame
		}
		last = e.Trace
		ctx := telemetry.WithParent(context.Background(), e.Trace.Parent, e.Trace.State)
		_, span := telemetry.Child(ctx, s.o.Tracer, "send", trace.WithSpanKind(trace.SpanKindProducer),
			trace.WithAttributes(attribute.Int64("ingestor.frame", f.ID), attribute.Int("ingestor.delivery", delivery),
				attribute.String("ingestor.source", f.Source), attribute.Int("ingestor.events", len(f.Events)),
				attribute.String("messaging.system", "zeromq"), attribute.String("messaging.operation.type", "send"),
				attribute.String("messaging.destination.name", s.o.Endpoint)))
		sends = append(sends, span.SpanContext())
		span.End()
	}
	return sends
}

// traceAck records, under each send span of frame id, an "ack" span from
// the send to the ack.
func (s *Sender) traceAck(id int64, in inflight, now time.Time) {
	for _, sc := range in.sends {
		_, span := telemetry.Child(trace.ContextWithSpanContext(context.Background(), sc), s.o.Tracer, "ack",
			trace.WithTimestamp(in.sent), trace.WithAttributes(attribute.Int64("ingestor.frame", id)))
		span.End(trace.WithTimestamp(now))
	}
}
