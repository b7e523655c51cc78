package queue

// The schema variants of the ledger study (ledger_study_test.go). V0 is
// today's schema (migrations) with today's statements, their SQL text
// copied from ops.go, settle.go, traces.go and verdict.go; the others
// are the schema a migration would leave, applied on top of today's.

import (
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ingestorhq/ingestor/internal/wire"
)

func studyVariants() []studyVariant {
	row := func(kind rowKind) func(db *sql.DB) (studyLedger, error) {
		return func(db *sql.DB) (studyLedger, error) { return openRowLedger(db, kind, studyFNV) }
	}
	return []studyVariant{
		{name: "V0", open: row(rowToday)},
		{name: "V0-random", random: true, open: row(rowToday)},
		{name: "V1", open: row(rowNoAutoinc)},
		{name: "V2", open: row(rowSourceIDs)},
		{name: "V1+V2", open: row(rowNoAutoincSourceIDs)},
		{name: "V3", open: openFrameLog},
		{name: "V3-random", random: true, open: openFrameLog},
		{name: "V4", open: row(rowHash)},
		{name: "V5", open: openGenerations},
		{name: "V5-random", random: true, open: openGenerations},
		{name: "V5-bound", open: openGenerationsBound},
		{name: "V5-bound-random", random: true, open: openGenerationsBound},
		{name: "V4-random", random: true, open: row(rowHash)},
		{name: "V0-cache64M", pragmas: []string{"PRAGMA cache_size = -65536"}, open: row(rowToday)},
		{name: "V0-page16k", pageSize: 16384, open: row(rowToday)},
		{name: "V1+V2-cache64M", pragmas: []string{"PRAGMA cache_size = -65536"}, open: row(rowNoAutoincSourceIDs)},
	}
}

type rowKind int

const (
	rowToday              rowKind = iota // V0: events with AUTOINCREMENT and UNIQUE(source, key)
	rowNoAutoinc                         // V1: V0 without AUTOINCREMENT
	rowSourceIDs                         // V2: V0 with source ids
	rowNoAutoincSourceIDs                // V1 and V2
	rowHash                              // V4: a 64-bit hash, indexed, not unique
)

// studyEventCols are the columns of events after v2 of today's schema,
// as the variants' migrations recreate it.
const studyEventCols = `frame_id   INTEGER NOT NULL,
	event_time INTEGER NOT NULL,
	raw_id     INTEGER NOT NULL,
	raw_off    INTEGER NOT NULL,
	raw_len    INTEGER NOT NULL,
	acked      INTEGER NOT NULL DEFAULT 0,
	attempts   INTEGER NOT NULL DEFAULT 1,
	last_seen  INTEGER NOT NULL DEFAULT 0,
	last_error TEXT    NOT NULL DEFAULT '',
	dead       INTEGER NOT NULL DEFAULT 0`

// rowMigrations are the migrations that turn today's events table into
// each row variant's; the tables are empty here, but each copies the rows
// as a shipped migration would.
var rowMigrations = map[rowKind]string{
	rowNoAutoinc: `
CREATE TABLE events_new (id INTEGER PRIMARY KEY, source TEXT NOT NULL, key TEXT NOT NULL, ` + studyEventCols + `);
INSERT INTO events_new SELECT id, source, key, frame_id, event_time, raw_id, raw_off, raw_len, acked, attempts, last_seen, last_error, dead FROM events;
INSERT INTO meta(key, value) VALUES ('seq_high', coalesce((SELECT seq FROM sqlite_sequence WHERE name = 'events'), 0));
DROP TABLE events;
ALTER TABLE events_new RENAME TO events;
CREATE UNIQUE INDEX events_source_key ON events(source, key);`,
	rowSourceIDs: `
CREATE TABLE sources (id INTEGER PRIMARY KEY, name TEXT NOT NULL UNIQUE);
INSERT INTO sources(name) SELECT DISTINCT source FROM events;
CREATE TABLE events_new (id INTEGER PRIMARY KEY AUTOINCREMENT, source_id INTEGER NOT NULL, key TEXT NOT NULL, ` + studyEventCols + `);
INSERT INTO events_new SELECT e.id, s.id, e.key, frame_id, event_time, raw_id, raw_off, raw_len, acked, attempts, last_seen, last_error, dead FROM events e JOIN sources s ON s.name = e.source;
DROP TABLE events;
ALTER TABLE events_new RENAME TO events;
CREATE UNIQUE INDEX events_source_key ON events(source_id, key);`,
	rowNoAutoincSourceIDs: `
CREATE TABLE sources (id INTEGER PRIMARY KEY, name TEXT NOT NULL UNIQUE);
INSERT INTO sources(name) SELECT DISTINCT source FROM events;
CREATE TABLE events_new (id INTEGER PRIMARY KEY, source_id INTEGER NOT NULL, key TEXT NOT NULL, ` + studyEventCols + `);
INSERT INTO events_new SELECT e.id, s.id, e.key, frame_id, event_time, raw_id, raw_off, raw_len, acked, attempts, last_seen, last_error, dead FROM events e JOIN sources s ON s.name = e.source;
INSERT INTO meta(key, value) VALUES ('seq_high', coalesce((SELECT seq FROM sqlite_sequence WHERE name = 'events'), 0));
DROP TABLE events;
ALTER TABLE events_new RENAME TO events;
CREATE UNIQUE INDEX events_source_key ON events(source_id, key);`,
	// The hash is computed in Go: a migration of existing rows needs a
	// Go step (or a registered SQL function) to fill it.
	rowHash: `
CREATE TABLE events_new (id INTEGER PRIMARY KEY AUTOINCREMENT, h INTEGER NOT NULL, source TEXT NOT NULL, key TEXT NOT NULL, ` + studyEventCols + `);
DROP TABLE events;
ALTER TABLE events_new RENAME TO events;
CREATE INDEX events_h ON events(h);`,
}

