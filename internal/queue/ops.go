package queue

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/ingestorhq/ingestor/internal/pagebuf"
	"github.com/ingestorhq/ingestor/internal/wire"
)

// NewEvent is one event to append.
type NewEvent struct {
	// Key is the idempotency key, unique within the source.
	Key string
	// EventTime is the event's own time, or zero.
	EventTime time.Time
	// RawOff and RawLen locate the event in the batch's raw object.
	RawOff, RawLen int
	// Payload is the event's bytes; not stored (the raw object holds them),
	// but handed back in the returned frames for the first send.
	Payload []byte
	// Device and DevSeq are a push device's id and the event's number in
	// its sequence (DevSeq 0: none); see devseq.go.
	Device string
	DevSeq int64
	// Verdict, when set, is the signature verdict of a signed webhook
	// event, stored with it when it is new (verdict.go).
	Verdict *Verdict
	// Traceparent and Tracestate, when set, are the event's own trace
	// context (a push event's request or envelope), in place of the
	// batch's: stored with the event (table event_traces, traces.go), so
	// a resend after a restart carries it too.
	Traceparent, Tracestate string
}

// Batch is one fetched batch: its events, its raw object and the cursor
// that follows it.
type Batch struct {
	Source    string
	FetchedAt time.Time
	// RawKey is the key of the batch's raw object, already durable.
	RawKey string
	Events []NewEvent
	// Cursor, when SetCursor is true, is stored as the source's cursor in
	// the same transaction as the events.
	Cursor    string
	SetCursor bool
	// SeqGrace is how long a device seq may stay missing before it is
	// reported lost; SeqFindings, when set, receives what the batch's
	// device seqs revealed (devseq.go).
	SeqGrace    time.Duration
	SeqFindings *[]SeqFinding
	// Traceparent and Tracestate are the W3C trace context of a traced
	// batch, stored with its raw object; every event of the batch carries
	// it. Empty when the batch is not traced.
	Traceparent, Tracestate string
	// Page, when set, is the pooled buffer the events' payloads are
	// slices of: each frame built from them takes a hold on it, which
	// the sender lets go once the frame is encoded (Frame.ReleasePayloads).
	Page *pagebuf.Page
}

// Event is one queued event as it is sent.
type Event struct {
	Seq       int64
	Source    string
	Key       string
	FetchedAt time.Time
	EventTime time.Time
	RawKey    string
	RawOff    int
	RawLen    int
	// Payload is set for frames returned by Append and nil for frames
	// loaded from the database, whose payload is read from the raw store.
	Payload []byte
	// Trace is the event's W3C trace context, nil when it was not traced:
	// its batch's (Batch.Traceparent), shared by the batch's events, or
	// its own (NewEvent.Traceparent).
	Trace *Trace
}

// Trace is a W3C trace context: a traceparent and its tracestate.
type Trace struct {
	Parent, State string
}

// newTrace returns the Trace of parent and state, nil when parent is "".
func newTrace(parent, state string) *Trace {
	if parent == "" {
		return nil
	}
	return &Trace{Parent: parent, State: state}
}

// Frame is a unit of delivery.
type Frame struct {
	ID     int64
	Source string
	// Deliveries counts earlier deliveries recorded for the frame (the
	// sender records them in batches, so a crash can leave it one low).
	Deliveries int
	// Committed is when the transaction that queued the frame began: the
	// publish latency runs from it to the frame's first send.
	Committed time.Time
	Events    []Event
	// hold is the frame's hold on the pooled buffer its payloads are
	// slices of (Batch.Page), shared by every copy of the frame; nil when
	// they are not pooled.
	hold *pagebuf.Hold
}

// ReleasePayloads lets the pooled buffer the frame's payloads are slices
// of go to a later fetch, once every other holder did too: the caller has
// encoded them and must not read them again, in this copy of the frame or
// any other (PayloadsReleased). Frames whose payloads are not pooled (read
// back, pushed) ignore it.
func (f *Frame) ReleasePayloads() { f.hold.Release() }

// PayloadsReleased reports whether ReleasePayloads was called on a copy of
// the frame: its payloads must then be read back from the raw store.
func (f *Frame) PayloadsReleased() bool { return f.hold.Released() }

