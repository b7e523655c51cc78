package processor

import (
	"context"
	"errors"
	"fmt"
	"runtime/debug"
	"strings"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/ingestorhq/ingestor/internal/telemetry"
	"github.com/ingestorhq/ingestor/internal/wire"
)

// handleFrame runs h on f's events in order, skipping those dd knows were
// processed, and reports which to ack and which to nack.
func (c *Client) handleFrame(ctx context.Context, f *frame, h Handler, dd *dedupeStore) frameResult {
	done := make([]bool, len(f.events))
	var fresh []*Event // processed now, to record in dd
	var nacks []wire.Nack
	for i := range f.events {
		if ctx.Err() != nil {
			break // stop between events; the rest are redelivered
		}
		ev := &f.events[i]
		c.events.Add(1)
		if dd != nil {
			seen, err := dd.seen(ctx, ev.Source, ev.Key)
			if err != nil {
				c.log.Warn("dedupe lookup failed; processing the event", "source", ev.Source, "key", ev.Key, "err", err)
			} else if seen {
				c.duplicates.Add(1)
				done[i] = true
				continue
			}
		}
		if err := c.call(ctx, h, ev); err != nil {
			if ctx.Err() != nil && errors.Is(err, ctx.Err()) {
				break // interrupted by the stop: redelivered, not a failure
			}
			nacks = append(nacks, c.nack(f, ev, err))
			continue
		}
		done[i] = true
		fresh = append(fresh, ev)
	}
	if dd != nil && len(fresh) > 0 {
		// The effects happened: ack them even when the record fails, as a
		// processor without DedupeDB would.
		if err := dd.record(context.WithoutCancel(ctx), fresh); err != nil {
			c.log.Warn("processed keys not recorded; a redelivery will repeat them", "frame", f.id, "events", len(fresh), "err", err)
		}
	}
	return result(f, done, nacks)
}

// result builds a frameResult from the events done and the nacks.
func result(f *frame, done []bool, nacks []wire.Nack) frameResult {
	r := frameResult{id: f.id, n: len(f.events), whole: true, nacks: nacks}
	for _, d := range done {
		r.whole = r.whole && d
	}
	if r.whole {
		return r
	}
	for i, d := range done {
		if d {
			r.keys = append(r.keys, wire.KeyAck{Frame: f.id, Source: f.events[i].Source, Key: f.events[i].Key})
		}
	}
	return r
}

// nack counts and logs a failure of ev and returns its nack.
func (c *Client) nack(f *frame, ev *Event, err error) wire.Nack {
	c.failed.Add(1)
	permanent := IsPermanent(err)
	if permanent {
		c.permanent.Add(1)
		c.log.Warn("handler failed permanently; nacked, the daemon dead-letters the event",
			"source", ev.Source, "key", ev.Key, "seq", ev.Seq, "frame", f.id, "delivery", f.delivery, "err", err)
	} else {
		c.log.Warn("handler failed; nacked, the event will be redelivered",
			"source", ev.Source, "key", ev.Key, "seq", ev.Seq, "frame", f.id, "delivery", f.delivery, "err", err)
	}
	return wire.Nack{Frame: f.id, Source: ev.Source, Key: ev.Key, Reason: reason(err), Permanent: permanent}
}

// reason returns err's text for a nack, cut to maxReasonBytes.
func reason(err error) string {
	s := err.Error()
	if len(s) > maxReasonBytes {
		s = strings.ToValidUTF8(s[:maxReasonBytes], "")
	}
	return s
}

// call runs h, turning a panic into an error.
func (c *Client) call(ctx context.Context, h Handler, ev *Event) (err error) {
	if ev.Traceparent != "" {
		// The handler continues the event's trace: spans it starts from
		// ctx are in it, with or without Options.TracerProvider.
		ctx = telemetry.WithParent(ctx, ev.Traceparent, ev.Tracestate)
		if c.opts.TracerProvider != nil {
			var span trace.Span
			ctx, span = c.opts.TracerProvider.Tracer(telemetry.ScopeName+"/processor").Start(ctx, "process",
				trace.WithSpanKind(trace.SpanKindConsumer), trace.WithAttributes(
					attribute.String("ingestor.source", ev.Source), attribute.String("ingestor.key", ev.Key),
					attribute.Int64("ingestor.seq", ev.Seq), attribute.Int("ingestor.delivery", ev.Delivery),
					attribute.String("messaging.system", "zeromq"), attribute.String("messaging.operation.type", "process")))
			defer func() { telemetry.End(span, err) }()
		}
	}
	defer c.recoverPanic(ev, &err)
	return h(ctx, ev)
}

// recoverPanic turns a handler's panic into *err; deferred directly.
func (c *Client) recoverPanic(ev *Event, err *error) {
	if r := recover(); r != nil {
		c.log.Error("handler panicked", "source", ev.Source, "key", ev.Key, "panic", r, "stack", string(debug.Stack()))
		*err = fmt.Errorf("handler panicked: %v", r)
	}
}
