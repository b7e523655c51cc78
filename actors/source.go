package actors

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/ingestorhq/ingestor/config"
	"github.com/ingestorhq/ingestor/internal/backoff"
	"github.com/ingestorhq/ingestor/internal/ingest"
	"github.com/ingestorhq/ingestor/internal/queue"
	"github.com/ingestorhq/ingestor/internal/telemetry"
	"github.com/ingestorhq/ingestor/sources"
)

// pauseCheck is how often a source paused by a full queue looks again.
const pauseCheck = 200 * time.Millisecond

// SourceActor runs one configured feed: it reads its durable cursor, fetches
// on a jittered schedule (honouring the upstream's Retry-After, which it
// keeps in the queue so that a restart honours it too), sends each
// batch to PersistRaw, then to the Publisher in fetch order (a large page
// in slices, see pendingBatch), and keeps at most InflightBatches batches
// uncommitted; a malformed payload on its way to the dead-letter list
// counts as one of them.
type SourceActor struct {
	cfg      config.Source
	deps     *Deps
	limiters *sources.RateLimiters // the shared limiters the source may name
	log      *slog.Logger

	gen    uint64 // incarnation: replies from an earlier one are ignored
	runCtx context.Context
	cancel context.CancelFunc
	src    sources.Source
	timer  *time.Timer
	// stopFetch cancels the running fetch, if any: a drain does not wait
	// for a stalled request, whose batch is not durable anyway.
	stopFetch context.CancelFunc

	cursor    string // cursor for the next fetch (may be ahead of the durable one)
	ready     bool   // the durable cursor has been read
	fetching  bool
	failures  int
	permanent bool // the current failure streak is of PermanentErrors
	// runPages counts the fetches that went back to back so far (each
	// said More): a catch-up or a paginated poll, shown in /status.
	runPages  int
	nextSeq   uint64
	inflight  int                      // batches fetched, not yet committed, and malformed payloads not yet kept
	pending   map[uint64]*pendingBatch // fetched batches by seq, until committed
	sendAt    uint64                   // next seq to send to the Publisher
	chain     *queue.Chain             // orders this incarnation's commits
	drainer   *actor.PID               // set once a drain was requested
	abandon   chan struct{}            // closed at the drain: failing raw writes stop retrying
	retry     backoff.Policy
	malformed malformedPages // retries of malformed pages, dead letters to resolve
}

// pendingBatch is a fetched batch on its way to the queue. Once its raw
// payload is durable it is committed in slices of at most
// sources.SliceRecords records, in order on the source's chain, the
// cursor with the last: at most slicesAhead of them are committing at a
// time, so a page of a million records holds a few slices of them in
// memory, not a million. A crash between two slices leaves the cursor
// before the page, which is fetched again, and the queue drops the
// records already queued as duplicates.
type pendingBatch struct {
	batch *sources.Batch
	raw   ingest.Ref // where the body is in the raw store, once durable
	// taken counts the records of batch.Records sent to the Publisher;
	// committing counts the slices sent and not yet committed; sent is
	// set once the last slice is sent.
	taken      int
	committing int
	sent       bool
}

// slicesAhead is how many slices of one batch may be committing at once:
// two, so that the queue's writer has the next while it commits one.
const slicesAhead = 2

func newSourceActor(cfg config.Source, deps *Deps, limiters *sources.RateLimiters) *SourceActor {
	return &SourceActor{
		cfg:      cfg,
		deps:     deps,
		limiters: limiters,
		log:      deps.Logger.With("source", cfg.Name),
		retry:    backoff.Policy{Base: min(cfg.Interval, time.Second), Max: max(cfg.Interval, 5*time.Minute)},
	}
}

// Receive implements actor.Actor.
func (a *SourceActor) Receive(ctx actor.Context) {
	switch m := ctx.Message().(type) {
	case *actor.Started:
		a.start(ctx)
	case *actor.Stopping, *actor.Restarting:
		a.stop()
	case *cursorRead:
		if m.gen == a.gen {
			a.cursorLoaded(ctx, m)
		}
	case *pollTick:
		if m.gen == a.gen {
			a.poll(ctx)
		}
	case *fetchDone:
		if m.gen == a.gen {
			a.fetched(ctx, m)
		}
	case *rawPersisted:
		if m.gen == a.gen {
			a.persisted(ctx, m)
		}
	case *batchCommitted:
		if m.gen == a.gen {
			a.committed(ctx, m)
		}
	case *deadLettered:
		if m.gen == a.gen {
			a.inflight--
			if a.malformed.listed(m.cursor) {
				a.resolveDeadLetters(m.cursor)
			}
			a.slotFreed(ctx)
		}
	case *drainRequest:
		if a.drainer == nil {
			close(a.abandon)
		}
		a.drainer = ctx.Sender()
		a.status().set(StateStopped, ReasonDraining, time.Time{}, "", a.cursor)
		a.stopTimer()
		if a.stopFetch != nil && !m.finishFetch {
			// The fetch's batch is not durable and the cursor has not moved
			// past it: cancelling loses nothing, and the next start fetches
			// it again.
			a.stopFetch()
		}
		a.maybeDrained(ctx)
	case *failed:
		panic(m.reason)
	}
}

