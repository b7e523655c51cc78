package queue

// V3 of the ledger study (ledger_study_test.go): the dedupe key is a
// WITHOUT ROWID table (source_id, key) -> seq, and each frame's events are
// ONE frame_log row, their keys (the JSON array the insert already binds)
// and a packed blob of their numbers. Per-event state exists only for the
// exceptions: event_marks rows for key acks, nacks and dead letters.

import (
	"database/sql"
	"encoding/binary"
	"errors"
	"fmt"
	"math"

	"github.com/ingestorhq/ingestor/internal/wire"
)

// frameLogSchema is V3's migration on top of today's schema. A shipped
// one would also move today's rows: ledger rows from events, frame_log
// rows built per frame_id in Go (the blob), then DROP TABLE events.
const frameLogSchema = `
CREATE TABLE sources (id INTEGER PRIMARY KEY, name TEXT NOT NULL UNIQUE);
CREATE TABLE ledger (
	source_id INTEGER NOT NULL,
	key       TEXT    NOT NULL,
	seq       INTEGER NOT NULL,
	attempts  INTEGER NOT NULL DEFAULT 1,
	last_seen INTEGER NOT NULL DEFAULT 0,
	PRIMARY KEY (source_id, key)
) WITHOUT ROWID;
CREATE TABLE frame_log (
	id         INTEGER PRIMARY KEY, -- the frame's id
	source_id  INTEGER NOT NULL,
	raw_id     INTEGER NOT NULL,
	first_seq  INTEGER NOT NULL,
	last_seq   INTEGER NOT NULL,
	created_at INTEGER NOT NULL,
	keys       TEXT    NOT NULL, -- JSON array of the new events' keys
	-- per event, 20 bytes little-endian: seq - first_seq (u32),
	-- event_time (i64), raw_off (u32), raw_len (u32)
	events     BLOB    NOT NULL
);
CREATE TABLE event_marks (
	seq        INTEGER PRIMARY KEY,
	acked      INTEGER NOT NULL DEFAULT 0,
	dead       INTEGER NOT NULL DEFAULT 0,
	last_error TEXT    NOT NULL DEFAULT ''
);
INSERT INTO meta(key, value) VALUES ('seq_high', coalesce((SELECT seq FROM sqlite_sequence WHERE name = 'events'), 0));
DROP TABLE events;
`

// frameLogEvent is the size of one event in frame_log.events.
const frameLogEvent = 20

type frameLog struct {
	sourceID                                                      int64
	insertKeys, insertLog, insertRaw, insertFrameRow, storeCursor *sql.Stmt
	ackFrames, forgetKeys                                         *sql.Stmt
	nextFrame, highSeq                                            int64
	keysBuf, eventsBuf                                            []byte
	above                                                         *string // see genLog.bound
}

