package queue

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"path"
	"strings"
	"time"
)

// DeadLetter is one entry of the dead-letter list: a payload that could
// not be parsed (Key empty; its bytes are the whole raw object RawKey), or
// one event that was nacked permanently, never acked, or lost its raw
// object. The admin endpoints and `ingestor dlq` show it as JSON.
type DeadLetter struct {
	ID     int64  `json:"id"`
	Source string `json:"source"`
	// Kind is "event" or "payload" (a malformed upstream response).
	Kind   string `json:"kind"`
	Reason string `json:"reason"`
	// RawKey is the raw object holding the payload.
	RawKey string `json:"raw_key"`
	// Frame is the frame the event was last delivered in (0 for a payload).
	Frame int64 `json:"frame,omitempty"`
	// Seq and Key identify an event dead letter; both are zero for a payload.
	Seq int64  `json:"seq,omitempty"`
	Key string `json:"key,omitempty"`
	// RawOff and RawLen locate the event in RawKey; RawLen is 0 for a
	// payload dead letter (the whole object) and once the event is gone.
	RawOff int `json:"raw_off,omitempty"`
	RawLen int `json:"raw_len,omitempty"`
	// Deliveries is how many times the event's frame had been delivered.
	Deliveries int `json:"deliveries"`
	// Count is how many times the payload (the same bytes from the same
	// source) failed while the entry was active, 1 for an event; LastSeen
	// is the last time, equal to CreatedAt for one.
	Count     int       `json:"count"`
	LastSeen  time.Time `json:"last_seen"`
	CreatedAt time.Time `json:"created_at"`
	// ReplayedAt is when the entry was replayed, or zero.
	ReplayedAt time.Time `json:"replayed_at,omitzero"`
	// ResolvedAt is when a later fetch of the payload's request succeeded,
	// or zero. An entry is active while both are zero.
	ResolvedAt time.Time `json:"resolved_at,omitzero"`
	// History is set by DeadLetterByID only.
	History []HistoryEntry `json:"history,omitempty"`
	// Payload is the dead-lettered bytes, read from the raw store, and
	// PayloadError why they could not be read (DLQ.Show only).
	Payload      string `json:"payload,omitempty"`
	PayloadError string `json:"payload_error,omitempty"`
}

// IsPayload reports whether d is a malformed payload rather than an event.
func (d DeadLetter) IsPayload() bool { return d.Key == "" }

// DLQFilter selects dead letters. The zero value selects every active one.
type DLQFilter struct {
	// IDs, when set, selects these entries only (other fields still apply).
	IDs []int64
	// Source matches exactly.
	Source string
	// Reason matches a substring of the reason.
	Reason string
	// Since and Until bound the creation time: [Since, Until).
	Since, Until time.Time
	// AfterID pages: only entries with a greater id.
	AfterID int64
	// Limit caps List results; default 100. Replay and drop ignore it.
	Limit int
	// IncludeReplayed also lists inactive entries: replayed and resolved.
	IncludeReplayed bool
}

// IsZero reports whether f selects everything.
func (f DLQFilter) IsZero() bool {
	return len(f.IDs) == 0 && f.Source == "" && f.Reason == "" && f.Since.IsZero() && f.Until.IsZero() && f.AfterID == 0
}

// where is f as an SQL condition on dead_letters columns, each prefixed
// with p (a table alias and a dot, or empty).
func (f DLQFilter) where(p string) (string, []any) {
	conds := []string{"1=1"}
	var args []any
	if !f.IncludeReplayed {
		conds = append(conds, p+"replayed_at = 0", p+"resolved_at = 0")
	}
	if len(f.IDs) > 0 {
		conds = append(conds, p+"id IN ("+strings.TrimSuffix(strings.Repeat("?,", len(f.IDs)), ",")+")")
		for _, id := range f.IDs {
			args = append(args, id)
		}
	}
	if f.Source != "" {
		conds = append(conds, p+"source = ?")
		args = append(args, f.Source)
	}
	if f.Reason != "" {
		conds = append(conds, "instr("+p+"reason, ?) > 0")
		args = append(args, f.Reason)
	}
	if !f.Since.IsZero() {
		conds = append(conds, p+"created_at >= ?")
		args = append(args, f.Since.UnixNano())
	}
	if !f.Until.IsZero() {
		conds = append(conds, p+"created_at < ?")
		args = append(args, f.Until.UnixNano())
	}
	if f.AfterID > 0 {
		conds = append(conds, p+"id > ?")
		args = append(args, f.AfterID)
	}
	return strings.Join(conds, " AND "), args
}