func (a *SourceActor) start(ctx actor.Context) {
	a.gen = rand.Uint64()
	a.runCtx, a.cancel = context.WithCancel(context.Background())
	a.pending = make(map[uint64]*pendingBatch)
	a.nextSeq, a.sendAt, a.inflight, a.fetching, a.ready = 0, 0, 0, false, false
	a.chain = &queue.Chain{}
	a.abandon = make(chan struct{})
	a.malformed = malformedPages{}
	a.status().set(StateWaiting, ReasonStarting, time.Time{}, "", "")
	src, err := a.cfg.Spec.Open(sources.Env{Name: a.cfg.Name, Timeout: a.cfg.Timeout, Logger: a.log, Limiters: a.limiters,
		Member: a.deps.Member, TracerProvider: a.deps.Tracing})
	if err != nil {
		// A source that cannot be built fails; the supervisor retries it
		// with backoff, and other sources are untouched.
		panic(fmt.Errorf("source %q: open: %w", a.cfg.Name, err))
	}
	a.src = src
	if m, ok := src.(interface{ MissingIDs() int64 }); ok {
		f := m.MissingIDs
		a.deps.Metrics.ages.state(a.cfg.Name).missingIDs.Store(&f)
	}
	// The durable cursor is written by the Publisher in the same
	// transaction as the batch it follows, the not-before time when the
	// upstream asks to wait; both are read once, here, off the mailbox.
	self, root, gen, runCtx, q, name := ctx.Self(), ctx.ActorSystem().Root, a.gen, a.runCtx, a.deps.Queue, a.cfg.Name
	go func() {
		qctx, cancel := context.WithTimeout(runCtx, 30*time.Second)
		defer cancel()
		c, _, err := q.Cursor(qctx, name)
		var nb time.Time
		if err == nil {
			nb, err = q.NotBefore(qctx, name)
		}
		root.Send(self, &cursorRead{gen: gen, cursor: c, notBefore: nb, err: err})
	}()
}

func (a *SourceActor) stop() {
	a.stopTimer()
	if a.cancel != nil {
		a.cancel()
	}
	if a.src != nil {
		if err := a.src.Close(); err != nil {
			a.log.Warn("close source", "err", err)
		}
		a.src = nil
	}
}

func (a *SourceActor) stopTimer() {
	if a.timer != nil {
		a.timer.Stop()
		a.timer = nil
	}
}

// schedule sends a pollTick after d, replacing any pending one.
func (a *SourceActor) schedule(ctx actor.Context, d time.Duration) {
	if a.drainer != nil {
		return
	}
	a.stopTimer()
	self, root, gen := ctx.Self(), ctx.ActorSystem().Root, a.gen
	a.timer = time.AfterFunc(d, func() { root.Send(self, &pollTick{gen: gen}) })
}

func (a *SourceActor) cursorLoaded(ctx actor.Context, m *cursorRead) {
	if m.err != nil {
		panic(fmt.Errorf("source %q: read cursor: %w", a.cfg.Name, m.err))
	}
	a.cursor, a.ready = m.cursor, true
	a.deps.Metrics.interval.WithLabelValues(a.cfg.Name).Set(a.cfg.Interval.Seconds())
	// Spread first polls over start_jitter (at most one interval) so many
	// sources do not fire together while a new feed polls within seconds,
	// and keep a wait the upstream asked for before a restart.
	first, reason := time.Duration(rand.Int64N(int64(min(a.cfg.StartJitter, a.cfg.Interval))+1)), ReasonInterval
	a.log.Info("source started", "kind", a.cfg.Kind, "cursor", a.cursor, "interval", a.cfg.Interval,
		"first_poll_in", max(first, time.Until(m.notBefore)).Round(time.Millisecond))
	if wait := time.Until(m.notBefore); wait > first {
		a.log.Info("still waiting as the upstream asked before the restart", "until", m.notBefore, "wait", wait.Round(time.Millisecond))
		first, reason = wait, ReasonRetryAfter
	}
	a.wait(ctx, reason, first, "")
}

