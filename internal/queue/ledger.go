package queue

// The ledger in generations (docs/ledger-design.md, the layout it calls V5-bound).
//
// An event's dedupe key is a row of one of two WITHOUT ROWID tables,
// ledger_0 and ledger_1: (source, key) -> seq, attempts, last seen. New
// keys go into the current generation, checked against the other one. The
// frame's fields (raw object, offsets, event times, keys) are one
// frame_log row per frame, its events packed in a blob; per-event state is
// written only for the exceptions, as event_marks rows (a key ack, a
// nack's last error, a dead letter with its raw reference).
//
// Forgetting is a generation switch, not row-by-row deletes: once the
// current generation began more than a dedupe window ago, every key of
// the other one is older than the window, so the other one is emptied
// whole (DELETE without WHERE: SQLite frees its pages without visiting
// rows), with its frame_log rows and marks, and becomes the current one.
// A key is remembered between one and two windows. The switch waits while
// a pending frame holds events of the generation it would empty, and the
// keys of events in active dead letters are copied into the current
// generation first, so neither loses its key.
//
// Seqs are given by the writer from its high mark (q.highSeq), loaded at
// open from meta's seq_high and the newest frame_log row and mark; the
// switch raises seq_high in its transaction, so a seq is never given
// twice, even once every row that held it is gone.

import (
	"context"
	"database/sql"
	"encoding/binary"
	"errors"
	"fmt"
	"time"
)

// ledgerTables are the two generations' tables, by generation.
var ledgerTables = [2]string{"ledger_0", "ledger_1"}

// generations is the writer's view of the ledger's generations: which
// one takes new keys, since when and from which seq, and the highest key
// of each source in the other one (the bound above which a new key need
// not be looked up there: the other generation takes no new keys).
type generations struct {
	cur   int   // the current generation, 0 or 1
	seq   int64 // the first seq given while cur is current
	since int64 // unix nanoseconds cur became current
	// bound holds, by source, the other generation's highest key; a
	// missing entry is not loaded yet, a NULL one means no key.
	bound map[string]sql.NullString
}

// querier is what *sql.DB and *sql.Tx have in common.
type querier interface {
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
}

// loadGenerations reads the generation state from meta.
func loadGenerations(ctx context.Context, db querier) (generations, error) {
	g := generations{bound: map[string]sql.NullString{}}
	var cur int64
	for _, m := range []struct {
		key string
		dst *int64
	}{{"gen_cur", &cur}, {"gen_seq", &g.seq}, {"gen_since", &g.since}} {
		if err := db.QueryRowContext(ctx, `SELECT value FROM meta WHERE key = ?`, m.key).Scan(m.dst); err != nil {
			return g, fmt.Errorf("load ledger generation (%s): %w", m.key, err)
		}
	}
	g.cur = int(cur & 1)
	return g, nil
}

// otherBound returns the other generation's highest key of source, loading
// it once per source and switch.
func (q *Queue) otherBound(tx *sql.Tx, source string) (sql.NullString, error) {
	if b, ok := q.gens.bound[source]; ok {
		return b, nil
	}
	var b sql.NullString
	err := tx.QueryRow(`SELECT key FROM `+ledgerTables[1-q.gens.cur]+` WHERE source = ? ORDER BY key DESC LIMIT 1`, source).Scan(&b)
	if err != nil && !errors.Is(err, sql.ErrNoRows) {
		return b, fmt.Errorf("read the ledger's bound for %q: %w", source, err)
	}
	q.gens.bound[source] = b
	return b, nil
}

// logEvent is one event of a frame_log row.
type logEvent struct {
	seq, eventTime int64
	rawOff, rawLen int
	key            string
}

// appendLogEvent appends e, of a frame_log row starting at seq first, to
// b: its seq offset, event time, raw offset, raw length and key, as
// varints and the key's bytes.
func appendLogEvent(b []byte, first int64, e logEvent) []byte {
	b = binary.AppendUvarint(b, uint64(e.seq-first))
	b = binary.AppendVarint(b, e.eventTime)
	b = binary.AppendUvarint(b, uint64(e.rawOff))
	b = binary.AppendUvarint(b, uint64(e.rawLen))
	b = binary.AppendUvarint(b, uint64(len(e.key)))
	return append(b, e.key...)
}

// errBadLog reports a frame_log blob that does not decode.
var errBadLog = errors.New("damaged frame_log row")