func openFrameLog(db *sql.DB) (studyLedger, error) {
	if _, err := db.Exec(frameLogSchema); err != nil {
		return nil, fmt.Errorf("migrate: %w", err)
	}
	l := &frameLog{nextFrame: 1}
	if err := db.QueryRow(`INSERT INTO sources(name) VALUES ('firehose') RETURNING id`).Scan(&l.sourceID); err != nil {
		return nil, err
	}
	var err error
	for _, p := range []struct {
		dst **sql.Stmt
		sql string
	}{
		// The seqs of a frame are ?2 + the key's index: a duplicate leaves
		// a gap, as AUTOINCREMENT does today.
		{&l.insertKeys, `INSERT INTO ledger(source_id, key, seq) SELECT ?1, j.value, ?2 + j.key FROM json_each(?3) AS j WHERE true
			ON CONFLICT(source_id, key) DO NOTHING`},
		{&l.insertLog, `INSERT INTO frame_log(id, source_id, raw_id, first_seq, last_seq, created_at, keys, events) VALUES (?,?,?,?,?,?,?,?)`},
		{&l.insertRaw, `INSERT INTO raw_objects(key, fetched_at, seq_floor, traceparent, tracestate) VALUES (?, ?, ?, ?, ?)`},
		{&l.insertFrameRow, `INSERT INTO frames(id, source, n, first_seq, last_seq, created_at) VALUES (?,?,?,?,?,?)`},
		{&l.storeCursor, `INSERT INTO offsets(source, cursor, updated_at) VALUES (?,?,?)
			ON CONFLICT(source) DO UPDATE SET cursor = excluded.cursor, updated_at = excluded.updated_at`},
		{&l.ackFrames, `DELETE FROM frames WHERE id IN (SELECT value FROM json_each(?)) RETURNING id, n`},
		// A dead event's key stays remembered, as dead = 1 keeps its row
		// today; its frame_log row may go (the dead letter holds the raw
		// key, seq and event key).
		{&l.forgetKeys, `DELETE FROM ledger WHERE source_id = ?1 AND key IN (SELECT value FROM json_each(?2)) AND seq BETWEEN ?3 AND ?4
			AND seq NOT IN (SELECT seq FROM event_marks WHERE seq BETWEEN ?3 AND ?4 AND dead = 1)`},
	} {
		if *p.dst, err = db.Prepare(p.sql); err != nil {
			return nil, fmt.Errorf("prepare %s: %w", p.sql, err)
		}
	}
	return l, nil
}

func (l *frameLog) close() error {
	var errs []error
	for _, st := range []*sql.Stmt{l.insertKeys, l.insertLog, l.insertRaw, l.insertFrameRow, l.storeCursor, l.ackFrames, l.forgetKeys} {
		if st != nil {
			errs = append(errs, st.Close())
		}
	}
	return errors.Join(errs...)
}

func (l *frameLog) appendBatch(tx *sql.Tx, b *studyBatch) error {
	res, err := tx.Stmt(l.insertRaw).Exec(b.rawKey, b.fetchedAt, l.highSeq+1, nil, nil)
	if err != nil {
		return fmt.Errorf("insert raw object: %w", err)
	}
	rawID, err := res.LastInsertId()
	if err != nil {
		return err
	}
	b.frames = b.frames[:0]
	for start := 0; start < len(b.keys); start += studyFrame {
		end := min(start+studyFrame, len(b.keys))
		frameID := l.nextFrame
		l.nextFrame++
		first := l.highSeq + 1
		keys, evs := append(l.keysBuf[:0], '['), l.eventsBuf[:0]
		for i := start; i < end; i++ {
			if i > start {
				keys = append(keys, ',')
			}
			keys = wire.AppendString(keys, b.keys[i])
			evs = binary.LittleEndian.AppendUint32(evs, uint32(i-start))
			evs = binary.LittleEndian.AppendUint64(evs, uint64(b.times[i]))
			evs = binary.LittleEndian.AppendUint32(evs, uint32(b.offs[i]))
			evs = binary.LittleEndian.AppendUint32(evs, uint32(b.lens[i]))
		}
		keys = append(keys, ']')
		l.keysBuf, l.eventsBuf = keys, evs
		args := []any{l.sourceID, first, keys}
		if l.above != nil { // V5 with a key bound: the other generation's highest key
			args = append(args, *l.above)
		}
		res, err := tx.Stmt(l.insertKeys).Exec(args...)
		if err != nil {
			return fmt.Errorf("insert keys: %w", err)
		}
		n, err := res.RowsAffected()
		if err != nil {
			return err
		}
		if int(n) != end-start {
			// A shipped version reads the new keys' seqs back (a primary
			// key look-up per key of the frame) and keeps only those in
			// keys and events; the study appends no duplicates.
			return fmt.Errorf("frame %d: %d of %d events new: the study appends no duplicates", frameID, n, end-start)
		}
		last := first + int64(end-start) - 1
		l.highSeq = last
		if _, err := tx.Stmt(l.insertLog).Exec(frameID, l.sourceID, rawID, first, last, b.fetchedAt, keys, evs); err != nil {
			return fmt.Errorf("insert frame log: %w", err)
		}
		if _, err := tx.Stmt(l.insertFrameRow).Exec(frameID, b.source, n, first, last, b.fetchedAt); err != nil {
			return fmt.Errorf("insert frame: %w", err)
		}
		b.frames = append(b.frames, frameID)
	}
	if _, err := tx.Stmt(l.storeCursor).Exec(b.source, b.cursor, b.fetchedAt); err != nil {
		return fmt.Errorf("store cursor: %w", err)
	}
	return nil
}

