package actors

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/ingestorhq/ingestor/internal/backoff"
	"github.com/ingestorhq/ingestor/internal/delivery"
	"github.com/ingestorhq/ingestor/internal/queue"
	"github.com/ingestorhq/ingestor/internal/rawstore"
	"github.com/ingestorhq/ingestor/sources"
)

// Deps are the shared components the actors use.
type Deps struct {
	Queue  *queue.Queue
	Raw    rawstore.Store
	Sender *delivery.Sender
	// NewAckReceiver binds the ack socket; AckManager calls it on every
	// (re)start.
	NewAckReceiver   func() (*delivery.AckReceiver, error)
	Metrics          *Metrics
	Logger           *slog.Logger
	MaxPendingEvents int64
	// RawWriters caps concurrent raw-store writes. Default 8.
	RawWriters int
	// Limiters are the shared rate limiters sources may name.
	Limiters *sources.RateLimiters

	// Set by the Supervisor when it spawns the shared actors.
	PersistRaw, Publisher, OffsetStore *actor.PID
}

// rawRetry is the backoff between failed raw-store writes.
var rawRetry = backoff.Policy{Base: 100 * time.Millisecond, Max: 30 * time.Second}

// PersistRaw makes raw payloads durable. Each write runs in its own
// goroutine, at most RawWriters at once, and is retried with backoff until it
// succeeds or the actor stops; a slow store therefore holds the sources'
// windows open, which slows their polls.
type PersistRaw struct {
	deps   *Deps
	sem    chan struct{}
	ctx    context.Context
	cancel context.CancelFunc
}

// Receive implements actor.Actor.
func (p *PersistRaw) Receive(ctx actor.Context) {
	switch m := ctx.Message().(type) {
	case *actor.Started:
		p.ctx, p.cancel = context.WithCancel(context.Background())
		p.sem = make(chan struct{}, max(p.deps.RawWriters, 1))
	case *actor.Stopping, *actor.Restarting:
		p.cancel()
	case *persistRaw:
		sender, root := ctx.Sender(), ctx.ActorSystem().Root
		go func() {
			key := rawstore.Key(m.source, m.batch.FetchedAt, m.batch.Body)
			err := p.put(m.source, key, m.batch.Body)
			root.Send(sender, &rawPersisted{gen: m.gen, seq: m.seq, rawKey: key, err: err})
		}()
	case *deadLetterPayload:
		go p.deadLetter(m)
	}
}

// put writes body under key, retrying until it succeeds or the actor stops.
func (p *PersistRaw) put(source, key string, body []byte) error {
	select {
	case p.sem <- struct{}{}:
	case <-p.ctx.Done():
		return p.ctx.Err()
	}
	defer func() { <-p.sem }()
	for attempt := 0; ; attempt++ {
		start := time.Now()
		err := p.deps.Raw.Put(p.ctx, key, body)
		if err == nil {
			p.deps.Metrics.rawPutDuration.Observe(time.Since(start).Seconds())
			return nil
		}
		if p.ctx.Err() != nil {
			return p.ctx.Err()
		}
		p.deps.Metrics.rawPutErrors.Inc()
		wait := rawRetry.Delay(attempt)
		p.deps.Logger.Warn("raw store write failed; retrying", "source", source, "key", key, "err", err, "retry_in", wait)
		select {
		case <-time.After(wait):
		case <-p.ctx.Done():
			return p.ctx.Err()
		}
	}
}

// deadLetter keeps a malformed payload under a "deadletter/" key and lists it.
func (p *PersistRaw) deadLetter(m *deadLetterPayload) {
	key := "deadletter/" + rawstore.Key(m.source, m.err.FetchedAt, m.err.Body)
	if err := p.put(m.source, key, m.err.Body); err != nil {
		p.deps.Logger.Error("keep malformed payload", "source", m.source, "err", err)
		return
	}
	if err := p.deps.Queue.DeadLetter(p.ctx, m.source, m.err.Reason, key); err != nil {
		p.deps.Logger.Error("record dead letter", "source", m.source, "err", err)
	}
}

