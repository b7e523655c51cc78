package edge

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"time"

	_ "github.com/mattn/go-sqlite3" // the outbox database

	"github.com/ingestorhq/ingestor/internal/datadir"
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
// concurrent use; writes are serialized by mu, which also guards the byte
// count that enforces the limit.
type outbox struct {
	path     string
	maxBytes int64
	log      *slog.Logger
	db       *sql.DB
	unlock   func() error
	// notify has a value when rows were added since the sender last looked.
	notify chan struct{}

	mu     sync.Mutex
	bytes  int64
	events int64
	closed bool
}

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
	if err := os.MkdirAll(dir, 0o700); err != nil {
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
	o := &outbox{path: path, maxBytes: maxBytes, log: log, db: db, unlock: unlock, notify: make(chan struct{}, 1)}
	if err := o.init(ctx); err != nil {
		return nil, errors.Join(err, db.Close(), unlock())
	}
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

// close closes the database and releases the lock. Add fails afterwards.
func (o *outbox) close() error {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.closed {
		return nil
	}
	o.closed = true
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
// error nothing was stored (and items may be passed again). It fails with
// ErrOutboxFull when the items do not fit under the byte limit.
func (o *outbox) add(ctx context.Context, items []*envelope) (err error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.closed {
		return errors.New("outbox is closed")
	}
	tx, err := o.db.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("outbox: begin: %w", err)
	}
	defer func() {
		if err != nil {
			err = errors.Join(err, tx.Rollback())
		}
	}()
	now := time.Now().UnixMilli()
	var added int64
	for _, e := range items {
		e.raw = e.base
		if e.needSeq {
			var seq int64
			if err := tx.QueryRowContext(ctx, `INSERT INTO seq (device_id, last) VALUES (?, 1)
				ON CONFLICT (device_id) DO UPDATE SET last = last + 1 RETURNING last`, e.deviceID).Scan(&seq); err != nil {
				return fmt.Errorf("outbox: next seq of device %q: %w", e.deviceID, err)
			}
			e.raw = withSeq(e.base, seq)
		}
		added += int64(len(e.raw))
	}
	if o.bytes+added > o.maxBytes {
		return fmt.Errorf("%w: %d bytes pending of max_outbox_bytes %d, %d event(s) of %d bytes refused",
			ErrOutboxFull, o.bytes, o.maxBytes, len(items), added)
	}
	for _, e := range items {
		if _, err := tx.ExecContext(ctx, `INSERT INTO outbox (event_id, envelope, size, created_at) VALUES (?, ?, ?, ?)`,
			e.eventID, e.raw, len(e.raw), now); err != nil {
			return fmt.Errorf("outbox: store event %s: %w", e.eventID, err)
		}
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("outbox: commit: %w", err)
	}
	o.bytes += added
	o.events += int64(len(items))
	select {
	case o.notify <- struct{}{}:
	default:
	}
	return nil
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
			case statusStored:
				if err := tx.QueryRowContext(ctx, `DELETE FROM outbox WHERE id = ? RETURNING size`, out.id).Scan(&size); err != nil {
					if errors.Is(err, sql.ErrNoRows) {
						continue
					}
					return err
				}
			case statusRejected:
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
			case statusRetry:
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