// decodeLog decodes the events of a frame_log row starting at seq first.
func decodeLog(first int64, b []byte) ([]logEvent, error) {
	var out []logEvent
	for len(b) > 0 {
		var v [5]uint64
		var et int64
		for i := range v {
			var n int
			if i == 1 {
				et, n = binary.Varint(b)
			} else {
				v[i], n = binary.Uvarint(b)
			}
			if n <= 0 {
				return nil, fmt.Errorf("%w at seq %d", errBadLog, first)
			}
			b = b[n:]
		}
		if v[4] > uint64(len(b)) {
			return nil, fmt.Errorf("%w at seq %d", errBadLog, first)
		}
		out = append(out, logEvent{seq: first + int64(v[0]), eventTime: et, rawOff: int(v[2]), rawLen: int(v[3]), key: string(b[:v[4]])})
		b = b[v[4]:]
	}
	return out, nil
}

// logRow is a frame_log row with its raw object.
type logRow struct {
	frame          int64
	source         string
	rawID          int64
	rawKey         string
	fetched        int64
	parent, state  string // the raw object's trace context
	events         []logEvent
	first, lastSeq int64
}

// readLog returns the frame_log rows whose first seq is in [first, last],
// with their raw objects, in seq order: the events of a frame with that
// seq range.
func readLog(ctx context.Context, db querier, first, last int64) ([]logRow, error) {
	rows, err := db.QueryContext(ctx, `SELECT l.first_seq, l.last_seq, l.frame_id, l.source, l.raw_id, l.events,
		coalesce(r.key, ''), coalesce(r.fetched_at, 0), coalesce(r.traceparent, ''), coalesce(r.tracestate, '')
		FROM frame_log l LEFT JOIN raw_objects r ON r.id = l.raw_id WHERE l.first_seq BETWEEN ? AND ? ORDER BY l.first_seq`, first, last)
	if err != nil {
		return nil, err
	}
	var out []logRow
	for rows.Next() {
		var r logRow
		var blob []byte
		if err := rows.Scan(&r.first, &r.lastSeq, &r.frame, &r.source, &r.rawID, &blob, &r.rawKey, &r.fetched, &r.parent, &r.state); err != nil {
			return nil, errors.Join(err, rows.Close())
		}
		if r.events, err = decodeLog(r.first, blob); err != nil {
			return nil, errors.Join(err, rows.Close())
		}
		out = append(out, r)
	}
	return out, errors.Join(rows.Err(), rows.Close())
}

// eventMark is an event_marks row.
type eventMark struct {
	acked, dead bool
	lastError   string
}

// readMarks returns the marks of the seqs in [first, last].
func readMarks(ctx context.Context, db querier, first, last int64) (map[int64]eventMark, error) {
	rows, err := db.QueryContext(ctx, `SELECT seq, acked, dead, last_error FROM event_marks WHERE seq BETWEEN ? AND ?`, first, last)
	if err != nil {
		return nil, err
	}
	out := map[int64]eventMark{}
	for rows.Next() {
		var seq int64
		var m eventMark
		if err := rows.Scan(&seq, &m.acked, &m.dead, &m.lastError); err != nil {
			return nil, errors.Join(err, rows.Close())
		}
		out[seq] = m
	}
	return out, errors.Join(rows.Err(), rows.Close())
}

// pendingIn calls fn for every event of the frame_log rows in [first,
// last] not acked (by a key ack, a partial frame ack or a dead letter).
func pendingIn(ctx context.Context, db querier, first, last int64, fn func(r *logRow, e logEvent, m eventMark)) error {
	log, err := readLog(ctx, db, first, last)
	if err != nil {
		return err
	}
	marks, err := readMarks(ctx, db, first, last)
	if err != nil {
		return err
	}
	for i := range log {
		for _, e := range log[i].events {
			if e.seq > last {
				break
			}
			if m := marks[e.seq]; !m.acked {
				fn(&log[i], e, m)
			}
		}
	}
	return nil
}

// keyRow is an event's row in the ledger.
type keyRow struct {
	gen                int
	seq                int64
	attempts, lastSeen int64
}

// lookupKey finds the ledger row of (source, key) in either generation.
func lookupKey(ctx context.Context, db querier, source, key string) (keyRow, bool, error) {
	var k keyRow
	err := db.QueryRowContext(ctx, `SELECT 0, seq, attempts, last_seen FROM ledger_0 WHERE source = ?1 AND key = ?2
		UNION ALL SELECT 1, seq, attempts, last_seen FROM ledger_1 WHERE source = ?1 AND key = ?2`, source, key).Scan(&k.gen, &k.seq, &k.attempts, &k.lastSeen)
	if errors.Is(err, sql.ErrNoRows) {
		return k, false, nil
	}
	return k, err == nil, err
}

