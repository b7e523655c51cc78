package actors

import (
	"errors"
	"fmt"
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/ingestorhq/ingestor/internal/ingest"
	"github.com/ingestorhq/ingestor/internal/queue"
	"github.com/ingestorhq/ingestor/internal/telemetry"
)

// Publisher commits durable batches through Ingest: events and cursor in
// one queue transaction, then the new frames to delivery.
// A batch of more than sources.SliceRecords records comes as several
// slices, in order on its source's chain, the cursor with the last one
// (see pendingBatch).
//
// It never waits for the queue's writer. A batch the writer has no room
// for is parked, and so is every batch after it, keeping the order in
// which they arrived, which is each source's fetch order; the writer calls
// back when it takes work, and the parked batches are offered again. A
// parked batch still holds its slot of its source's window, so the windows
// bound what is parked, and a busy writer slows the sources' polls.
type Publisher struct {
	deps *Deps
	// parked are the batches not yet handed to the writer, oldest first.
	// While it is not empty, the writer holds a room callback.
	parked []parkedBatch
}

// parkedBatch is a batch waiting for room in the queue's writer.
type parkedBatch struct {
	m      *appendBatch
	sender *actor.PID
	since  time.Time
}

// queueHasRoom tells the Publisher that the queue's writer took work, so
// the parked batches may fit.
type queueHasRoom struct{}

// Receive implements actor.Actor.
func (p *Publisher) Receive(ctx actor.Context) {
	switch m := ctx.Message().(type) {
	case *appendBatch:
		p.parked = append(p.parked, parkedBatch{m: m, sender: ctx.Sender(), since: time.Now()})
		if len(p.parked) == 1 {
			p.offer(ctx)
		} // otherwise it waits behind the others for queueHasRoom
	case *queueHasRoom:
		p.offer(ctx)
	case *actor.Stopping, *actor.Restarting:
		p.abandon(ctx)
	}
}

// offer hands the parked batches to the writer, oldest first, until the
// writer is full.
func (p *Publisher) offer(ctx actor.Context) {
	self, root := ctx.Self(), ctx.ActorSystem().Root
	room := func() { root.Send(self, &queueHasRoom{}) }
	for len(p.parked) > 0 {
		pb := p.parked[0]
		err := p.deps.Ingest.TryCommit(queueBatch(pb.m), pb.m.chain, p.committed(root, pb), room)
		if errors.Is(err, queue.ErrFull) {
			return // room calls back
		}
		if err != nil { // the queue is closed: no later batch of its chain may commit
			pb.m.chain.Fail(err)
			ctx.Send(pb.sender, &batchCommitted{gen: pb.m.gen, seq: pb.m.seq, records: pb.m.records, err: err})
		}
		p.parked[0] = parkedBatch{}
		p.parked = p.parked[1:]
	}
	p.parked = nil // let the backing array go
}

// committed returns the writer's callback for pb, called once the new
// frames went to delivery: it answers the source.
func (p *Publisher) committed(root *actor.RootContext, pb parkedBatch) func([]queue.Frame, error) {
	return func(frames []queue.Frame, err error) {
		p.deps.Metrics.commitDuration.Observe(time.Since(pb.since).Seconds())
		n := 0
		for _, f := range frames {
			n += len(f.Events)
		}
		root.Send(pb.sender, &batchCommitted{gen: pb.m.gen, seq: pb.m.seq, records: pb.m.records, newEvents: n, err: err})
	}
}

// abandon answers the parked batches with an error when the Publisher
// stops, and fails their chains so that no later batch of theirs commits
// past them; their sources re-read their durable cursors and fetch again.
func (p *Publisher) abandon(ctx actor.Context) {
	for _, pb := range p.parked {
		err := fmt.Errorf("append batch of %q: publisher stopped before the batch was queued", pb.m.source)
		pb.m.chain.Fail(err)
		ctx.Send(pb.sender, &batchCommitted{gen: pb.m.gen, seq: pb.m.seq, records: pb.m.records, err: err})
	}
	p.parked = nil
}

// queueBatch converts a slice of a fetched batch to the queue's form,
// with the batch's cursor only when it is the last slice; the events'
// payloads are slices of the batch's body, not copies.
func queueBatch(m *appendBatch) queue.Batch {
	b := ingest.PageBatch(m.source, m.batch.FetchedAt, m.raw, m.batch.Body, m.records)
	b.Traceparent, b.Tracestate = telemetry.Parent(m.batch.Trace)
	b.Page = m.batch.Page
	if m.last {
		b.Cursor, b.SetCursor = m.batch.Cursor, m.batch.Cursor != ""
	}
	return b
}