// Append commits b durably and returns the frames of its events that were
// new; an event whose (source, key) is already queued or remembered is
// dropped as a duplicate.
func (q *Queue) Append(ctx context.Context, b Batch) ([]Frame, error) {
	done := make(chan struct{})
	var frames []Frame
	var err error
	r := q.appendRequest(b, nil, func(f []Frame, e error) { frames, err = f, e; close(done) })
	if err := q.enqueue(ctx, r); err != nil {
		return nil, fmt.Errorf("append batch of %q: %w", b.Source, err)
	}
	<-done
	return frames, err
}

// Chain orders the batches of one source. A batch appended on a chain
// fails without being applied if an earlier batch on the same chain failed:
// its cursor must never be committed past events that were not.
type Chain struct {
	mu     sync.Mutex
	failed error
}

// Fail marks the chain failed, so that no later batch on it is applied;
// call it for a batch of the chain that will never be appended.
func (c *Chain) Fail(err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.failed == nil {
		c.failed = err
	}
}

// err returns the chain's first failure, or nil.
func (c *Chain) err() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.failed
}

// ErrFull is returned by TryAppendAsync when the writer has no room for
// another request.
var ErrFull = errors.New("queue writer is full")

// TryAppendAsync hands b to the writer without waiting: it returns nil
// once b is enqueued, and done is called on the writer goroutine after the
// group commit, with the frames of the new events or the error. When the
// writer has no room, nothing is enqueued, TryAppendAsync returns ErrFull
// and room is called once, on the writer goroutine, when the writer next
// takes work, so the caller can try again. Batches enqueued one after
// another are committed in that order, so a source can have several
// batches in flight and its cursor still only moves forward. chain may be
// nil.
func (q *Queue) TryAppendAsync(b Batch, chain *Chain, done func([]Frame, error), room func()) error {
	if err := q.tryEnqueue(q.appendRequest(b, chain, done), room); err != nil {
		return fmt.Errorf("append batch of %q: %w", b.Source, err)
	}
	return nil
}

// appendRequest is the writer's work for appending b on chain.
func (q *Queue) appendRequest(b Batch, chain *Chain, done func([]Frame, error)) *request {
	var frames []Frame
	var added, dups int64
	r := &request{
		apply: func(tx *sql.Tx) error {
			if chain != nil {
				if err := chain.err(); err != nil {
					return fmt.Errorf("an earlier batch on this chain failed: %w", err)
				}
			}
			var err error
			dups = 0
			frames, added, err = q.applyAppend(tx, &b, &dups)
			if err != nil && chain != nil {
				chain.Fail(err) // later batches in this same group must not apply
			}
			return err
		},
	}
	r.finished = func(err error) {
		if err != nil {
			if chain != nil {
				chain.Fail(err)
			}
			done(nil, fmt.Errorf("append batch of %q: %w", b.Source, err))
			return
		}
		if q.opts.TrackSettled && b.SetCursor {
			var last int64
			if n := len(frames); n > 0 {
				last = frames[n-1].Events[len(frames[n-1].Events)-1].Seq
			}
			q.marks.record(b.Source, last, b.Cursor, q.highSeq)
		}
		q.pendingEvents.Add(added)
		q.pendingFrames.Add(int64(len(frames)))
		q.duplicates.Add(dups)
		done(frames, nil)
	}
	return r
}

