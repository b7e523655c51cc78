package queue

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"time"

	"github.com/ingestorhq/ingestor/internal/wire"
)

// KeyAck acknowledges one event of a frame.
type KeyAck struct {
	Frame  int64
	Source string
	Key    string
}

// NackInput reports that a processor could not process one event of a
// frame. A permanent nack dead-letters the event at once; a retryable one
// only records Reason as the event's last error, and the event is
// redelivered with its frame.
type NackInput struct {
	Frame     int64
	Source    string
	Key       string
	Reason    string
	Permanent bool
}

// Settled is the outcome of Settle.
type Settled struct {
	// Cleared are the frames no longer pending: acked whole, or whose last
	// events were acked or dead-lettered. The sender must stop tracking them.
	Cleared []int64
	// DeadLettered counts events dead-lettered by permanent nacks.
	DeadLettered int
	// Retryable counts retryable nacks recorded.
	Retryable int
	// Unknown counts acks and nacks naming a frame or event that is not
	// pending (already acked, dead-lettered, or never known): harmless.
	Unknown int
	// Overridden counts acks of events that a nack in the same call named:
	// the nack won.
	Overridden int
}

// Ack clears acked frames and events. Unknown or already acked ones are
// ignored: acks are idempotent. It returns the frames now fully acked.
func (q *Queue) Ack(ctx context.Context, frames []int64, keys []KeyAck) ([]int64, error) {
	s, err := q.Settle(ctx, frames, keys, nil)
	return s.Cleared, err
}

// Nack applies nacks; see NackInput. It returns the frames cleared because
// their last pending events were dead-lettered.
func (q *Queue) Nack(ctx context.Context, nacks []NackInput) ([]int64, error) {
	s, err := q.Settle(ctx, nil, nil, nacks)
	return s.Cleared, err
}

// eventRef names an event as acks and nacks do.
type eventRef struct {
	frame       int64
	source, key string
}

// Settle applies one burst of acks and nacks in one transaction. A nack
// wins over every ack of its event in the same call, whatever their order:
// a key ack of the event is ignored, and a frame ack of its frame acks
// every other pending event of the frame. A permanent nack dead-letters
// the event; a retryable one records its reason as the event's last error
// and the event stays pending, and with it its frame. Of a permanent and a
// retryable nack of one event, the permanent one wins.
//
// Each kind of entry is looked up in one statement, whatever their number,
// so that an ack naming thousands of unknown frames or events costs
// milliseconds; only what it changes costs a statement or more each.
func (q *Queue) Settle(ctx context.Context, frames []int64, keys []KeyAck, nacks []NackInput) (Settled, error) {
	var st *settler
	r := &request{lazy: true, apply: func(tx *sql.Tx) error {
		st = q.newSettler(tx)
		st.nacked = make(map[eventRef]bool, len(nacks))
		if err := st.nackPermanent(nacks); err != nil {
			return fmt.Errorf("nack permanently: %w", err)
		}
		if err := st.nackRetryable(nacks); err != nil {
			return fmt.Errorf("nack: %w", err)
		}
		if err := st.ackFrames(frames); err != nil {
			return fmt.Errorf("ack frames: %w", err)
		}
		if err := st.ackKeys(keys); err != nil {
			return fmt.Errorf("ack keys: %w", err)
		}
		return nil
	}}
	if err := q.submit(ctx, r, func() { q.settled(st) }); err != nil {
		return Settled{}, fmt.Errorf("ack: %w", err)
	}
	return st.out, nil
}

// settled lowers the pending counts by what st settled, once committed.
func (q *Queue) settled(st *settler) {
	q.settledEvents.Add(st.events)
	q.pendingEvents.Add(-st.events)
	q.pendingFrames.Add(-int64(len(st.out.Cleared)))
}