// rowLedger is a variant that keeps one row per event (V0, V1, V2, V4).
type rowLedger struct {
	kind                                                rowKind
	hash                                                func(source, key string) int64
	insertFrame, insertRaw, insertFrameRow, storeCursor *sql.Stmt
	ackFrames                                           *sql.Stmt
	nextFrame                                           int64
	keysBuf, numsBuf                                    []byte
	width                                               int // numbers per event in the nums blob
	sourceArg                                           any
}

func openRowLedger(db *sql.DB, kind rowKind, hash func(source, key string) int64) (*rowLedger, error) {
	if m := rowMigrations[kind]; m != "" {
		if _, err := db.Exec(m); err != nil {
			return nil, fmt.Errorf("migrate: %w", err)
		}
	}
	l := &rowLedger{kind: kind, hash: hash, nextFrame: 1, width: 3, sourceArg: "firehose"}
	// Today's insert of a frame (ops.go prepareInserts), and its variants.
	insert := `INSERT INTO events(source, key, frame_id, event_time, raw_id, raw_off, raw_len)
		SELECT ?1, j.value, ?2, CAST(substr(?5, j.key*60+1, 20) AS INTEGER), ?3,
			CAST(substr(?5, j.key*60+21, 20) AS INTEGER), CAST(substr(?5, j.key*60+41, 20) AS INTEGER)
		FROM json_each(?4) AS j WHERE true ORDER BY j.key
		ON CONFLICT(source, key) DO NOTHING`
	seqFloor := `coalesce((SELECT seq FROM sqlite_sequence WHERE name = 'events'), 0) + 1`
	switch kind {
	case rowNoAutoinc, rowNoAutoincSourceIDs:
		seqFloor = `coalesce((SELECT max(id) FROM events), 0) + 1`
	}
	switch kind {
	case rowSourceIDs, rowNoAutoincSourceIDs:
		if err := db.QueryRow(`INSERT INTO sources(name) VALUES ('firehose') RETURNING id`).Scan(&l.sourceArg); err != nil {
			return nil, err
		}
		insert = strings.NewReplacer("events(source,", "events(source_id,", "(source, key)", "(source_id, key)").Replace(insert)
	case rowHash:
		// No unique index to conflict on: an event is new when no row has
		// its hash and its (source, key); a row with the hash and another
		// key (a collision) does not stop it. Duplicates within one frame
		// are removed by the caller first (the SELECT reads events, so
		// SQLite materialises it before inserting).
		l.width = 4
		insert = `INSERT INTO events(h, source, key, frame_id, event_time, raw_id, raw_off, raw_len)
		SELECT CAST(substr(?5, j.key*80+61, 20) AS INTEGER), ?1, j.value, ?2, CAST(substr(?5, j.key*80+1, 20) AS INTEGER), ?3,
			CAST(substr(?5, j.key*80+21, 20) AS INTEGER), CAST(substr(?5, j.key*80+41, 20) AS INTEGER)
		FROM json_each(?4) AS j
		WHERE NOT EXISTS (SELECT 1 FROM events e WHERE e.h = CAST(substr(?5, j.key*80+61, 20) AS INTEGER) AND e.source = ?1 AND e.key = j.value)
		ORDER BY j.key`
	}
	var err error
	for _, p := range []struct {
		dst **sql.Stmt
		sql string
	}{
		{&l.insertFrame, insert},
		{&l.insertRaw, `INSERT INTO raw_objects(key, fetched_at, seq_floor, traceparent, tracestate)
			VALUES (?, ?, ` + seqFloor + `, ?, ?)`},
		{&l.insertFrameRow, `INSERT INTO frames(id, source, n, first_seq, last_seq, created_at) VALUES (?,?,?,?,?,?)`},
		{&l.storeCursor, `INSERT INTO offsets(source, cursor, updated_at) VALUES (?,?,?)
			ON CONFLICT(source) DO UPDATE SET cursor = excluded.cursor, updated_at = excluded.updated_at`},
		{&l.ackFrames, `DELETE FROM frames WHERE id IN (SELECT value FROM json_each(?)) RETURNING id, n`},
	} {
		if *p.dst, err = db.Prepare(p.sql); err != nil {
			return nil, fmt.Errorf("prepare %s: %w", p.sql, err)
		}
	}
	return l, nil
}

