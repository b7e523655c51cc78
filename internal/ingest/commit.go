package ingest

import (
	"context"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/ingestorhq/ingestor/internal/queue"
	"github.com/ingestorhq/ingestor/internal/rawstore"
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

// WriteCommit makes p, a page, durable in the raw store and commits the
// batch that batch returns (built from p's Ref), as Write then Commit do,
// and returns the frames, when the raw write ended, and either the raw
// write's error (nothing is then committed) or the commit's. When the
// store can say where a page goes before writing it (a
// rawstore.PageReserver), the queue applies the batch while the page is
// written and commits it only once the page is durable
// (queue.AppendAfter): the inserts no longer wait for the raw sync. p's
// Ref is then set before the write ends, and stays set if it fails.
func (in *Ingest) WriteCommit(ctx context.Context, p *Payload, batch func() queue.Batch) (frames []queue.Frame, wrote time.Time, rawErr, err error) {
	res, ok := in.o.Raw.(rawstore.PageReserver)
	if !ok || !p.page {
		if rawErr = in.Write(ctx, p); rawErr != nil {
			return nil, time.Now(), rawErr, nil
		}
		wrote = time.Now()
		frames, err = in.Commit(context.Background(), batch())
		return frames, wrote, nil, err
	}
	ctx, span := telemetry.Child(ctx, in.o.Tracer, "raw write", trace.WithAttributes(
		attribute.String("ingestor.source", p.Source), attribute.Int("ingestor.bytes", len(p.Body))))
	key, off, write, rerr := res.ReservePage(ctx, p.Source, p.fetchedAt, p.Body)
	if rerr != nil {
		telemetry.End(span, rerr)
		return nil, time.Now(), in.failed(rerr), nil
	}
	p.ref = Ref{Key: key, Off: off}
	b := batch()
	cspan := in.commitSpan(&b)
	written := make(chan error, 1)
	wait, qerr := in.o.Queue.AppendAfter(context.Background(), b, written)
	werr := write() // always: it releases the source's page segment
	written <- werr
	wrote = time.Now()
	telemetry.End(span, werr)
	if qerr == nil {
		frames, qerr = wait()
	}
	telemetry.End(cspan, qerr)
	switch {
	case werr != nil:
		return nil, wrote, in.failed(werr), nil
	case qerr != nil:
		return nil, wrote, nil, in.failed(qerr)
	}
	in.deliver(frames)
	return frames, wrote, nil, nil
}
