package edge

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"
	"sync"
	"time"

	_ "github.com/mattn/go-sqlite3" // the outbox database

	"github.com/ingestorhq/ingestor/internal/datadir"
	"github.com/ingestorhq/ingestor/internal/devicewire"
	"github.com/ingestorhq/ingestor/internal/durable"
	"github.com/ingestorhq/ingestor/internal/sqliteuri"
)

// outboxSchema is the outbox database: the envelopes waiting for their
// ACK, the per-device seq counters, and the envelopes the daemon rejected.
const outboxSchema = `
CREATE TABLE IF NOT EXISTS outbox (
	id           INTEGER PRIMARY KEY AUTOINCREMENT,
	event_id     TEXT    NOT NULL,
	envelope     BLOB    NOT NULL,
	size         INTEGER NOT NULL,
	attempts     INTEGER NOT NULL DEFAULT 0,
	next_attempt INTEGER NOT NULL DEFAULT 0,
	last_error   TEXT    NOT NULL DEFAULT '',
	created_at   INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS seq (
	device_id TEXT PRIMARY KEY,
	last      INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS dead_letters (
	id         INTEGER PRIMARY KEY AUTOINCREMENT,
	event_id   TEXT    NOT NULL,
	envelope   BLOB    NOT NULL,
	reason     TEXT    NOT NULL,
	attempts   INTEGER NOT NULL,
	created_at INTEGER NOT NULL,
	failed_at  INTEGER NOT NULL
);
`

// ErrOutboxFull is returned by Add when the envelopes would take the
// outbox past its byte limit. Nothing was stored; the producer may try
// again once the daemon has acknowledged some of the backlog.
var ErrOutboxFull = errors.New("outbox full")

// maxDeadLetters bounds the local dead-letter table: when a rejection
// would exceed it, the oldest dead letters are dropped (and logged), so a
// device that keeps producing invalid events cannot fill its disk.
const maxDeadLetters = 10_000

// outbox is the forwarder's SQLite file. Every method is safe for
// concurrent use. New events go through one committer goroutine, which
// stores the requests waiting together in one transaction (a group
// commit: one fsync for many producers).
type outbox struct {
	path     string
	maxBytes int64
	log      *slog.Logger
	db       *sql.DB
	unlock   func() error
	// notify has a value when rows were added since the sender last looked.
	notify chan struct{}
	// adds takes requests to the committer; stopping is closed by close,
	// committed when the committer has returned.
	adds      chan *addRequest
	stopping  chan struct{}
	committed chan struct{}

	mu     sync.Mutex // guards what follows
	bytes  int64
	events int64
	closed bool
}

// addRequest is one caller's items waiting for the group commit.
type addRequest struct {
	ctx   context.Context
	items []*envelope
	done  chan error
}

// maxGroup bounds how many waiting requests one commit takes.
const maxGroup = 256

// row is one pending envelope as the sender sees it.
type row struct {
	id      int64
	eventID string
	env     []byte
}

// openOutbox opens (creating if needed) the outbox at path, locking its
// directory against a second forwarder. Every row's next_attempt is
// reset, so that a start resends the whole backlog at once whatever the
// clock did while the device was off.
func openOutbox(ctx context.Context, path string, maxBytes int64, log *slog.Logger) (*outbox, error) {
	dir := filepath.Dir(path)
	if err := durable.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("outbox %s: create directory: %w", path, err)
	}
	unlock, err := datadir.Lock(dir)
	if err != nil {
		return nil, fmt.Errorf("outbox %s: %w", path, err)
	}
	db, err := openDB(path)
	if err != nil {
		return nil, errors.Join(err, unlock())
	}
	o := &outbox{path: path, maxBytes: maxBytes, log: log, db: db, unlock: unlock, notify: make(chan struct{}, 1),
		adds: make(chan *addRequest), stopping: make(chan struct{}), committed: make(chan struct{})}
	if err := o.init(ctx); err != nil {
		return nil, errors.Join(err, db.Close(), unlock())
	}
	go o.commitLoop()
	return o, nil
}