// settleStmts are the statements that settle and dead-letter pending
// events and count deliveries, prepared once on the writer's connection
// before the writer starts, as prepareInserts prepares the inserts: each
// transaction binds them with tx.Stmt instead of parsing them again.
type settleStmts struct {
	// pending finds the pending events that a JSON array of [source, key,
	// frame, ...] entries names, each row with the entry's index in the
	// array.
	pending *sql.Stmt
	// markDead marks an event dead, and acked so that it is never loaded
	// for delivery again, with its raw reference (it outlives its
	// frame_log row).
	markDead *sql.Stmt
	// frameDeliveries returns a frame's deliveries.
	frameDeliveries *sql.Stmt
	// deadLetter lists one event as a dead letter: source, reason, raw key,
	// frame id, time, seq, key, deliveries and history.
	deadLetter *sql.Stmt
	// lastError records a retryable nack's reason on its event.
	lastError *sql.Stmt
	// ackEvents acks the events whose seqs a JSON array lists.
	ackEvents *sql.Stmt
	// ackFrames deletes the frames a JSON array lists, returning each
	// deleted frame's id and pending count.
	ackFrames *sql.Stmt
	// frameSpan returns the first and last seq of a pending frame.
	frameSpan *sql.Stmt
	// takeFromFrame lowers a frame's pending count, returning what is left.
	takeFromFrame *sql.Stmt
	// dropFrame deletes a frame.
	dropFrame *sql.Stmt
	// countDelivery records one more delivery of a frame.
	countDelivery *sql.Stmt
}

// prepareSettle prepares q.settle.
func (q *Queue) prepareSettle() error {
	for _, s := range []struct {
		dst   **sql.Stmt
		query string
	}{
		{&q.settle.pending, `WITH n AS MATERIALIZED (
	SELECT j.value->>0 AS source, j.value->>1 AS key, j.value->>2 AS frame, j.key AS entry,
		coalesce((SELECT seq FROM ledger_0 l WHERE l.source = j.value->>0 AND l.key = j.value->>1),
			(SELECT seq FROM ledger_1 l WHERE l.source = j.value->>0 AND l.key = j.value->>1)) AS seq
	FROM json_each(?) j)
	SELECT n.seq, f.id, f.source, n.key, n.entry FROM n
	JOIN frames f ON f.id = n.frame AND f.source = n.source
	WHERE n.seq BETWEEN f.first_seq AND f.last_seq AND NOT EXISTS (SELECT 1 FROM event_marks m WHERE m.seq = n.seq AND m.acked = 1)`},
		{&q.settle.markDead, `INSERT INTO event_marks(seq, acked, dead, raw_id, raw_off, raw_len, event_time) VALUES (?1, 1, 1, ?2, ?3, ?4, ?5)
	ON CONFLICT(seq) DO UPDATE SET acked = 1, dead = 1, raw_id = ?2, raw_off = ?3, raw_len = ?4, event_time = ?5`},
		{&q.settle.frameDeliveries, `SELECT deliveries FROM frames WHERE id = ?`},
		{&q.settle.deadLetter, `INSERT INTO dead_letters(source, reason, raw_key, frame_id, created_at, seq, event_key, deliveries, history)
	VALUES (?,?,?,?,?,?,?,?,?)`},
		{&q.settle.lastError, `INSERT INTO event_marks(seq, last_error) VALUES (?2, ?1) ON CONFLICT(seq) DO UPDATE SET last_error = ?1`},
		{&q.settle.ackEvents, `INSERT INTO event_marks(seq, acked) SELECT value, 1 FROM json_each(?) WHERE true
	ON CONFLICT(seq) DO UPDATE SET acked = 1`},
		{&q.settle.ackFrames, `DELETE FROM frames WHERE id IN (SELECT value FROM json_each(?)) RETURNING id, n`},
		{&q.settle.frameSpan, `SELECT first_seq, last_seq FROM frames WHERE id = ?`},
		{&q.settle.takeFromFrame, `UPDATE frames SET n = n - ? WHERE id = ? RETURNING n`},
		{&q.settle.dropFrame, `DELETE FROM frames WHERE id = ?`},
		{&q.settle.countDelivery, `UPDATE frames SET deliveries = deliveries + 1 WHERE id = ?`},
	} {
		st, err := q.wdb.Prepare(s.query)
		if err != nil {
			return fmt.Errorf("prepare %s: %w", s.query, err)
		}
		*s.dst = st
	}
	return nil
}

