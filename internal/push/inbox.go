package push

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/ingestorhq/ingestor/internal/ingest"
	"github.com/ingestorhq/ingestor/internal/queue"
	"github.com/ingestorhq/ingestor/internal/telemetry"
)

// Event is one event of a pushed body.
type Event struct {
	// Key is the idempotency key, unique within the source.
	Key string
	// Time is the event's own time, or zero.
	Time time.Time
	// Off and Len locate the event's bytes in the body.
	Off, Len int
	// Device and Seq are a device's id and the event's number in its
	// sequence (Seq 0: none), tracked by the queue (queue.SeqFinding).
	Device string
	Seq    int64
	// Verdict is the signature verdict of a signed webhook's event, or
	// nil; the events of one request share it.
	Verdict *queue.Verdict
	// Trace is the span context of the request or envelope that brought
	// the event: its raw write and commit are traced under it when it is
	// sampled, and the event carries it to processors.
	Trace trace.SpanContext
}

// Outcome is what a commit did with one event.
type Outcome struct {
	queue.EventStatus
	// New is true for an event the ledger did not know; false for a
	// duplicate, whose status is the stored event's.
	New bool
}

// BusyError is returned by Commit when the inbox takes nothing more for now:
// the queue holds max_pending_events, the commit group is saturated, or
// disk space is low (Unavailable). Nothing of the refused commit is stored.
type BusyError struct {
	// Reason says which limit was hit.
	Reason string
	// RetryAfter is how long the sender should wait before trying again.
	RetryAfter time.Duration
	// Unavailable is set when the daemon cannot store anything for now
	// (disk space low): a webhook answers 503 rather than 429.
	Unavailable bool
}

func (e *BusyError) Error() string { return "busy: " + e.Reason }

// ErrClosed is returned by Commit once the inbox is closed (the daemon is
// stopping).
var ErrClosed = errors.New("push inbox closed")

// CommitStats describe one source's share of a committed group, for the
// per-source metrics.
type CommitStats struct {
	New, Duplicates, Bytes int
	// Newest is the newest event time among the new events, or zero.
	Newest time.Time
}

// InboxOptions configure an Inbox.
type InboxOptions struct {
	// Queue is the ledger: the inbox reads its pending events and the
	// statuses of duplicates there.
	Queue *queue.Queue
	// Ingest makes each group durable (raw bytes, then events) and hands
	// the new frames to delivery. While it reports disk space low, commits
	// are refused (503 with Retry-After).
	Ingest *ingest.Ingest
	// MaxPendingEvents is publish.max_pending_events: at that many
	// unacked events in the queue, Commit answers BusyError.
	MaxPendingEvents int64
	// MaxWaiting is how many commits may wait for a group; beyond it,
	// Commit answers BusyError. Default 4096.
	MaxWaiting int
	// RawTimeout bounds one raw-store write. Default 30s.
	RawTimeout time.Duration
	Logger     *slog.Logger
	Metrics    *Metrics
	// OnCommit, when set, is called after each group commit with each
	// source's share.
	OnCommit func(source string, s CommitStats)
	// Tracer, when set, traces the raw write and commit of each traced
	// request or envelope of a group, in its own trace.
	Tracer trace.Tracer
}

// Inbox makes pushed events durable with group commit: every commit waiting
// when the worker takes work shares one raw write per source (one page,
// which the raw store appends to the source's page segment or keeps as
// an object: one write and one fsync either way) and one queue
// transaction, both through Ingest, and each Commit returns only once
// both are durable. One worker commits the groups, one after another:
// while it commits one, the next gathers every request that arrives
// meanwhile. On a busy machine the cost is in the per-group work (a raw
// file created and fsynced, a queue transaction), so the larger groups of
// one worker serve more requests per CPU second than two workers
// overlapping smaller groups (ingestor-bench -mode webhook: 16 requests
// per group with two workers, 28 with one, about 20% less CPU per request).
// The commits waiting are shared fairly between the sources (waitLine).
type Inbox struct {
	o    InboxOptions
	line *waitLine
	wg   sync.WaitGroup
	// drain estimates the Retry-After of a full queue, backlog that of a
	// saturated group commit.
	drain   drainEstimate
	backlog backlogEstimate
	// graces holds each source's seq_gap_grace (SetSeqGrace).
	gracesMu sync.Mutex
	graces   map[string]time.Duration
}

