package processor

import (
	"context"
	"database/sql"
	"errors"
	"fmt"

	"github.com/ingestorhq/ingestor/internal/wire"
)

// TxHandler applies one event's effects inside tx. Returning nil commits
// them, together with the event's row in the processed table, and the event
// is acknowledged after the commit. An error undoes this event's writes
// only (the others of the frame still commit) and nacks it, permanently
// when the error was made by Permanent. tx belongs to RunTx: a TxHandler
// must not commit or roll it back.
type TxHandler func(ctx context.Context, tx *sql.Tx, ev *Event) error

// RunTx is Run with exactly-once effects in db, which must be a SQLite
// database (opened with driver "sqlite3"). RunTx creates a table processed
// (source, key, processed_at) in db. For each frame it begins one
// transaction and, for each event whose (source, key) is not in processed,
// calls h under a savepoint and inserts the pair into processed; it commits
// and only then acknowledges the frame. The effects and the processed key
// commit together, so an event redelivered after a crash between the commit
// and the ack is found in processed, skipped and acknowledged again
// (counted in Stats.Duplicates). An in-memory cache of
// Options.DedupeCacheSize keys skips recent duplicates without a query.
//
// Open db so that transactions take the write lock at once and wait for
// it, which lets several workers share it:
//
//	file:PATH?_journal_mode=WAL&_synchronous=FULL&_busy_timeout=10000&_txlock=immediate
//
// with PATH escaped, so that a '?', '#' or '%' in it is part of the path
// (ExampleClient_RunTx builds it with url.URL{Scheme: "file", Path: ...}).
//
// Options.DedupeDB must be empty.
func (c *Client) RunTx(ctx context.Context, db *sql.DB, h TxHandler) error {
	if h == nil {
		return errors.New("processor: nil handler")
	}
	if db == nil {
		return errors.New("processor: nil database")
	}
	if c.opts.DedupeDB != "" {
		return errors.New("processor: RunTx keeps processed keys in its own database; DedupeDB must be empty")
	}
	if !c.running.CompareAndSwap(false, true) {
		return errors.New("processor: Run is already active on this client")
	}
	defer c.running.Store(false)
	// Setup is not abandoned half-way: a stop that arrives now is a
	// graceful stop, which serve then honours at once.
	if _, err := db.ExecContext(context.WithoutCancel(ctx), processedSchema); err != nil {
		return fmt.Errorf("processor: create table processed: %w", err)
	}
	clock, err := openClock(context.WithoutCancel(ctx), db)
	if err != nil {
		return fmt.Errorf("processor: %w", err)
	}
	defer c.startForgetter(db, clock)()
	cache := newKeyCache(c.opts.DedupeCacheSize)
	return c.serve(ctx, func(ctx context.Context, f *frame) frameResult {
		return c.txFrame(ctx, f, db, h, cache, clock)
	})
}

// txFrame applies f's events in one transaction of db.
func (c *Client) txFrame(ctx context.Context, f *frame, db *sql.DB, h TxHandler, cache *keyCache, clock *keyClock) frameResult {
	done := make([]bool, len(f.events))
	var todo []int
	for i := range f.events {
		ev := &f.events[i]
		if cache.has(ev.Source, ev.Key) {
			c.events.Add(1)
			c.duplicates.Add(1)
			done[i] = true
			continue
		}
		todo = append(todo, i)
	}
	if len(todo) == 0 || ctx.Err() != nil {
		return result(f, done, nil)
	}
	nacks, fresh := c.applyTx(ctx, f, db, h, todo, done, clock)
	for _, i := range fresh {
		done[i] = true
		cache.add(f.events[i].Source, f.events[i].Key)
	}
	return result(f, done, nacks)
}

// applyTx runs the events todo of f in one transaction, marking duplicates
// found in processed in done. It returns the nacks and the events
// committed now.
func (c *Client) applyTx(ctx context.Context, f *frame, db *sql.DB, h TxHandler, todo []int, done []bool, clock *keyClock) (nacks []wire.Nack, fresh []int) {
	var parents parentCache // the events of one batch share their trace
	// The transaction outlives a stop: what was applied still commits.
	bg := context.WithoutCancel(ctx)
	failAll := func(err error) {
		for _, i := range fresh {
			nacks = append(nacks, c.nack(f, &f.events[i], err))
		}
		fresh = nil
	}
	tx, err := db.BeginTx(bg, nil)
	if err != nil {
		err = fmt.Errorf("begin transaction: %w", err)
		for _, i := range todo {
			c.events.Add(1)
			nacks = append(nacks, c.nack(f, &f.events[i], err))
		}
		return nacks, nil
	}
	for _, i := range todo {
		if ctx.Err() != nil {
			break // stop between events; the rest are redelivered
		}
		ev := &f.events[i]
		c.events.Add(1)
		var one int
		switch err := tx.QueryRowContext(bg, selectProcessed, ev.Source, ev.Key).Scan(&one); {
		case err == nil:
			c.duplicates.Add(1)
			done[i] = true
			continue
		case !errors.Is(err, sql.ErrNoRows):
			nacks = append(nacks, c.nack(f, ev, fmt.Errorf("look up processed key: %w", err)))
			continue
		}
		if _, err := tx.ExecContext(bg, "SAVEPOINT event"); err != nil {
			nacks = append(nacks, c.nack(f, ev, fmt.Errorf("savepoint: %w", err)))
			continue
		}
		herr := c.callTx(ctx, h, tx, ev, &parents)
		if herr == nil {
			if _, err := tx.ExecContext(bg, insertProcessed, ev.Source, ev.Key, clock.now()); err != nil {
				herr = fmt.Errorf("record processed key: %w", err)
			}
		}
		if herr == nil {
			if _, err := tx.ExecContext(bg, "RELEASE event"); err != nil {
				herr = fmt.Errorf("release savepoint: %w", err)
			} else {
				fresh = append(fresh, i)
				continue
			}
		}
		// Undo this event's writes only.
		if _, err := tx.ExecContext(bg, "ROLLBACK TO event; RELEASE event"); err != nil {
			rerr := fmt.Errorf("roll back to savepoint: %w", err)
			if err := tx.Rollback(); err != nil {
				rerr = errors.Join(rerr, fmt.Errorf("roll back: %w", err))
			}
			failAll(rerr)
			if !(ctx.Err() != nil && errors.Is(herr, ctx.Err())) {
				nacks = append(nacks, c.nack(f, ev, errors.Join(herr, rerr)))
			}
			return nacks, nil
		}
		if ctx.Err() != nil && errors.Is(herr, ctx.Err()) {
			break // interrupted by the stop: redelivered, not a failure
		}
		nacks = append(nacks, c.nack(f, ev, herr))
	}
	if err := tx.Commit(); err != nil {
		failAll(fmt.Errorf("commit: %w", err))
	}
	return nacks, fresh
}

// callTx runs h, turning a panic into an error; ctx continues ev's trace
// as call's does.
func (c *Client) callTx(ctx context.Context, h TxHandler, tx *sql.Tx, ev *Event, parents *parentCache) (err error) {
	ctx, end := c.traced(ctx, ev, parents)
	defer func() { end(err) }()
	defer c.recoverPanic(ev, &err)
	return h(ctx, tx, ev)
}
