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

	"github.com/ingestorhq/ingestor/config"
	"github.com/ingestorhq/ingestor/internal/testsync"
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
	cfg, err := config.Parse("t.toml", []byte(fmt.Sprintf(`
[daemon]
data_dir = %q
http_addr = "127.0.0.1:0"
[publish]
endpoint = %q
ack_endpoint = %q
[source.steady]
kind = "demo"
interval = "5ms"
events_per_tick = 200
`, dir, h.pub, h.ack)))
	if err != nil {
		t.Fatal(err)
	}
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