// prepareInserts prepares the insert statements before the writer starts
// (the writer's only connection is busy inside its transaction later).
//
// insertKeys[g] inserts a frame's keys into generation g in one statement
// with four parameters, whatever their number: the source, the seq of the
// first key, the keys as a JSON array of strings, and the other
// generation's highest key of the source. Binding values per event cost
// more CPU than SQLite inserting the row (each bind is a cgo call). A key
// is new when neither generation holds it; the other one is only looked
// up for a key at or below its highest key, since it takes no new keys
// (ledger.go). Key i of the array gets the first seq + i, whatever the
// order SQLite inserts them in: a duplicate leaves a gap, and of a key
// repeated in the array the one inserted is the one readBack finds. insertKeyOne[g] inserts one
// key, for keys that JSON text cannot carry exactly (control characters,
// invalid UTF-8); readBack[g] lists which keys of an array were new.
func (q *Queue) prepareInserts() error {
	for g, cur := range ledgerTables {
		other := ledgerTables[1-g]
		for _, p := range []struct {
			dst  **sql.Stmt
			what string
			sql  string
		}{
			{&q.insertKeys[g], "the keys of a frame", `INSERT INTO ` + cur + `(source, key, seq)
				SELECT ?1, j.value, ?2 + j.key FROM json_each(?3) AS j
				WHERE coalesce(j.value > ?4, 1) OR NOT EXISTS (SELECT 1 FROM ` + other + ` o WHERE o.source = ?1 AND o.key = j.value)
				ON CONFLICT(source, key) DO NOTHING`},
			{&q.insertKeyOne[g], "a key", `INSERT INTO ` + cur + `(source, key, seq) SELECT ?1, ?2, ?3
				WHERE NOT EXISTS (SELECT 1 FROM ` + other + ` o WHERE o.source = ?1 AND o.key = ?2) ON CONFLICT(source, key) DO NOTHING`},
			{&q.readBack[g], "the read-back of new keys", `SELECT j.key FROM json_each(?3) AS j CROSS
				JOIN ` + cur + ` l ON l.source = ?1 AND l.key = j.value AND l.seq = ?2 + j.key`},
		} {
			var err error
			if *p.dst, err = q.wdb.Prepare(p.sql); err != nil {
				return fmt.Errorf("prepare the insert of %s: %w", p.what, err)
			}
		}
	}
	for _, p := range []struct {
		dst  **sql.Stmt
		what string
		sql  string
	}{
		{&q.insertRaw, "a raw object", `INSERT INTO raw_objects(key, fetched_at, seq_floor, traceparent, tracestate) VALUES (?, ?, ?, ?, ?)`},
		{&q.storeCursor, "a cursor", `INSERT INTO offsets(source, cursor, updated_at) VALUES (?,?,?)
			ON CONFLICT(source) DO UPDATE SET cursor = excluded.cursor, updated_at = excluded.updated_at`},
	} {
		var err error
		if *p.dst, err = q.wdb.Prepare(p.sql); err != nil {
			return fmt.Errorf("prepare the insert of %s: %w", p.what, err)
		}
	}
	var err error
	if q.frameLogs, err = prepareMultiInsert(q.wdb, "frame_log rows", `INSERT INTO frame_log(first_seq, last_seq, frame_id, source, raw_id, events) VALUES `, 6); err != nil {
		return err
	}
	q.frameRows, err = prepareMultiInsert(q.wdb, "frames", `INSERT INTO frames(id, source, n, first_seq, last_seq, created_at) VALUES `, 6)
	return err
}

// insertChunk inserts the keys of chunk into the current generation and
// sets seqs[i] to the seq given to chunk[i], or 0 when it was a
// duplicate. The chunk's seqs are the next len(chunk) ones, given or not.
func (q *Queue) insertChunk(tx *sql.Tx, source string, chunk []NewEvent, seqs []int64) error {
	g := q.gens.cur
	base := q.highSeq + 1
	q.highSeq += int64(len(chunk))
	if !jsonKeys(chunk) {
		st := tx.Stmt(q.insertKeyOne[g])
		for i := range chunk {
			res, err := st.Exec(source, chunk[i].Key, base+int64(i))
			if err != nil {
				return fmt.Errorf("insert events: %w", err)
			}
			if n, err := res.RowsAffected(); err != nil {
				return fmt.Errorf("insert events: %w", err)
			} else if n == 1 {
				seqs[i] = base + int64(i)
			}
		}
		return countDuplicates(tx, source, chunk, seqs)
	}
	bound, err := q.otherBound(tx, source)
	if err != nil {
		return err
	}
	keys := append(q.keysBuf[:0], '[')
	for i := range chunk {
		if i > 0 {
			keys = append(keys, ',')
		}
		keys = wire.AppendString(keys, chunk[i].Key)
	}
	keys = append(keys, ']')
	q.keysBuf = keys
	res, err := tx.Stmt(q.insertKeys[g]).Exec(source, base, keys, bound)
	if err != nil {
		return fmt.Errorf("insert events: %w", err)
	}
	n, err := res.RowsAffected()
	if err != nil {
		return fmt.Errorf("insert events: %w", err)
	}
	switch {
	case int(n) == len(chunk): // all new: the common case, nothing read back
		for i := range seqs {
			seqs[i] = base + int64(i)
		}
		return nil
	case n > 0:
		rows, err := tx.Stmt(q.readBack[g]).Query(source, base, keys)
		if err != nil {
			return fmt.Errorf("read back inserted events: %w", err)
		}
		for rows.Next() {
			var i int
			if err := rows.Scan(&i); err != nil {
				return fmt.Errorf("read back inserted events: %w", errors.Join(err, rows.Close()))
			}
			seqs[i] = base + int64(i)
		}
		if err := errors.Join(rows.Err(), rows.Close()); err != nil {
			return fmt.Errorf("read back inserted events: %w", err)
		}
	}
	return countDuplicates(tx, source, chunk, seqs)
}

