package queue

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"time"
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

// Settle applies one burst of acks and nacks in one request. Acks apply
// before nacks, so an event both acked and nacked in a burst counts as
// acked.
func (q *Queue) Settle(ctx context.Context, frames []int64, keys []KeyAck, nacks []NackInput) (Settled, error) {
	var out Settled
	var events int64
	r := &request{apply: func(tx *sql.Tx) error {
		out, events = Settled{}, 0
		now := time.Now()
		for _, id := range frames {
			var n int64
			err := tx.QueryRow(`DELETE FROM frames WHERE id = ? RETURNING n`, id).Scan(&n)
			if errors.Is(err, sql.ErrNoRows) {
				out.Unknown++
				continue
			}
			if err != nil {
				return fmt.Errorf("ack frame %d: %w", id, err)
			}
			out.Cleared = append(out.Cleared, id)
			events += n
		}
		for _, k := range keys {
			res, err := tx.Exec(`UPDATE events SET acked = 1 WHERE source = ? AND key = ? AND frame_id = ? AND acked = 0
				AND EXISTS (SELECT 1 FROM frames WHERE id = ?)`, k.Source, k.Key, k.Frame, k.Frame)
			if err != nil {
				return fmt.Errorf("ack key in frame %d: %w", k.Frame, err)
			}
			if n, err := res.RowsAffected(); err != nil || n == 0 {
				out.Unknown++
				continue
			}
			events++
			cleared, err := takeFromFrame(tx, k.Frame, 1)
			if err != nil {
				return fmt.Errorf("ack key in frame %d: %w", k.Frame, err)
			}
			if cleared {
				out.Cleared = append(out.Cleared, k.Frame)
			}
		}
		for _, nk := range nacks {
			if !nk.Permanent {
				res, err := tx.Exec(`UPDATE events SET last_error = ? WHERE source = ? AND key = ? AND frame_id = ? AND acked = 0
					AND EXISTS (SELECT 1 FROM frames WHERE id = ?)`, nk.Reason, nk.Source, nk.Key, nk.Frame, nk.Frame)
				if err != nil {
					return fmt.Errorf("nack key in frame %d: %w", nk.Frame, err)
				}
				if n, err := res.RowsAffected(); err != nil || n == 0 {
					out.Unknown++
					continue
				}
				out.Retryable++
				continue
			}
			reason := nk.Reason
			if reason == "" {
				reason = "rejected by processor"
			}
			n, cleared, err := deadLetterEvents(tx, nk.Frame, now, func(source, key string) bool {
				return source == nk.Source && key == nk.Key
			}, func(string) string { return reason })
			if err != nil {
				return fmt.Errorf("nack key in frame %d: %w", nk.Frame, err)
			}
			if n == 0 {
				out.Unknown++
				continue
			}
			events += int64(n)
			out.DeadLettered += n
			if cleared {
				out.Cleared = append(out.Cleared, nk.Frame)
			}
		}
		return nil
	}}
	committed := func() {
		q.pendingEvents.Add(-events)
		q.pendingFrames.Add(-int64(len(out.Cleared)))
	}
	if err := q.submit(ctx, r, committed); err != nil {
		return Settled{}, fmt.Errorf("ack: %w", err)
	}
	return out, nil
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
	n, err := q.deadLetter(ctx, id, func(string, string) bool { return true }, func(lastErr string) string {
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
	n, err := q.deadLetterSeqs(ctx, id, want, reason)
	if err != nil {
		return 0, fmt.Errorf("dead-letter events of frame %d: %w", id, err)
	}
	return n, nil
}

func (q *Queue) deadLetterSeqs(ctx context.Context, id int64, want map[int64]bool, reason string) (int, error) {
	var n int
	var cleared bool
	r := &request{apply: func(tx *sql.Tx) error {
		var err error
		n, cleared, err = deadLetterWhere(tx, id, time.Now(), func(seq int64, _, _ string) bool { return want[seq] },
			func(string) string { return reason })
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

func (q *Queue) deadLetter(ctx context.Context, id int64, match func(source, key string) bool, reason func(lastErr string) string) (int, error) {
	var n int
	var cleared bool
	r := &request{apply: func(tx *sql.Tx) error {
		var err error
		n, cleared, err = deadLetterEvents(tx, id, time.Now(), match, reason)
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

func deadLetterEvents(tx *sql.Tx, id int64, now time.Time, match func(source, key string) bool, reason func(lastErr string) string) (int, bool, error) {
	return deadLetterWhere(tx, id, now, func(_ int64, source, key string) bool { return match(source, key) }, reason)
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
		if _, err := tx.Exec(`INSERT INTO dead_letters(source, reason, raw_key, frame_id, created_at, seq, event_key, deliveries, history)
			VALUES (?,?,?,?,?,?,?,?,?)`, v.source, why, v.raw, id, now.UnixNano(), v.seq, v.key, deliveries,
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
