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
	var parents parentCache // the events of one batch share their trace
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
		if err := c.call(ctx, h, ev, &parents); err != nil {
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
func (c *Client) call(ctx context.Context, h Handler, ev *Event, parents *parentCache) (err error) {
	ctx, end := c.traced(ctx, ev, parents)
	defer func() { end(err) }()
	defer c.recoverPanic(ev, &err)
	return h(ctx, ev)
}

// traced returns ctx continuing ev's trace, if the daemon traced it: spans
// the handler starts from it are in that trace, with or without
// Options.TracerProvider, which adds a "process" span around the call.
// end ends that span with the call's error.
func (c *Client) traced(ctx context.Context, ev *Event, parents *parentCache) (_ context.Context, end func(error)) {
	if ev.Traceparent == "" {
		return ctx, func(error) {}
	}
	if sc, ok := parents.get(ev); ok {
		ctx = trace.ContextWithRemoteSpanContext(ctx, sc)
	}
	if c.opts.TracerProvider == nil {
		return ctx, func(error) {}
	}
	ctx, span := c.opts.TracerProvider.Tracer(telemetry.ScopeName+"/processor").Start(ctx, "process",
		trace.WithSpanKind(trace.SpanKindConsumer), trace.WithAttributes(
			attribute.String("ingestor.source", ev.Source), attribute.String("ingestor.key", ev.Key),
			attribute.Int64("ingestor.seq", ev.Seq), attribute.Int("ingestor.delivery", ev.Delivery),
			attribute.String("messaging.system", "zeromq"), attribute.String("messaging.operation.type", "process")))
	return ctx, func(err error) { telemetry.End(span, err) }
}

// recoverPanic turns a handler's panic into *err; deferred directly.
func (c *Client) recoverPanic(ev *Event, err *error) {
	if r := recover(); r != nil {
		c.log.Error("handler panicked", "source", ev.Source, "key", ev.Key, "panic", r, "stack", string(debug.Stack()))
		*err = fmt.Errorf("handler panicked: %v", r)
	}
}

// parentCache holds the last trace context parsed in a frame: the events of
// one batch share it, so a frame parses it once, not once per event.
type parentCache struct {
	parent, state string
	sc            trace.SpanContext
	ok            bool
}

// get returns the span context of ev's traceparent, false when it is not
// one.
func (p *parentCache) get(ev *Event) (trace.SpanContext, bool) {
	if ev.Traceparent != p.parent || ev.Tracestate != p.state {
		p.parent, p.state = ev.Traceparent, ev.Tracestate
		sc, err := telemetry.ParseParent(ev.Traceparent, ev.Tracestate)
		p.sc, p.ok = sc, err == nil
	}
	return p.sc, p.ok
}
