package queue

// V5 of the ledger study (ledger_study_test.go): V3 with the dedupe keys
// in two alternating generations, ledger_0 and ledger_1. New keys go
// into the current one, checked against the other; once the current
// generation is a whole window old, the other holds only keys older than
// the window and is emptied by a DELETE without WHERE (SQLite's truncate
// optimisation frees its pages without visiting its rows), and becomes
// the current one. Keys are remembered between one and two windows.

import (
	"database/sql"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
)

type genLog struct {
	*frameLog
	insert   [2]*sql.Stmt // into generation i, unless generation 1-i knows the key
	own      *sql.Stmt    // V3's insert, unused
	cur      int
	start    [2]int64 // the fetchedAt of each generation's first batch
	rows     [2]int64
	lastSeq  [2]int64 // the highest seq of each generation
	lastLogs [2]int64 // the highest frame id of each generation
	// bound, when set, skips the look-up in the other generation for a
	// key above its highest key (maxKey, kept by the writer and read at
	// open with max(key)): mostly increasing keys are then checked in
	// one b-tree only. Any key at or below it is looked up, so the bound
	// only saves work, never a look-up that could find the key.
	bound  bool
	maxKey [2]string
}

func openGenerationsBound(db *sql.DB) (studyLedger, error) {
	l, err := openGenerations(db)
	if err != nil {
		return nil, err
	}
	g := l.(*genLog)
	g.bound = true
	for i := range 2 {
		q := fmt.Sprintf(`INSERT INTO ledger_%d(source_id, key, seq) SELECT ?1, j.value, ?2 + j.key FROM json_each(?3) AS j
			WHERE j.value > ?4 OR NOT EXISTS (SELECT 1 FROM ledger_%d o WHERE o.source_id = ?1 AND o.key = j.value)
			ON CONFLICT(source_id, key) DO NOTHING`, i, 1-i)
		_ = g.insert[i].Close()
		if g.insert[i], err = db.Prepare(q); err != nil {
			return nil, fmt.Errorf("prepare %s: %w", q, err)
		}
	}
	return g, nil
}

func openGenerations(db *sql.DB) (studyLedger, error) {
	fl, err := openFrameLog(db)
	if err != nil {
		return nil, err
	}
	l := &genLog{frameLog: fl.(*frameLog)}
	l.own = l.frameLog.insertKeys
	ddl := strings.Replace(strings.SplitN(strings.SplitN(frameLogSchema, "CREATE TABLE ledger", 2)[1], ";", 2)[0], "(", "ledger_1 (", 1)
	if _, err := db.Exec(`ALTER TABLE ledger RENAME TO ledger_0; CREATE TABLE ` + ddl); err != nil {
		return nil, fmt.Errorf("create ledger_1: %w", err)
	}
	for i := range 2 {
		q := fmt.Sprintf(`INSERT INTO ledger_%d(source_id, key, seq) SELECT ?1, j.value, ?2 + j.key FROM json_each(?3) AS j
			WHERE NOT EXISTS (SELECT 1 FROM ledger_%d o WHERE o.source_id = ?1 AND o.key = j.value)
			ON CONFLICT(source_id, key) DO NOTHING`, i, 1-i)
		if l.insert[i], err = db.Prepare(q); err != nil {
			return nil, fmt.Errorf("prepare %s: %w", q, err)
		}
	}
	l.start = [2]int64{0, -1}
	return l, nil
}

func (l *genLog) close() error {
	for _, st := range l.insert {
		if st != nil {
			_ = st.Close()
		}
	}
	l.frameLog.insertKeys = l.own
	return l.frameLog.close()
}

func (l *genLog) appendBatch(tx *sql.Tx, b *studyBatch) error {
	if l.start[l.cur] < 0 {
		l.start[l.cur] = b.fetchedAt
	}
	l.frameLog.insertKeys = l.insert[l.cur]
	if l.bound {
		l.frameLog.above = &l.maxKey[1-l.cur]
	}
	if err := l.frameLog.appendBatch(tx, b); err != nil {
		return err
	}
	if l.bound {
		for _, k := range b.keys {
			l.maxKey[l.cur] = max(l.maxKey[l.cur], k)
		}
	}
	l.rows[l.cur] += int64(len(b.keys))
	l.lastSeq[l.cur], l.lastLogs[l.cur] = l.highSeq, l.nextFrame-1
	return nil
}

