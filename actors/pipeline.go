package actors

import (
	"cmp"
	"context"
	"errors"
	"io/fs"
	"log/slog"
	"os"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"go.opentelemetry.io/otel/trace"

	"github.com/ingestorhq/ingestor/internal/backoff"
	"github.com/ingestorhq/ingestor/internal/ingest"
	"github.com/ingestorhq/ingestor/internal/queue"
)

// Deps are the shared components the actors use.
type Deps struct {
	// Queue is read for the sources' cursors, waits and pending events,
	// and written for their waits and resolved dead letters; batches
	// reach it only through Ingest.
	Queue *queue.Queue
	// Ingest makes batches durable (raw bytes, then events and cursor)
	// and hands their frames to delivery; it also says when disk space is
	// too low for new polls.
	Ingest           *ingest.Ingest
	Metrics          *Metrics
	Logger           *slog.Logger
	MaxPendingEvents int64
	// RawWriters caps concurrent raw-store writes. Default 8.
	RawWriters int
	// RawMaxAttempts is how many failed writes of one payload precede its
	// spill to SpillDir. Default 10.
	RawMaxAttempts int
	// SpillDir keeps payloads the raw store refuses until it takes them;
	// "" keeps them in memory only.
	SpillDir string
	// Member, in cluster mode, is this daemon's member name: sources send
	// it upstream (sources.MemberHeader).
	Member string
	// Placed, in cluster mode, starts no polled source with the pipeline:
	// each starts when the cluster places it here (Pipeline.Apply).
	Placed bool
	// Fence, in cluster mode, says whether this member still holds the
	// source and until when: a source polls only while it does, and ends
	// each poll by that deadline. Nil outside cluster mode.
	Fence func(source string) (deadline time.Time, ok bool)
	// Tracing, when set, traces each poll (and its HTTP requests), the
	// raw write and commit of what it fetched; nil traces nothing.
	Tracing trace.TracerProvider

	// Set by the Supervisor when it spawns the shared actors.
	PersistRaw, Publisher *actor.PID
}

// rawRetry is the backoff between failed raw-store writes.
var rawRetry = backoff.Policy{Base: 100 * time.Millisecond, Max: 30 * time.Second}

// PersistRaw makes raw payloads durable: batches, and malformed payloads
// under deadletter/. Each write runs in its own goroutine, at most
// RawWriters at once, and is retried with backoff. Both kinds hold a slot
// of their source's window until answered, so the bodies held during an
// outage are bounded by the windows. After
// RawMaxAttempts failures the payload is spilled to SpillDir, so it is
// durable locally, and the write goes on being retried from there until the
// raw store takes it; only then is the source answered. A slow or absent
// store therefore holds the sources' windows open, which stops their polls
// and keeps their cursors where they are. Spilled batches left by an earlier
// run are written to the raw store when the actor starts.
type PersistRaw struct {
	deps   *Deps
	sem    chan struct{}
	spill  *spillDir // nil without a SpillDir: failed writes are retried in memory only
	ctx    context.Context
	cancel context.CancelFunc
}

// rawWrite is one payload to make durable.
type rawWrite struct {
	// raw is the payload; its Ref is set by the write that succeeds (for a
	// page the raw store appends, only then).
	raw ingest.Payload
	// deadLetter is the malformed payload's reason, "" for a batch.
	deadLetter string
	// cursor is the cursor a malformed payload was fetched with.
	cursor string
	// failed is set by a failed attempt: an abandoned write (a timeout)
	// may still be reading the payload, so its buffer is never recycled.
	failed bool
}

// logKey names w in logs before it is written.
func (w *rawWrite) logKey() string {
	if k := w.raw.Ref().Key; k != "" {
		return k
	}
	return "(a page to append)"
}

