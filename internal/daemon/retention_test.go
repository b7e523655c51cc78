package daemon

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/ingestorhq/ingestor/internal/testsync"
	"github.com/ingestorhq/ingestor/processor"
)

// retentionSamples and retentionEvery are the measurement window of
// TestRetentionLevelsOff: long enough for many dedupe windows and prune
// rounds to pass, so a queue that grows without bound shows it.
const (
	retentionSamples = 15
	retentionEvery   = time.Second
)

// TestRetentionLevelsOff runs a steady demo stream with a processor that
// acks everything, a 1s dedupe window and a 200ms prune interval, and
// checks that the queue's files and its events table stop growing: acked
// events are remembered for the window and then pruned.
func TestRetentionLevelsOff(t *testing.T) {
	if testing.Short() {
		t.Skip("samples the queue for 15s")
	}
	const window = time.Second
	h := startDaemon(t, "", fmt.Sprintf("dedupe_window = %q\nprune_interval = \"200ms\"\nsynchronous = \"normal\"", window.String()), `
[source.steady]
kind = "demo"
interval = "20ms"
jitter = "0%"
events_per_tick = 500
event_size = 128
`)
	h.startProcessor(func(context.Context, *processor.Event) error { return nil })
	reg := h.d.Registry()
	testsync.WaitFor(t, "the stream to flow", 30*time.Second, func() bool {
		return metric(t, reg, "ingestor_source_events_total", "source", "steady") > 0
	})

	db, err := sql.Open("sqlite3", "file:"+filepath.Join(h.dir, "queue.db")+"?mode=ro&_busy_timeout=10000")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := db.Close(); err != nil {
			t.Error(err)
		}
	})
	sizes := make([]int64, 0, retentionSamples)
	var maxRows int64
	startEvents, start := metric(t, reg, "ingestor_source_events_total", "source", "steady"), time.Now()
	tick := time.NewTicker(retentionEvery)
	defer tick.Stop()
	for range retentionSamples {
		<-tick.C
		sizes = append(sizes, fileSize(t, filepath.Join(h.dir, "queue.db"))+fileSize(t, filepath.Join(h.dir, "queue.db-wal")))
		var rows int64
		if err := db.QueryRowContext(t.Context(), `SELECT count(*) FROM events`).Scan(&rows); err != nil {
			t.Fatal(err)
		}
		maxRows = max(maxRows, rows)
	}
	rate := (metric(t, reg, "ingestor_source_events_total", "source", "steady") - startEvents) / time.Since(start).Seconds()
	t.Logf("%.0f events/s; queue.db+wal bytes per second: %v; most event rows: %d", rate, sizes, maxRows)
	if rate < 1000 {
		t.Fatalf("only %.0f events/s: too little traffic for the measurement to mean anything", rate)
	}

	third := len(sizes) / 3
	middle, last := slices.Max(sizes[third:2*third]), slices.Max(sizes[2*third:])
	if float64(last) > 1.5*float64(middle) {
		t.Errorf("queue files still growing: max %d bytes over the last third, %d over the middle third", last, middle)
	}
	if bound := rate * window.Seconds() * 5; float64(maxRows) > bound {
		t.Errorf("events table reached %d rows, above %.0f (5x rate x dedupe window): acked events are not pruned", maxRows, bound)
	}
}

// fileSize returns the size of path, 0 if it does not exist.
func fileSize(t *testing.T, path string) int64 {
	t.Helper()
	fi, err := os.Stat(path)
	if errors.Is(err, fs.ErrNotExist) {
		return 0
	}
	if err != nil {
		t.Fatal(err)
	}
	return fi.Size()
}