func (l *frameLog) ack(tx *sql.Tx, frames []int64) error {
	return ackFramesStudy(tx, l.ackFrames, frames)
}

// prune forgets the keys of the oldest settled frames outside the window,
// a frame_log row (up to 100 keys) at a time, then those rows, the marks
// and raw objects below them.
func (l *frameLog) prune(tx *sql.Tx, cutoff int64, limit int) (int64, error) {
	bound := int64(math.MaxInt64) // the oldest pending frame
	if err := tx.QueryRow(`SELECT id FROM frames ORDER BY id LIMIT 1`).Scan(&bound); err != nil && !errors.Is(err, sql.ErrNoRows) {
		return 0, err
	}
	window := int64(math.MaxInt64) // the oldest frame inside the window
	if err := tx.QueryRow(`SELECT id FROM frame_log WHERE created_at >= ? ORDER BY id LIMIT 1`, cutoff).Scan(&window); err != nil && !errors.Is(err, sql.ErrNoRows) {
		return 0, err
	}
	if _, err := tx.Exec(`UPDATE meta SET value = max(value, ?) WHERE key = 'frame_high'`, l.nextFrame-1); err != nil {
		return 0, err
	}
	if _, err := tx.Exec(`UPDATE meta SET value = max(value, ?) WHERE key = 'seq_high'`, l.highSeq); err != nil {
		return 0, err
	}
	rows, err := tx.Query(`SELECT id, source_id, keys, first_seq, last_seq FROM frame_log WHERE id < ? ORDER BY id LIMIT ?`,
		min(bound, window), max(1, limit/studyFrame))
	if err != nil {
		return 0, err
	}
	type logRow struct {
		id, source, first, last int64
		keys                    []byte
	}
	var logRows []logRow
	for rows.Next() {
		var r logRow
		if err := rows.Scan(&r.id, &r.source, &r.keys, &r.first, &r.last); err != nil {
			return 0, errors.Join(err, rows.Close())
		}
		logRows = append(logRows, r)
	}
	if err := errors.Join(rows.Err(), rows.Close()); err != nil {
		return 0, err
	}
	if len(logRows) == 0 {
		return 0, nil
	}
	var deleted int64
	forget := tx.Stmt(l.forgetKeys)
	for _, r := range logRows {
		res, err := forget.Exec(r.source, r.keys, r.first, r.last)
		if err != nil {
			return 0, err
		}
		n, err := res.RowsAffected()
		if err != nil {
			return 0, err
		}
		deleted += n
	}
	top := logRows[len(logRows)-1]
	for _, q := range []struct {
		sql string
		arg int64
	}{
		{`DELETE FROM frame_log WHERE id <= ?`, top.id},
		{`DELETE FROM event_marks WHERE seq <= ? AND dead = 0`, top.last},
		{`DELETE FROM raw_objects WHERE id < coalesce((SELECT raw_id FROM frame_log ORDER BY id LIMIT 1), (SELECT max(id) + 1 FROM raw_objects)) AND ? > 0`, 1},
		{`DELETE FROM event_traces WHERE seq <= ?`, top.last},
		{`DELETE FROM event_verdicts WHERE seq <= ?`, top.last},
	} {
		if _, err := tx.Exec(q.sql, q.arg); err != nil {
			return 0, err
		}
	}
	return deleted, nil
}
