package queue

import (
	"database/sql"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/ingestorhq/ingestor/internal/wire"
)

// BenchmarkLedgerStudyMigration measures, once whatever b.N, what
// migrating a queue of today's schema holding LEDGER_WINDOW events
// (default 500,000: an hour's dedupe window at ~140 events/s, or 5 s at
// 100k/s) costs, to V3 and to V1+V2, in one transaction each as migrate
// runs a step. make bench runs it with BenchmarkLedgerStudy.
func BenchmarkLedgerStudyMigration(b *testing.B) {
	t := b
	rows := envInt(t, "LEDGER_WINDOW", 500_000)
	for _, to := range []string{"V1+V2", "V3"} {
		path := filepath.Join(t.TempDir(), "q.db")
		db, err := openStudyDB(studyVariant{name: "V0"}, path)
		if err != nil {
			t.Fatal(err)
		}
		l, err := openRowLedger(db, rowToday, studyFNV)
		if err != nil {
			t.Fatal(err)
		}
		sync := "FULL"
		var n int64
		for n < int64(rows) {
			b := &studyBatch{source: "firehose", fetchedAt: n / studyPage, rawKey: "raw", cursor: "c", keys: make([]string, studyPage),
				times: make([]int64, studyPage), offs: make([]int, studyPage), lens: make([]int, studyPage)}
			for j := range studyPage {
				b.keys[j], b.times[j], b.offs[j], b.lens[j] = studyKey(n, false), n, j*500, 500
				n++
			}
			if err := studyTx(db, "FULL", &sync, func(tx *sql.Tx) error { return l.appendBatch(tx, b) }); err != nil {
				t.Fatal(err)
			}
			if n < int64(rows)-10*studyPage { // the last 10 pages stay pending
				if err := studyTx(db, "FULL", &sync, func(tx *sql.Tx) error { return l.ack(tx, b.frames) }); err != nil {
					t.Fatal(err)
				}
			}
		}
		if err := l.close(); err != nil {
			t.Fatal(err)
		}
		c0, w0 := cpuNow(), time.Now()
		tx, err := db.Begin()
		if err != nil {
			t.Fatal(err)
		}
		if to == "V3" {
			err = migrateToFrameLog(tx)
		} else {
			_, err = tx.Exec(rowMigrations[rowNoAutoincSourceIDs])
		}
		if err != nil {
			t.Fatal(errors.Join(err, tx.Rollback()))
		}
		if err := tx.Commit(); err != nil {
			t.Fatal(err)
		}
		cpu, wall := cpuNow()-c0, time.Since(w0)
		var pages int64
		if err := db.QueryRow(`PRAGMA page_count`).Scan(&pages); err != nil {
			t.Fatal(err)
		}
		var walSize int64
		if fi, err := os.Stat(path + "-wal"); err == nil {
			walSize = fi.Size()
		}
		if err := db.Close(); err != nil {
			t.Fatal(err)
		}
		t.Logf("migrating %d events of today's schema to %s: %.2f CPU-s, %.2f s, database %d pages of 4 KiB, WAL file %d MB (load %s)",
			rows, to, cpu.Seconds(), wall.Seconds(), pages, walSize>>20, loadAvg())
	}
}