// jsonKeys reports whether every key of chunk reads back from JSON text
// exactly: valid UTF-8 without control characters.
func jsonKeys(chunk []NewEvent) bool {
	for i := range chunk {
		k := chunk[i].Key
		for j := 0; j < len(k); j++ {
			if k[j] < 0x20 {
				return false
			}
		}
		if !utf8.ValidString(k) {
			return false
		}
	}
	return true
}

// eventTime is e's time in unix nanoseconds, 0 for none.
func eventTime(e *NewEvent) int64 {
	if e.EventTime.IsZero() {
		return 0
	}
	return e.EventTime.UnixNano()
}

// countDuplicates records a new arrival of every event whose seq is 0 (a
// duplicate of a known event) in the ledger: one more attempt per arrival,
// seen now. A key repeated in the chunk counts once per repeat. One
// statement covers the keys that arrived the same number of times (all of
// them, nearly always); the rows all have the same source.
func countDuplicates(tx *sql.Tx, source string, chunk []NewEvent, seqs []int64) error {
	var keys []any
	times := make(map[any]int)
	for i, seq := range seqs {
		if seq != 0 {
			continue
		}
		key := chunk[i].Key
		if times[key] == 0 {
			keys = append(keys, key)
		}
		times[key]++
	}
	now := time.Now().UnixNano()
	for len(keys) > 0 {
		n := times[keys[0]]
		var sb strings.Builder
		qargs := []any{n, now, source}
		sb.WriteString(` SET attempts = attempts + ?1, last_seen = ?2 WHERE source = ?3 AND key IN (`)
		rest := keys[:0]
		for _, k := range keys {
			if times[k] != n {
				rest = append(rest, k)
				continue
			}
			if len(qargs) > 3 {
				sb.WriteByte(',')
			}
			fmt.Fprintf(&sb, "?%d", len(qargs)+1)
			qargs = append(qargs, k)
		}
		sb.WriteByte(')')
		// A key is in one generation: the statement changes nothing in the
		// other.
		for _, table := range ledgerTables {
			if _, err := tx.Exec(`UPDATE `+table+sb.String(), qargs...); err != nil {
				return fmt.Errorf("count duplicate arrivals: %w", err)
			}
		}
		keys = rest
	}
	return nil
}

func (q *Queue) applyAppend(tx *sql.Tx, b *Batch, dups *int64) ([]Frame, int64, error) {
	now := time.Now().UnixNano()
	st := appendState{batch: b, now: now, trace: newTrace(b.Traceparent, b.Tracestate)}
	if len(b.Events) > 0 {
		res, err := tx.Stmt(q.insertRaw).Exec(b.RawKey, b.FetchedAt.UnixNano(), q.highSeq+1, nullString(b.Traceparent), nullString(b.Tracestate))
		if err != nil {
			return nil, 0, fmt.Errorf("insert raw object: %w", err)
		}
		if st.rawID, err = res.LastInsertId(); err != nil {
			return nil, 0, fmt.Errorf("insert raw object: %w", err)
		}
		step := q.opts.EventsPerFrame * framesPerStatement
		for start := 0; start < len(b.Events); start += step {
			if err := q.appendSlice(tx, &st, start, min(start+step, len(b.Events))); err != nil {
				return nil, 0, err
			}
		}
		*dups += st.dups
		if err := q.traces.insert(tx, st.traces); err != nil {
			return nil, 0, err
		}
		if err := q.verdicts.insert(tx, st.verdicts); err != nil {
			return nil, 0, err
		}
		if len(st.devSeqs) > 0 {
			findings, err := trackSeqs(tx, b.Source, st.devSeqs, b.SeqGrace, now)
			if err != nil {
				return nil, 0, err
			}
			if b.SeqFindings != nil {
				*b.SeqFindings = findings
			}
		}
	}
	if b.SetCursor {
		if _, err := tx.Stmt(q.storeCursor).Exec(b.Source, b.Cursor, now); err != nil {
			return nil, 0, fmt.Errorf("store cursor: %w", err)
		}
	}
	return st.frames, st.added, nil
}