// close closes the prepared statements.
func (s *settleStmts) close() error {
	var errs []error
	for _, st := range []*sql.Stmt{s.pending, s.markDead, s.frameDeliveries, s.deadLetter, s.lastError, s.ackEvents, s.ackFrames, s.frameSpan, s.takeFromFrame, s.dropFrame, s.countDelivery} {
		if st != nil {
			errs = append(errs, st.Close())
		}
	}
	return errors.Join(errs...)
}

// newSettler starts settling in tx.
func (q *Queue) newSettler(tx *sql.Tx) *settler {
	return &settler{tx: tx, stmts: &q.settle, now: time.Now(), kept: map[int64][]int64{}, matched: map[int64]int{}}
}

// settler is the state of one Settle or dead-letter transaction.
type settler struct {
	tx     *sql.Tx
	stmts  *settleStmts
	now    time.Time
	out    Settled
	events int64 // pending events settled
	// kept holds, by frame, the seqs of the events that retryable nacks
	// keep pending; matched counts, by frame, the nacks that applied, and
	// nacked holds the events they named.
	kept    map[int64][]int64
	matched map[int64]int
	nacked  map[eventRef]bool
}

// refsJSON encodes the entries named by ref(i), i < n, as a JSON array of
// [source, key, frame] arrays for the pending statement. It appends rather than
// marshals: a maximal ack names 16384 entries, and json.Marshal of them
// through interfaces took a fifth of the time settling it takes.
func refsJSON(n int, ref func(i int) eventRef) []byte {
	size := 2
	for i := range n {
		r := ref(i)
		size += len(r.source) + len(r.key) + 30 // quotes, commas, brackets, the frame id
	}
	b := make([]byte, 0, size)
	b = append(b, '[')
	for i := range n {
		if i > 0 {
			b = append(b, ',')
		}
		r := ref(i)
		b = append(b, '[')
		b = wire.AppendString(b, r.source)
		b = append(b, ',')
		b = wire.AppendString(b, r.key)
		b = append(b, ',')
		b = strconv.AppendInt(b, r.frame, 10)
		b = append(b, ']')
	}
	return append(b, ']')
}

// found is a pending event that an entry named.
type found struct {
	seq   int64
	ref   eventRef
	entry int // the entry's index
}

// findPending returns the pending events named by the entries ref(i),
// i < n, once each, in the order of the first entry naming each.
func (st *settler) findPending(n int, ref func(i int) eventRef) ([]found, error) {
	if n == 0 {
		return nil, nil
	}
	rows, err := st.tx.Stmt(st.stmts.pending).Query(refsJSON(n, ref))
	if err != nil {
		return nil, err
	}
	var out []found
	for rows.Next() {
		var f found
		if err := rows.Scan(&f.seq, &f.ref.frame, &f.ref.source, &f.ref.key, &f.entry); err != nil {
			return nil, errors.Join(err, rows.Close())
		}
		out = append(out, f)
	}
	if err := errors.Join(rows.Err(), rows.Close()); err != nil {
		return nil, err
	}
	// An event named by several entries counts once, for the first.
	slices.SortFunc(out, func(a, b found) int { return a.entry - b.entry })
	seen := make(map[int64]bool, len(out))
	return slices.DeleteFunc(out, func(f found) bool {
		dup := seen[f.seq]
		seen[f.seq] = true
		return dup
	}), nil
}

// take lowers the pending counts of frames, by frame, and records the
// frames it cleared.
func (st *settler) take(counts map[int64]int) error {
	for _, id := range slices.Sorted(maps.Keys(counts)) {
		cleared, err := st.takeFromFrame(id, counts[id])
		if err != nil {
			return fmt.Errorf("frame %d: %w", id, err)
		}
		if cleared {
			st.out.Cleared = append(st.out.Cleared, id)
		}
	}
	return nil
}

