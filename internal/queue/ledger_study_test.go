package queue

// The ledger study (issue 31, item 3): what one event row of the queue's
// ledger costs, and what alternative schemas would cost, measured on real
// SQLite files opened as Open opens the queue. docs/ledger-design.md holds
// the design and the results. BenchmarkLedgerStudy runs only as a
// benchmark (make bench runs it): plain go test does not run it.
//
// Every variant is driven the same way, the writer's way: a group commit
// of studyGroup batches of 1000 events (frames of 100, one statement per
// frame) with their raw objects and cursors, each under its savepoint, at
// synchronous = FULL; then one lazy commit (synchronous = NORMAL) acking
// those frames whole, as a processor's acks are settled; then, once more
// than the window of rows is kept, Prune-like deletes of the oldest 1000
// rows per transaction until the window is kept again. CPU time is the
// process's (getrusage, user + system) around each phase; WAL bytes are
// the frames each commit appended, read from the WAL index header in the
// -shm file.

import (
	"database/sql"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/ingestorhq/ingestor/internal/sqliteuri"
)

const (
	studyPage  = 1000 // events per batch: one fetched page
	studyFrame = 100  // events per frame
	studyGroup = 4    // batches per group commit
	// studyKeyBase makes increasing keys of a fixed width, so their text
	// order is their numeric order.
	studyKeyBase = 10_000_000
)

// studyBatch is one fetched page as the study appends it.
type studyBatch struct {
	source    string
	fetchedAt int64 // the batch's index: the prune window is in batches
	rawKey    string
	cursor    string
	keys      []string
	times     []int64
	offs      []int
	lens      []int
	frames    []int64 // set by appendBatch: the frames committed
}

// studyLedger is one schema variant's writer-side statements.
type studyLedger interface {
	// appendBatch stores b's raw object, events, frames and cursor in tx.
	appendBatch(tx *sql.Tx, b *studyBatch) error
	// ack acks frames whole, as Settle does for frame acks.
	ack(tx *sql.Tx, frames []int64) error
	// prune deletes up to limit settled rows of batches older than
	// cutoff (a fetchedAt), returning how many events it forgot.
	prune(tx *sql.Tx, cutoff int64, limit int) (int64, error)
	close() error
}

// studyVariant is one schema to measure.
type studyVariant struct {
	name     string
	random   bool // keys in random order instead of mostly increasing
	pageSize int  // 0: SQLite's default (4096)
	pragmas  []string
	open     func(db *sql.DB) (studyLedger, error)
}

// studyResult is what one run of a variant measured.
type studyResult struct {
	name                         string
	load                         string // /proc/loadavg's 1-minute figure at the start
	events, pruned, live         int64
	appendCPU, ackCPU, pruneCPU  time.Duration
	appendWAL, ackWAL, pruneWAL  int64 // bytes
	commits                      int
	dbBytes, usedBytes, pageSize int64
	wall                         time.Duration
}