// maxKeptLogBuf bounds the frame_log buffer the writer keeps between
// slices (a slice of 1000 events of short keys needs ~30 KB).
const maxKeptLogBuf = 1 << 20

// framesPerStatement is how many frames' keys, frame_log rows and frames
// rows applyAppend inserts per statement: a page of 1000 events in three
// statements instead of thirty (each a cgo call and database/sql's work),
// while a page of a million records still binds a bounded JSON array.
const framesPerStatement = 16

// appendState is what applyAppend gathers over a batch's slices.
type appendState struct {
	batch         *Batch
	now, rawID    int64
	trace         *Trace // the batch's, shared by its events
	frames        []Frame
	added, dups   int64
	devSeqs       []deviceSeq
	verdicts      []any
	traces        []any
	seqs          []int64
	logArgs, rows []any
}

// appendSlice inserts the keys of events [from, to) of the batch in one
// statement, then their frames (EventsPerFrame events of the batch each,
// less their duplicates) as frame_log and frames rows.
func (q *Queue) appendSlice(tx *sql.Tx, st *appendState, from, to int) error {
	b := st.batch
	events := b.Events[from:to]
	st.seqs = append(st.seqs[:0], make([]int64, len(events))...)
	if err := q.insertChunk(tx, b.Source, events, st.seqs); err != nil {
		return err
	}
	per := q.opts.EventsPerFrame
	st.logArgs, st.rows = st.logArgs[:0], st.rows[:0]
	// The frame_log blobs are slices of one buffer, reused by every slice:
	// SQLite copies a blob when it is bound, and the statements that bind
	// these run before this returns.
	logs := q.logBuf[:0]
	for start := 0; start < len(events); start += per {
		chunk, seqs := events[start:min(start+per, len(events))], st.seqs[start:min(start+per, len(events))]
		frameID := q.nextFrame
		q.nextFrame++
		start := len(logs)
		f := Frame{ID: frameID, Source: b.Source, Committed: time.Unix(0, st.now), Events: make([]Event, 0, len(chunk))}
		var first, last int64
		for i, seq := range seqs {
			if seq == 0 {
				st.dups++
				continue
			}
			if first == 0 {
				first = seq
			}
			last = seq
			e := &chunk[i]
			logs = appendLogEvent(logs, first, logEvent{seq: seq, eventTime: eventTime(e), rawOff: e.RawOff, rawLen: e.RawLen, key: e.Key})
			f.Events = append(f.Events, st.event(e, seq))
		}
		if len(f.Events) == 0 {
			continue
		}
		// A frame's events are inserted together by the only writer, so
		// they are exactly the events with seq in [first, last]: frames
		// find their frame_log rows by primary key.
		f.hold = b.Page.Hold()
		st.logArgs = append(st.logArgs, first, last, frameID, b.Source, st.rawID, logs[start:len(logs):len(logs)])
		st.rows = append(st.rows, frameID, b.Source, len(f.Events), first, last, st.now)
		st.added += int64(len(f.Events))
		st.frames = append(st.frames, f)
	}
	if q.logBuf = logs; cap(logs) > maxKeptLogBuf {
		q.logBuf = nil // a page of long keys: not kept for every page after it
	}
	if err := q.frameLogs.insert(tx, st.logArgs); err != nil {
		return err
	}
	return q.frameRows.insert(tx, st.rows)
}