// logEventAt returns the frame_log row holding seq and the event, ok false
// when no row holds it.
func logEventAt(ctx context.Context, db querier, seq int64) (logRow, logEvent, bool, error) {
	var first sql.NullInt64
	if err := db.QueryRowContext(ctx, `SELECT max(first_seq) FROM frame_log WHERE first_seq <= ?`, seq).Scan(&first); err != nil || !first.Valid {
		return logRow{}, logEvent{}, false, err
	}
	rows, err := readLog(ctx, db, first.Int64, first.Int64)
	if err != nil || len(rows) == 0 {
		return logRow{}, logEvent{}, false, err
	}
	for _, e := range rows[0].events {
		if e.seq == seq {
			return rows[0], e, true, nil
		}
	}
	return logRow{}, logEvent{}, false, nil
}

// switchGeneration empties the other generation and makes it the current
// one when the current one began more than a dedupe window ago and no
// pending frame holds an event older than it. It returns how many keys
// it forgot. Run by Prune in the writer's transaction; the writer's state
// changes with it (and is read again if the transaction fails: see Prune).
func (q *Queue) switchGeneration(tx *sql.Tx, now time.Time) (int64, error) {
	if now.UnixNano()-q.gens.since < q.opts.DedupeWindow.Nanoseconds() {
		return 0, nil
	}
	var oldest sql.NullInt64
	if err := tx.QueryRow(`SELECT min(first_seq) FROM frames`).Scan(&oldest); err != nil {
		return 0, err
	}
	if oldest.Valid && oldest.Int64 < q.gens.seq {
		return 0, nil // a pending frame still holds events of the other generation
	}
	cur, old := ledgerTables[q.gens.cur], ledgerTables[1-q.gens.cur]
	// The keys of events in active dead letters stay: their entries can be
	// replayed, and a re-fetch of them is still a duplicate.
	res, err := tx.Exec(`INSERT INTO ` + cur + `(source, key, seq, attempts, last_seen)
		SELECT l.source, l.key, l.seq, l.attempts, l.last_seen FROM dead_letters d CROSS JOIN ` + old + ` l ON l.source = d.source AND l.key = d.event_key
		WHERE d.replayed_at = 0 AND d.event_key != '' ON CONFLICT(source, key) DO NOTHING`)
	if err != nil {
		return 0, fmt.Errorf("keep the keys of dead letters: %w", err)
	}
	kept, err := res.RowsAffected()
	if err != nil {
		return 0, err
	}
	if res, err = tx.Exec(`DELETE FROM ` + old); err != nil {
		return 0, fmt.Errorf("empty %s: %w", old, err)
	}
	deleted, err := res.RowsAffected()
	if err != nil {
		return 0, err
	}
	forgotten := deleted - kept
	for _, stmt := range []string{
		`DELETE FROM frame_log WHERE first_seq < ?1`,
		`DELETE FROM event_marks WHERE seq < ?1 AND dead = 0`,
		`UPDATE meta SET value = max(value, ?2) WHERE key = 'seq_high'`,
		`UPDATE meta SET value = max(value, ?3) WHERE key = 'frame_high'`,
		`UPDATE meta SET value = ?4 WHERE key = 'gen_cur'`,
		`UPDATE meta SET value = ?2 + 1 WHERE key = 'gen_seq'`,
		`UPDATE meta SET value = ?5 WHERE key = 'gen_since'`,
	} {
		if _, err := tx.Exec(stmt, q.gens.seq, q.highSeq, q.nextFrame-1, 1-q.gens.cur, now.UnixNano()); err != nil {
			return 0, fmt.Errorf("switch ledger generation: %w", err)
		}
	}
	q.gens = generations{cur: 1 - q.gens.cur, seq: q.highSeq + 1, since: now.UnixNano(), bound: map[string]sql.NullString{}}
	return forgotten, nil
}

// pruneRetained deletes the raw-object rows, trace contexts and verdicts
// that no frame_log row and no dead event needs any more: everything below
// the oldest frame_log row (raw objects are committed in seq order) but
// the dead events' own rows. A dead letter left for weeks so keeps its
// rows only, not every newer one.
func pruneRetained(tx *sql.Tx) error {
	for _, stmt := range []string{
		`DELETE FROM raw_objects WHERE id < coalesce((SELECT raw_id FROM frame_log ORDER BY first_seq LIMIT 1), (SELECT max(id) + 1 FROM raw_objects))
			AND id NOT IN (SELECT raw_id FROM event_marks WHERE dead = 1)`,
		`DELETE FROM event_traces WHERE seq < coalesce((SELECT first_seq FROM frame_log ORDER BY first_seq LIMIT 1), (SELECT max(seq) + 1 FROM event_traces))
			AND seq NOT IN (SELECT seq FROM event_marks WHERE dead = 1)`,
		`DELETE FROM event_verdicts WHERE seq < coalesce((SELECT first_seq FROM frame_log ORDER BY first_seq LIMIT 1), (SELECT max(seq) + 1 FROM event_verdicts))
			AND seq NOT IN (SELECT seq FROM event_marks WHERE dead = 1)`,
	} {
		if _, err := tx.Exec(stmt); err != nil {
			return fmt.Errorf("prune: %w", err)
		}
	}
	return nil
}