// prune empties the other generation once every key of it is older than
// the window (the current one began before cutoff) and settled, with the
// frame_log rows of its frames; dead keys move to the current generation
// first. It returns the keys forgotten.
func (l *genLog) prune(tx *sql.Tx, cutoff int64, _ int) (int64, error) {
	old := 1 - l.cur
	if l.start[l.cur] < 0 || l.start[l.cur] >= cutoff {
		return 0, nil
	}
	var pending int64 = 1<<63 - 1
	if err := tx.QueryRow(`SELECT coalesce(min(first_seq), ?) FROM frames`, pending).Scan(&pending); err != nil {
		return 0, err
	}
	if pending <= l.lastSeq[old] {
		return 0, nil // a frame of the old generation is still pending
	}
	for _, q := range []string{
		`UPDATE meta SET value = max(value, ?) WHERE key = 'frame_high'`,
		`UPDATE meta SET value = max(value, ?) WHERE key = 'seq_high'`,
	} {
		if _, err := tx.Exec(q, max(l.nextFrame-1, l.highSeq)); err != nil {
			return 0, err
		}
	}
	for _, q := range []struct {
		sql  string
		args []any
	}{
		{fmt.Sprintf(`INSERT INTO ledger_%d SELECT * FROM ledger_%d WHERE seq IN (SELECT seq FROM event_marks WHERE dead = 1 AND seq <= ?)`, l.cur, old), []any{l.lastSeq[old]}},
		// No WHERE: the truncate optimisation.
		{fmt.Sprintf(`DELETE FROM ledger_%d`, old), nil},
		{`DELETE FROM frame_log WHERE id <= ?`, []any{l.lastLogs[old]}},
		{`DELETE FROM event_marks WHERE seq <= ? AND dead = 0`, []any{l.lastSeq[old]}},
		{`DELETE FROM raw_objects WHERE id < coalesce((SELECT raw_id FROM frame_log ORDER BY id LIMIT 1), (SELECT max(id) + 1 FROM raw_objects))`, nil},
		{`DELETE FROM event_traces WHERE seq <= ?`, []any{l.lastSeq[old]}},
		{`DELETE FROM event_verdicts WHERE seq <= ?`, []any{l.lastSeq[old]}},
	} {
		if _, err := tx.Exec(q.sql, q.args...); err != nil {
			return 0, fmt.Errorf("%s: %w", q.sql, err)
		}
	}
	forgotten := l.rows[old]
	l.rows[old], l.start[old], l.maxKey[old], l.cur = 0, -1, "", old
	return forgotten, nil
}

// TestLedgerStudyGenerationsRememberKeys checks V5-bound's dedupe across
// a generation switch: a key in the other generation is a duplicate
// (looked up there, being at or below its highest key), a key above it
// is new, and a generation is emptied only once its frames are settled.
func TestLedgerStudyGenerationsRememberKeys(t *testing.T) {
	db, err := openStudyDB(studyVariant{name: "V5-bound"}, filepath.Join(t.TempDir(), "q.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := db.Close(); err != nil {
			t.Error(err)
		}
	}()
	sl, err := openGenerationsBound(db)
	if err != nil {
		t.Fatal(err)
	}
	l := sl.(*genLog)
	defer func() {
		if err := l.close(); err != nil {
			t.Error(err)
		}
	}()
	sync := "FULL"
	appendKeys := func(at, first int64) (*studyBatch, error) {
		b := &studyBatch{source: "firehose", fetchedAt: at, rawKey: "raw", cursor: "c", keys: make([]string, studyFrame),
			times: make([]int64, studyFrame), offs: make([]int, studyFrame), lens: make([]int, studyFrame)}
		for i := range studyFrame {
			b.keys[i], b.offs[i], b.lens[i] = studyKey(first+int64(i), false), i*500, 500
		}
		return b, studyTx(db, "FULL", &sync, func(tx *sql.Tx) error { return l.appendBatch(tx, b) })
	}
	prune := func(cutoff int64) int64 {
		var n int64
		if err := studyTx(db, "FULL", &sync, func(tx *sql.Tx) (err error) { n, err = l.prune(tx, cutoff, 1000); return err }); err != nil {
			t.Fatal(err)
		}
		return n
	}
	b0, err := appendKeys(0, 0) // keys 0-99 into generation 0
	if err != nil {
		t.Fatal(err)
	}
	if n := prune(1); n != 0 || l.cur != 1 { // generation 1 (empty) emptied, now current
		t.Fatalf("first switch: forgot %d, current %d", n, l.cur)
	}
	if _, err := appendKeys(1, 0); err == nil || !strings.Contains(err.Error(), "0 of 100 events new") {
		t.Fatalf("keys of the other generation appended again: %v, want 0 of 100 events new", err)
	}
	b1, err := appendKeys(1, 100) // above generation 0's highest key: new
	if err != nil {
		t.Fatal(err)
	}
	if n := prune(2); n != 0 || l.cur != 1 { // generation 0's frame is pending: kept
		t.Fatalf("switch with a pending frame: forgot %d, current %d", n, l.cur)
	}
	if err := studyTx(db, "NORMAL", &sync, func(tx *sql.Tx) error { return l.ack(tx, append(b0.frames, b1.frames...)) }); err != nil {
		t.Fatal(err)
	}
	if n := prune(2); n != 100 || l.cur != 0 {
		t.Fatalf("switch once settled: forgot %d, current %d, want 100 and 0", n, l.cur)
	}
	if _, err := appendKeys(2, 150); err == nil || !strings.Contains(err.Error(), "50 of 100 events new") {
		t.Fatalf("keys 150-249 with 150-199 in generation 1: %v, want 50 of 100 events new", err)
	}
}