// event is new event e of the batch, given seq, as it is sent; it also
// gathers e's device seq, verdict and trace context rows.
func (st *appendState) event(e *NewEvent, seq int64) Event {
	b := st.batch
	if e.DevSeq > 0 {
		st.devSeqs = append(st.devSeqs, deviceSeq{device: e.Device, seq: e.DevSeq})
	}
	if e.Verdict != nil {
		st.verdicts = e.Verdict.appendRow(st.verdicts, seq)
	}
	ev := Event{
		Seq: seq, Source: b.Source, Key: e.Key, FetchedAt: b.FetchedAt, EventTime: e.EventTime,
		RawKey: b.RawKey, RawOff: e.RawOff, RawLen: e.RawLen, Payload: e.Payload, Trace: st.trace,
	}
	if e.Traceparent != "" && e.Traceparent != b.Traceparent {
		ev.Trace = newTrace(e.Traceparent, e.Tracestate)
		st.traces = append(st.traces, seq, e.Traceparent, nullString(e.Tracestate))
	}
	return ev
}

// Cursor returns the stored cursor of source; ok is false when none is stored.
func (q *Queue) Cursor(ctx context.Context, source string) (cursor string, ok bool, err error) {
	err = q.rdb.QueryRowContext(ctx, `SELECT cursor FROM offsets WHERE source = ?`, source).Scan(&cursor)
	if errors.Is(err, sql.ErrNoRows) {
		return "", false, nil
	}
	if err != nil {
		return "", false, fmt.Errorf("read cursor of %q: %w", source, err)
	}
	return cursor, true, nil
}

// SetCursor stores cursor as source's cursor outside a batch: cluster
// mode installs the cursor a source was handed over with before the
// source starts here. The source must not be running.
func (q *Queue) SetCursor(ctx context.Context, source, cursor string) error {
	r := &request{apply: func(tx *sql.Tx) error {
		_, err := tx.Stmt(q.storeCursor).Exec(source, cursor, time.Now().UnixNano())
		return err
	}}
	committed := func() {
		if q.opts.TrackSettled {
			q.marks.reset(source, q.highSeq, cursor)
		}
	}
	if err := q.submit(ctx, r, committed); err != nil {
		return fmt.Errorf("store cursor of %q: %w", source, err)
	}
	return nil
}

// FramesAfter returns up to limit pending frame ids greater than after, in
// order. Paging with it streams the backlog without loading it. It lists
// only durable frames (walsync.go): a newer one reaches the sender from
// its commit.
func (q *Queue) FramesAfter(ctx context.Context, after int64, limit int) ([]int64, error) {
	rows, err := q.rdb.QueryContext(ctx, `SELECT id FROM frames WHERE id > ? AND id <= ? ORDER BY id LIMIT ?`,
		after, q.durable.frame.Load(), limit)
	if err != nil {
		return nil, fmt.Errorf("scan frames: %w", err)
	}
	var ids []int64
	for rows.Next() {
		var id int64
		if err := rows.Scan(&id); err != nil {
			return nil, fmt.Errorf("scan frames: %w", errors.Join(err, rows.Close()))
		}
		ids = append(ids, id)
	}
	if err := errors.Join(rows.Err(), rows.Close()); err != nil {
		return nil, fmt.Errorf("scan frames: %w", err)
	}
	return ids, nil
}

// LoadFrame returns a pending frame with its events not yet acked; ok is
// false when the frame is no longer pending.
func (q *Queue) LoadFrame(ctx context.Context, id int64) (Frame, bool, error) {
	f := Frame{ID: id}
	var first, last, created int64
	err := q.rdb.QueryRowContext(ctx, `SELECT source, deliveries, first_seq, last_seq, created_at FROM frames WHERE id = ?`, id).Scan(&f.Source, &f.Deliveries, &first, &last, &created)
	if errors.Is(err, sql.ErrNoRows) {
		return Frame{}, false, nil
	}
	if err != nil {
		return Frame{}, false, fmt.Errorf("load frame %d: %w", id, err)
	}
	f.Committed = time.Unix(0, created)
	tx, err := q.rdb.BeginTx(ctx, &sql.TxOptions{ReadOnly: true})
	if err != nil {
		return Frame{}, false, fmt.Errorf("load frame %d: %w", id, err)
	}
	defer tx.Rollback() //nolint:errcheck // read-only: nothing to undo
	traces, err := readTraces(ctx, tx, first, last)
	if err != nil {
		return Frame{}, false, fmt.Errorf("load frame %d: %w", id, err)
	}
	var shared *Trace // consecutive events of a batch share theirs
	err = pendingIn(ctx, tx, first, last, func(r *logRow, le logEvent, _ eventMark) {
		e := Event{Seq: le.seq, Source: r.source, Key: le.key, FetchedAt: time.Unix(0, r.fetched).UTC(),
			RawKey: r.rawKey, RawOff: le.rawOff, RawLen: le.rawLen}
		if le.eventTime != 0 {
			e.EventTime = time.Unix(0, le.eventTime).UTC()
		}
		parent, state := r.parent, r.state
		if t, ok := traces[le.seq]; ok {
			parent, state = t.Parent, t.State
		}
		if parent != "" {
			if shared == nil || shared.Parent != parent || shared.State != state {
				shared = newTrace(parent, state)
			}
			e.Trace = shared
		}
		f.Events = append(f.Events, e)
	})
	if err != nil {
		return Frame{}, false, fmt.Errorf("load frame %d: %w", id, err)
	}
	return f, true, nil
}

