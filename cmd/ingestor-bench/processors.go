package main

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"

	_ "github.com/mattn/go-sqlite3" // the exactly-once sink

	"github.com/ingestorhq/ingestor/internal/sqliteuri"
	"github.com/ingestorhq/ingestor/processor"
)

// processors are the in-process processor clients.
type processors struct {
	log           *slog.Logger
	endpoint, ack string
	// sinkDB, when set, makes every client write each event into one
	// SQLite table exactly once (processor.RunTx), as cmd/processor's
	// -sqlite mode does.
	sinkDB string
	db     *sql.DB

	clients []*processor.Client
	bytes   atomic.Int64
	cancel  context.CancelFunc
	wg      sync.WaitGroup
	mu      sync.Mutex
	errs    []error
}

// start starts n clients, each running on its own goroutine until stop. They
// ack every event after reading its bytes.
func (p *processors) start(n int) error {
	ctx, cancel := context.WithCancel(context.Background())
	p.cancel = cancel
	handle := func(_ context.Context, ev *processor.Event) error {
		p.bytes.Add(int64(len(ev.Data())))
		return nil
	}
	if p.sinkDB != "" && p.db == nil {
		dsn, err := sqliteuri.File(p.sinkDB, "_journal_mode=WAL&_synchronous=FULL&_busy_timeout=10000&_txlock=immediate")
		if err != nil {
			return fmt.Errorf("open sink: %w", err)
		}
		db, err := sql.Open("sqlite3", dsn)
		if err != nil {
			return fmt.Errorf("open sink: %w", err)
		}
		if _, err := db.Exec(`CREATE TABLE IF NOT EXISTS events(source TEXT, key TEXT, seq INTEGER, payload BLOB, PRIMARY KEY(source, key))`); err != nil {
			return fmt.Errorf("create sink table: %w", errors.Join(err, db.Close()))
		}
		p.db = db
	}
	txHandle := func(ctx context.Context, tx *sql.Tx, ev *processor.Event) error {
		p.bytes.Add(int64(len(ev.Data())))
		_, err := tx.ExecContext(ctx, `INSERT INTO events(source, key, seq, payload) VALUES (?,?,?,?)`, ev.Source, ev.Key, ev.Seq, []byte(ev.Data()))
		return err
	}
	for i := range n {
		// Their handlers keep nothing of an event past their return, so
		// they recycle frames, as bin/processor does.
		c, err := processor.New(processor.Options{Endpoint: p.endpoint, AckEndpoint: p.ack, Logger: p.log.With("processor", i+1), RecycleFrames: true})
		if err != nil {
			return err
		}
		p.clients = append(p.clients, c)
		p.wg.Go(func() {
			run := func() error { return c.Run(ctx, handle) }
			if p.db != nil {
				run = func() error { return c.RunTx(ctx, p.db, txHandle) }
			}
			if err := run(); err != nil {
				p.mu.Lock()
				p.errs = append(p.errs, fmt.Errorf("processor %d: %w", i+1, err))
				p.mu.Unlock()
			}
		})
	}
	return nil
}

// stop stops the clients and returns their errors. It may be called again.
func (p *processors) stop() error {
	if p.cancel != nil {
		p.cancel()
	}
	p.wg.Wait()
	p.mu.Lock()
	defer p.mu.Unlock()
	err := errors.Join(p.errs...)
	p.errs = nil
	if p.db != nil {
		err = errors.Join(err, p.db.Close())
		p.db = nil
	}
	return err
}

// totals sums the clients' counters.
func (p *processors) totals() processorTotals {
	t := processorTotals{Bytes: p.bytes.Load()}
	for _, c := range p.clients {
		st := c.Stats()
		t.Events += st.Events
		t.Frames += st.Frames
		t.Redeliveries += st.Redeliveries
	}
	return t
}