// Receive implements actor.Actor.
func (p *PersistRaw) Receive(ctx actor.Context) {
	switch m := ctx.Message().(type) {
	case *actor.Started:
		p.ctx, p.cancel = context.WithCancel(context.Background())
		p.sem = make(chan struct{}, max(p.deps.RawWriters, 1))
		p.deps.Metrics.rawStoreUp.Set(1)
		if p.deps.SpillDir != "" {
			p.spill = &spillDir{dir: p.deps.SpillDir}
			go p.redriveLeftovers(p.ctx)
		}
	case *actor.Stopping, *actor.Restarting:
		p.cancel()
	case *persistRaw:
		sender, root := ctx.Sender(), ctx.ActorSystem().Root
		go func() {
			w := rawWrite{raw: p.deps.Ingest.Page(m.source, m.batch.FetchedAt, m.batch.Body)}
			// The raw write is traced under the poll that fetched the batch.
			err := p.put(trace.ContextWithSpanContext(p.ctx, m.batch.Trace), m.abandon, &w)
			if w.failed {
				m.batch.Page.Keep()
			}
			root.Send(sender, &rawPersisted{gen: m.gen, seq: m.seq, raw: w.raw.Ref(), err: err})
		}()
	case *deadLetterPayload:
		sender, root := ctx.Sender(), ctx.ActorSystem().Root
		go func() {
			p.deadLetter(p.ctx, m)
			root.Send(sender, &deadLettered{gen: m.gen, cursor: m.cursor})
		}()
	}
}

// errRawAbandoned ends the retries of a raw write that failed after its
// source began to drain: nothing depends on the batch (its cursor never
// moved past it), so the next start fetches it again, and the drain need
// not wait for a store that is down or a disk that is full.
var errRawAbandoned = errors.New("raw write abandoned: it was failing when its source stopped")

