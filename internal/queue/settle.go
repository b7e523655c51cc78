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
	r := &request{apply: func(tx *sql.Tx) error {
		st = &settler{tx: tx, now: time.Now(), kept: map[int64][]int64{}, matched: map[int64]int{},
			nacked: make(map[eventRef]bool, len(nacks))}
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
	committed := func() {
		q.pendingEvents.Add(-st.events)
		q.pendingFrames.Add(-int64(len(st.out.Cleared)))
	}
	if err := q.submit(ctx, r, committed); err != nil {
		return Settled{}, fmt.Errorf("ack: %w", err)
	}
	return st.out, nil
}

// settler is the state of one Settle transaction.
type settler struct {
	tx     *sql.Tx
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

// pendingEvents is the query that finds the pending events that a JSON
// array of [source, key, frame, ...] entries names, each row with the
// entry's index in the array.
const pendingEvents = `SELECT e.id, e.frame_id, e.source, e.key, j.key FROM json_each(?) j
	JOIN events e ON e.source = j.value->>0 AND e.key = j.value->>1 AND e.frame_id = j.value->>2
	JOIN frames f ON f.id = e.frame_id WHERE e.acked = 0`

// refsJSON encodes the entries named by ref(i), i < n, as a JSON array of
// [source, key, frame] arrays for pendingEvents. It appends rather than
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
	rows, err := st.tx.Query(pendingEvents, refsJSON(n, ref))
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
		cleared, err := takeFromFrame(st.tx, id, counts[id])
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
	bury, err := st.tx.Prepare(`UPDATE events SET dead = 1, acked = 1 WHERE id = ?
		RETURNING (SELECT coalesce(r.key, '') FROM raw_objects r WHERE r.id = events.raw_id),
		(SELECT deliveries FROM frames f WHERE f.id = events.frame_id)`)
	if err != nil {
		return err
	}
	insert, err := st.tx.Prepare(insertEventDeadLetter)
	if err != nil {
		return errors.Join(err, bury.Close())
	}
	counts := map[int64]int{}
	for _, h := range hits {
		reason := nacks[h.entry].Reason
		if reason == "" {
			reason = "rejected by processor"
		}
		var raw string
		var deliveries int
		if err = bury.QueryRow(h.seq).Scan(&raw, &deliveries); err != nil {
			break
		}
		if _, err = insert.Exec(h.ref.source, reason, raw, h.ref.frame, st.now.UnixNano(), h.seq, h.ref.key, deliveries,
			historyLine(st.now, "dead-lettered", reason)); err != nil {
			break
		}
		counts[h.ref.frame]++
		st.matched[h.ref.frame]++
		st.nacked[h.ref] = true
	}
	if err := errors.Join(err, bury.Close(), insert.Close()); err != nil {
		return err
	}
	st.events += int64(len(hits))
	st.out.DeadLettered += len(hits)
	return st.take(counts)
}

// nackRetryable records the reasons of retryable nacks as their events'
// last errors.
func (st *settler) nackRetryable(all []NackInput) error {
	nacks, hits, err := st.findNacks(all, false)
	if err != nil || len(hits) == 0 {
		return err
	}
	record, err := st.tx.Prepare(`UPDATE events SET last_error = ? WHERE id = ?`)
	if err != nil {
		return err
	}
	for _, h := range hits {
		if _, err = record.Exec(nacks[h.entry].Reason, h.seq); err != nil {
			break
		}
		st.matched[h.ref.frame]++
		st.nacked[h.ref] = true
		st.kept[h.ref.frame] = append(st.kept[h.ref.frame], h.seq)
	}
	if err := errors.Join(err, record.Close()); err != nil {
		return err
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
	if _, err := st.tx.Exec(`UPDATE events SET acked = 1 WHERE id IN (SELECT value FROM json_each(?))`, arg); err != nil {
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
	rows, err := st.tx.Query(`DELETE FROM frames WHERE id IN (SELECT value FROM json_each(?)) RETURNING id, n`, arg)
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
	if err := st.tx.QueryRow(`SELECT first_seq, last_seq FROM frames WHERE id = ?`, id).Scan(&first, &last); err != nil {
		return err
	}
	arg, err := json.Marshal(keep)
	if err != nil {
		return err
	}
	res, err := st.tx.Exec(`UPDATE events SET acked = 1 WHERE id BETWEEN ? AND ? AND acked = 0
		AND id NOT IN (SELECT value FROM json_each(?))`, first, last, arg)
	if err != nil {
		return err
	}
	n, err := res.RowsAffected()
	if err != nil || n == 0 {
		return err
	}
	st.events += n
	_, err = takeFromFrame(st.tx, id, int(n))
	return err
}

// takeFromFrame lowers frame id's pending count by n and deletes the frame
// when none is left; it reports whether it did.
func takeFromFrame(tx *sql.Tx, id int64, n int) (bool, error) {
	var left int64
	if err := tx.QueryRow(`UPDATE frames SET n = n - ? WHERE id = ? RETURNING n`, n, id).Scan(&left); err != nil {
		return false, err
	}
	if left > 0 {
		return false, nil
	}
	if _, err := tx.Exec(`DELETE FROM frames WHERE id = ?`, id); err != nil {
		return false, err
	}
	return true, nil
}

// DeadLetterFrame dead-letters every event of pending frame id not yet
// acked, one dead letter per event. Each dead letter's reason is reason,
// followed by the event's last error when a retryable nack recorded one.
// The frame is then cleared. It returns how many events it dead-lettered
// (0 when the frame is no longer pending).
func (q *Queue) DeadLetterFrame(ctx context.Context, id int64, reason string) (int, error) {
	n, err := q.deadLetter(ctx, id, func(int64, string, string) bool { return true }, func(lastErr string) string {
		if lastErr == "" {
			return reason
		}
		return reason + "; last error: " + lastErr
	})
	if err != nil {
		return 0, fmt.Errorf("dead-letter frame %d: %w", id, err)
	}
	return n, nil
}

// DeadLetterEvents dead-letters the pending events of frame id whose seqs
// are given, with reason; the frame is cleared if none is left. It returns
// how many it dead-lettered.
func (q *Queue) DeadLetterEvents(ctx context.Context, id int64, seqs []int64, reason string) (int, error) {
	want := make(map[int64]bool, len(seqs))
	for _, s := range seqs {
		want[s] = true
	}
	n, err := q.deadLetter(ctx, id, func(seq int64, _, _ string) bool { return want[seq] }, func(string) string { return reason })
	if err != nil {
		return 0, fmt.Errorf("dead-letter events of frame %d: %w", id, err)
	}
	return n, nil
}

// deadLetter runs deadLetterWhere in a request of its own.
func (q *Queue) deadLetter(ctx context.Context, id int64, match func(seq int64, source, key string) bool, reason func(lastErr string) string) (int, error) {
	var n int
	var cleared bool
	r := &request{apply: func(tx *sql.Tx) error {
		var err error
		n, cleared, err = deadLetterWhere(tx, id, time.Now(), match, reason)
		return err
	}}
	committed := func() {
		q.pendingEvents.Add(-int64(n))
		if cleared {
			q.pendingFrames.Add(-1)
		}
	}
	if err := q.submit(ctx, r, committed); err != nil {
		return 0, err
	}
	return n, nil
}

// deadLetterWhere moves the pending events of frame id that match into
// the dead-letter list, one entry each: the event is marked dead (and
// acked, so it is never loaded for delivery again) and the frame's count
// drops like on an ack. It reports how many moved and whether the frame
// was cleared.
func deadLetterWhere(tx *sql.Tx, id int64, now time.Time, match func(seq int64, source, key string) bool, reason func(lastErr string) string) (int, bool, error) {
	var first, last int64
	var deliveries int
	err := tx.QueryRow(`SELECT first_seq, last_seq, deliveries FROM frames WHERE id = ?`, id).Scan(&first, &last, &deliveries)
	if errors.Is(err, sql.ErrNoRows) {
		return 0, false, nil
	}
	if err != nil {
		return 0, false, err
	}
	type victim struct {
		seq                       int64
		source, key, lastErr, raw string
	}
	rows, err := tx.Query(`SELECT e.id, e.source, e.key, e.last_error, coalesce(r.key, '') FROM events e LEFT JOIN raw_objects r ON r.id = e.raw_id
		WHERE e.id BETWEEN ? AND ? AND e.acked = 0 ORDER BY e.id`, first, last)
	if err != nil {
		return 0, false, err
	}
	var vs []victim
	for rows.Next() {
		var v victim
		if err := rows.Scan(&v.seq, &v.source, &v.key, &v.lastErr, &v.raw); err != nil {
			return 0, false, errors.Join(err, rows.Close())
		}
		if match(v.seq, v.source, v.key) {
			vs = append(vs, v)
		}
	}
	if err := errors.Join(rows.Err(), rows.Close()); err != nil {
		return 0, false, err
	}
	if len(vs) == 0 {
		return 0, false, nil
	}
	for _, v := range vs {
		why := reason(v.lastErr)
		if _, err := tx.Exec(`UPDATE events SET dead = 1, acked = 1 WHERE id = ?`, v.seq); err != nil {
			return 0, false, err
		}
		if _, err := tx.Exec(insertEventDeadLetter, v.source, why, v.raw, id, now.UnixNano(), v.seq, v.key, deliveries,
			historyLine(now, "dead-lettered", why)); err != nil {
			return 0, false, err
		}
	}
	cleared, err := takeFromFrame(tx, id, len(vs))
	if err != nil {
		return 0, false, err
	}
	return len(vs), cleared, nil
}

// insertEventDeadLetter lists one event as a dead letter: source, reason,
// raw key, frame id, time, seq, key, deliveries and history.
const insertEventDeadLetter = `INSERT INTO dead_letters(source, reason, raw_key, frame_id, created_at, seq, event_key, deliveries, history)
	VALUES (?,?,?,?,?,?,?,?,?)`

// HistoryEntry is one thing that happened to a dead letter.
type HistoryEntry struct {
	At     time.Time `json:"at"`
	Action string    `json:"action"`
	Detail string    `json:"detail,omitempty"`
}

// historyLine is one JSON line of a dead letter's history.
func historyLine(at time.Time, action, detail string) string {
	b, err := json.Marshal(HistoryEntry{At: at.UTC(), Action: action, Detail: detail})
	if err != nil { // a struct of strings and a time always marshals
		panic(err)
	}
	return string(b) + "\n"
}