// SetSeqGrace sets how long a device seq of source may stay missing before
// it is reported lost (ws_ingress seq_gap_grace); a source without one
// reports gaps at once.
func (in *Inbox) SetSeqGrace(source string, d time.Duration) {
	in.gracesMu.Lock()
	defer in.gracesMu.Unlock()
	if in.graces == nil {
		in.graces = make(map[string]time.Duration)
	}
	in.graces[source] = d
}

func (in *Inbox) seqGrace(source string) time.Duration {
	in.gracesMu.Lock()
	defer in.gracesMu.Unlock()
	return in.graces[source]
}

// reportSeqs logs and counts what a commit's device seqs revealed: the
// numbers a device skipped (events lost at the edge) and counters that
// went back (an outbox reset).
func (in *Inbox) reportSeqs(source string, findings []queue.SeqFinding) {
	for _, f := range findings {
		if f.Reset {
			in.o.Metrics.ws.seqResets.WithLabelValues(source).Inc()
			in.o.Logger.Warn("device seq went back: its counter restarted (its outbox was reset?); events numbered after the old value may be lost",
				"source", source, "device", f.Device, "from", f.From, "to", f.To)
			continue
		}
		in.o.Metrics.ws.seqGaps.WithLabelValues(source).Inc()
		in.o.Logger.Warn("device skipped seq numbers: those events were lost before they reached the daemon",
			"source", source, "device", f.Device, "missing_from", f.From, "missing_to", f.To, "missing", f.To-f.From+1)
	}
}

// commit is one Commit call waiting for its group.
type commit struct {
	source string
	body   []byte
	events []Event
	done   chan commitResult
	// patient is set for a commit that waits for a place rather than be
	// refused (enter's hold).
	patient bool
}

type commitResult struct {
	outcomes []Outcome
	err      error
}

const (
	// maxGroupBytes caps one group, which otherwise takes every commit
	// waiting (MaxWaiting at most). Groups were capped at 1024 commits
	// too: under overload, with the fsyncs of each group the larger part
	// of its time, that cap held 1,000 devices to ~7,900 events/s where
	// groups of everything waiting commit ~10,600-11,300 (ingestor-bench
	// -mode overload, the same hour).
	maxGroupBytes = 16 << 20
	// busyRetryAfter is the Retry-After of a device's envelope the daemon
	// could not store or refused while stopping; a saturated commit's
	// comes from backlogEstimate, a full queue's from drainEstimate.
	busyRetryAfter = time.Second
	// diskRetryAfter is the Retry-After while disk space is low: space
	// comes back when retention frees acknowledged events or an operator
	// acts, neither of which a sender can hurry.
	diskRetryAfter = 30 * time.Second
)