func (l *rowLedger) close() error {
	var errs []error
	for _, st := range []*sql.Stmt{l.insertFrame, l.insertRaw, l.insertFrameRow, l.storeCursor, l.ackFrames} {
		if st != nil {
			errs = append(errs, st.Close())
		}
	}
	return errors.Join(errs...)
}

// appendBatch is applyAppend's path for a batch of new events without
// device seqs, verdicts or traces: the raw object, one insert per frame,
// the frame rows, the cursor.
func (l *rowLedger) appendBatch(tx *sql.Tx, b *studyBatch) error {
	res, err := tx.Stmt(l.insertRaw).Exec(b.rawKey, b.fetchedAt, nil, nil)
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
		keys, nums := append(l.keysBuf[:0], '['), l.numsBuf[:0]
		for i := start; i < end; i++ {
			if i > start {
				keys = append(keys, ',')
			}
			keys = wire.AppendString(keys, b.keys[i])
			nums = appendNum(appendNum(appendNum(nums, b.times[i]), int64(b.offs[i])), int64(b.lens[i]))
			if l.kind == rowHash {
				nums = appendNum(nums, l.hash(b.source, b.keys[i]))
			}
		}
		keys = append(keys, ']')
		l.keysBuf, l.numsBuf = keys, nums
		res, err := tx.Stmt(l.insertFrame).Exec(l.sourceArg, frameID, rawID, keys, nums)
		if err != nil {
			return fmt.Errorf("insert events: %w", err)
		}
		n, err := res.RowsAffected()
		if err != nil {
			return err
		}
		if int(n) != end-start {
			return fmt.Errorf("frame %d: %d of %d events new: the study appends no duplicates", frameID, n, end-start)
		}
		last, err := res.LastInsertId()
		if err != nil {
			return err
		}
		if _, err := tx.Stmt(l.insertFrameRow).Exec(frameID, b.source, n, last-n+1, last, b.fetchedAt); err != nil {
			return fmt.Errorf("insert frame: %w", err)
		}
		b.frames = append(b.frames, frameID)
	}
	if _, err := tx.Stmt(l.storeCursor).Exec(b.source, b.cursor, b.fetchedAt); err != nil {
		return fmt.Errorf("store cursor: %w", err)
	}
	return nil
}

// ack is Settle's ackFrames for frames without retryable nacks.
func (l *rowLedger) ack(tx *sql.Tx, frames []int64) error {
	return ackFramesStudy(tx, l.ackFrames, frames)
}

func ackFramesStudy(tx *sql.Tx, st *sql.Stmt, frames []int64) error {
	arg, err := json.Marshal(frames)
	if err != nil {
		return err
	}
	rows, err := tx.Stmt(st).Query(arg)
	if err != nil {
		return err
	}
	found := 0
	for rows.Next() {
		var id, n int64
		if err := rows.Scan(&id, &n); err != nil {
			return errors.Join(err, rows.Close())
		}
		found++
	}
	if err := errors.Join(rows.Err(), rows.Close()); err != nil {
		return err
	}
	if found != len(frames) {
		return fmt.Errorf("acked %d of %d frames", found, len(frames))
	}
	return nil
}

