package daemon

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"strconv"
	"testing"
	"time"

	"github.com/ingestorhq/ingestor/internal/queue"
	"github.com/ingestorhq/ingestor/internal/testconfig"
	"github.com/ingestorhq/ingestor/internal/testsync"
)

// TestStartupRehydratesLargeBacklog starts the daemon on a queue holding a
// million pending events and no processor: it becomes ready, reports the
// backlog in its "queue opened" line, and the Go heap it holds afterwards
// does not grow with the backlog. How fast it starts is measured by
// ingestor-bench -mode rehydrate, not asserted here.
func TestStartupRehydratesLargeBacklog(t *testing.T) {
	if testing.Short() {
		t.Skip("writes a million queued events")
	}
	const events, batch = 1_000_000, 10_000
	dir := t.TempDir()
	if err := fillQueue(t.Context(), dir, events, batch); err != nil {
		t.Fatal(err)
	}

	logs := &testsync.LockedBuffer{}
	pub, ack := testconfig.FreeEndpoints(t)
	cfg := testconfig.Daemon{Dir: dir, DataDir: dir, HTTPAddr: "127.0.0.1:0", Publish: pub, Ack: ack}.Parse(t, "rehydrate.toml")
	before := heapInuse()
	d, err := Start(t.Context(), cfg, Options{Logger: slog.New(slog.NewTextHandler(logs, nil))})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
		defer cancel()
		if err := d.Shutdown(ctx); err != nil {
			t.Errorf("shutdown: %v", err)
		}
	})
	after := heapInuse()
	if !d.ready.Load() {
		t.Fatal("Start returned a daemon that is not ready")
	}
	m := regexp.MustCompile(`msg="queue opened".* pending_events=(\d+)`).FindStringSubmatch(logs.String())
	if m == nil {
		t.Fatalf("no \"queue opened\" line with pending_events in the logs:\n%s", logs.String())
	}
	if n, err := strconv.Atoi(m[1]); err != nil || n != events {
		t.Errorf("queue opened with pending_events=%s, want %d", m[1], events)
	}
	if n := d.Queue().PendingEvents(); n != events {
		t.Errorf("PendingEvents() = %d, want %d", n, events)
	}
	const limit = 64 << 20
	growth := int64(after) - int64(before)
	t.Logf("heap in use: %d MiB before Start, %d MiB after (%+d MiB)", before>>20, after>>20, growth>>20)
	if growth > limit {
		t.Errorf("heap in use grew by %d MiB on start with %d queued events, want below %d MiB: memory scales with the backlog",
			growth>>20, events, limit>>20)
	}
}

// heapInuse returns the bytes in in-use heap spans after a collection.
func heapInuse() uint64 {
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapInuse
}

// fillQueueRawKey is the raw object every filled event refers to.
const fillQueueRawKey = "backlog/2026/01/01/0-backlog.json"

// fillQueue writes n pending events, in Append batches of batch, into the
// queue at <dataDir>/queue.db, all referring to one raw object written once
// to the file raw store at <dataDir>/raw, and closes the queue.
func fillQueue(ctx context.Context, dataDir string, n, batch int) (err error) {
	record := []byte(`{"id":"backlog","payload":"0123456789abcdef0123456789abcdef"}`)
	rawPath := filepath.Join(dataDir, "raw", filepath.FromSlash(fillQueueRawKey))
	if err := os.MkdirAll(filepath.Dir(rawPath), 0o750); err != nil {
		return err
	}
	if err := os.WriteFile(rawPath, record, 0o640); err != nil {
		return err
	}
	q, err := queue.Open(queue.Options{Path: filepath.Join(dataDir, "queue.db"), Synchronous: "normal",
		Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		return err
	}
	defer func() {
		if cerr := q.Close(); cerr != nil && err == nil {
			err = cerr
		}
	}()
	fetched := time.Now()
	for start := 0; start < n; start += batch {
		b := queue.Batch{Source: "backlog", FetchedAt: fetched, RawKey: fillQueueRawKey,
			Events: make([]queue.NewEvent, min(batch, n-start))}
		for i := range b.Events {
			b.Events[i] = queue.NewEvent{Key: "ev-" + strconv.Itoa(start+i+1), EventTime: fetched,
				RawOff: 0, RawLen: len(record)}
		}
		if _, err := q.Append(ctx, b); err != nil {
			return fmt.Errorf("fill queue: %w", err)
		}
	}
	return nil
}