func (a *SourceActor) poll(ctx actor.Context) {
	a.timer = nil
	if !a.ready || a.fetching || a.drainer != nil {
		return
	}
	// A pause is checked before the window, so that a source whose window
	// is full of batches held up by the pause shows the pause as its
	// reason, not the window; the pause's timer, not a freed slot, then
	// polls again (slotFreed polls only with no timer set).
	if a.deps.Queue.PendingEvents() >= a.deps.MaxPendingEvents {
		a.deps.Metrics.paused.WithLabelValues(a.cfg.Name).Set(1)
		a.wait(ctx, ReasonQueueFull, pauseCheck, "")
		return
	}
	if why, low := a.deps.Ingest.DiskLow(); low {
		a.deps.Metrics.paused.WithLabelValues(a.cfg.Name).Set(1)
		a.wait(ctx, ReasonDiskFull, pauseCheck, why)
		return
	}
	if a.inflight >= a.cfg.InflightBatches {
		a.status().set(StateWaiting, ReasonWindow, time.Time{}, "", a.cursor)
		return // committed() polls again when a slot frees
	}
	deadline := time.Now().Add(a.cfg.Timeout)
	if a.deps.Fence != nil {
		// Cluster mode: poll only while this member holds the source, and
		// end the poll before its hold could lapse.
		until, ok := a.deps.Fence(a.cfg.Name)
		if !ok {
			a.wait(ctx, ReasonNotOwner, pauseCheck, "")
			return
		}
		deadline = minTime(deadline, until)
	}
	a.deps.Metrics.paused.WithLabelValues(a.cfg.Name).Set(0)
	a.status().polling(time.Now(), a.cursor)
	a.fetching = true
	self, root, gen, src, cursor, runCtx := ctx.Self(), ctx.ActorSystem().Root, a.gen, a.src, a.cursor, a.runCtx
	q, name, log := a.deps.Queue, a.cfg.Name, a.log
	fctx, cancel := context.WithDeadline(runCtx, deadline)
	a.stopFetch = cancel
	go func() {
		msg := &fetchDone{gen: gen, cursor: cursor}
		defer func() {
			if r := recover(); r != nil {
				msg.panicked = r
			}
			root.Send(self, msg)
		}()
		defer cancel()
		start := time.Now()
		if !start.Before(deadline) {
			// The goroutine started late (the process was paused, as by
			// SIGSTOP): in cluster mode the member's lease may have lapsed
			// meanwhile, and the request must not go out.
			msg.err = fmt.Errorf("poll not sent: its deadline passed before it started: %w", context.DeadlineExceeded)
			return
		}
		fctx, span := a.startPoll(fctx)
		msg.batch, msg.err = src.Fetch(fctx, cursor)
		a.deps.Metrics.pollDuration.WithLabelValues(name).Observe(time.Since(start).Seconds())
		endPoll(span, msg.batch, msg.err)
		// A Retry-After promise is made durable before the wait begins, so
		// that a restart keeps it. Failing to store it only risks an early
		// request after a crash: the wait itself goes on.
		var wait *sources.WaitError
		if errors.As(msg.err, &wait) {
			if err := q.SetNotBefore(runCtx, name, wait.Until); err != nil {
				log.Warn("upstream asked to wait; keeping the wait across a restart failed", "until", wait.Until, "err", err)
			}
		}
	}()
}

// startPoll starts the span of a poll, the root of its trace, when tracing
// is on (the sampler decides); else it returns ctx and a no-op span.
func (a *SourceActor) startPoll(ctx context.Context) (context.Context, trace.Span) {
	if a.deps.Tracing == nil {
		return ctx, noop.Span{}
	}
	return a.deps.Tracing.Tracer(telemetry.ScopeName).Start(ctx, "poll", trace.WithNewRoot(),
		trace.WithAttributes(attribute.String("ingestor.source", a.cfg.Name), attribute.String("ingestor.kind", a.cfg.Kind)))
}

// endPoll ends a poll's span, giving the batch its context: the batch's
// raw write and commit are traced under it, its events carry it.
func endPoll(span trace.Span, b *sources.Batch, err error) {
	if b != nil {
		b.Trace = span.SpanContext()
		if span.IsRecording() {
			span.SetAttributes(attribute.Int("ingestor.records", len(b.Records)), attribute.Int("ingestor.bytes", len(b.Body)))
		}
	}
	telemetry.End(span, err)
}