const dlCols = `d.id, d.source, d.reason, d.raw_key, d.frame_id, d.seq, d.event_key, d.deliveries, d.count, d.last_seen, d.created_at, d.replayed_at, d.resolved_at, d.history,
	coalesce(e.raw_off, 0), coalesce(e.raw_len, 0)`

// dlFrom joins the event still held for an active event dead letter.
const dlFrom = `dead_letters d LEFT JOIN event_marks e ON d.event_key != '' AND e.seq = d.seq AND e.dead = 1`

type scanner interface{ Scan(...any) error }

func scanDeadLetter(s scanner, withHistory bool) (DeadLetter, error) {
	var d DeadLetter
	var at, lastSeen, replayed, resolved int64
	var history string
	if err := s.Scan(&d.ID, &d.Source, &d.Reason, &d.RawKey, &d.Frame, &d.Seq, &d.Key, &d.Deliveries, &d.Count, &lastSeen, &at, &replayed, &resolved, &history,
		&d.RawOff, &d.RawLen); err != nil {
		return d, err
	}
	d.Kind = "event"
	if d.IsPayload() {
		d.Kind = "payload"
	}
	d.CreatedAt = time.Unix(0, at).UTC()
	d.LastSeen = d.CreatedAt
	if lastSeen != 0 {
		d.LastSeen = time.Unix(0, lastSeen).UTC()
	}
	if replayed != 0 {
		d.ReplayedAt = time.Unix(0, replayed).UTC()
	}
	if resolved != 0 {
		d.ResolvedAt = time.Unix(0, resolved).UTC()
	}
	if withHistory {
		for _, line := range strings.Split(strings.TrimSpace(history), "\n") {
			if line == "" {
				continue
			}
			var h HistoryEntry
			if err := json.Unmarshal([]byte(line), &h); err != nil {
				return d, fmt.Errorf("history of dead letter %d: %w", d.ID, err)
			}
			d.History = append(d.History, h)
		}
	}
	return d, nil
}

// ListDeadLetters lists the dead letters f selects, oldest first. Replayed
// and resolved ones are left out unless f.IncludeReplayed.
func (q *Queue) ListDeadLetters(ctx context.Context, f DLQFilter) ([]DeadLetter, error) {
	if f.Limit <= 0 {
		f.Limit = 100
	}
	where, args := f.where("d.")
	rows, err := q.rdb.QueryContext(ctx, `SELECT `+dlCols+` FROM `+dlFrom+` WHERE `+where+` ORDER BY d.id LIMIT ?`, append(args, f.Limit)...)
	if err != nil {
		return nil, fmt.Errorf("list dead letters: %w", err)
	}
	var out []DeadLetter
	for rows.Next() {
		d, err := scanDeadLetter(rows, false)
		if err != nil {
			return nil, fmt.Errorf("list dead letters: %w", errors.Join(err, rows.Close()))
		}
		out = append(out, d)
	}
	if err := errors.Join(rows.Err(), rows.Close()); err != nil {
		return nil, fmt.Errorf("list dead letters: %w", err)
	}
	return out, nil
}

// CountDeadLetters returns how many dead letters f selects, ignoring
// f.Limit and f.AfterID: the total a page of ListDeadLetters is part of.
func (q *Queue) CountDeadLetters(ctx context.Context, f DLQFilter) (int, error) {
	f.AfterID = 0
	where, args := f.where("d.")
	var n int
	if err := q.rdb.QueryRowContext(ctx, `SELECT count(*) FROM dead_letters d WHERE `+where, args...).Scan(&n); err != nil {
		return 0, fmt.Errorf("count dead letters: %w", err)
	}
	return n, nil
}

// DeadLetters lists active dead letters, oldest first, up to limit.
func (q *Queue) DeadLetters(ctx context.Context, limit int) ([]DeadLetter, error) {
	return q.ListDeadLetters(ctx, DLQFilter{Limit: limit})
}

// ErrNoDeadLetter is returned for an unknown dead-letter id.
var ErrNoDeadLetter = errors.New("no such dead letter")