// NewInbox starts an Inbox; Close stops it.
func NewInbox(o InboxOptions) *Inbox {
	if o.MaxWaiting <= 0 {
		o.MaxWaiting = 4096
	}
	if o.RawTimeout <= 0 {
		o.RawTimeout = 30 * time.Second
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	if o.Metrics == nil {
		o.Metrics = NewMetrics(nil)
	}
	in := &Inbox{o: o, line: newWaitLine(o.MaxWaiting)}
	in.drain.settled = o.Queue.SettledEvents
	in.wg.Go(in.work)
	return in
}

// Commit stores body (raw) and its events (ledger rows) durably and returns
// one Outcome per event, in order. It returns a *BusyError when the inbox
// is full and ErrClosed once closed; then nothing is stored and nothing is
// read: a refusal costs no ledger read, so that refusing under overload
// never takes a connection the group commit needs (a sender retrying an
// event stored already is told its status once it is let in). A commit
// let in may still be answered a *BusyError, before anything of it is
// stored, when a source holding less than its fair share of the waiting
// places takes its place (waitLine). Once a commit is accepted, Commit
// waits for its outcome even if ctx ends, so that the caller knows what
// happened. events must locate bytes inside body.
func (in *Inbox) Commit(ctx context.Context, source string, body []byte, events []Event) ([]Outcome, error) {
	if len(events) == 0 {
		return nil, nil
	}
	c, err := in.enter(nil, source, body, events)
	if err != nil {
		return nil, err
	}
	return c.wait()
}

// errGaveUp is enter's error when hold was closed before the commit got a
// place.
var errGaveUp = errors.New("push inbox: stopped waiting for a place")

// enter is the first half of Commit: it refuses the commit or lets it in,
// and then c.wait returns its outcome. With hold non-nil, a commit the
// saturated line has no place for is not refused: enter waits for a place
// (first come, first served) until hold is closed, and then returns
// errGaveUp, nothing stored; let in and pushed out by a source below its
// fair share, it waits again rather than be answered busy. A device's
// connection waits so, reading nothing meanwhile: holding a device back
// costs nothing, while refusing its envelopes costs a read, an answer and
// a resend each, and 1,000 devices refused at full speed took the CPU the
// commits needed.
func (in *Inbox) enter(hold <-chan struct{}, source string, body []byte, events []Event) (*commit, error) {
	if in.line.isClosed() {
		return nil, ErrClosed
	}
	now := time.Now()
	in.drain.sample(now)
	if n := in.o.Queue.PendingEvents(); n >= in.o.MaxPendingEvents {
		wait := in.drain.retryAfter(now, n-in.o.MaxPendingEvents+int64(len(events)))
		return nil, in.busy(source, "queue_full", fmt.Sprintf("the queue holds %d unacked events (publish.max_pending_events)", n), wait)
	}
	if why, low := in.o.Ingest.DiskLow(); low {
		return nil, in.busy(source, "disk_full", "disk space low: "+why, diskRetryAfter)
	}
	c := &commit{source: source, body: body, events: events, done: make(chan commitResult, 1), patient: hold != nil}
	res, pushed := in.line.add(c, hold)
	if pushed != nil {
		pushed.done <- commitResult{err: in.saturated(pushed.source, now)}
	}
	switch res {
	case lineClosed:
		return nil, ErrClosed
	case lineFull:
		return nil, in.saturated(source, now)
	case lineGaveUp:
		return nil, errGaveUp
	}
	return c, nil
}

// wait returns the outcome of a commit let in.
func (c *commit) wait() ([]Outcome, error) {
	r := <-c.done
	return r.outcomes, r.err
}

// saturated is the BusyError of a commit of source refused, or pushed out
// of the waiting line, at now because the group commit is saturated.
func (in *Inbox) saturated(source string, now time.Time) error {
	return in.busy(source, "saturated", "the group commit is saturated", in.backlog.retryAfter(now, in.line.len()))
}

// busy counts a commit the inbox cannot take now and returns its
// BusyError; it reads and writes nothing.
func (in *Inbox) busy(source, reason, msg string, wait time.Duration) error {
	in.o.Metrics.busy.WithLabelValues(source, reason).Inc()
	return &BusyError{Reason: msg, RetryAfter: wait, Unavailable: reason == "disk_full"}
}

// Close refuses new commits, finishes those already accepted and returns
// when they are answered.
func (in *Inbox) Close() {
	in.line.close()
	in.wg.Wait()
}

// EventBySeq and EventByKey look up an event of source in the ledger.
func (in *Inbox) EventBySeq(ctx context.Context, source string, seq int64) (queue.EventStatus, bool, error) {
	return in.o.Queue.EventBySeq(ctx, source, seq)
}

// EventByKey looks up the event of source with idempotency key key.
func (in *Inbox) EventByKey(ctx context.Context, source, key string) (queue.EventStatus, bool, error) {
	return in.o.Queue.EventByKey(ctx, source, key)
}

// work takes the commits waiting, up to a group's caps and each source its
// share, and commits them, until the line is closed and empty.
func (in *Inbox) work() {
	group := make([]*commit, 0, in.o.MaxWaiting)
	for {
		group = in.line.take(group[:0], in.o.MaxWaiting, maxGroupBytes)
		if len(group) == 0 {
			return
		}
		in.commitGroup(group)
		clear(group)
	}
}

// commitGroup commits a group, one raw object and one queue batch per
// source, the sources in parallel so that their batches share the queue's
// transaction, and answers every commit of the group.
func (in *Inbox) commitGroup(group []*commit) {
	start := time.Now()
	bySource := make(map[string][]*commit)
	var order []string
	for _, c := range group {
		if _, ok := bySource[c.source]; !ok {
			order = append(order, c.source)
		}
		bySource[c.source] = append(bySource[c.source], c)
	}
	// The acks that arrive while the raw pages are written commit with
	// the group's events (queue.Expect).
	expected := in.o.Queue.Expect()
	if len(order) == 1 {
		// One source (the common case): no goroutine to start and wait
		// for, two wake-ups fewer on the path every request waits on.
		in.commitSource(order[0], group)
	} else {
		var wg sync.WaitGroup
		for _, source := range order {
			wg.Go(func() { in.commitSource(source, bySource[source]) })
		}
		wg.Wait()
	}
	expected()
	took := time.Since(start)
	in.backlog.observe(len(group), took)
	in.o.Metrics.groupSize.Observe(float64(len(group)))
	in.o.Metrics.commitDuration.Observe(took.Seconds())
}

// commitSource makes the commits of one source durable: their bodies, each
// followed by a newline, as one raw page (one record with its CRC-32C in a
// page segment, so that a resend and ingestor doctor find bytes that
// changed on disk), then their events as one batch.
func (in *Inbox) commitSource(source string, cs []*commit) {
	size, n := 0, 0
	for _, c := range cs {
		size += len(c.body) + 1
		n += len(c.events)
	}
	raw := make([]byte, 0, size)
	for _, c := range cs {
		raw = append(append(raw, c.body...), '\n')
	}
	fail := func(err error) {
		for _, c := range cs {
			c.done <- commitResult{err: err}
		}
	}
	fetchedAt := time.Now()
	page := in.o.Ingest.Page(source, fetchedAt, raw)
	var findings []queue.SeqFinding
	var b queue.Batch
	batch := func() queue.Batch {
		b = groupBatch(source, fetchedAt, &page, cs, n)
		b.SeqGrace, b.SeqFindings = in.seqGrace(source), &findings
		return b
	}
	// The raw write and the queue's statements run at once; the commit
	// waits for the write (ingest.WriteCommit).
	ctx, cancel := context.WithTimeout(context.Background(), in.o.RawTimeout)
	frames, wrote, rawErr, err := in.o.Ingest.WriteCommit(ctx, &page, batch)
	cancel()
	in.traceGroup(cs, "raw write", fetchedAt, wrote, rawErr)
	if rawErr != nil {
		in.o.Metrics.rawErrors.Inc()
		in.o.Logger.Error("push: raw store write failed; senders are told to retry", "source", source, "err", rawErr)
		fail(fmt.Errorf("make the raw payload durable: %w", rawErr))
		return
	}
	in.traceGroup(cs, "commit", wrote, time.Now(), err)
	if err != nil {
		in.o.Logger.Error("push: queue commit failed; senders are told to retry", "source", source, "err", err)
		fail(fmt.Errorf("commit to the queue: %w", err))
		return
	}
	in.reportSeqs(source, findings)
	in.answer(source, cs, b, frames)
}

// groupBatch returns the queue batch of cs's n events, whose bodies page holds
// one after the other, each followed by a newline: each event points at
// its bytes in page's object, and its payload is a slice of page's body.
func groupBatch(source string, fetchedAt time.Time, page *ingest.Payload, cs []*commit, n int) queue.Batch {
	at := page.Ref()
	b := queue.Batch{Source: source, FetchedAt: fetchedAt, RawKey: at.Key, Events: make([]queue.NewEvent, 0, n)}
	base := 0
	for _, c := range cs {
		for _, e := range c.events {
			off := base + e.Off
			ne := queue.NewEvent{Key: e.Key, EventTime: e.Time, RawOff: at.Off + off, RawLen: e.Len,
				Payload: page.Body[off : off+e.Len : off+e.Len], Device: e.Device, DevSeq: e.Seq, Verdict: e.Verdict}
			ne.Traceparent, ne.Tracestate = telemetry.Parent(e.Trace)
			b.Events = append(b.Events, ne)
		}
		base += len(c.body) + 1
	}
	return b
}

// duplicates reads the statuses of b's events that are not among added
// (the new ones, in batch order): one query for the group, whatever the
// number of duplicates, so that answering never queues a read per
// duplicate on the ledger's small read pool.
func (in *Inbox) duplicates(source string, b queue.Batch, added []queue.Event) (map[string]queue.EventStatus, error) {
	var keys []string
	next := 0
	for i := range b.Events {
		e := &b.Events[i]
		if next < len(added) && added[next].RawOff == e.RawOff && added[next].Key == e.Key {
			next++
			continue
		}
		keys = append(keys, e.Key)
	}
	if len(keys) == 0 {
		return nil, nil
	}
	return in.o.Queue.EventsByKeys(context.Background(), source, keys)
}

// answer sends each commit its outcomes. The new events are those in
// frames, in batch order; every other event of b was a duplicate, whose
// status is read from the ledger, all of the group's in one read.
func (in *Inbox) answer(source string, cs []*commit, b queue.Batch, frames []queue.Frame) {
	var added []queue.Event
	for _, f := range frames {
		added = append(added, f.Events...)
	}
	dups, derr := in.duplicates(source, b, added)
	stats := CommitStats{Bytes: 0}
	i, next := 0, 0
	for _, c := range cs {
		stats.Bytes += len(c.body)
		outs := make([]Outcome, len(c.events))
		var err error
		for j := range c.events {
			e := &b.Events[i]
			i++
			if next < len(added) && added[next].RawOff == e.RawOff && added[next].Key == e.Key {
				a := added[next]
				next++
				outs[j] = Outcome{New: true, EventStatus: queue.EventStatus{Seq: a.Seq, Source: source, Key: a.Key,
					Status: queue.StatusQueued, Received: 1, CreatedAt: b.FetchedAt, UpdatedAt: b.FetchedAt}}
				stats.New++
				if e.EventTime.After(stats.Newest) {
					stats.Newest = e.EventTime
				}
				continue
			}
			stats.Duplicates++
			st, ok := dups[e.Key]
			switch {
			case derr != nil:
				err = fmt.Errorf("read the status of a duplicate: %w", derr)
				continue
			case !ok:
				// Only a prune racing this very commit could forget it.
				err = fmt.Errorf("read the status of a duplicate: event %q was a duplicate but the ledger no longer knows it", e.Key)
				continue
			}
			outs[j] = Outcome{EventStatus: st}
		}
		if err != nil {
			c.done <- commitResult{err: err}
			continue
		}
		c.done <- commitResult{outcomes: outs}
	}
	if in.o.OnCommit != nil {
		in.o.OnCommit(source, stats)
	}
}

// traceGroup records the span name, from start to end, in the trace of
// each commit of cs whose request or envelope is traced: a group holds
// many callers' events, and each trace shows the group's work as its own.
func (in *Inbox) traceGroup(cs []*commit, name string, start, end time.Time, err error) {
	if in.o.Tracer == nil {
		return
	}
	for _, c := range cs {
		if len(c.events) == 0 || !c.events[0].Trace.IsSampled() {
			continue
		}
		ctx := trace.ContextWithSpanContext(context.Background(), c.events[0].Trace)
		_, span := in.o.Tracer.Start(ctx, name, trace.WithTimestamp(start), trace.WithAttributes(
			attribute.String("ingestor.source", c.source), attribute.Int("ingestor.events", len(c.events)),
			attribute.Int("ingestor.group", len(cs))))
		if err != nil {
			span.RecordError(err)
			span.SetStatus(codes.Error, err.Error())
		}
		span.End(trace.WithTimestamp(end))
	}
}
