package processor

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"
)

// The processed table's retention (Options.DedupeRetention) counts the
// processor's running time, not the wall clock: a key applied just before
// a crash may come again whenever the daemon resends its unacked frame,
// which is once a processor is back, however long that takes (PROTOCOL.md,
// "How long to remember a key"). So processed_at holds the processor's
// clock: it starts at the wall time when the database is first used, and
// advances only while a Client runs; processed_clock keeps it across
// restarts. Downtime never ages a key.
const retentionSchema = `CREATE TABLE IF NOT EXISTS processed_clock (
	id INTEGER PRIMARY KEY CHECK (id = 1),
	now INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS processed_by_time ON processed(processed_at)`

const (
	selectClock = `SELECT now FROM processed_clock WHERE id = 1`
	storeClock  = `INSERT INTO processed_clock (id, now) VALUES (1, ?) ON CONFLICT (id) DO UPDATE SET now = max(now, excluded.now)`
	// forgetBatch deletes at most forgetLimit keys older than the bound.
	forgetBatch = `DELETE FROM processed WHERE (source, key) IN
	(SELECT source, key FROM processed WHERE processed_at < ? ORDER BY processed_at LIMIT ?)`
	forgetLimit = 1000
)

// DefaultDedupeRetention is Options.DedupeRetention's default: a week of
// the processor's running time.
const DefaultDedupeRetention = 7 * 24 * time.Hour

// keyClock is the processor's clock of a processed table (see
// retentionSchema): base, read from processed_clock, plus the time since
// started.
type keyClock struct {
	base    int64
	started time.Time
}

// now returns the clock in nanoseconds.
func (k *keyClock) now() int64 { return k.base + int64(time.Since(k.started)) }

// openClock creates the clock table and the index retention deletes by,
// and reads the clock (starting it at the wall time when it is new).
func openClock(ctx context.Context, db *sql.DB) (*keyClock, error) {
	if _, err := db.ExecContext(ctx, retentionSchema); err != nil {
		return nil, fmt.Errorf("create processed_clock: %w", err)
	}
	k := &keyClock{started: time.Now()}
	switch err := db.QueryRowContext(ctx, selectClock).Scan(&k.base); {
	case errors.Is(err, sql.ErrNoRows):
		k.base = time.Now().UnixNano()
		if _, err := db.ExecContext(ctx, storeClock, k.base); err != nil {
			return nil, fmt.Errorf("start processed_clock: %w", err)
		}
	case err != nil:
		return nil, fmt.Errorf("read processed_clock: %w", err)
	}
	return k, nil
}

// forgetter deletes the processed keys older than the retention, off the
// hot path: a goroutine every interval, in batches of forgetLimit, each
// its own short transaction.
type forgetter struct {
	db        *sql.DB
	clock     *keyClock
	retention time.Duration
	interval  time.Duration
	log       *slog.Logger
	forgotten *atomic.Int64
}

// run forgets old keys and saves the clock every interval until ctx ends,
// then saves the clock once more.
func (f *forgetter) run(ctx context.Context) {
	t := time.NewTicker(f.interval)
	defer t.Stop()
	for {
		if err := f.pass(ctx); err != nil && ctx.Err() == nil {
			f.log.Warn("processor: forget processed keys past the retention", "err", err)
		}
		select {
		case <-ctx.Done():
			if _, err := f.db.ExecContext(context.WithoutCancel(ctx), storeClock, f.clock.now()); err != nil {
				f.log.Warn("processor: save processed_clock", "err", err)
			}
			return
		case <-t.C:
		}
	}
}

// pass saves the clock, then deletes the keys processed more than the
// retention ago by it, a batch at a time.
func (f *forgetter) pass(ctx context.Context) error {
	now := f.clock.now()
	if _, err := f.db.ExecContext(ctx, storeClock, now); err != nil {
		return fmt.Errorf("save processed_clock: %w", err)
	}
	if f.retention < 0 {
		return nil // keep every key
	}
	bound := now - int64(f.retention)
	for ctx.Err() == nil {
		res, err := f.db.ExecContext(ctx, forgetBatch, bound, forgetLimit)
		if err != nil {
			return err
		}
		n, err := res.RowsAffected()
		if err != nil {
			return err
		}
		f.forgotten.Add(n)
		if n < forgetLimit {
			return nil
		}
	}
	return nil
}

// startForgetter starts a forgetter on db until the returned stop is
// called; stop waits for it to save the clock.
func (c *Client) startForgetter(db *sql.DB, clock *keyClock) (stop func()) {
	f := &forgetter{db: db, clock: clock, retention: c.opts.DedupeRetention, log: c.log, forgotten: &c.forgotten,
		interval: min(max(c.opts.DedupeRetention/10, time.Second), time.Minute)}
	if c.opts.DedupeRetention < 0 {
		f.interval = time.Minute // it only saves the clock
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		f.run(ctx)
	}()
	return func() {
		cancel()
		<-done
	}
}