// openDB opens the SQLite file at path in WAL mode with synchronous =
// FULL: a commit returns only once it is on disk.
func openDB(path string) (*sql.DB, error) {
	dsn, err := sqliteuri.File(path, "_journal_mode=WAL&_synchronous=FULL&_busy_timeout=10000&_txlock=immediate")
	if err != nil {
		return nil, fmt.Errorf("outbox: %w", err)
	}
	db, err := sql.Open("sqlite3", dsn)
	if err != nil {
		return nil, fmt.Errorf("outbox: open %s: %w", path, err)
	}
	db.SetMaxOpenConns(1)
	return db, nil
}

func (o *outbox) init(ctx context.Context) error {
	if _, err := o.db.ExecContext(ctx, outboxSchema); err != nil {
		return fmt.Errorf("outbox %s: create tables: %w", o.path, err)
	}
	if _, err := o.db.ExecContext(ctx, `UPDATE outbox SET next_attempt = 0 WHERE next_attempt != 0`); err != nil {
		return fmt.Errorf("outbox %s: reset retry times: %w", o.path, err)
	}
	if err := o.db.QueryRowContext(ctx, `SELECT COUNT(*), COALESCE(SUM(size), 0) FROM outbox`).Scan(&o.events, &o.bytes); err != nil {
		return fmt.Errorf("outbox %s: count the backlog: %w", o.path, err)
	}
	return nil
}

// close stops the committer (after the group it is committing), closes
// the database and releases the lock. Add fails afterwards.
func (o *outbox) close() error {
	o.mu.Lock()
	if o.closed {
		o.mu.Unlock()
		return nil
	}
	o.closed = true
	o.mu.Unlock()
	close(o.stopping)
	<-o.committed
	return errors.Join(o.db.Close(), o.unlock())
}

// backlog returns the number of pending envelopes and their bytes.
func (o *outbox) backlog() (events, bytes int64) {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.events, o.bytes
}

// add stores items in one transaction, giving each envelope that lacks a
// seq the next value of its device's counter, and sets each item's raw to
// the bytes stored. It returns only after the commit is on disk; on any
// error nothing of items was stored (and they may be passed again). It
// fails with ErrOutboxFull when the items do not fit under the byte
// limit. Concurrent calls share one commit. Once the committer has taken
// the items, they are committed even if ctx ends meanwhile.
func (o *outbox) add(ctx context.Context, items []*envelope) error {
	req := &addRequest{ctx: ctx, items: items, done: make(chan error, 1)}
	select {
	case o.adds <- req:
		return <-req.done
	case <-ctx.Done():
		return ctx.Err()
	case <-o.stopping:
		return errors.New("outbox is closed")
	}
}

// commitLoop is the committer: it takes a request and every other one
// already waiting, up to maxGroup, and commits them together, until close.
func (o *outbox) commitLoop() {
	defer close(o.committed)
	for {
		var group []*addRequest
		select {
		case r := <-o.adds:
			group = append(group, r)
		case <-o.stopping:
			return
		}
	more:
		for len(group) < maxGroup {
			select {
			case r := <-o.adds:
				group = append(group, r)
			default:
				break more
			}
		}
		o.commitGroup(group)
	}
}

// commitGroup stores the requests of group in one transaction, each whole
// or not at all, and answers each.
func (o *outbox) commitGroup(group []*addRequest) {
	results := make([]error, len(group))
	answer := func(err error) {
		for i, r := range group {
			if err != nil && results[i] == nil {
				results[i] = err
			}
			r.done <- results[i]
		}
	}
	o.mu.Lock()
	pending := o.bytes
	o.mu.Unlock()
	// The commit is not cut short by one caller's context: a request the
	// committer took is committed, or failed for every caller, as a whole.
	ctx := context.Background()
	tx, err := o.db.BeginTx(ctx, nil)
	if err != nil {
		answer(fmt.Errorf("outbox: begin: %w", err))
		return
	}
	now := time.Now().UnixMilli()
	var added, events int64
	for i, r := range group {
		if err := r.ctx.Err(); err != nil {
			results[i] = err // the producer left before its turn: it heard no OK
			continue
		}
		size, err := o.store(ctx, tx, r.items, now, pending+added)
		if err != nil && !errors.Is(err, ErrOutboxFull) {
			answer(errors.Join(err, tx.Rollback()))
			return
		}
		results[i] = err
		if err == nil {
			added += size
			events += int64(len(r.items))
		}
	}
	if err := tx.Commit(); err != nil {
		answer(fmt.Errorf("outbox: commit: %w", err))
		return
	}
	o.mu.Lock()
	o.bytes += added
	o.events += events
	o.mu.Unlock()
	if events > 0 {
		select {
		case o.notify <- struct{}{}:
		default:
		}
	}
	answer(nil)
}