// BenchmarkLedgerStudy runs the study once, whatever b.N (make bench:
// -run '^$' -bench LedgerStudy -benchtime 1x); it is a benchmark so that
// plain go test never runs, nor skips, it.
func BenchmarkLedgerStudy(b *testing.B) {
	t := b
	rows := envInt(t, "LEDGER_ROWS", 2_000_000)
	window := envInt(t, "LEDGER_WINDOW", 500_000)
	repeat := envInt(t, "LEDGER_REPEAT", 2)
	want := map[string]bool{}
	for _, n := range strings.Split(os.Getenv("LEDGER_VARIANTS"), ",") {
		if n != "" {
			want[n] = true
		}
	}
	var variants []studyVariant
	for _, v := range studyVariants() {
		if len(want) == 0 || want[v.name] {
			variants = append(variants, v)
		}
	}
	dir := os.Getenv("LEDGER_DIR")
	if dir == "" {
		dir = t.TempDir()
	}
	var results []studyResult
	for rep := range repeat { // interleaved: every variant once, then again
		for _, v := range variants {
			path := filepath.Join(dir, fmt.Sprintf("%s-%d.db", v.name, rep))
			r, err := runStudy(v, path, rows, window)
			for _, p := range []string{path, path + "-wal", path + "-shm"} {
				_ = os.Remove(p)
			}
			if err != nil {
				t.Fatalf("%s: %v", v.name, err)
			}
			t.Log(r.row())
			results = append(results, r)
		}
	}
	var sb strings.Builder
	sb.WriteString("\n| variant | load | append+commit CPU-us/event | ack CPU-us/event | prune CPU-us/event | WAL B/event (append, ack, prune) | DB B/row (file, used) | wall s |\n|---|---|---|---|---|---|---|---|\n")
	for _, r := range results {
		sb.WriteString(r.row() + "\n")
	}
	t.Log(sb.String())
	if out := os.Getenv("LEDGER_OUT"); out != "" {
		f, err := os.OpenFile(out, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
		if err == nil {
			_, err = f.WriteString(sb.String())
			err = errors.Join(err, f.Close())
		}
		if err != nil {
			t.Fatal(err)
		}
	}
}

func (r studyResult) row() string {
	per := func(d time.Duration, n int64) string {
		if n == 0 {
			return "-"
		}
		return fmt.Sprintf("%.2f", float64(d.Microseconds())/float64(n))
	}
	perB := func(b, n int64) float64 {
		if n == 0 {
			return 0
		}
		return float64(b) / float64(n)
	}
	return fmt.Sprintf("| %s | %s | %s | %s | %s | %.0f, %.0f, %.0f | %.0f, %.0f | %.1f |", r.name, r.load,
		per(r.appendCPU, r.events), per(r.ackCPU, r.events), per(r.pruneCPU, r.pruned),
		perB(r.appendWAL, r.events), perB(r.ackWAL, r.events), perB(r.pruneWAL, r.pruned),
		perB(r.dbBytes, r.live), perB(r.usedBytes, r.live), r.wall.Seconds())
}

func envInt(t testing.TB, name string, def int) int {
	s := os.Getenv(name)
	if s == "" {
		return def
	}
	n, err := strconv.Atoi(s)
	if err != nil {
		t.Fatalf("%s=%q: %v", name, s, err)
	}
	return n
}

// openStudyDB creates the database at path with v's page size, then opens
// it as Open opens the queue's writer connection, runs today's migrations
// (every variant starts from a queue of today's schema) and v's pragmas.
func openStudyDB(v studyVariant, path string) (*sql.DB, error) {
	create, err := sql.Open("sqlite3", "file:"+path)
	if err != nil {
		return nil, err
	}
	var stmts []string
	if v.pageSize > 0 {
		stmts = append(stmts, fmt.Sprintf("PRAGMA page_size = %d", v.pageSize))
	}
	stmts = append(stmts, "PRAGMA journal_mode = WAL")
	for _, s := range stmts {
		if _, err := create.Exec(s); err != nil {
			return nil, errors.Join(err, create.Close())
		}
	}
	if err := create.Close(); err != nil {
		return nil, err
	}
	uri, err := sqliteuri.File(path, "_journal_mode=WAL&_synchronous=FULL&_busy_timeout=10000&_txlock=immediate&_foreign_keys=0")
	if err != nil {
		return nil, err
	}
	db, err := sql.Open("sqlite3", uri)
	if err != nil {
		return nil, err
	}
	db.SetMaxOpenConns(1)
	db.SetConnMaxLifetime(0)
	db.SetConnMaxIdleTime(0)
	// The study's variants start from the schema before the ledger
	// generations (v10), which they were measured against.
	if err := migrateTo(db, 0, 9); err != nil {
		return nil, errors.Join(err, db.Close())
	}
	for _, p := range v.pragmas {
		if _, err := db.Exec(p); err != nil {
			return nil, errors.Join(err, db.Close())
		}
	}
	return db, nil
}

// walWatch reads the WAL index header of the -shm file: mxFrame (the
// frames in the WAL) and the salts, which change when a writer restarts
// the WAL after a checkpoint.
type walWatch struct {
	f        *os.File
	mx, salt uint64
	frame    int64 // bytes of one WAL frame: a page and its 24-byte header
}

func (w *walWatch) read() (mx, salt uint64, err error) {
	var h [48]byte
	if _, err := w.f.ReadAt(h[:], 0); err != nil {
		return 0, 0, err
	}
	return uint64(binary.LittleEndian.Uint32(h[16:])), binary.LittleEndian.Uint64(h[32:]), nil
}

// written returns the WAL bytes appended since the last call.
func (w *walWatch) written() (int64, error) {
	mx, salt, err := w.read()
	if err != nil {
		return 0, err
	}
	n := mx - w.mx
	if salt != w.salt || mx < w.mx {
		n = mx // restarted from the start of the file
	}
	w.mx, w.salt = mx, salt
	return int64(n) * w.frame, nil
}

func cpuNow() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// studyTx runs each of fns under its own savepoint in one transaction, as
// commitGroup does, at the synchronous mode sync.
func studyTx(db *sql.DB, sync string, cur *string, fns ...func(tx *sql.Tx) error) error {
	if *cur != sync {
		if _, err := db.Exec("PRAGMA synchronous = " + sync); err != nil {
			return err
		}
		*cur = sync
	}
	tx, err := db.Begin()
	if err != nil {
		return err
	}
	for _, fn := range fns {
		if _, err := tx.Exec(`SAVEPOINT req`); err != nil {
			return errors.Join(err, tx.Rollback())
		}
		if err := fn(tx); err != nil {
			return errors.Join(err, tx.Rollback())
		}
		if _, err := tx.Exec(`RELEASE req`); err != nil {
			return errors.Join(err, tx.Rollback())
		}
	}
	return tx.Commit()
}

// studyKey is the key of the n-th event: increasing, or a bijection of n
// onto [0, 2^27) that scatters consecutive events, of the same width.
func studyKey(n int64, random bool) string {
	if random {
		return fmt.Sprintf("ev-%09d", (uint64(n)*0x9E3779B1)&(1<<27-1))
	}
	return fmt.Sprintf("ev-%09d", studyKeyBase+n)
}

func loadAvg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	return strings.Fields(string(b))[0]
}