// migrateLedger is the Go step of migration v10: it copies the events
// table into the generations (every key into ledger_0, which is current
// from now on), frame_log (one row per run of events sharing a frame and
// a raw object) and event_marks (key-acked events of pending frames,
// nacked and dead events), then replaces the table with a read-only view
// of the same name for ops' queries.
func migrateLedger(tx *sql.Tx) error {
	for _, stmt := range []string{
		`INSERT INTO ledger_0(source, key, seq, attempts, last_seen) SELECT source, key, id, attempts, last_seen FROM events ORDER BY source, key`,
		`INSERT INTO event_marks(seq, acked, dead, last_error, raw_id, raw_off, raw_len, event_time)
			SELECT id, acked, dead, last_error, raw_id, raw_off, raw_len, event_time FROM events
			WHERE dead = 1 OR last_error != '' OR (acked = 1 AND frame_id IN (SELECT id FROM frames))`,
	} {
		if _, err := tx.Exec(stmt); err != nil {
			return fmt.Errorf("copy the ledger: %w", err)
		}
	}
	if err := migrateFrameLog(tx); err != nil {
		return err
	}
	for _, stmt := range []string{
		`UPDATE meta SET value = ` + fmt.Sprint(time.Now().UnixNano()) + ` WHERE key = 'gen_since'`,
		`DELETE FROM sqlite_sequence WHERE name = 'events'`,
		`DROP TABLE events`,
		`CREATE VIEW events(id, source, key) AS SELECT seq, source, key FROM ledger_0 UNION ALL SELECT seq, source, key FROM ledger_1`,
	} {
		if _, err := tx.Exec(stmt); err != nil {
			return fmt.Errorf("replace the events table: %w", err)
		}
	}
	return nil
}

// migrateFrameLog packs the events table into frame_log rows, reading it
// in pages of migratePage rows.
func migrateFrameLog(tx *sql.Tx) error {
	const migratePage = 10000
	type run struct {
		first, last, frame, raw int64
		source                  string
		blob                    []byte
	}
	var cur *run
	flush := func() error {
		if cur == nil {
			return nil
		}
		_, err := tx.Exec(`INSERT INTO frame_log(first_seq, last_seq, frame_id, source, raw_id, events) VALUES (?,?,?,?,?,?)`,
			cur.first, cur.last, cur.frame, cur.source, cur.raw, cur.blob)
		cur = nil
		return err
	}
	var after int64
	for {
		rows, err := tx.Query(`SELECT id, source, key, frame_id, event_time, raw_id, raw_off, raw_len FROM events WHERE id > ? ORDER BY id LIMIT ?`, after, migratePage)
		if err != nil {
			return fmt.Errorf("copy frame_log: %w", err)
		}
		type row struct {
			e            logEvent
			source       string
			frame, rawID int64
		}
		var page []row
		for rows.Next() {
			var r row
			if err := rows.Scan(&r.e.seq, &r.source, &r.e.key, &r.frame, &r.e.eventTime, &r.rawID, &r.e.rawOff, &r.e.rawLen); err != nil {
				return errors.Join(err, rows.Close())
			}
			page = append(page, r)
		}
		if err := errors.Join(rows.Err(), rows.Close()); err != nil {
			return fmt.Errorf("copy frame_log: %w", err)
		}
		for _, r := range page {
			if cur != nil && (cur.frame != r.frame || cur.raw != r.rawID || cur.source != r.source) {
				if err := flush(); err != nil {
					return fmt.Errorf("copy frame_log: %w", err)
				}
			}
			if cur == nil {
				cur = &run{first: r.e.seq, frame: r.frame, raw: r.rawID, source: r.source}
			}
			cur.last = r.e.seq
			cur.blob = appendLogEvent(cur.blob, cur.first, r.e)
			after = r.e.seq
		}
		if len(page) < migratePage {
			break
		}
	}
	if err := flush(); err != nil {
		return fmt.Errorf("copy frame_log: %w", err)
	}
	return nil
}