func (a *SourceActor) fetched(ctx actor.Context, m *fetchDone) {
	a.fetching = false
	a.stopFetch = nil
	if m.panicked != nil {
		panic(fmt.Errorf("source %q: fetch panicked: %v", a.cfg.Name, m.panicked))
	}
	if a.drainer != nil && m.err != nil {
		a.maybeDrained(ctx)
		return
	}
	if m.err != nil {
		a.fetchFailed(ctx, m)
		return
	}
	if a.failures > 0 {
		a.log.Info("fetch recovered", "after_failures", a.failures)
	}
	a.failures, a.permanent = 0, false
	if a.malformed.succeeded(m.cursor) {
		a.resolveDeadLetters(m.cursor)
	}
	a.deps.Metrics.polls.WithLabelValues(a.cfg.Name, "ok").Inc()
	b := m.batch
	if b == nil || (len(b.Records) == 0 && b.Cursor == "") {
		// Nothing new (304, an empty page, a quiet stream): the poll
		// succeeded, and a quiet source is a healthy one.
		a.succeeded(time.Now())
	}
	if b != nil && (len(b.Records) > 0 || b.Cursor != "") {
		a.deps.Metrics.bytes.WithLabelValues(a.cfg.Name).Add(float64(len(b.Body)))
		if b.Cursor != "" {
			a.cursor = b.Cursor
		}
		seq := a.nextSeq
		a.nextSeq++
		a.inflight++
		a.pending[seq] = &pendingBatch{batch: b}
		ctx.Request(a.deps.PersistRaw, &persistRaw{gen: a.gen, seq: seq, source: a.cfg.Name, batch: b, abandon: a.abandon})
	}
	if a.drainer != nil {
		a.maybeDrained(ctx)
		return
	}
	a.scheduleNext(ctx, b)
}

// fetchFailed handles a fetch that ended with m.err: a malformed payload,
// an upstream's request to wait, a refusal that retrying soon will not
// fix, or a failure to back off from.
func (a *SourceActor) fetchFailed(ctx actor.Context, m *fetchDone) {
	if bad, ok := sources.AsMalformed(m.err); ok {
		a.fetchedMalformed(ctx, m, bad)
		return
	}
	var wait *sources.WaitError
	if errors.As(m.err, &wait) {
		a.deps.Metrics.polls.WithLabelValues(a.cfg.Name, "wait").Inc()
		d := max(time.Until(wait.Until), 0)
		a.log.Info("upstream asked to wait", "err", wait.Err, "until", wait.Until, "wait", d.Round(time.Millisecond))
		a.wait(ctx, cmp.Or(wait.Reason, ReasonRetryAfter), d, wait.Err.Error())
		return
	}
	var perm *sources.PermanentError
	if errors.As(m.err, &perm) {
		a.deps.Metrics.polls.WithLabelValues(a.cfg.Name, "error").Inc()
		d := backoff.Jitter(a.retry.Max, 0.1)
		if a.failures == 0 || !a.permanent {
			a.log.Error("fetch refused: this looks like a configuration problem (poll_url, headers, credentials); not retrying hot",
				"err", m.err, "retry_in", d)
		}
		a.failures++
		a.permanent = true
		a.failing(ctx, m.err, d)
		return
	}
	a.deps.Metrics.polls.WithLabelValues(a.cfg.Name, "error").Inc()
	d := a.retry.Delay(a.failures)
	if a.failures == 0 || a.permanent {
		a.log.Warn("fetch failed; backing off", "err", m.err, "retry_in", d)
	} else {
		a.log.Debug("fetch failed again", "err", m.err, "failures", a.failures+1, "retry_in", d)
	}
	a.failures++
	a.permanent = false
	a.failing(ctx, m.err, d)
}

