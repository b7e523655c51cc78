package processor

import (
	"context"
	"database/sql"
	"errors"
	"fmt"

	// The dedupe store and the exactly-once path use SQLite.
	_ "github.com/mattn/go-sqlite3"

	"github.com/ingestorhq/ingestor/internal/sqliteuri"
)

// processedSchema creates the table of processed (source, key) pairs, used
// both by Options.DedupeDB and by RunTx in the handler's database.
const processedSchema = `CREATE TABLE IF NOT EXISTS processed (
	source TEXT NOT NULL,
	key TEXT NOT NULL,
	processed_at INTEGER NOT NULL,
	PRIMARY KEY (source, key)
) WITHOUT ROWID`

const (
	selectProcessed = `SELECT 1 FROM processed WHERE source = ? AND key = ?`
	insertProcessed = `INSERT INTO processed (source, key, processed_at) VALUES (?, ?, ?)`
	// recordProcessed tolerates a pair another processor recorded first.
	recordProcessed = `INSERT OR IGNORE INTO processed (source, key, processed_at) VALUES (?, ?, ?)`
)

// dedupeStore is the processed-key store of Options.DedupeDB: a SQLite
// table with an LRU cache in front.
type dedupeStore struct {
	path  string
	db    *sql.DB
	cache *keyCache
	clock *keyClock
}

// openDedupe opens (creating if needed) the dedupe database at path.
func openDedupe(ctx context.Context, path string, cacheSize int) (*dedupeStore, error) {
	dsn, err := sqliteuri.File(path, "_journal_mode=WAL&_synchronous=NORMAL&_busy_timeout=10000&_txlock=immediate")
	if err != nil {
		return nil, fmt.Errorf("processor: %w", err)
	}
	db, err := sql.Open("sqlite3", dsn)
	if err != nil {
		return nil, fmt.Errorf("processor: open dedupe database %s: %w", path, err)
	}
	if _, err := db.ExecContext(ctx, processedSchema); err != nil {
		return nil, errors.Join(fmt.Errorf("processor: dedupe database %s: create table processed: %w", path, err), db.Close())
	}
	clock, err := openClock(ctx, db)
	if err != nil {
		return nil, errors.Join(fmt.Errorf("processor: dedupe database %s: %w", path, err), db.Close())
	}
	return &dedupeStore{path: path, db: db, cache: newKeyCache(cacheSize), clock: clock}, nil
}

// seen reports whether (source, key) was processed.
func (d *dedupeStore) seen(ctx context.Context, source, key string) (bool, error) {
	if d.cache.has(source, key) {
		return true, nil
	}
	var one int
	err := d.db.QueryRowContext(ctx, selectProcessed, source, key).Scan(&one)
	switch {
	case err == nil:
		d.cache.add(source, key)
		return true, nil
	case errors.Is(err, sql.ErrNoRows):
		return false, nil
	default:
		return false, fmt.Errorf("processor: dedupe database %s: look up %s/%s: %w", d.path, source, key, err)
	}
}

// record marks evs processed, in one transaction.
func (d *dedupeStore) record(ctx context.Context, evs []*Event) (err error) {
	tx, err := d.db.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("processor: dedupe database %s: begin: %w", d.path, err)
	}
	defer func() {
		if err != nil {
			if rerr := tx.Rollback(); rerr != nil && !errors.Is(rerr, sql.ErrTxDone) {
				err = errors.Join(err, rerr)
			}
		}
	}()
	now := d.clock.now()
	for _, ev := range evs {
		if _, err := tx.ExecContext(ctx, recordProcessed, ev.Source, ev.Key, now); err != nil {
			return fmt.Errorf("processor: dedupe database %s: record %s/%s: %w", d.path, ev.Source, ev.Key, err)
		}
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("processor: dedupe database %s: commit: %w", d.path, err)
	}
	for _, ev := range evs {
		d.cache.add(ev.Source, ev.Key)
	}
	return nil
}

func (d *dedupeStore) close() error { return d.db.Close() }