// migrateToFrameLog is V3's migration of a queue of today's schema: the
// ledger from every event row, one frame_log row per frame_id (packed
// here, in Go), event_marks for the acked or nacked events of pending
// frames, then today's events table dropped.
func migrateToFrameLog(tx *sql.Tx) error {
	for _, q := range []string{
		`CREATE TABLE sources (id INTEGER PRIMARY KEY, name TEXT NOT NULL UNIQUE)`,
		`INSERT INTO sources(name) SELECT DISTINCT source FROM events`,
		`CREATE TABLE ledger (source_id INTEGER NOT NULL, key TEXT NOT NULL, seq INTEGER NOT NULL, attempts INTEGER NOT NULL DEFAULT 1,
			last_seen INTEGER NOT NULL DEFAULT 0, PRIMARY KEY (source_id, key)) WITHOUT ROWID`,
		`INSERT INTO ledger(source_id, key, seq, attempts, last_seen) SELECT s.id, e.key, e.id, e.attempts, e.last_seen
			FROM events e JOIN sources s ON s.name = e.source ORDER BY s.id, e.key`,
		`CREATE TABLE frame_log (id INTEGER PRIMARY KEY, source_id INTEGER NOT NULL, raw_id INTEGER NOT NULL, first_seq INTEGER NOT NULL,
			last_seq INTEGER NOT NULL, created_at INTEGER NOT NULL, keys TEXT NOT NULL, events BLOB NOT NULL)`,
		`CREATE TABLE event_marks (seq INTEGER PRIMARY KEY, acked INTEGER NOT NULL DEFAULT 0, dead INTEGER NOT NULL DEFAULT 0, last_error TEXT NOT NULL DEFAULT '')`,
		`INSERT INTO event_marks(seq, acked, dead, last_error) SELECT e.id, e.acked, e.dead, e.last_error FROM events e
			WHERE e.dead = 1 OR ((e.acked = 1 OR e.last_error != '') AND e.frame_id IN (SELECT id FROM frames))`,
		`INSERT INTO meta(key, value) VALUES ('seq_high', coalesce((SELECT seq FROM sqlite_sequence WHERE name = 'events'), 0))`,
	} {
		if _, err := tx.Exec(q); err != nil {
			return fmt.Errorf("%s: %w", q, err)
		}
	}
	ins, err := tx.Prepare(`INSERT INTO frame_log(id, source_id, raw_id, first_seq, last_seq, created_at, keys, events) VALUES (?,?,?,?,?,?,?,?)`)
	if err != nil {
		return err
	}
	rows, err := tx.Query(`SELECT e.id, e.frame_id, s.id, e.raw_id, r.fetched_at, e.key, e.event_time, e.raw_off, e.raw_len
		FROM events e JOIN sources s ON s.name = e.source JOIN raw_objects r ON r.id = e.raw_id ORDER BY e.id`)
	if err != nil {
		return errors.Join(err, ins.Close())
	}
	var cur struct {
		frame, source, raw, created, first, last int64
		keys, evs                                []byte
	}
	flush := func() error {
		if cur.frame == 0 {
			return nil
		}
		_, err := ins.Exec(cur.frame, cur.source, cur.raw, cur.first, cur.last, cur.created, append(cur.keys, ']'), cur.evs)
		return err
	}
	for rows.Next() {
		var seq, frame, source, raw, created, et, off, ln int64
		var key string
		if err := rows.Scan(&seq, &frame, &source, &raw, &created, &key, &et, &off, &ln); err != nil {
			return errors.Join(err, rows.Close(), ins.Close())
		}
		if frame != cur.frame {
			if err := flush(); err != nil {
				return errors.Join(err, rows.Close(), ins.Close())
			}
			cur.frame, cur.source, cur.raw, cur.created, cur.first = frame, source, raw, created, seq
			cur.keys, cur.evs = append(cur.keys[:0], '['), cur.evs[:0]
		} else {
			cur.keys = append(cur.keys, ',')
		}
		cur.last = seq
		cur.keys = wire.AppendString(cur.keys, key)
		cur.evs = binary.LittleEndian.AppendUint32(cur.evs, uint32(seq-cur.first))
		cur.evs = binary.LittleEndian.AppendUint64(cur.evs, uint64(et))
		cur.evs = binary.LittleEndian.AppendUint32(cur.evs, uint32(off))
		cur.evs = binary.LittleEndian.AppendUint32(cur.evs, uint32(ln))
	}
	if err := errors.Join(rows.Err(), rows.Close(), flush(), ins.Close()); err != nil {
		return err
	}
	_, err = tx.Exec(`DROP TABLE events`)
	return err
}