// fetchedMalformed fetches a malformed page again (its cursor has not
// moved) up to malformed_retries times, then dead-letters it.
func (a *SourceActor) fetchedMalformed(ctx actor.Context, m *fetchDone, bad *sources.MalformedError) {
	a.deps.Metrics.polls.WithLabelValues(a.cfg.Name, "malformed").Inc()
	a.deps.Metrics.malformed.WithLabelValues(a.cfg.Name).Inc()
	a.failures = 0
	retries := a.cfg.MalformedRetries
	if !bad.Refetch {
		retries = 0 // a stream's message cannot be fetched again
	}
	attempt, deadLetter := a.malformed.malformed(m.cursor, retries)
	if !deadLetter {
		// The cursor has not moved: the same request goes out again.
		wait := a.retry.Delay(attempt - 1)
		a.log.Warn("malformed payload; fetching the page again", "reason", bad.Reason, "bytes", len(bad.Body),
			"attempt", attempt, "malformed_retries", a.cfg.MalformedRetries, "retry_in", wait)
		a.failing(ctx, m.err, wait)
		return
	}
	a.log.Warn("malformed payload dead-lettered", "reason", bad.Reason, "bytes", len(bad.Body), "attempts", attempt)
	// Keeping the payload holds a window slot like a batch, so an
	// outage of the raw store stops the polls instead of piling up
	// malformed bodies in memory.
	a.inflight++
	ctx.Request(a.deps.PersistRaw, &deadLetterPayload{gen: a.gen, source: a.cfg.Name, cursor: m.cursor, err: bad, abandon: a.abandon})
	a.wait(ctx, ReasonInterval, backoff.Jitter(a.cfg.Interval, a.cfg.Jitter), "")
}

// scheduleNext schedules the fetch after b, a successful one's batch (nil
// for none): at once for the next page (b.More), else after the interval,
// saying so when a run of max_pages pages back to back ended it
// (b.Capped).
func (a *SourceActor) scheduleNext(ctx actor.Context, b *sources.Batch) {
	if b != nil && b.More {
		a.runPages++
		a.wait(ctx, ReasonNextPage, 0, fmt.Sprintf("%d pages back to back so far", a.runPages))
		return
	}
	detail := ""
	if b != nil && b.Capped {
		detail = fmt.Sprintf("the upstream has more, but %d pages went back to back (max_pages): the catch-up goes on after the interval", a.runPages+1)
	}
	a.runPages = 0
	a.wait(ctx, ReasonInterval, backoff.Jitter(a.cfg.Interval, a.cfg.Jitter), detail)
}

// resolveDeadLetters marks the dead letters of the request cursor resolved,
// off the mailbox: a later fetch of it succeeded.
func (a *SourceActor) resolveDeadLetters(cursor string) {
	runCtx, q, name, log := a.runCtx, a.deps.Queue, a.cfg.Name, a.log
	go func() {
		qctx, cancel := context.WithTimeout(runCtx, 30*time.Second)
		defer cancel()
		n, err := q.ResolveDeadLetters(qctx, name, cursor)
		if err != nil {
			log.Warn("resolving dead letters of a page fetched again", "err", err)
			return
		}
		log.Info("malformed page fetched again; its dead letters are resolved", "dead_letters", n)
	}()
}

func (a *SourceActor) persisted(ctx actor.Context, m *rawPersisted) {
	if errors.Is(m.err, errRawAbandoned) && a.drainer != nil {
		a.abandoned(ctx, m.seq)
		return
	}
	if m.err != nil {
		// PersistRaw retries until it succeeds or is stopped, so an error
		// here means shutdown or a bug: fail and let supervision decide.
		panic(fmt.Errorf("source %q: persist raw batch: %w", a.cfg.Name, m.err))
	}
	if p, ok := a.pending[m.seq]; ok {
		p.raw = m.raw
	}
	a.commitNext(ctx)
}

// abandoned drops, while draining, the batch seq whose raw write was
// failing, and every later batch not sent to the Publisher yet: they
// cannot commit without it (the cursor must not pass its events), and
// nothing depends on them, so the next start fetches them again.
func (a *SourceActor) abandoned(ctx actor.Context, seq uint64) {
	if _, ok := a.pending[seq]; !ok || seq < a.sendAt {
		return // dropped already with an earlier batch
	}
	dropped := 0
	for s := range a.pending {
		if s >= seq {
			delete(a.pending, s)
			a.inflight--
			dropped++
		}
	}
	a.log.Warn("source stopping while its raw store writes fail: the batches not yet durable are dropped and fetched again at the next start",
		"batches", dropped)
	a.maybeDrained(ctx)
}

// commitNext sends the batches whose raw payload is durable to the
// Publisher, in fetch order. Several may be committing at once: the queue
// commits them in the order they were sent, on one chain, so cursors only
// move forward and never past a batch that failed.
func (a *SourceActor) commitNext(ctx actor.Context) {
	for {
		p, ok := a.pending[a.sendAt]
		if !ok || p.raw.Key == "" {
			return
		}
		for !p.sent && p.committing < slicesAhead {
			a.sendSlice(ctx, a.sendAt, p)
		}
		if !p.sent {
			return // its next slice goes once one commits
		}
		a.sendAt++
	}
}