// store stores items in tx under a savepoint, so that a request that
// does not fit on top of pending bytes leaves nothing behind (not even
// the seq values it took). It returns the bytes stored.
func (o *outbox) store(ctx context.Context, tx *sql.Tx, items []*envelope, now, pending int64) (int64, error) {
	if _, err := tx.ExecContext(ctx, `SAVEPOINT add_request`); err != nil {
		return 0, fmt.Errorf("outbox: savepoint: %w", err)
	}
	var size int64
	for _, e := range items {
		e.raw = e.Base
		if e.NeedSeq {
			var seq int64
			if err := tx.QueryRowContext(ctx, `INSERT INTO seq (device_id, last) VALUES (?, 1)
				ON CONFLICT (device_id) DO UPDATE SET last = last + 1 RETURNING last`, e.DeviceID).Scan(&seq); err != nil {
				return 0, fmt.Errorf("outbox: next seq of device %q: %w", e.DeviceID, err)
			}
			e.raw = e.WithSeq(seq)
		}
		size += int64(len(e.raw))
	}
	if pending+size > o.maxBytes {
		if _, err := tx.ExecContext(ctx, `ROLLBACK TO add_request; RELEASE add_request`); err != nil {
			return 0, fmt.Errorf("outbox: roll back to the savepoint: %w", err)
		}
		return 0, fmt.Errorf("%w: %d bytes pending of max_outbox_bytes %d, %d event(s) of %d bytes refused",
			ErrOutboxFull, pending, o.maxBytes, len(items), size)
	}
	for _, e := range items {
		if _, err := tx.ExecContext(ctx, `INSERT INTO outbox (event_id, envelope, size, created_at) VALUES (?, ?, ?, ?)`,
			e.EventID, e.raw, len(e.raw), now); err != nil {
			return 0, fmt.Errorf("outbox: store event %s: %w", e.EventID, err)
		}
	}
	if _, err := tx.ExecContext(ctx, `RELEASE add_request`); err != nil {
		return 0, fmt.Errorf("outbox: release the savepoint: %w", err)
	}
	return size, nil
}

// stats reads the backlog for a scrape; a failed read is logged and
// reads as empty.
func (o *outbox) stats() Stats {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	s, err := readStats(ctx, o.db)
	if err != nil {
		o.log.Warn("outbox stats for metrics", "err", err)
	}
	return s
}

// pending returns up to limit envelopes due now (next_attempt passed), in
// the order they were stored, leaving out the ids in skip.
func (o *outbox) pending(ctx context.Context, limit int, skip map[int64]bool) ([]row, error) {
	rows, err := o.db.QueryContext(ctx, `SELECT id, event_id, envelope FROM outbox WHERE next_attempt <= ? ORDER BY id LIMIT ?`,
		time.Now().UnixMilli(), limit+len(skip))
	if err != nil {
		return nil, fmt.Errorf("outbox: read pending: %w", err)
	}
	var out []row
	for rows.Next() {
		var r row
		if err := rows.Scan(&r.id, &r.eventID, &r.env); err != nil {
			return nil, errors.Join(fmt.Errorf("outbox: read pending: %w", err), rows.Close())
		}
		if !skip[r.id] && len(out) < limit {
			out = append(out, r)
		}
	}
	if err := errors.Join(rows.Err(), rows.Close()); err != nil {
		return nil, fmt.Errorf("outbox: read pending: %w", err)
	}
	return out, nil
}