// CountDeliveries records one more delivery of each frame.
func (q *Queue) CountDeliveries(ctx context.Context, ids []int64) error {
	r := &request{lazy: true, apply: func(tx *sql.Tx) error {
		count := tx.Stmt(q.settle.countDelivery)
		for _, id := range ids {
			if _, err := count.Exec(id); err != nil {
				return fmt.Errorf("count delivery of frame %d: %w", id, err)
			}
		}
		return nil
	}}
	return q.submit(ctx, r, nil)
}

// Stats is a snapshot for startup logs and metrics.
type Stats struct {
	PendingEvents int64
	PendingFrames int64
	DeadLetters   int64
	// OldestPending is the creation time of the oldest pending frame, or zero.
	OldestPending time.Time
}

// Stats reads a snapshot using indexed aggregate queries.
func (q *Queue) Stats(ctx context.Context) (Stats, error) {
	s := Stats{PendingEvents: q.pendingEvents.Load(), PendingFrames: q.pendingFrames.Load()}
	var err error
	if s.OldestPending, err = q.OldestPending(ctx); err != nil {
		return s, fmt.Errorf("queue stats: %w", err)
	}
	if err := q.rdb.QueryRowContext(ctx, `SELECT count(*) FROM dead_letters WHERE replayed_at = 0 AND resolved_at = 0`).Scan(&s.DeadLetters); err != nil {
		return s, fmt.Errorf("queue stats: %w", err)
	}
	return s, nil
}

// Prune forgets the remembered events older than the dedupe window: a
// switch of the ledger's generations (ledger.go), once the current one is
// older than the window; otherwise it does nothing. It also deletes the
// raw-object rows, trace contexts and verdicts nothing needs any more. It
// returns how many remembered events it forgot.
func (q *Queue) Prune(ctx context.Context) (int64, error) {
	var forgotten int64
	r := &request{apply: func(tx *sql.Tx) error {
		before := q.gens
		var err error
		if forgotten, err = q.switchGeneration(tx, time.Now()); err != nil {
			q.gens = before
			return fmt.Errorf("prune: %w", err)
		}
		if forgotten == 0 && q.gens.seq == before.seq {
			return nil
		}
		if err := pruneRetained(tx); err != nil {
			q.gens = before
			return err
		}
		return nil
	}}
	err := q.submit(ctx, r, func() {
		q.genSince.Store(q.gens.since)
		q.forgotten.Add(forgotten)
	})
	if err != nil {
		// The switch may have changed the writer's state in a transaction
		// that did not commit: read it again.
		if gerr := q.reloadGenerations(ctx); gerr != nil {
			err = errors.Join(err, gerr)
		}
		return 0, err
	}
	return forgotten, nil
}

// reloadGenerations reads the generation state again, on the writer.
func (q *Queue) reloadGenerations(ctx context.Context) error {
	r := &request{apply: func(tx *sql.Tx) error {
		g, err := loadGenerations(ctx, tx)
		if err == nil {
			q.gens = g
		}
		return err
	}}
	return q.submit(ctx, r, nil)
}

// nullString is s, or NULL for "".
func nullString(s string) any {
	if s == "" {
		return nil
	}
	return s
}