// Publisher commits durable batches to the write-ahead queue (events and
// cursor in one transaction) and hands the new frames to the ZeroMQ sender.
type Publisher struct {
	deps *Deps
}

// Receive implements actor.Actor.
func (p *Publisher) Receive(ctx actor.Context) {
	m, ok := ctx.Message().(*appendBatch)
	if !ok {
		return
	}
	b := queue.Batch{
		Source:    m.source,
		FetchedAt: m.batch.FetchedAt,
		RawKey:    m.rawKey,
		Events:    make([]queue.NewEvent, len(m.batch.Records)),
		Cursor:    m.batch.Cursor,
		SetCursor: m.batch.Cursor != "",
	}
	for i, r := range m.batch.Records {
		b.Events[i] = queue.NewEvent{Key: r.Key, EventTime: r.Time, RawOff: r.Off, RawLen: r.Len,
			Payload: m.batch.Body[r.Off : r.Off+r.Len]}
	}
	sender, root, start := ctx.Sender(), ctx.ActorSystem().Root, time.Now()
	// Enqueueing keeps the order in which this actor received the
	// batches, which is each source's fetch order; the commit itself
	// happens on the queue's writer, which calls back. Enqueueing only
	// waits when the writer is far behind, which is backpressure.
	err := p.deps.Queue.AppendAsync(context.Background(), b, m.chain, func(frames []queue.Frame, err error) {
		p.deps.Metrics.commitDuration.Observe(time.Since(start).Seconds())
		n := 0
		if err == nil {
			p.deps.Sender.Submit(frames)
			for _, f := range frames {
				n += len(f.Events)
			}
		}
		root.Send(sender, &batchCommitted{gen: m.gen, seq: m.seq, newEvents: n, err: err})
	})
	if err != nil {
		ctx.Send(sender, &batchCommitted{gen: m.gen, seq: m.seq, err: err})
	}
}

// OffsetStore serves the durable cursors. Cursors are written by the
// Publisher in the same transaction as the batch they follow, so a cursor
// can never get ahead of the events it covers.
type OffsetStore struct {
	deps *Deps
}

// Receive implements actor.Actor.
func (o *OffsetStore) Receive(ctx actor.Context) {
	m, ok := ctx.Message().(*getCursor)
	if !ok {
		return
	}
	sender, root := ctx.Sender(), ctx.ActorSystem().Root
	go func() {
		qctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		c, _, err := o.deps.Queue.Cursor(qctx, m.source)
		root.Send(sender, &cursorReply{cursor: c, err: err})
	}()
}

// AckManager runs the ack receiver: it binds the PULL socket processors push
// acks to, clears acked frames from the queue and frees the sender's window.
// If the receiver fails, the actor fails and is restarted with backoff.
type AckManager struct {
	deps   *Deps
	cancel context.CancelFunc
	done   chan struct{}
}

// Receive implements actor.Actor.
func (a *AckManager) Receive(ctx actor.Context) {
	switch m := ctx.Message().(type) {
	case *actor.Started:
		recv, err := a.deps.NewAckReceiver()
		if err != nil {
			panic(fmt.Errorf("ack manager: %w", err))
		}
		runCtx, cancel := context.WithCancel(context.Background())
		a.cancel, a.done = cancel, make(chan struct{})
		self, root := ctx.Self(), ctx.ActorSystem().Root
		go func() {
			defer close(a.done)
			if err := recv.Run(runCtx); err != nil {
				root.Send(self, &failed{reason: fmt.Errorf("ack manager: %w", err)})
			}
		}()
	case *actor.Stopping, *actor.Restarting:
		if a.cancel != nil {
			a.cancel()
			<-a.done // the socket must be closed before a restart binds it again
		}
	case *failed:
		panic(m.reason)
	}
}