// nextDue returns when the earliest envelope waiting out a retry is due,
// or false when none waits.
func (o *outbox) nextDue(ctx context.Context) (time.Time, bool, error) {
	var ms sql.NullInt64
	if err := o.db.QueryRowContext(ctx, `SELECT MIN(next_attempt) FROM outbox WHERE next_attempt > ?`, time.Now().UnixMilli()).Scan(&ms); err != nil {
		return time.Time{}, false, fmt.Errorf("outbox: next retry time: %w", err)
	}
	return time.UnixMilli(ms.Int64), ms.Valid, nil
}

// sent counts one more attempt for each of ids.
func (o *outbox) sent(ctx context.Context, ids []int64) error {
	return o.tx(ctx, "count attempts", func(tx *sql.Tx) error { return countAttempts(ctx, tx, ids) })
}

// countAttempts adds one to the attempts of each of ids in tx.
func countAttempts(ctx context.Context, tx *sql.Tx, ids []int64) error {
	for _, id := range ids {
		if _, err := tx.ExecContext(ctx, `UPDATE outbox SET attempts = attempts + 1 WHERE id = ?`, id); err != nil {
			return err
		}
	}
	return nil
}

// outcome is the daemon's answer about one stored row.
type outcome struct {
	id     int64
	status string // stored, rejected or retry
	reason string
	// retryAt is when a "retry" row is due again.
	retryAt time.Time
}

// settle counts one more attempt for each of sent, then applies outcomes,
// in one transaction: a stored row is deleted, a rejected one moved to the
// dead letters with its reason, a retried one kept with its next attempt
// time and the reason as its last error. It returns how many dead letters
// were dropped to respect maxDeadLetters.
func (o *outbox) settle(ctx context.Context, sent []int64, outs []outcome) (dropped int64, err error) {
	var freed, gone int64
	err = o.tx(ctx, "settle acks", func(tx *sql.Tx) error {
		if err := countAttempts(ctx, tx, sent); err != nil {
			return err
		}
		now := time.Now().UnixMilli()
		for _, out := range outs {
			var size int64
			switch out.status {
			case devicewire.StatusStored:
				if err := tx.QueryRowContext(ctx, `DELETE FROM outbox WHERE id = ? RETURNING size`, out.id).Scan(&size); err != nil {
					if errors.Is(err, sql.ErrNoRows) {
						continue
					}
					return err
				}
			case devicewire.StatusRejected:
				if _, err := tx.ExecContext(ctx, `INSERT INTO dead_letters (event_id, envelope, reason, attempts, created_at, failed_at)
					SELECT event_id, envelope, ?, attempts, created_at, ? FROM outbox WHERE id = ?`, out.reason, now, out.id); err != nil {
					return err
				}
				if err := tx.QueryRowContext(ctx, `DELETE FROM outbox WHERE id = ? RETURNING size`, out.id).Scan(&size); err != nil {
					if errors.Is(err, sql.ErrNoRows) {
						continue
					}
					return err
				}
			case devicewire.StatusRetry:
				if _, err := tx.ExecContext(ctx, `UPDATE outbox SET next_attempt = ?, last_error = ? WHERE id = ?`,
					out.retryAt.UnixMilli(), out.reason, out.id); err != nil {
					return err
				}
				continue
			}
			freed += size
			gone++
		}
		res, err := tx.ExecContext(ctx, `DELETE FROM dead_letters WHERE id <= (SELECT MAX(id) FROM dead_letters) - ?`, maxDeadLetters)
		if err != nil {
			return err
		}
		dropped, err = res.RowsAffected()
		return err
	})
	if err != nil {
		return 0, err
	}
	o.mu.Lock()
	o.bytes -= freed
	o.events -= gone
	o.mu.Unlock()
	return dropped, nil
}

// tx runs fn in one transaction, naming what in its error.
func (o *outbox) tx(ctx context.Context, what string, fn func(*sql.Tx) error) (err error) {
	tx, err := o.db.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("outbox: %s: begin: %w", what, err)
	}
	if err := fn(tx); err != nil {
		return fmt.Errorf("outbox: %s: %w", what, errors.Join(err, tx.Rollback()))
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("outbox: %s: commit: %w", what, err)
	}
	return nil
}