// prune is Prune's transaction (ops.go), with the cutoff given.
func (l *rowLedger) prune(tx *sql.Tx, cutoff int64, limit int) (int64, error) {
	bound := int64(math.MaxInt64)
	if err := tx.QueryRow(`SELECT first_seq FROM frames ORDER BY id LIMIT 1`).Scan(&bound); err != nil && !errors.Is(err, sql.ErrNoRows) {
		return 0, err
	}
	if _, err := tx.Exec(`UPDATE meta SET value = max(value, ?) WHERE key = 'frame_high'`, l.nextFrame-1); err != nil {
		return 0, err
	}
	var windowSeq int64 = math.MaxInt64
	if err := tx.QueryRow(`SELECT seq_floor FROM raw_objects WHERE fetched_at >= ? ORDER BY id LIMIT 1`, cutoff).Scan(&windowSeq); err != nil && !errors.Is(err, sql.ErrNoRows) {
		return 0, err
	}
	res, err := tx.Exec(`DELETE FROM events WHERE id IN (SELECT id FROM events WHERE id < ? AND dead = 0 ORDER BY id LIMIT ?)`,
		min(bound, windowSeq), limit)
	if err != nil {
		return 0, err
	}
	deleted, err := res.RowsAffected()
	if err != nil || deleted == 0 {
		return deleted, err
	}
	for _, q := range []string{
		`DELETE FROM raw_objects WHERE id < coalesce((SELECT raw_id FROM events ORDER BY id LIMIT 1), (SELECT max(id) + 1 FROM raw_objects))`,
		`DELETE FROM event_traces WHERE seq < coalesce((SELECT id FROM events ORDER BY id LIMIT 1),
		(SELECT max(seq) + 1 FROM event_traces))`,
		`DELETE FROM event_verdicts WHERE seq < coalesce((SELECT id FROM events ORDER BY id LIMIT 1),
		(SELECT max(seq) + 1 FROM event_verdicts))`,
	} {
		if _, err := tx.Exec(q); err != nil {
			return 0, err
		}
	}
	return deleted, nil
}

// TestLedgerStudyHashCollisionKeepsEvents breaks V4 on purpose: with a
// hash that gives every event the same value, every lookup hits, and only
// the full (source, key) comparison tells events apart. No new event may
// be dropped, and a real duplicate must still be recognised. (A V4 that
// trusted the hash alone fails here at the second frame.)
func TestLedgerStudyHashCollisionKeepsEvents(t *testing.T) {
	v := studyVariant{name: "V4-collide"}
	db, err := openStudyDB(v, filepath.Join(t.TempDir(), "q.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := db.Close(); err != nil {
			t.Error(err)
		}
	}()
	l, err := openRowLedger(db, rowHash, func(string, string) int64 { return 42 })
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := l.close(); err != nil {
			t.Error(err)
		}
	}()
	sync := "FULL"
	batch := func(first int64, n int) *studyBatch {
		b := &studyBatch{source: "firehose", rawKey: "raw", cursor: "c", keys: make([]string, n), times: make([]int64, n), offs: make([]int, n), lens: make([]int, n)}
		for i := range n {
			b.keys[i], b.offs[i], b.lens[i] = studyKey(first+int64(i), false), i*500, 500
		}
		return b
	}
	for i := range 3 { // 300 events, every one colliding with all the others
		b := batch(int64(i*studyFrame), studyFrame)
		if err := studyTx(db, "FULL", &sync, func(tx *sql.Tx) error { return l.appendBatch(tx, b) }); err != nil {
			t.Fatalf("batch %d: %v (a colliding event was taken for a duplicate)", i, err)
		}
	}
	var n int
	if err := db.QueryRow(`SELECT count(*) FROM events WHERE h = 42`).Scan(&n); err != nil || n != 3*studyFrame {
		t.Fatalf("%d events stored (%v), want %d", n, err, 3*studyFrame)
	}
	// A frame re-fetched: every event a duplicate, none stored again.
	b := batch(0, studyFrame)
	err = studyTx(db, "FULL", &sync, func(tx *sql.Tx) error { return l.appendBatch(tx, b) })
	if err == nil || !strings.Contains(err.Error(), "0 of 100 events new") {
		t.Fatalf("re-fetched frame: %v, want 0 of 100 events new", err)
	}
}

// numWidth is the width of one number in the V0 insert's numbers blob: a
// sign and 19 digits, as CAST(... AS INTEGER) reads them (the insert of
// the events table before the ledger generations).
const numWidth = 20

// appendNum appends v to b as numWidth characters: a sign ('-' or '0') and
// 19 digits.
func appendNum(b []byte, v int64) []byte {
	var d [numWidth]byte
	u := uint64(v)
	d[0] = '0'
	if v < 0 {
		d[0], u = '-', uint64(-v) // -MinInt64 wraps to its own magnitude
	}
	for i := numWidth - 1; i > 0; i-- {
		d[i] = byte('0' + u%10)
		u /= 10
	}
	return append(b, d[:]...)
}