// findNacks returns the nacks of all that are permanent (or not), and the
// pending events they name; the others count as unknown.
func (st *settler) findNacks(all []NackInput, permanent bool) ([]NackInput, []found, error) {
	var nacks []NackInput
	for _, nk := range all {
		if nk.Permanent == permanent {
			nacks = append(nacks, nk)
		}
	}
	hits, err := st.findPending(len(nacks), func(i int) eventRef {
		return eventRef{nacks[i].Frame, nacks[i].Source, nacks[i].Key}
	})
	if err != nil {
		return nil, nil, err
	}
	st.out.Unknown += len(nacks) - len(hits)
	return nacks, hits, nil
}

// nackPermanent dead-letters the events that permanent nacks name.
func (st *settler) nackPermanent(all []NackInput) error {
	nacks, hits, err := st.findNacks(all, true)
	if err != nil || len(hits) == 0 {
		return err
	}
	bury := st.burier()
	counts := map[int64]int{}
	for _, h := range hits {
		reason := nacks[h.entry].Reason
		if reason == "" {
			reason = "rejected by processor"
		}
		if err := bury(h.seq, h.ref, reason); err != nil {
			return err
		}
		counts[h.ref.frame]++
		st.matched[h.ref.frame]++
		st.nacked[h.ref] = true
	}
	st.out.DeadLettered += len(hits)
	return st.take(counts)
}

// burier returns a function that dead-letters pending event seq, named by
// ref, with reason: the event is marked dead (and acked, so it is never
// loaded for delivery again) with its raw reference, and listed as a dead
// letter. The caller lowers the frame's count with take.
func (st *settler) burier() func(seq int64, ref eventRef, reason string) error {
	mark, insert := st.tx.Stmt(st.stmts.markDead), st.tx.Stmt(st.stmts.deadLetter)
	deliveries := st.tx.Stmt(st.stmts.frameDeliveries)
	return func(seq int64, ref eventRef, reason string) error {
		ctx := context.Background()
		r, e, ok, err := logEventAt(ctx, st.tx, seq)
		if err != nil {
			return err
		}
		if !ok {
			return fmt.Errorf("event %d: no frame_log row", seq)
		}
		if _, err := mark.Exec(seq, r.rawID, e.rawOff, e.rawLen, e.eventTime); err != nil {
			return err
		}
		var n int
		if err := deliveries.QueryRow(ref.frame).Scan(&n); err != nil && !errors.Is(err, sql.ErrNoRows) {
			return err
		}
		if _, err := insert.Exec(ref.source, reason, r.rawKey, ref.frame, st.now.UnixNano(), seq, ref.key, n,
			historyLine(st.now, "dead-lettered", reason)); err != nil {
			return err
		}
		st.events++
		return nil
	}
}

// nackRetryable records the reasons of retryable nacks as their events'
// last errors.
func (st *settler) nackRetryable(all []NackInput) error {
	nacks, hits, err := st.findNacks(all, false)
	if err != nil || len(hits) == 0 {
		return err
	}
	record := st.tx.Stmt(st.stmts.lastError)
	for _, h := range hits {
		if _, err := record.Exec(nacks[h.entry].Reason, h.seq); err != nil {
			return err
		}
		st.matched[h.ref.frame]++
		st.nacked[h.ref] = true
		st.kept[h.ref.frame] = append(st.kept[h.ref.frame], h.seq)
	}
	st.out.Retryable += len(hits)
	return nil
}