// put writes w to the raw store, retrying until it succeeds or ctx ends;
// after RawMaxAttempts failures it spills w and keeps retrying. Once
// abandon is closed, a write that has failed is not tried again
// (errRawAbandoned); one that never failed goes on.
func (p *PersistRaw) put(ctx context.Context, abandon <-chan struct{}, w *rawWrite) error {
	p.deps.Metrics.rawHeld.Inc()
	defer p.deps.Metrics.rawHeld.Dec()
	maxAttempts := p.deps.RawMaxAttempts
	if maxAttempts <= 0 {
		maxAttempts = 10
	}
	first := time.Now()
	var err error
	for attempt := 0; ; attempt++ {
		if attempt > 0 {
			wait := rawRetry.Delay(attempt - 1)
			p.deps.Logger.Warn("raw store write failed; retrying", "source", w.raw.Source, "key", w.logKey(),
				"attempt", attempt, "err", err, "retry_in", wait)
			if !sleep(ctx, abandon, wait) {
				return cmp.Or(ctx.Err(), errRawAbandoned)
			}
		}
		if err = p.attempt(ctx, w); err == nil {
			return nil
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if attempt+1 == maxAttempts && p.spill != nil {
			p.spillWrite(w, spillInfo{Key: w.raw.ObjectKey(), Source: w.raw.Source, Error: err.Error(), Attempts: attempt + 1,
				FirstAttempt: first, LastAttempt: time.Now(), DeadLetterReason: w.deadLetter, DeadLetterCursor: w.cursor})
			return p.redrive(ctx, abandon, w, attempt+1)
		}
	}
}

// spillWrite keeps w in the spill dir. If even that fails, w stays in
// memory only, still retried, and is lost only if the process dies first.
func (p *PersistRaw) spillWrite(w *rawWrite, info spillInfo) {
	info.SpilledAt = time.Now()
	if err := p.spill.write(info.Key, w.raw.Body, info); err != nil {
		p.deps.Logger.Error("raw store unavailable and spilling the batch failed; retrying from memory",
			"source", w.raw.Source, "key", info.Key, "err", err)
		return
	}
	p.deps.Metrics.rawSpilled.Inc()
	p.deps.Metrics.rawSpillPending.Inc()
	p.deps.Logger.Warn("raw store unavailable; batch spilled to local disk until it can be written",
		"source", w.raw.Source, "key", info.Key, "attempts", info.Attempts, "err", info.Error, "spill_dir", p.spill.dir)
}

// redrive writes a spilled w to the raw store with backoff, from the n-th
// attempt, until it succeeds or ctx ends, then deletes its spill files.
// Once abandon is closed it stops retrying (errRawAbandoned): the spill
// files stay, for the next start to write to the raw store.
func (p *PersistRaw) redrive(ctx context.Context, abandon <-chan struct{}, w *rawWrite, n int) error {
	for attempt := n; ; attempt++ {
		err := p.attempt(ctx, w)
		if err == nil {
			break
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		wait := rawRetry.Delay(attempt)
		p.deps.Logger.Warn("raw store write of spilled batch failed; retrying", "source", w.raw.Source, "key", w.raw.ObjectKey(),
			"attempt", attempt+1, "err", err, "retry_in", wait)
		if !sleep(ctx, abandon, wait) {
			return cmp.Or(ctx.Err(), errRawAbandoned)
		}
	}
	spilled := w.raw.ObjectKey()
	if err := p.spill.remove(spilled); err != nil {
		p.deps.Logger.Error("spilled batch is in the raw store; delete its spill files by hand", "key", spilled, "err", err)
	} else if _, statErr := os.Stat(p.spill.path(spilled)); errors.Is(statErr, fs.ErrNotExist) {
		p.deps.Metrics.rawSpillPending.Dec()
	}
	p.deps.Logger.Info("spilled batch written to the raw store", "source", w.raw.Source, "key", w.raw.Ref().Key)
	return nil
}

// attempt is one raw-store write, counted in the metrics.
func (p *PersistRaw) attempt(ctx context.Context, w *rawWrite) error {
	select {
	case p.sem <- struct{}{}:
	case <-ctx.Done():
		return ctx.Err()
	}
	defer func() { <-p.sem }()
	start := time.Now()
	if err := p.deps.Ingest.Write(ctx, &w.raw); err != nil {
		w.failed = true
		if ctx.Err() == nil {
			p.deps.Metrics.rawPutErrors.Inc()
			p.deps.Metrics.rawStoreUp.Set(0)
		}
		return err
	}
	p.deps.Metrics.rawPutDuration.Observe(time.Since(start).Seconds())
	p.deps.Metrics.rawStoreUp.Set(1)
	return nil
}

// redriveLeftovers writes the batches an earlier run spilled to the raw
// store. Their events need nothing more: the source's cursor never moved
// past them, so the source fetches them again. A malformed payload is also
// recorded as a dead letter, which its source will not do again.
func (p *PersistRaw) redriveLeftovers(ctx context.Context) {
	left, err := p.spill.load()
	if err != nil {
		p.deps.Logger.Error("read spilled batches", "err", err)
	}
	if len(left) == 0 {
		return
	}
	p.deps.Metrics.rawSpillPending.Add(float64(len(left)))
	p.deps.Logger.Info("writing batches spilled by an earlier run to the raw store", "batches", len(left), "spill_dir", p.spill.dir)
	for _, b := range left {
		body, err := os.ReadFile(p.spill.path(b.key))
		if err != nil {
			p.deps.Logger.Error("read spilled batch; it stays in the spill dir", "key", b.key, "err", err)
			continue
		}
		w := rawWrite{raw: ingest.Object(b.info.Source, b.key, body), deadLetter: b.info.DeadLetterReason, cursor: b.info.DeadLetterCursor}
		p.deps.Metrics.rawHeld.Inc()
		err = p.redrive(ctx, nil, &w, 0)
		p.deps.Metrics.rawHeld.Dec()
		if err != nil {
			return // stopping: the rest stays spilled for the next start
		}
		if w.deadLetter != "" {
			p.recordDeadLetter(ctx, &w)
		}
	}
}

// sleep waits for d or until ctx ends or abandon closes (a nil abandon
// never does), reporting whether d passed.
func sleep(ctx context.Context, abandon <-chan struct{}, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	case <-abandon:
		return false
	}
}

// deadLetter keeps a malformed payload under a "deadletter/" key and lists it.
func (p *PersistRaw) deadLetter(ctx context.Context, m *deadLetterPayload) {
	w := rawWrite{raw: ingest.DeadLetter(m.source, m.err.FetchedAt, m.err.Body), deadLetter: m.err.Reason, cursor: m.cursor}
	if err := p.put(ctx, m.abandon, &w); err != nil {
		if errors.Is(err, errRawAbandoned) {
			// Its cursor never moved past it: the next start fetches the
			// page again and keeps it then.
			p.deps.Logger.Warn("malformed payload not kept: the raw store was failing when its source stopped", "source", m.source)
			return
		}
		p.deps.Logger.Error("keep malformed payload", "source", m.source, "err", err)
		return
	}
	p.recordDeadLetter(ctx, &w)
}

// recordDeadLetter lists w, a malformed payload now in the raw store.
func (p *PersistRaw) recordDeadLetter(ctx context.Context, w *rawWrite) {
	if err := p.deps.Ingest.RecordDeadLetter(ctx, &w.raw, w.deadLetter, w.cursor); err != nil {
		p.deps.Logger.Error("record dead letter", "source", w.raw.Source, "err", err)
	}
}
