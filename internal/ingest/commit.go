package ingest

import (
	"context"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/ingestorhq/ingestor/internal/queue"
	"github.com/ingestorhq/ingestor/internal/telemetry"
	"github.com/ingestorhq/ingestor/sources"
)

// PageBatch returns the queue batch of records, some or all of the records
// of a page of source fetched at fetchedAt whose body is at page in the
// raw store: each event points at its bytes in page's object, and its
// payload is a slice of body, not a copy. It sets no cursor: the caller
// sets the page's cursor on the batch of its last records.
func PageBatch(source string, fetchedAt time.Time, page Ref, body []byte, records []sources.Record) queue.Batch {
	b := queue.Batch{Source: source, FetchedAt: fetchedAt, RawKey: page.Key, Events: make([]queue.NewEvent, len(records))}
	for i, r := range records {
		b.Events[i] = queue.NewEvent{Key: r.Key, EventTime: r.Time, RawOff: page.Off + r.Off, RawLen: r.Len,
			Payload: body[r.Off : r.Off+r.Len]}
	}
	return b
}

// Commit commits b, whose raw bytes Write made durable, and waits: its new
// events, its cursor (SetCursor) and its events' device seqs and verdicts
// in one queue transaction, fsynced. An event whose (source, key) the
// queue holds already is a duplicate and is dropped. It then hands the
// frames of the new events to the sender and returns them. A failed
// commit stores nothing and is shown to the disk guard (IsDiskFull).
func (in *Ingest) Commit(ctx context.Context, b queue.Batch) (frames []queue.Frame, err error) {
	span := in.commitSpan(&b)
	defer func() { telemetry.End(span, err) }()
	frames, err = in.o.Queue.Append(ctx, b)
	if err != nil {
		return nil, in.failed(err)
	}
	in.deliver(frames)
	return frames, nil
}

// commitSpan starts the commit span of a traced batch, or a no-op one.
func (in *Ingest) commitSpan(b *queue.Batch) trace.Span {
	if b.Traceparent == "" || in.o.Tracer == nil {
		return noop.Span{}
	}
	_, span := telemetry.Child(telemetry.WithParent(context.Background(), b.Traceparent, b.Tracestate), in.o.Tracer, "commit",
		trace.WithAttributes(attribute.String("ingestor.source", b.Source), attribute.Int("ingestor.events", len(b.Events))))
	return span
}

// TryCommit is Commit without waiting, for a caller that must not block
// (an actor): it hands b to the queue's writer on chain, which keeps a
// source's batches in the order they were handed over and commits none
// after one that failed (chain may be nil). done is called on the writer's
// goroutine once the group commit is durable, after the new frames went
// to the sender, or with the error, shown to the disk guard. When the
// writer has no room, nothing is handed over: TryCommit returns an error
// wrapping queue.ErrFull, and room is called once the writer takes work.
// Any other error (the queue is closed) means b was not handed over and
// done is not called.
func (in *Ingest) TryCommit(b queue.Batch, chain *queue.Chain, done func([]queue.Frame, error), room func()) error {
	span := in.commitSpan(&b)
	err := in.o.Queue.TryAppendAsync(b, chain, func(frames []queue.Frame, err error) {
		telemetry.End(span, err)
		if err != nil {
			done(nil, in.failed(err))
			return
		}
		in.deliver(frames)
		done(frames, nil)
	}, room)
	if err != nil {
		span.End() // not handed over: done is not called
	}
	return err
}

// deliver shows frames to the tap and hands them to the sender, if any.
func (in *Ingest) deliver(frames []queue.Frame) {
	if in.o.Tap != nil {
		in.o.Tap.Committed(frames)
	}
	if in.o.Sender != nil {
		in.o.Sender.Submit(frames)
	}
}