// ackKeys acks the events that key acks name, except those a nack named.
func (st *settler) ackKeys(all []KeyAck) error {
	var keys []KeyAck
	for _, k := range all {
		if st.nacked[eventRef{k.Frame, k.Source, k.Key}] {
			st.out.Overridden++
			continue
		}
		keys = append(keys, k)
	}
	hits, err := st.findPending(len(keys), func(i int) eventRef {
		return eventRef{keys[i].Frame, keys[i].Source, keys[i].Key}
	})
	if err != nil {
		return err
	}
	st.out.Unknown += len(keys) - len(hits)
	if len(hits) == 0 {
		return nil
	}
	seqs := make([]int64, len(hits))
	counts := map[int64]int{}
	for i, h := range hits {
		seqs[i] = h.seq
		counts[h.ref.frame]++
	}
	arg, err := json.Marshal(seqs)
	if err != nil {
		return err
	}
	if _, err := st.tx.Stmt(st.stmts.ackEvents).Exec(arg); err != nil {
		return err
	}
	st.events += int64(len(hits))
	return st.take(counts)
}

// ackFrames acks frames whole, except for the events that retryable
// nacks keep pending. A frame named twice is unknown the second time.
// Frames without such events, nearly all of them, are deleted in one
// statement.
func (st *settler) ackFrames(frames []int64) error {
	if len(frames) == 0 {
		return nil
	}
	whole := make([]int64, 0, len(frames))
	seen := make(map[int64]bool, len(frames))
	for _, id := range frames {
		switch {
		case seen[id]:
			st.out.Unknown++
		case st.kept[id] != nil:
			if err := st.ackAllBut(id, st.kept[id]); err != nil {
				return fmt.Errorf("frame %d: %w", id, err)
			}
		default:
			whole = append(whole, id)
		}
		if !seen[id] {
			st.out.Overridden += st.matched[id]
		}
		seen[id] = true
	}
	if len(whole) == 0 {
		return nil
	}
	arg, err := json.Marshal(whole)
	if err != nil {
		return err
	}
	rows, err := st.tx.Stmt(st.stmts.ackFrames).Query(arg)
	if err != nil {
		return err
	}
	found := 0
	for rows.Next() {
		var id, n int64
		if err := rows.Scan(&id, &n); err != nil {
			return errors.Join(err, rows.Close())
		}
		st.out.Cleared = append(st.out.Cleared, id)
		st.events += n
		found++
	}
	if err := errors.Join(rows.Err(), rows.Close()); err != nil {
		return err
	}
	st.out.Unknown += len(whole) - found
	return nil
}

// ackAllBut acks every pending event of frame id but those whose seqs are
// in keep, which are pending: the frame stays.
func (st *settler) ackAllBut(id int64, keep []int64) error {
	var first, last int64
	if err := st.tx.Stmt(st.stmts.frameSpan).QueryRow(id).Scan(&first, &last); err != nil {
		return err
	}
	kept := make(map[int64]bool, len(keep))
	for _, s := range keep {
		kept[s] = true
	}
	var seqs []int64
	if err := pendingIn(context.Background(), st.tx, first, last, func(_ *logRow, e logEvent, _ eventMark) {
		if !kept[e.seq] {
			seqs = append(seqs, e.seq)
		}
	}); err != nil {
		return err
	}
	if len(seqs) == 0 {
		return nil
	}
	arg, err := json.Marshal(seqs)
	if err != nil {
		return err
	}
	if _, err := st.tx.Stmt(st.stmts.ackEvents).Exec(arg); err != nil {
		return err
	}
	st.events += int64(len(seqs))
	_, err = st.takeFromFrame(id, len(seqs))
	return err
}

// takeFromFrame lowers frame id's pending count by n and deletes the frame
// when none is left; it reports whether it did.
func (st *settler) takeFromFrame(id int64, n int) (bool, error) {
	var left int64
	if err := st.tx.Stmt(st.stmts.takeFromFrame).QueryRow(n, id).Scan(&left); err != nil {
		return false, err
	}
	if left > 0 {
		return false, nil
	}
	if _, err := st.tx.Stmt(st.stmts.dropFrame).Exec(id); err != nil {
		return false, err
	}
	return true, nil
}