// DeadLetterByID returns one dead letter, active or not, with its history.
func (q *Queue) DeadLetterByID(ctx context.Context, id int64) (DeadLetter, error) {
	d, err := scanDeadLetter(q.rdb.QueryRowContext(ctx, `SELECT `+dlCols+` FROM `+dlFrom+` WHERE d.id = ?`, id), true)
	if errors.Is(err, sql.ErrNoRows) {
		return DeadLetter{}, fmt.Errorf("dead letter %d: %w", id, ErrNoDeadLetter)
	}
	if err != nil {
		return DeadLetter{}, fmt.Errorf("dead letter %d: %w", id, err)
	}
	return d, nil
}

// ErrPayloadDeadLetter is returned when replay names a malformed-payload
// dead letter: its bytes must be parsed again, which the queue cannot do.
var ErrPayloadDeadLetter = errors.New("malformed payloads are re-parsed with `ingestor replay -include-deadletters`, not replayed from the dead-letter list")

type activeDL struct {
	id, seq     int64
	source, key string
	raw         string
}

// selectActive reads the active dead letters f selects, in id order.
func selectActive(tx *sql.Tx, f DLQFilter) ([]activeDL, error) {
	f.IncludeReplayed = false
	where, args := f.where("")
	rows, err := tx.Query(`SELECT id, seq, source, event_key, raw_key FROM dead_letters WHERE `+where+` ORDER BY id`, args...)
	if err != nil {
		return nil, err
	}
	var out []activeDL
	for rows.Next() {
		var a activeDL
		if err := rows.Scan(&a.id, &a.seq, &a.source, &a.key, &a.raw); err != nil {
			return nil, errors.Join(err, rows.Close())
		}
		out = append(out, a)
	}
	return out, errors.Join(rows.Err(), rows.Close())
}

// DropDeadLetters deletes the active dead letters f selects: the operator
// gives up on them. Their events become ordinary remembered events, pruned
// after the dedupe window. It returns how many it dropped.
func (q *Queue) DropDeadLetters(ctx context.Context, f DLQFilter) (int, error) {
	var n int
	r := &request{apply: func(tx *sql.Tx) error {
		n = 0
		sel, err := selectActive(tx, f)
		if err != nil {
			return err
		}
		for _, a := range sel {
			if a.key != "" {
				if _, err := tx.Exec(`UPDATE event_marks SET dead = 0 WHERE seq = ? AND dead = 1`, a.seq); err != nil {
					return err
				}
			}
			if _, err := tx.Exec(`DELETE FROM dead_letters WHERE id = ?`, a.id); err != nil {
				return err
			}
			n++
		}
		return nil
	}}
	if err := q.submit(ctx, r, nil); err != nil {
		return 0, fmt.Errorf("drop dead letters: %w", err)
	}
	return n, nil
}

// ExpireDeadLetters deletes the dead letters that stopped being active
// (replayed, or resolved by a later fetch) before before: their history
// has been readable long enough, and with them goes the last reference to
// their raw objects, which raw retention then deletes. Active ones stay
// until they are replayed or dropped. It returns how many it deleted.
func (q *Queue) ExpireDeadLetters(ctx context.Context, before time.Time) (int64, error) {
	var n int64
	r := &request{apply: func(tx *sql.Tx) error {
		res, err := tx.Exec(`DELETE FROM dead_letters WHERE (replayed_at != 0 AND replayed_at < ?1) OR (resolved_at != 0 AND resolved_at < ?1)`,
			before.UnixNano())
		if err != nil {
			return err
		}
		n, err = res.RowsAffected()
		return err
	}}
	if err := q.submit(ctx, r, nil); err != nil {
		return 0, fmt.Errorf("expire dead letters: %w", err)
	}
	return n, nil
}

// DLQRequest selects the dead letters to replay or drop: IDs, a filter, or
// All. An empty request is refused, so that a slip never selects
// everything.
type DLQRequest struct {
	IDs    []int64   `json:"ids,omitempty"`
	Source string    `json:"source,omitempty"`
	Reason string    `json:"reason,omitempty"`
	Since  time.Time `json:"since,omitzero"`
	Until  time.Time `json:"until,omitzero"`
	All    bool      `json:"all,omitempty"`
}

