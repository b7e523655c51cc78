package daemon

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"path/filepath"
	"testing"
	"time"

	"github.com/ingestorhq/ingestor/internal/s3test"
	"github.com/ingestorhq/ingestor/internal/testsync"
	"github.com/ingestorhq/ingestor/internal/testupstream"
	"github.com/ingestorhq/ingestor/processor"
)

// rawStoreOutage is how long the S3 raw store is down in
// TestRawStoreOutageLosesNothing: the outage the daemon must ride out, an
// acceptance requirement rather than a wait for a condition.
const rawStoreOutage = 30 * time.Second

// TestRawStoreOutageLosesNothing stops the S3 raw store for rawStoreOutage
// while an http_poll source has most of its feed still to fetch. The outage
// shows in the metrics, the batches in flight are spilled to local disk, the
// source stops advancing, and after the store comes back every upstream
// event is delivered, the spill dir empties and the queue drains.
func TestRawStoreOutageLosesNothing(t *testing.T) {
	if testing.Short() {
		t.Skip("rides out a 30s raw store outage")
	}
	srv := s3test.Start(t)
	srv.SetEnv(t)
	const total = 10_000
	feed := testupstream.New(t, total, 100)
	raw := fmt.Sprintf("url = %q\nendpoint = %q\nregion = %q\npath_style = true\nmax_attempts = 3",
		"s3://"+srv.Bucket+"/raw", srv.Endpoint, srv.Region)
	h := startDaemon(t, raw, `events_per_frame = 50`, httpSource("orders", feed.URL))
	seen := newSeenSet()
	h.startProcessor(func(_ context.Context, ev *processor.Event) error {
		seen.add(ev.Key)
		return nil
	})
	reg := h.d.Registry()
	srv.Stop()
	outage := time.NewTimer(rawStoreOutage)

	testsync.WaitFor(t, "the outage to show in the metrics", 20*time.Second, func() bool {
		return metric(t, reg, "ingestor_raw_store_up") == 0 && metric(t, reg, "ingestor_raw_put_errors_total") > 0
	})
	testsync.WaitFor(t, "a batch spilled to local disk", 20*time.Second, func() bool {
		return metric(t, reg, "ingestor_raw_spilled_total") > 0 && metric(t, reg, "ingestor_raw_spill_pending") > 0
	})
	spillDir := filepath.Join(h.dir, "raw-spill")
	if n := countFiles(t, spillDir); n == 0 {
		t.Fatalf("spill pending, but %s holds no files", spillDir)
	}
	<-outage.C
	// The source cannot have got past the batches the store refused.
	if n := seen.len(); n >= total {
		t.Fatalf("all %d events delivered while the raw store was down", n)
	}
	delivered := seen.len()
	srv.Restart()
	t.Logf("raw store back after %v; %d of %d events delivered during the outage", rawStoreOutage, delivered, total)

	testsync.WaitFor(t, "every event delivered", 120*time.Second, func() bool { return seen.len() == total })
	for n := 1; n <= total; n++ {
		if seen.count(testupstream.ID(n)) == 0 {
			t.Fatalf("event %s never reached the processor", testupstream.ID(n))
		}
	}
	testsync.WaitFor(t, "queue drained", 30*time.Second, func() bool { return h.d.Queue().PendingEvents() == 0 })
	testsync.WaitFor(t, "spill dir emptied", 30*time.Second, func() bool {
		return metric(t, reg, "ingestor_raw_spill_pending") == 0 && countFiles(t, spillDir) == 0
	})
	if up := metric(t, reg, "ingestor_raw_store_up"); up != 1 {
		t.Errorf("ingestor_raw_store_up = %v after the store came back, want 1", up)
	}
}

// countFiles counts the regular files under dir (0 if it does not exist).
func countFiles(t *testing.T, dir string) int {
	t.Helper()
	n := 0
	err := filepath.WalkDir(dir, func(_ string, e fs.DirEntry, err error) error {
		if errors.Is(err, fs.ErrNotExist) {
			return nil // removed while walking, or no dir at all
		}
		if err != nil {
			return err
		}
		if !e.IsDir() {
			n++
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return n
}
