package processor_test

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"log"
	"log/slog"
	"net/url"
	"os"
	"path/filepath"

	_ "github.com/mattn/go-sqlite3"

	"github.com/ingestorhq/ingestor/processor"
)

// ExampleRun is a whole processor program: it prints the id of each new
// event until its context ends. A real program runs until it is
// interrupted, with
//
//	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
//
// here a stand-in daemon sends one frame and ends ctx once it is settled.
func ExampleRun() {
	d := startExampleDaemon()
	defer d.close()
	ctx := d.serve(`{"id":"a1"}`, `"not a record"`, `{"id":"a3"}`)

	// seen stands in for a durable store with a unique index on
	// (source, key), the event's idempotency key: a redelivered event is
	// found there and acknowledged again without being processed twice.
	seen := make(map[[2]string]bool)
	handle := func(ctx context.Context, ev *processor.Event) error {
		id := [2]string{ev.Source, ev.Key}
		if seen[id] {
			return nil
		}
		var rec struct {
			ID string `json:"id"`
		}
		if err := json.Unmarshal(ev.Data(), &rec); err != nil {
			// An event that can never succeed is nacked permanently: the
			// daemon dead-letters it instead of delivering it again.
			return processor.Permanent(fmt.Errorf("decode %s/%s: %w", ev.Source, ev.Key, err))
		}
		fmt.Println(ev.Source, ev.Key, rec.ID)
		seen[id] = true
		return nil
	}

	err := processor.Run(ctx, processor.Options{
		Endpoint:    d.Endpoint,    // the daemon's publish.endpoint, "tcp://127.0.0.1:5557" by default
		AckEndpoint: d.AckEndpoint, // its publish.ack_endpoint, "tcp://127.0.0.1:5558" by default
	}, handle)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(d.Settled())
	// Output:
	// github evt-1 a1
	// github evt-3 a3
	// daemon: 2 acked, 1 dead-lettered
}

// ExampleNew keeps the Client to read its counters when Run returns.
func ExampleNew() {
	d := startExampleDaemon()
	defer d.close()
	c, err := processor.New(processor.Options{
		Endpoint:    d.Endpoint,
		AckEndpoint: d.AckEndpoint,
		Logger:      slog.New(slog.NewJSONHandler(os.Stderr, nil)),
	})
	if err != nil {
		log.Fatal(err)
	}
	// A real program runs until it is interrupted (see ExampleRun); the
	// stand-in daemon ends ctx once its frame is settled.
	ctx := d.serve(`{"id":1}`, `{"id":2}`, `{"id":3}`)
	err = c.Run(ctx, func(ctx context.Context, ev *processor.Event) error {
		return nil // acknowledge everything
	})
	if err != nil {
		log.Fatal(err)
	}
	st := c.Stats()
	fmt.Printf("%d events in %d frames, %d acked, %d failed, %d frames redelivered\n",
		st.Events, st.Frames, st.Acked, st.Failed, st.Redeliveries)
	fmt.Println(d.Settled())
	// Output:
	// 3 events in 1 frames, 3 acked, 0 failed, 0 frames redelivered
	// daemon: 3 acked, 0 dead-lettered
}

// ExampleClient_RunTx stores every event exactly once in a SQLite
// database: each row commits with the event's processed key, and the ack
// leaves after the commit, so a redelivered event is skipped.
func ExampleClient_RunTx() {
	d := startExampleDaemon()
	defer d.close()
	// A real program runs until it is interrupted (see ExampleRun); the
	// stand-in daemon ends ctx once its frame is settled.
	ctx := d.serve(`{"id":1}`, `{"id":2}`, `{"id":3}`)

	dir, err := os.MkdirTemp("", "events")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)
	dsn := (&url.URL{Scheme: "file", Path: filepath.Join(dir, "events.db"),
		RawQuery: "_journal_mode=WAL&_synchronous=FULL&_busy_timeout=10000&_txlock=immediate"}).String()
	db, err := sql.Open("sqlite3", dsn)
	if err != nil {
		log.Fatal(err)
	}
	defer func() {
		if err := db.Close(); err != nil {
			log.Print(err)
		}
	}()
	if _, err := db.ExecContext(context.Background(), `CREATE TABLE IF NOT EXISTS events (source TEXT, key TEXT, payload BLOB, PRIMARY KEY (source, key))`); err != nil {
		log.Fatal(err)
	}
	c, err := processor.New(processor.Options{
		Endpoint:    d.Endpoint,
		AckEndpoint: d.AckEndpoint,
		Workers:     4,
	})
	if err != nil {
		log.Fatal(err)
	}
	err = c.RunTx(ctx, db, func(ctx context.Context, tx *sql.Tx, ev *processor.Event) error {
		if !json.Valid(ev.Data()) {
			// Retrying cannot help: the daemon dead-letters it.
			return processor.Permanent(fmt.Errorf("event %s/%s is not JSON", ev.Source, ev.Key))
		}
		_, err := tx.ExecContext(ctx, `INSERT INTO events (source, key, payload) VALUES (?, ?, ?)`, ev.Source, ev.Key, ev.Data())
		return err // a retryable nack when not nil
	})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(d.Settled())

	rows, err := db.QueryContext(context.Background(), `SELECT source, key, payload FROM events ORDER BY key`)
	if err != nil {
		log.Fatal(err)
	}
	for rows.Next() {
		var source, key, payload string
		if err := rows.Scan(&source, &key, &payload); err != nil {
			log.Fatal(err)
		}
		fmt.Println(source, key, payload)
	}
	if err := errors.Join(rows.Err(), rows.Close()); err != nil {
		log.Fatal(err)
	}
	// Output:
	// daemon: 3 acked, 0 dead-lettered
	// github evt-1 {"id":1}
	// github evt-2 {"id":2}
	// github evt-3 {"id":3}
}

// ExampleReadCurveKey reads a key file as `ingestor curve-keygen` writes
// it, for Options.CurveServerKey or Options.CurveSecretKey.
func ExampleReadCurveKey() {
	dir, err := os.MkdirTemp("", "keys")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)
	path := dir + "/daemon.pub"
	content := "# CURVE public key daemon\nGVUlV?l*1.p)>yIHv=mf>7wK%g*TjJ3uj)$}0L<f\n"
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		log.Fatal(err)
	}
	key, err := processor.ReadCurveKey(path)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(key)
	// Output: GVUlV?l*1.p)>yIHv=mf>7wK%g*TjJ3uj)$}0L<f
}

// ExampleEvent_Data reads an event's bytes whichever field carried them:
// Payload for a JSON payload, PayloadBase64 (decoded from the frame's
// payload_b64) for any other.
func ExampleEvent_Data() {
	events := []processor.Event{
		{Source: "github", Key: "evt-1", Payload: []byte(`{"id":"evt-1"}`)},
		{Source: "sensors", Key: "r-7", PayloadBase64: []byte("temp=21.5")},
	}
	for _, ev := range events {
		fmt.Printf("%s/%s: %s\n", ev.Source, ev.Key, ev.Data())
	}
	// Output:
	// github/evt-1: {"id":"evt-1"}
	// sensors/r-7: temp=21.5
}