// ErrEmptyDLQRequest is returned for a request naming no ids, no filter
// and not All.
var ErrEmptyDLQRequest = errors.New("name dead-letter ids, a filter (source, reason, since, until) or all")

// filter returns the DLQFilter r selects, refusing an empty request.
func (r DLQRequest) filter() (DLQFilter, error) {
	f := DLQFilter{IDs: r.IDs, Source: r.Source, Reason: r.Reason, Since: r.Since, Until: r.Until}
	if f.IsZero() && !r.All {
		return f, ErrEmptyDLQRequest
	}
	return f, nil
}

// RawReader reads raw objects by key from the raw store that dead letters
// point into; rawstore.Store is one.
type RawReader interface {
	Get(ctx context.Context, key string) ([]byte, error)
}

// DLQ operates on a queue's dead-letter list. The daemon serves it on its
// admin endpoints; `ingestor dlq` uses it directly when no daemon runs.
type DLQ struct {
	q   *Queue
	raw RawReader
	// submit hands replayed frames to a running sender; nil when none runs
	// (the frames are then delivered by the next daemon start).
	submit func([]Frame)
}

// NewDLQ returns a DLQ over q whose payloads are read from raw. submit,
// when not nil, receives the frames of replayed events.
func NewDLQ(q *Queue, raw RawReader, submit func([]Frame)) *DLQ {
	return &DLQ{q: q, raw: raw, submit: submit}
}

// List returns the dead letters f selects, up to f.Limit, and how many
// it selects in all (whatever f.Limit and f.AfterID).
func (d *DLQ) List(ctx context.Context, f DLQFilter) ([]DeadLetter, int, error) {
	dls, err := d.q.ListDeadLetters(ctx, f)
	if err != nil {
		return nil, 0, err
	}
	total, err := d.q.CountDeadLetters(ctx, f)
	if err != nil {
		return nil, 0, err
	}
	return dls, total, nil
}

// Show returns one dead letter with its history and payload.
func (d *DLQ) Show(ctx context.Context, id int64) (DeadLetter, error) {
	dl, err := d.q.DeadLetterByID(ctx, id)
	if err != nil {
		return DeadLetter{}, err
	}
	e := dl
	body, err := d.raw.Get(ctx, dl.RawKey)
	switch {
	case err != nil:
		e.PayloadError = fmt.Sprintf("read raw object %s: %v", dl.RawKey, err)
	case dl.IsPayload():
		e.Payload = string(body)
	case dl.RawLen == 0:
		e.PayloadError = "the event is no longer held (replayed); see raw_key"
	case dl.RawOff < 0 || dl.RawOff+dl.RawLen > len(body):
		e.PayloadError = fmt.Sprintf("raw object %s: range [%d,+%d) outside %d bytes", dl.RawKey, dl.RawOff, dl.RawLen, len(body))
	default:
		e.Payload = string(body[dl.RawOff : dl.RawOff+dl.RawLen])
	}
	return e, nil
}

// Replay queues the events of the selected dead letters again and returns
// how many.
func (d *DLQ) Replay(ctx context.Context, r DLQRequest) (int, error) {
	f, err := r.filter()
	if err != nil {
		return 0, err
	}
	n, frames, err := d.q.ReplayDeadLetters(ctx, f)
	if err != nil {
		return 0, err
	}
	if d.submit != nil {
		d.submit(frames)
	}
	return n, nil
}

// Drop deletes the selected dead letters and returns how many.
func (d *DLQ) Drop(ctx context.Context, r DLQRequest) (int, error) {
	f, err := r.filter()
	if err != nil {
		return 0, err
	}
	return d.q.DropDeadLetters(ctx, f)
}

