// Package queue is the daemon's SQLite write-ahead queue: the system of
// record between the upstream and the processors.
//
// One writer goroutine owns the write connection and commits whatever work is
// waiting (batches from several sources, acks, cursors) in one transaction:
// group commit, so one fsync covers many batches. A batch's events and the
// cursor that follows them commit together, so a crash leaves both or
// neither. Rows hold a reference into the raw store, not the payload: the
// payload is already durable there.
//
// Events are packed into frames of up to EventsPerFrame events when they are
// appended; a frame is the unit of delivery and of acknowledgement. An acked
// frame's row is deleted; its event rows stay as tombstones for DedupeWindow
// so that a re-fetched event is recognised and not queued twice.
package queue

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	_ "github.com/mattn/go-sqlite3" // registers the sqlite3 driver

	"github.com/ingestorhq/ingestor/internal/sqliteuri"
)

// Options configure a Queue.
type Options struct {
	// Path is the SQLite database file.
	Path string
	// Synchronous is "full" (default) or "normal".
	Synchronous string
	// EventsPerFrame caps the events packed into one frame. Default 100.
	EventsPerFrame int
	// DedupeWindow is how long acked events are remembered to suppress
	// re-fetched duplicates. Default 1h.
	DedupeWindow time.Duration
	// Logger receives the queue's logs.
	Logger *slog.Logger
	// TrackSettled makes the queue remember which committed cursors are
	// settled (SettledCursors). Cluster mode sets it.
	TrackSettled bool
}

// ErrClosed is returned by calls made after Close.
var ErrClosed = errors.New("queue closed")

// Queue is the write-ahead queue. Its methods are safe for concurrent use.
type Queue struct {
	opts Options
	wdb  *sql.DB // the single writer connection
	rdb  *sql.DB // readers

	reqs    chan *request
	done    chan struct{}
	closeMu sync.RWMutex
	closed  bool

	// roomMu guards roomWaiters: the callbacks of TryAppendAsync calls that
	// found reqs full, called once the writer takes work.
	roomMu      sync.Mutex
	roomWaiters []func()

	pendingEvents atomic.Int64
	pendingFrames atomic.Int64
	// settledEvents counts the events that left the pending set (acked or
	// dead-lettered) since the queue was opened.
	settledEvents atomic.Int64
	duplicates    atomic.Int64
	// genSince is when the ledger's current generation began (unix
	// nanoseconds), and forgotten counts the remembered events generation
	// switches forgot since Open: the writer's state, published for
	// metrics.
	genSince, forgotten atomic.Int64
	// walSyncs counts the writer's fsyncs of the WAL (synchronous = normal).
	walSyncs atomic.Int64
	// expected counts the appends announced by Expect and not yet handed
	// to the writer, and expectWake wakes a writer holding lazy requests
	// for them when the count drops.
	expected   atomic.Int64
	expectWake chan struct{}
	// commits counts the writer's transactions committed: synced (FULL,
	// or every one with synchronous = normal) and lazy (NORMAL, for a
	// group of only lazy requests).
	commits [2]atomic.Int64

	// writer-goroutine state
	nextFrame int64
	// lazySync is true for a group of lazy requests (see request.lazy),
	// committed without the WAL's sync, and ownSync for a group the writer
	// syncs itself (walsync.go), with synchronous = full; connNormal is
	// true while the writer's connection runs with SQLite's NORMAL.
	lazySync, ownSync, connNormal bool
	// wal is the WAL file the writer syncs (walsync.go), and durable what
	// its syncs made durable.
	wal     *os.File
	durable durableMarks
	// insertKeys[g] inserts a frame's keys into generation g, insertKeyOne[g]
	// one key, readBack[g] finds which keys of a frame were new; insertRaw
	// and storeCursor insert a batch's raw object and cursor, frameLogs and
	// frameRows its frame_log and frames rows (ops.go).
	insertKeys, insertKeyOne, readBack [2]*sql.Stmt
	insertRaw, storeCursor             *sql.Stmt
	frameLogs, frameRows               *multiInsert
	// keysBuf is insertKeys' parameter, reused, and logBuf holds the
	// frame_log blobs of a slice (appendSlice).
	keysBuf, logBuf []byte
	// gens is the ledger's generation state (ledger.go).
	gens generations
	// verdicts and traces insert rows of event_verdicts (verdict.go) and
	// event_traces (traces.go).
	verdicts, traces *multiInsert
	settle           settleStmts
	// highSeq is the highest seq given so far (writer goroutine), and
	// marks the marks of settled cursors (settled.go).
	highSeq int64
	marks   *settledMarks
}