func runStudy(v studyVariant, path string, rows, window int) (res studyResult, err error) {
	res = studyResult{name: v.name, load: loadAvg()}
	db, err := openStudyDB(v, path)
	if err != nil {
		return res, err
	}
	defer func() { err = errors.Join(err, db.Close()) }()
	l, err := v.open(db)
	if err != nil {
		return res, err
	}
	defer func() { err = errors.Join(err, l.close()) }()
	var pageSize int64
	if err := db.QueryRow(`PRAGMA page_size`).Scan(&pageSize); err != nil {
		return res, err
	}
	shm, err := os.Open(path + "-shm")
	if err != nil {
		return res, err
	}
	defer func() { err = errors.Join(err, shm.Close()) }()
	w := &walWatch{f: shm, frame: pageSize + 24}
	if _, err := w.written(); err != nil {
		return res, err
	}
	sync := "FULL"
	batches := make([]*studyBatch, studyGroup)
	var n, batchNo int64
	windowBatches := int64(window / studyPage)
	start := time.Now()
	for n < int64(rows) {
		for i := range batches {
			b := &studyBatch{source: "firehose", fetchedAt: batchNo, rawKey: fmt.Sprintf("firehose/2026/11/24/%d-page.json", batchNo),
				cursor: strconv.FormatInt(batchNo+1, 10), keys: make([]string, studyPage), times: make([]int64, studyPage),
				offs: make([]int, studyPage), lens: make([]int, studyPage)}
			for j := range studyPage {
				b.keys[j] = studyKey(n, v.random)
				b.times[j] = 1_795_000_000_000_000_000 + n*1000
				b.offs[j], b.lens[j] = j*500, 500
				n++
			}
			batches[i] = b
			batchNo++
		}
		// The appends: one group commit, fsynced.
		fns := make([]func(*sql.Tx) error, len(batches))
		for i, b := range batches {
			fns[i] = func(tx *sql.Tx) error { return l.appendBatch(tx, b) }
		}
		c0 := cpuNow()
		if err := studyTx(db, "FULL", &sync, fns...); err != nil {
			return res, fmt.Errorf("append: %w", err)
		}
		res.appendCPU += cpuNow() - c0
		wal, err := w.written()
		if err != nil {
			return res, err
		}
		res.appendWAL += wal
		res.commits++
		res.events += int64(len(batches) * studyPage)
		// The acks: one lazy commit of every frame of the group.
		var frames []int64
		for _, b := range batches {
			frames = append(frames, b.frames...)
		}
		c0 = cpuNow()
		if err := studyTx(db, "NORMAL", &sync, func(tx *sql.Tx) error { return l.ack(tx, frames) }); err != nil {
			return res, fmt.Errorf("ack: %w", err)
		}
		res.ackCPU += cpuNow() - c0
		if wal, err = w.written(); err != nil {
			return res, err
		}
		res.ackWAL += wal
		// Prune: batches of 1000 until the window is kept again.
		for n-res.pruned > int64(window) {
			var deleted int64
			c0 = cpuNow()
			if err := studyTx(db, "FULL", &sync, func(tx *sql.Tx) error {
				var err error
				deleted, err = l.prune(tx, batchNo-windowBatches, 1000)
				return err
			}); err != nil {
				return res, fmt.Errorf("prune: %w", err)
			}
			res.pruneCPU += cpuNow() - c0
			if wal, err = w.written(); err != nil {
				return res, err
			}
			res.pruneWAL += wal
			res.pruned += deleted
			if deleted < 1000 {
				break
			}
		}
	}
	res.wall = time.Since(start)
	res.live = n - res.pruned
	var pages, free int64
	if err := db.QueryRow(`PRAGMA page_count`).Scan(&pages); err != nil {
		return res, err
	}
	if err := db.QueryRow(`PRAGMA freelist_count`).Scan(&free); err != nil {
		return res, err
	}
	res.pageSize = pageSize
	res.dbBytes, res.usedBytes = pages*pageSize, (pages-free)*pageSize
	return res, nil
}

// studyFNV is FNV-1a of source, a zero byte and key: the V4 variant's
// 64-bit hash of an event's identity.
func studyFNV(source, key string) int64 {
	h := uint64(14695981039346656037)
	for _, s := range []string{source, "\x00", key} {
		for i := 0; i < len(s); i++ {
			h ^= uint64(s[i])
			h *= 1099511628211
		}
	}
	return int64(h & math.MaxInt64)
}