// sendSlice sends the next slice of batch seq to the Publisher: the next
// sources.SliceRecords records of its Records, then of its Rest.
func (a *SourceActor) sendSlice(ctx actor.Context, seq uint64, p *pendingBatch) {
	b := p.batch
	var records []sources.Record
	if p.taken < len(b.Records) {
		end := min(p.taken+sources.SliceRecords, len(b.Records))
		records = b.Records[p.taken:end]
		p.taken = end
	} else if b.Rest != nil {
		var err error
		if records, err = b.Rest.Next(sources.SliceRecords); err != nil {
			// The page was validated whole when it was fetched: a bug.
			// Failing restarts the source from its durable cursor.
			panic(fmt.Errorf("source %q: %w", a.cfg.Name, err))
		}
	}
	p.sent = p.taken == len(b.Records) && (b.Rest == nil || b.Rest.Left() == 0)
	p.committing++
	ctx.Request(a.deps.Publisher, &appendBatch{chain: a.chain, gen: a.gen, seq: seq, source: a.cfg.Name,
		raw: p.raw, batch: b, records: records, last: p.sent})
}

func (a *SourceActor) committed(ctx actor.Context, m *batchCommitted) {
	if m.err != nil {
		if a.drainer == nil && ingest.IsDiskFull(m.err) {
			// The disk is full: start over from the durable cursor, as a
			// restart would, without counting a crash; the polls wait for
			// space (ReasonDiskFull) and then fetch the batch again.
			a.log.Warn("commit failed for lack of disk space; the batch is fetched again once space returns", "err", m.err)
			a.stop()
			a.start(ctx)
			return
		}
		// The batch is durable in the raw store but not queued: fail, so the
		// restarted actor re-reads the durable cursor and fetches it again.
		panic(fmt.Errorf("source %q: commit batch: %w", a.cfg.Name, m.err))
	}
	now := time.Now()
	a.deps.Metrics.events.WithLabelValues(a.cfg.Name).Add(float64(m.newEvents))
	a.deps.Metrics.duplicates.WithLabelValues(a.cfg.Name).Add(float64(len(m.records) - m.newEvents))
	st := a.deps.Metrics.ages.state(a.cfg.Name)
	for i := range m.records {
		if t := m.records[i].Time.UnixNano(); !m.records[i].Time.IsZero() && t > st.newestRecord.Load() {
			st.newestRecord.Store(t)
		}
	}
	p := a.pending[m.seq]
	if p != nil {
		p.committing--
		if !p.sent || p.committing > 0 {
			// A slice of the batch committed; the batch goes on.
			st.status.committed(now, len(m.records), m.newEvents, 0)
			a.commitNext(ctx)
			return
		}
		st.status.committed(now, len(m.records), m.newEvents, len(p.batch.Body))
		// Its last slice is queued: only its frames still read its body,
		// each until it is encoded for sending.
		p.batch.Page.Release()
	}
	delete(a.pending, m.seq)
	a.inflight--
	a.succeeded(now)
	a.commitNext(ctx)
	a.slotFreed(ctx)
}

// succeeded records a successful poll at now: one that found nothing new,
// or whose batch committed (a batch with records succeeds only once it is
// durable).
func (a *SourceActor) succeeded(now time.Time) {
	a.deps.Metrics.ages.state(a.cfg.Name).lastSuccess.Store(now.UnixNano())
	a.deps.Metrics.lastSuccess.WithLabelValues(a.cfg.Name).Set(float64(now.UnixNano()) / 1e9)
}

// slotFreed follows the release of a window slot: a committed batch or a
// kept malformed payload.
func (a *SourceActor) slotFreed(ctx actor.Context) {
	if a.drainer != nil {
		a.maybeDrained(ctx)
		return
	}
	if a.timer == nil && !a.fetching {
		a.poll(ctx) // the window was full; fetch now
	}
}

// maybeDrained answers a drain request once nothing is fetching or in flight.
func (a *SourceActor) maybeDrained(ctx actor.Context) {
	if a.fetching || a.inflight > 0 {
		return
	}
	ctx.Send(a.drainer, &drained{source: a.cfg.Name})
}

// minTime returns the earlier of a and b.
func minTime(a, b time.Time) time.Time {
	if b.Before(a) {
		return b
	}
	return a
}
