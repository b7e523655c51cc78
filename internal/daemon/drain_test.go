package daemon

import (
	"context"
	"database/sql"
	"fmt"
	"log/slog"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/ingestorhq/ingestor/internal/testconfig"
	"github.com/ingestorhq/ingestor/internal/testsync"
	"github.com/ingestorhq/ingestor/internal/testupstream"
	"github.com/ingestorhq/ingestor/processor"
)

// TestShutdownDrains stops the daemon in the middle of a steady stream with
// a processor acking: the source stops fetching and commits what it
// fetched, in-flight frames are acked within the grace period, and
// afterwards nothing is pending and every event up to the stored cursor
// reached the processor.
func TestShutdownDrains(t *testing.T) {
	dir := t.TempDir()
	h := &harness{t: t, dir: dir, pub: "tcp://" + testsync.FreePort(t), ack: "tcp://" + testsync.FreePort(t), logs: &testsync.LockedBuffer{}}
	cfg := testconfig.Daemon{
		Dir: dir, DataDir: dir, HTTPAddr: "127.0.0.1:0", Publish: h.pub, Ack: h.ack,
		Rest: `
[source.steady]
kind = "demo"
interval = "5ms"
events_per_tick = 200
`,
	}.Parse(t, "t.toml")
	d, err := Start(t.Context(), cfg, Options{Logger: slog.New(slog.NewTextHandler(h.logs, nil))})
	if err != nil {
		t.Fatal(err)
	}
	h.d = d
	seen := newSeenSet()
	_, stop := h.startProcessor(func(_ context.Context, ev *processor.Event) error {
		seen.add(ev.Key)
		return nil
	})
	testsync.WaitFor(t, "events flowing", 30*time.Second, func() bool { return seen.len() >= 5000 })
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := d.Shutdown(ctx); err != nil {
		t.Fatalf("shutdown: %v\n%s", err, h.logs.String())
	}
	stop()
	if n := d.Queue().PendingEvents(); n != 0 {
		t.Fatalf("%d events still pending after a drain with a processor acking", n)
	}
	db, err := sql.Open("sqlite3", "file:"+filepath.Join(dir, "queue.db")+"?mode=ro")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = db.Close() }()
	var cursor string
	if err := db.QueryRow(`SELECT cursor FROM offsets WHERE source = 'steady'`).Scan(&cursor); err != nil {
		t.Fatal(err)
	}
	last, err := strconv.Atoi(cursor)
	if err != nil {
		t.Fatalf("cursor %q: %v", cursor, err)
	}
	for n := 1; n <= last; n++ {
		if seen.count(fmt.Sprintf("steady-%d", n)) == 0 {
			t.Fatalf("event steady-%d is below the stored cursor %d but never reached the processor", n, last)
		}
	}
}

// TestShutdownCancelsStalledFetch stops the daemon while the upstream holds
// a request forever and the source's timeout is a minute: Shutdown cancels
// the fetch instead of waiting for it, and a restart on the same data
// directory still delivers every record (the cancelled batch was never
// durable, so the cursor had not moved past it).
func TestShutdownCancelsStalledFetch(t *testing.T) {
	const total = 40
	srv := testupstream.NewServer(t, testupstream.Options{Total: total, PageSize: 10})
	srv.Script(testupstream.Fault{}, testupstream.Fault{}, testupstream.Hang())
	dir := t.TempDir()
	pub, ack := "tcp://"+testsync.FreePort(t), "tcp://"+testsync.FreePort(t)
	cfg := testconfig.Daemon{
		Dir: dir, DataDir: dir, HTTPAddr: "127.0.0.1:0", ShutdownGrace: "30s", Publish: pub, Ack: ack,
		Rest: fmt.Sprintf(`
[source.stall]
kind = "http_poll"
poll_url = %q
interval = "20ms"
timeout = "60s"
id_field = "id"
cursor_field = "seq"
cursor_param = "since"
`, srv.URL+"/feed"),
	}.Parse(t, "t.toml")
	logs := &testsync.LockedBuffer{}
	log := slog.New(slog.NewTextHandler(logs, nil))
	d, err := Start(t.Context(), cfg, Options{Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	testsync.WaitFor(t, "a request stalled", 30*time.Second, func() bool { return len(srv.Requests()) >= 3 })
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	began := time.Now()
	if err := d.Shutdown(ctx); err != nil {
		t.Fatalf("shutdown: %v\n%s", err, logs.String())
	}
	took := time.Since(began)
	t.Logf("shutdown with a stalled request took %v", took)
	if took > 10*time.Second {
		t.Fatalf("shutdown took %v with a request stalled: it waited for the fetch instead of cancelling it", took)
	}

	h := startConfig(t, &harness{t: t, dir: dir, pub: pub, ack: ack, logs: logs}, cfg, Options{})
	seen := newSeenSet()
	h.startProcessor(func(_ context.Context, ev *processor.Event) error {
		seen.add(ev.Key)
		return nil
	})
	testsync.WaitFor(t, "every record delivered after the restart", 60*time.Second, func() bool { return seen.len() == total })
	for n := 1; n <= total; n++ {
		if seen.count(testupstream.ID(n)) == 0 {
			t.Fatalf("record %s lost", testupstream.ID(n))
		}
	}
}