// Open opens (creating if needed) the queue at o.Path, applies migrations and
// starts the writer. The error is a *DamagedError when SQLite finds the
// file damaged.
func Open(o Options) (*Queue, error) {
	if o.EventsPerFrame <= 0 {
		o.EventsPerFrame = 100
	}
	if o.DedupeWindow <= 0 {
		o.DedupeWindow = time.Hour
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	sync := "FULL"
	if o.Synchronous == "normal" {
		sync = "NORMAL"
	}
	wuri, err := sqliteuri.File(o.Path, "_journal_mode=WAL&_synchronous="+sync+"&_busy_timeout=10000&_txlock=immediate&_foreign_keys=0")
	if err != nil {
		return nil, fmt.Errorf("open queue: %w", err)
	}
	ruri, err := sqliteuri.File(o.Path, "_journal_mode=WAL&_busy_timeout=10000&_query_only=1")
	if err != nil {
		return nil, fmt.Errorf("open queue: %w", err)
	}
	wdb, err := sql.Open("sqlite3", wuri)
	if err != nil {
		return nil, fmt.Errorf("open queue %s: %w", o.Path, err)
	}
	wdb.SetMaxOpenConns(1)
	wdb.SetConnMaxLifetime(0)
	wdb.SetConnMaxIdleTime(0)
	// openErr reports a failure of what follows: a *DamagedError when
	// SQLite found the file damaged.
	openErr := func(err error) error {
		if d := asDamaged(o.Path, err); d != nil {
			return d
		}
		return fmt.Errorf("open queue %s: %w", o.Path, err)
	}
	if err := migrate(wdb, o.Logger); err != nil {
		return nil, openErr(errors.Join(err, wdb.Close()))
	}
	if err := checkPragmas(wdb); err != nil {
		return nil, openErr(errors.Join(err, wdb.Close()))
	}
	rdb, err := sql.Open("sqlite3", ruri)
	if err != nil {
		return nil, fmt.Errorf("open queue %s: %w", o.Path, errors.Join(err, wdb.Close()))
	}
	rdb.SetMaxOpenConns(4)
	q := &Queue{
		opts:       o,
		wdb:        wdb,
		rdb:        rdb,
		reqs:       make(chan *request, 256),
		done:       make(chan struct{}),
		expectWake: make(chan struct{}, 1),
	}
	if err := errors.Join(q.load(), q.loadSettled(), q.prepareInserts(), q.prepareVerdicts(), q.prepareTraces(), q.prepareSettle()); err != nil {
		return nil, openErr(errors.Join(err, wdb.Close(), rdb.Close()))
	}
	if err := q.syncAtOpen(); err != nil {
		return nil, openErr(errors.Join(err, wdb.Close(), rdb.Close()))
	}
	go q.writer()
	return q, nil
}

// normalSyncInterval is how often, with synchronous = normal, the writer
// fsyncs the WAL when something was committed since the last time: a
// power cut takes at most the commits of about that long.
const normalSyncInterval = time.Second

// syncWAL fsyncs the queue's WAL file, making every commit so far durable
// (fsync flushes the file's data, whichever descriptor wrote it; a commit
// cut short after the last one is discarded by SQLite's recovery as
// usual). It reports whether it succeeded; a failure is logged and tried
// again at the next tick.
func (q *Queue) syncWAL() bool {
	f, err := os.Open(q.opts.Path + "-wal")
	if errors.Is(err, fs.ErrNotExist) {
		return true // no WAL: everything is in the database file
	}
	if err == nil {
		err = errors.Join(f.Sync(), f.Close())
	}
	if err != nil {
		q.opts.Logger.Warn("fsync of the queue's WAL failed; retrying", "path", q.opts.Path+"-wal", "err", err)
		return false
	}
	q.walSyncs.Add(1)
	return true
}

// normalFrameIDGap is how many frame ids a queue run with synchronous =
// normal skips at each open: more than could ever be committed between
// two fsyncs of its WAL.
const normalFrameIDGap = 1 << 32

// skipFrameIDs moves the frame counter on by normalFrameIDGap, durably.
// With synchronous = normal a power cut takes the commits since the WAL
// was last fsynced, their frame ids with them, while a processor may
// still hold acks of those frames in its socket: a frame given one of
// those ids again would be cleared, unread, by such a stale whole-frame
// ack. The jump is committed with synchronous = FULL, so it survives the
// next cut. Ids stay below 2^63 for two billion opens.
func (q *Queue) skipFrameIDs() error {
	q.nextFrame += normalFrameIDGap
	for _, stmt := range []string{`PRAGMA synchronous = FULL`, `UPDATE meta SET value = ` + strconv.FormatInt(q.nextFrame-1, 10) + ` WHERE key = 'frame_high'`, `PRAGMA synchronous = NORMAL`} {
		if _, err := q.wdb.Exec(stmt); err != nil {
			return fmt.Errorf("skip frame ids after a synchronous = normal start: %w", err)
		}
	}
	return nil
}

// checkPragmas asserts what the DSN asked for: a database opened by an
// older binary or copied from elsewhere must still run in WAL mode.
func checkPragmas(db *sql.DB) error {
	var mode string
	if err := db.QueryRow(`PRAGMA journal_mode`).Scan(&mode); err != nil {
		return fmt.Errorf("read journal mode: %w", err)
	}
	if !strings.EqualFold(mode, "wal") {
		return fmt.Errorf("journal mode is %q, want wal", mode)
	}
	return nil
}

// load reads the counters the writer maintains in memory. It uses
// aggregate queries over the frames table only, never the whole backlog.
func (q *Queue) load() error {
	var maxFrame, logFrame, logSeq, markSeq sql.NullInt64
	if err := q.wdb.QueryRow(`SELECT max(id) FROM frames`).Scan(&maxFrame); err != nil {
		return fmt.Errorf("load frame counter: %w", err)
	}
	// frame_log rows are inserted in seq and frame order, so the newest
	// has the highest frame id and seq; reading it by primary key avoids a
	// table scan.
	if err := q.wdb.QueryRow(`SELECT frame_id, last_seq FROM frame_log ORDER BY first_seq DESC LIMIT 1`).Scan(&logFrame, &logSeq); err != nil && !errors.Is(err, sql.ErrNoRows) {
		return fmt.Errorf("load frame counter: %w", err)
	}
	if err := q.wdb.QueryRow(`SELECT max(seq) FROM event_marks`).Scan(&markSeq); err != nil {
		return fmt.Errorf("load seq counter: %w", err)
	}
	var high, seqHigh int64
	if err := q.wdb.QueryRow(`SELECT (SELECT value FROM meta WHERE key = 'frame_high'), (SELECT value FROM meta WHERE key = 'seq_high')`).Scan(&high, &seqHigh); err != nil {
		return fmt.Errorf("load frame counter: %w", err)
	}
	q.nextFrame = max(maxFrame.Int64, logFrame.Int64, high) + 1
	q.highSeq = max(seqHigh, logSeq.Int64, markSeq.Int64)
	var err error
	if q.gens, err = loadGenerations(context.Background(), q.wdb); err != nil {
		return err
	}
	q.genSince.Store(q.gens.since)
	if q.opts.Synchronous == "normal" {
		if err := q.skipFrameIDs(); err != nil {
			return err
		}
	}
	var n, f sql.NullInt64
	if err := q.wdb.QueryRow(`SELECT sum(n), count(*) FROM frames`).Scan(&n, &f); err != nil {
		return fmt.Errorf("load pending count: %w", err)
	}
	q.pendingEvents.Store(n.Int64)
	q.pendingFrames.Store(f.Int64)
	return nil
}

// PendingEvents returns the number of events queued and not yet acked.
func (q *Queue) PendingEvents() int64 { return q.pendingEvents.Load() }

// SettledEvents returns how many events left the pending set, acked or
// dead-lettered, since Open: its growth over time is the queue's drain
// rate.
func (q *Queue) SettledEvents() int64 { return q.settledEvents.Load() }

// Duplicates returns how many arrivals of already known events were
// dropped since Open; each also raised the event's attempts column.
func (q *Queue) Duplicates() int64 { return q.duplicates.Load() }

// LedgerGeneration returns when the ledger's current generation began
// (ledger.go): remembered events are forgotten a generation at a time once
// it is older than the dedupe window.
func (q *Queue) LedgerGeneration() time.Time { return time.Unix(0, q.genSince.Load()) }

// Forgotten returns how many remembered events generation switches forgot
// since Open.
func (q *Queue) Forgotten() int64 { return q.forgotten.Load() }

// PendingFrames returns the number of frames queued and not yet acked.
func (q *Queue) PendingFrames() int64 { return q.pendingFrames.Load() }

// Close stops the writer after the work already submitted and closes the
// database. Calls after Close return ErrClosed.
func (q *Queue) Close() error {
	q.closeMu.Lock()
	if q.closed {
		q.closeMu.Unlock()
		return nil
	}
	q.closed = true
	close(q.reqs)
	q.closeMu.Unlock()
	<-q.done
	var errs []error
	for _, st := range []*sql.Stmt{q.insertKeys[0], q.insertKeys[1], q.insertKeyOne[0], q.insertKeyOne[1], q.readBack[0], q.readBack[1],
		q.insertRaw, q.storeCursor} {
		if st != nil {
			errs = append(errs, st.Close())
		}
	}
	errs = append(errs, q.verdicts.close(), q.traces.close(), q.frameLogs.close(), q.frameRows.close(), q.settle.close(), q.rdb.Close(), q.wdb.Close())
	if q.wal != nil {
		errs = append(errs, q.wal.Close())
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("close queue %s: %w", q.opts.Path, err)
	}
	return nil
}

// request is one unit of work for the writer. apply runs inside the group
// transaction under its own savepoint; finished then runs on the writer
// goroutine with the outcome: apply's error, or the commit's.
type request struct {
	apply    func(tx *sql.Tx) error
	finished func(err error)
	// lazy marks a request whose commit need not wait for an fsync:
	// settling acks and nacks and counting deliveries. Losing one to a
	// power cut (never to a crash of the process, whose writes the kernel
	// keeps) only sends its events again, which at-least-once delivery
	// allows. A group of lazy requests only commits with synchronous =
	// NORMAL; the next group holding anything else commits with FULL,
	// whose fsync of the WAL makes every earlier commit durable too, in
	// order.
	lazy bool
	// gate, for an append whose raw payload is still being written
	// (AppendAfter), yields the write's outcome; the request commits only
	// after it yielded nil (gate.go).
	gate <-chan error
}

// enqueue hands r to the writer without waiting for its commit.
func (q *Queue) enqueue(ctx context.Context, r *request) error {
	q.closeMu.RLock()
	defer q.closeMu.RUnlock()
	if q.closed {
		return ErrClosed
	}
	select {
	case q.reqs <- r:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// tryEnqueue hands r to the writer if it has room; otherwise it returns
// ErrFull and calls room once the writer takes work. The check and the
// registration happen under roomMu, which the writer takes after emptying
// reqs, so a room callback is never missed.
func (q *Queue) tryEnqueue(r *request, room func()) error {
	q.closeMu.RLock()
	defer q.closeMu.RUnlock()
	if q.closed {
		return ErrClosed
	}
	q.roomMu.Lock()
	defer q.roomMu.Unlock()
	select {
	case q.reqs <- r:
		return nil
	default:
		q.roomWaiters = append(q.roomWaiters, room)
		return ErrFull
	}
}

// callRoomWaiters calls, on the writer goroutine, the callbacks of the
// TryAppendAsync calls that found reqs full.
func (q *Queue) callRoomWaiters() {
	q.roomMu.Lock()
	waiters := q.roomWaiters
	q.roomWaiters = nil
	q.roomMu.Unlock()
	for _, room := range waiters {
		room()
	}
}

// submit hands r to the writer and waits for its commit. Once enqueued, the
// request is committed or failed even if ctx ends: submit waits for the
// outcome so the caller knows what happened. committed, if set, runs on the
// writer goroutine after a successful commit.
func (q *Queue) submit(ctx context.Context, r *request, committed func()) error {
	errc := make(chan error, 1)
	r.finished = func(err error) {
		if err == nil && committed != nil {
			committed()
		}
		errc <- err
	}
	if err := q.enqueue(ctx, r); err != nil {
		return err
	}
	return <-errc
}

// syncFor sets how group's commit is made durable, with synchronous =
// full: a group of only lazy requests commits with SQLite's NORMAL and no
// sync; a group holding a push group's append (gated: a request of
// AppendAfter) commits with NORMAL and the writer's own sync of the WAL
// (walsync.go); any other with FULL, SQLite syncing the WAL in its
// COMMIT. With normal the connection stays NORMAL.
func (q *Queue) syncFor(group []*request, gated bool) error {
	q.lazySync, q.ownSync = false, false
	if !q.ownWALSync() {
		return nil
	}
	switch {
	case allLazy(group):
		q.lazySync = true
	case gated:
		q.ownSync = true
	}
	normal := q.lazySync || q.ownSync
	if normal == q.connNormal {
		return nil
	}
	mode := "FULL"
	if normal {
		mode = "NORMAL"
	}
	if _, err := q.wdb.Exec("PRAGMA synchronous = " + mode); err != nil {
		return fmt.Errorf("set synchronous = %s: %w", mode, err)
	}
	q.connNormal = normal
	return nil
}

// maxGroup caps the requests committed in one transaction.
const maxGroup = 128

func (q *Queue) writer() {
	defer close(q.done)
	// Waiters left when reqs closes try again and get ErrClosed.
	defer q.callRoomWaiters()
	group := make([]*request, 0, maxGroup)
	errs := make([]error, 0, maxGroup)
	// With synchronous = normal SQLite fsyncs the WAL only at a checkpoint,
	// which may be hours apart on a quiet daemon: the writer fsyncs it
	// itself every normalSyncInterval after a commit, which bounds what a
	// power cut can take.
	var syncTick <-chan time.Time
	if q.opts.Synchronous == "normal" {
		t := time.NewTicker(normalSyncInterval)
		defer t.Stop()
		syncTick = t.C
	}
	unsynced := false
	for {
		var r *request
		select {
		case next, ok := <-q.reqs:
			if !ok {
				return
			}
			r = next
		case <-syncTick:
			if unsynced {
				unsynced = !q.syncWAL()
			}
			continue
		}
		unsynced = true
		group = append(group[:0], r)
	fill:
		for len(group) < maxGroup {
			select {
			case r, ok := <-q.reqs:
				if !ok {
					break fill
				}
				group = append(group, r)
			default:
				break fill
			}
		}
		group = q.holdLazy(group)
		q.callRoomWaiters()
		errs = errs[:0]
		err := q.commitGroup(group, &errs)
		if err == nil {
			q.commits[b2i(q.lazySync)].Add(1)
		}
		for i, r := range group {
			if errs[i] == errDeferred {
				continue // finished once applied again (deferGated)
			}
			e := err
			if e == nil {
				e = errs[i]
			}
			r.finished(e)
		}
	}
}

// Commits returns how many transactions the writer committed since Open:
// synced ones (with synchronous = full, those whose commit fsynced the
// WAL) and lazy ones (a group of only acks and nacks, with full).
func (q *Queue) Commits() (synced, lazy int64) {
	return q.commits[0].Load(), q.commits[1].Load()
}

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}

// holdingLazy, when set (by a test), is called when the writer starts
// holding a group of lazy requests for an expected append.
var holdingLazy func()

// maxLazyHold bounds how long the writer holds a group of lazy requests
// for an append announced by Expect.
const maxLazyHold = 5 * time.Millisecond

// Expect announces an append of the caller's that follows within about a
// raw write's time (the push inbox calls it before a group's raw write);
// the caller calls done once the append is committed, or will not be.
// While an append is expected, the writer holds a group of only lazy
// requests (acks and nacks) for it, up to maxLazyHold, and commits them
// in its transaction: one transaction and one WAL sync instead of two,
// and the pages both change (the frames table's) written once. On the
// webhook path, where a processor's ack of one group arrives while the
// next group is being written to the raw store, that took a commit off
// every group. A lazy request waits for its commit anyway, and an ack
// settled a millisecond later holds its frame in the sender's window that
// much longer, which the window's 256 frames absorb. A wake-up left over
// from a done nobody waited for only makes the next hold look again.
func (q *Queue) Expect() (done func()) {
	q.expected.Add(1)
	var once sync.Once
	return func() {
		once.Do(func() {
			if q.expected.Add(-1) == 0 {
				select {
				case q.expectWake <- struct{}{}:
				default:
				}
			}
		})
	}
}

// holdLazy returns group, a group of only lazy requests, with the
// requests that reach the writer while an append is expected (Expect),
// up to maxLazyHold and maxGroup; any other group as it is.
func (q *Queue) holdLazy(group []*request) []*request {
	if q.expected.Load() == 0 || !allLazy(group) {
		return group
	}
	if holdingLazy != nil {
		holdingLazy()
	}
	timer := time.NewTimer(maxLazyHold)
	defer timer.Stop()
	for len(group) < maxGroup && q.expected.Load() > 0 {
		select {
		case r, ok := <-q.reqs:
			if !ok {
				return group
			}
			group = append(group, r)
			if !r.lazy {
				return group
			}
		case <-q.expectWake:
		case <-timer.C:
			return group
		}
	}
	return group
}

// allLazy reports whether every request of group is lazy.
func allLazy(group []*request) bool {
	for _, r := range group {
		if !r.lazy {
			return false
		}
	}
	return true
}

// commitGroup applies every request under its own savepoint (a failing
// request is rolled back alone), the gated ones last, once their raw
// writes ended (applyGated), and commits once; errs gets each request's
// outcome, by its index in group.
func (q *Queue) commitGroup(group []*request, errs *[]error) error {
	*errs = (*errs)[:0]
	gated := false
	for _, r := range group {
		*errs = append(*errs, nil)
		gated = gated || r.gate != nil
	}
	if err := q.durable.err(); err != nil {
		return err
	}
	if err := q.syncFor(group, gated); err != nil {
		return err
	}
	tx, err := q.wdb.Begin()
	if err != nil {
		return fmt.Errorf("begin: %w", err)
	}
	for i, r := range group {
		if r.gate == nil {
			if (*errs)[i], err = q.applyOne(tx, r); err != nil {
				return errors.Join(err, tx.Rollback())
			}
		}
	}
	if gated {
		if err := q.applyGated(tx, group, *errs); err != nil {
			return errors.Join(err, tx.Rollback())
		}
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("commit: %w", err)
	}
	switch {
	case q.ownSync:
		return q.syncCommitted()
	case !q.lazySync: // FULL synced it, or synchronous = normal shows it
		q.durable.set(q.nextFrame-1, q.highSeq)
	}
	return nil
}

// applyOne applies r under its own savepoint, rolled back when r fails:
// r's error, and the error that ends the transaction.
func (q *Queue) applyOne(tx *sql.Tx, r *request) (rerr, err error) {
	if _, err := tx.Exec(`SAVEPOINT req`); err != nil {
		return nil, fmt.Errorf("savepoint: %w", err)
	}
	rerr = r.apply(tx)
	if rerr != nil {
		if _, err := tx.Exec(`ROLLBACK TO req`); err != nil {
			return rerr, fmt.Errorf("rollback to savepoint: %w", errors.Join(err, rerr))
		}
	}
	if _, err := tx.Exec(`RELEASE req`); err != nil {
		return rerr, fmt.Errorf("release savepoint: %w", err)
	}
	return rerr, nil
}