// DeadLetter records a payload that could not be queued (for example a
// malformed upstream response), whose bytes are in the raw store at rawKey.
// cursor is the source's cursor the payload was fetched with, so that a
// later good fetch of it can resolve the entry (see ResolveDeadLetters);
// "" if unknown. The same bytes from the same source again, while their
// entry is active, count on it (count, last seen, the latest reason and
// request) instead of adding one: an upstream that serves the same bad
// page at every poll makes one entry, not one a poll. The bytes are known
// by the content hash their raw key ends with (rawstore.Key).
func (q *Queue) DeadLetter(ctx context.Context, source, reason, rawKey, cursor string) error {
	digest := payloadDigest(rawKey)
	r := &request{apply: func(tx *sql.Tx) error {
		now := time.Now()
		if digest != "" {
			res, err := tx.Exec(`UPDATE dead_letters SET count = count + 1, last_seen = ?, reason = ?, request = ?
				WHERE source = ? AND digest = ? AND event_key = '' AND resolved_at = 0 AND replayed_at = 0`,
				now.UnixNano(), reason, cursor, source, digest)
			if err != nil {
				return err
			}
			if n, err := res.RowsAffected(); err != nil || n > 0 {
				return err
			}
		}
		_, err := tx.Exec(`INSERT INTO dead_letters(source, reason, raw_key, request, created_at, history, digest) VALUES (?,?,?,?,?,?,?)`,
			source, reason, rawKey, cursor, now.UnixNano(), historyLine(now, "dead-lettered", reason), digest)
		return err
	}}
	if err := q.submit(ctx, r, nil); err != nil {
		return fmt.Errorf("dead-letter payload of %q: %w", source, err)
	}
	return nil
}

// payloadDigest returns the content hash a raw key names
// (".../<unix-nanos>-<hex>.json", rawstore.Key), or "" for a key of
// another shape.
func payloadDigest(rawKey string) string {
	base := path.Base(rawKey)
	name, ok := strings.CutSuffix(base, ".json")
	if !ok {
		return ""
	}
	_, digest, ok := strings.Cut(name, "-")
	if !ok || digest == "" {
		return ""
	}
	return digest
}

// ResolveDeadLetters marks the active payload dead letters of source that
// were fetched with cursor resolved: a later fetch with the same cursor
// succeeded, so the payload was a transient fault. They leave the default
// list and stay readable by id, with a "resolved" history entry. It
// returns how many it resolved.
func (q *Queue) ResolveDeadLetters(ctx context.Context, source, cursor string) (int, error) {
	var n int
	r := &request{apply: func(tx *sql.Tx) error {
		now := time.Now()
		res, err := tx.Exec(`UPDATE dead_letters SET resolved_at = ?, history = history || ?
			WHERE source = ? AND request = ? AND event_key = '' AND resolved_at = 0 AND replayed_at = 0`,
			now.UnixNano(), historyLine(now, "resolved", "a later fetch of the same request succeeded"), source, cursor)
		if err != nil {
			return err
		}
		rows, err := res.RowsAffected()
		n = int(rows)
		return err
	}}
	if err := q.submit(ctx, r, nil); err != nil {
		return 0, fmt.Errorf("resolve dead letters of %q: %w", source, err)
	}
	return n, nil
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
	var st *settler
	r := &request{apply: func(tx *sql.Tx) error {
		st = q.newSettler(tx)
		return st.deadLetterWhere(id, match, reason)
	}}
	if err := q.submit(ctx, r, func() { q.settled(st) }); err != nil {
		return 0, err
	}
	return st.out.DeadLettered, nil
}

// deadLetterWhere dead-letters the pending events of frame id that match,
// one dead letter each, as a permanent nack does, and lowers the frame's
// count as an ack does.
func (st *settler) deadLetterWhere(id int64, match func(seq int64, source, key string) bool, reason func(lastErr string) string) error {
	var first, last int64
	err := st.tx.Stmt(st.stmts.frameSpan).QueryRow(id).Scan(&first, &last)
	if errors.Is(err, sql.ErrNoRows) {
		return nil
	}
	if err != nil {
		return err
	}
	type victim struct {
		seq     int64
		ref     eventRef
		lastErr string
	}
	var vs []victim
	err = pendingIn(context.Background(), st.tx, first, last, func(r *logRow, e logEvent, m eventMark) {
		if match(e.seq, r.source, e.key) {
			vs = append(vs, victim{seq: e.seq, ref: eventRef{frame: id, source: r.source, key: e.key}, lastErr: m.lastError})
		}
	})
	if err != nil {
		return err
	}
	if len(vs) == 0 {
		return nil
	}
	bury := st.burier()
	for _, v := range vs {
		if err := bury(v.seq, v.ref, reason(v.lastErr)); err != nil {
			return err
		}
	}
	st.out.DeadLettered += len(vs)
	return st.take(map[int64]int{id: len(vs)})
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
