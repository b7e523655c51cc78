package daemon

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/ingestorhq/ingestor/internal/testsync"
	"github.com/ingestorhq/ingestor/processor"
)

// readyz returns /readyz's status code and body.
func readyz(t *testing.T, h *harness) (int, string) {
	t.Helper()
	resp, err := http.Get("http://" + h.d.HTTPAddr() + "/readyz")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = resp.Body.Close() }()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, string(b)
}

// TestDiskFull fills the data dir, a small tmpfs holding the queue, its
// WAL and the raw store, with a demo source while a processor acks, then
// grows the tmpfs with mount -o remount. Without a watermark the daemon
// meets real ENOSPC and SQLITE_FULL errors; with one it pauses before. In
// both the daemon keeps running, pauses its source (ingestor_disk_full,
// the source's status, /readyz), keeps delivering what is queued, resumes
// by itself when space returns, and in the end the queue holds the
// source's events 1..cursor once each and the processor got each of them.
func TestDiskFull(t *testing.T) {
	for _, tc := range []struct {
		name     string
		minFree  int64
		size     int64
		wantErrs bool // real ENOSPC/SQLITE_FULL errors are expected
		// stop stops the daemon while the disk is full (it must drain
		// and stop cleanly) and starts it again once space is back.
		stop bool
	}{
		{name: "no watermark", minFree: 0, size: 24 << 20, wantErrs: true},
		{name: "watermark", minFree: 12 << 20, size: 32 << 20, wantErrs: false},
		{name: "stopped while full", minFree: 0, size: 24 << 20, wantErrs: true, stop: true},
	} {
		t.Run(tc.name, func(t *testing.T) { testDiskFull(t, tc.minFree, tc.size, tc.wantErrs, tc.stop) })
	}
}

// diskFullSources is the daemon's config for TestDiskFull; %[1]s is a
// device tokens file.
const diskFullSources = `
[push]
addr = "127.0.0.1:0"

[source.devices]
kind = "ws_ingress"
tokens_file = %[1]q

[source.fill]
kind = "demo"
interval = "5ms"
jitter = "0%%"
events_per_tick = 100
event_size = 1000

[source.hooks]
kind = "webhook"
`

func testDiskFull(t *testing.T, minFree, size int64, wantErrs, stop bool) {
	fs := testsync.MountTmpfs(t, size)
	dir := fs.Dir
	tokens := filepath.Join(t.TempDir(), "device-tokens")
	if err := os.WriteFile(tokens, []byte("pump-1 pump-1-token-0123456789\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	daemonExtra, sources := fmt.Sprintf("min_free_bytes = %d", minFree), fmt.Sprintf(diskFullSources, tokens)
	h := startDaemonIn(t, dir, daemonExtra, "", `ack_timeout = "1s"`, sources, Options{})
	seen := newSeenSet()
	handler := func(_ context.Context, ev *processor.Event) error {
		seen.add(ev.Key)
		return nil
	}
	h.startProcessor(handler)
	reg := h.d.Registry()

	testsync.WaitFor(t, "the disk to fill and the source to pause", 2*time.Minute, func() bool {
		return metric(t, reg, "ingestor_disk_full") == 1 && metric(t, reg, "ingestor_source_paused", "source", "fill") == 1
	})
	errs := checkDiskFullShows(t, h, dir, wantErrs)
	checkPushRefusedWhileFull(t, h)
	// What is queued is still delivered.
	testsync.WaitFor(t, "the processor to receive every queued event", time.Minute, func() bool {
		return int64(seen.len()) == queuedEvents(t, filepath.Join(dir, "queue.db"), "fill")
	})
	pausedAt := metric(t, reg, "ingestor_source_events_total", "source", "fill")
	t.Logf("full after %v events (%v failed writes)", pausedAt, errs)

	if stop {
		// A drain must not wait for raw writes the full disk refuses: the
		// batches not yet durable are fetched again after the restart.
		if err := h.stop(); err != nil {
			t.Fatalf("shutdown while the disk is full: %v", err)
		}
		fs.Resize(256 << 20)
		h = startDaemonIn(t, dir, daemonExtra, "", `ack_timeout = "1s"`, sources, Options{})
		h.startProcessor(handler)
		reg, pausedAt = h.d.Registry(), 0
	} else {
		fs.Resize(256 << 20)
	}
	testsync.WaitFor(t, "the source to resume after the tmpfs grew", time.Minute, func() bool {
		return metric(t, reg, "ingestor_disk_full") == 0 && metric(t, reg, "ingestor_source_events_total", "source", "fill") >= pausedAt+5000
	})
	if code, body := readyz(t, h); code != http.StatusOK {
		t.Errorf("/readyz answered %d %q after space returned", code, body)
	}
	if !stop && !strings.Contains(h.logs.String(), "disk space is back") {
		t.Error("no log line says the disk space is back")
	}
	if err := h.stop(); err != nil {
		t.Fatalf("shutdown: %v", err)
	}
	checkContiguous(t, filepath.Join(dir, "queue.db"), "fill", seen)
}

// checkDiskFullShows checks how h's daemon, its data dir dir full, shows
// it: writes that failed for lack of space when wantErrs (none otherwise),
// /readyz, a log line and the fill source's status naming the disk. It
// returns the number of failed writes.
func checkDiskFullShows(t *testing.T, h *harness, dir string, wantErrs bool) (errs float64) {
	t.Helper()
	errs = metric(t, h.d.Registry(), "ingestor_disk_full_errors_total")
	if wantErrs && errs == 0 {
		t.Error("the disk filled without a single ENOSPC or SQLITE_FULL: the test did not reach a full disk")
	}
	if !wantErrs && errs != 0 {
		t.Errorf("%v writes failed for lack of space although min_free_bytes should have paused the source first", errs)
	}
	if code, body := readyz(t, h); code != http.StatusServiceUnavailable || !strings.Contains(body, "disk space low") {
		t.Errorf("/readyz answered %d %q while the disk is full, want 503 naming the disk", code, body)
	}
	if !strings.Contains(h.logs.String(), "disk space low") || !strings.Contains(h.logs.String(), dir) {
		t.Errorf("no log line says the disk is low and which path:\n%s", h.logs)
	}
	for _, st := range getStatus(t, h.d.HTTPAddr()).Sources {
		if st.Name == "fill" && (st.State != "waiting" || st.Reason != "disk_full" || !strings.Contains(st.Detail, dir)) {
			t.Errorf("source status %s/%s %q while the disk is full, want waiting/disk_full naming the disk", st.State, st.Reason, st.Detail)
		}
	}
	return errs
}

// checkPushRefusedWhileFull checks that h's push sources, the disk full,
// tell their clients to retry later: a webhook answers 503 with
// Retry-After, never 202, and a device is told to retry after a wait.
func checkPushRefusedWhileFull(t *testing.T, h *harness) {
	t.Helper()
	// A push source answers 503 with Retry-After, never 202.
	resp, err := http.Post("http://"+h.d.PushAddr()+"/ingest/hooks", "application/json", strings.NewReader(`{"n":1}`))
	if err != nil {
		t.Fatal(err)
	}
	_ = resp.Body.Close()
	if ra, _ := strconv.Atoi(resp.Header.Get("Retry-After")); resp.StatusCode != http.StatusServiceUnavailable || ra < 1 {
		t.Errorf("a webhook while the disk is full answered %d with Retry-After %q, want 503 and a wait", resp.StatusCode, resp.Header.Get("Retry-After"))
	}
	// A device is told to retry, after the same wait.
	conn, _, err := websocket.Dial(t.Context(), "ws://"+h.d.PushAddr()+"/ingest/devices/ws",
		&websocket.DialOptions{HTTPHeader: http.Header{"Authorization": {"Bearer pump-1-token-0123456789"}}})
	if err != nil {
		t.Fatalf("device: dial: %v", err)
	}
	msg := `{"schema_version":1,"event_id":"e1","type":"flow","ts":"2026-11-25T09:00:00Z","session_id":"s","device_id":"pump-1","payload":{}}`
	if err := conn.Write(t.Context(), websocket.MessageText, []byte(msg)); err != nil {
		t.Fatalf("device: send: %v", err)
	}
	_, b, err := conn.Read(t.Context())
	if err != nil {
		t.Fatalf("device: read the answer: %v", err)
	}
	var a struct {
		Status       string `json:"status"`
		RetryAfterMS int64  `json:"retry_after_ms"`
	}
	if err := json.Unmarshal(b, &a); err != nil || a.Status != "retry" || a.RetryAfterMS < 1000 {
		t.Errorf("a device envelope while the disk is full was answered %s (%v), want retry with retry_after_ms", b, err)
	}
	if err := conn.Close(websocket.StatusNormalClosure, ""); err != nil {
		t.Errorf("device: close: %v", err)
	}
}

// openQueueReadOnly opens the queue database at path read-only, alongside
// a running daemon's writer; the caller closes it.
func openQueueReadOnly(t *testing.T, path string) *sql.DB {
	t.Helper()
	db, err := sql.Open("sqlite3", "file:"+path+"?mode=ro&_busy_timeout=10000")
	if err != nil {
		t.Fatal(err)
	}
	return db
}

// queuedEvents returns how many events of source the ledger at path
// holds, read through a read-only connection.
func queuedEvents(t *testing.T, path, source string) int64 {
	t.Helper()
	db := openQueueReadOnly(t, path)
	defer func() { _ = db.Close() }() // read-only: nothing to flush
	var n int64
	if err := db.QueryRowContext(t.Context(), `SELECT count(*) FROM events WHERE source = ?`, source).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// checkContiguous checks, on a stopped daemon's queue, that source's
// events are exactly 1..cursor, each once, and that the processor saw
// each.
func checkContiguous(t *testing.T, path, source string, seen *seenSet) {
	t.Helper()
	db := openQueueReadOnly(t, path)
	defer func() { _ = db.Close() }() // read-only: nothing to flush
	var cursor string
	if err := db.QueryRow(`SELECT cursor FROM offsets WHERE source = ?`, source).Scan(&cursor); err != nil {
		t.Fatal(err)
	}
	last, err := strconv.Atoi(cursor)
	if err != nil {
		t.Fatalf("cursor %q: %v", cursor, err)
	}
	var rows, distinct int
	if err := db.QueryRow(`SELECT count(*), count(DISTINCT key) FROM events WHERE source = ?`, source).Scan(&rows, &distinct); err != nil {
		t.Fatal(err)
	}
	if rows != last || distinct != last {
		t.Errorf("the queue holds %d events (%d distinct) of %s, want 1..%d once each", rows, distinct, source, last)
	}
	var check string
	if err := db.QueryRow(`PRAGMA integrity_check`).Scan(&check); err != nil || check != "ok" {
		t.Errorf("PRAGMA integrity_check: %q, %v", check, err)
	}
	missing := 0
	for n := 1; n <= last; n++ {
		if seen.count(fmt.Sprintf("%s-%d", source, n)) == 0 {
			missing++
		}
	}
	if missing > 0 {
		t.Errorf("%d of the %d events up to the cursor never reached the processor", missing, last)
	}
	t.Logf("%s: %d events, each in the queue once and delivered", source, last)
}

// TestDiskFullStopWithAMalformedPayloadPending: a source whose every
// fetch is malformed keeps each payload under deadletter/ in the raw
// store; with the disk full that write fails and is retried. SIGTERM must
// still drain at once: the payload is not kept, and the next start
// fetches the same page again (the cursor never moved past it).
func TestDiskFullStopWithAMalformedPayloadPending(t *testing.T) {
	fs := testsync.MountTmpfs(t, 16<<20)
	h := startDaemonIn(t, fs.Dir, "min_free_bytes = 0", "", "", `
[source.bad]
kind = "demo"
interval = "5ms"
malformed_every = 1
malformed_retries = 0
events_per_tick = 100
event_size = 1000
`, Options{})
	filler, err := os.Create(filepath.Join(fs.Dir, "filler"))
	if err != nil {
		t.Fatal(err)
	}
	for err == nil { // fill the disk
		_, err = filler.Write(make([]byte, 1<<20))
	}
	if err := filler.Close(); err != nil {
		t.Logf("close the filler: %v", err) // a full disk may refuse the last flush
	}
	reg := h.d.Registry()
	testsync.WaitFor(t, "a dead-letter write to fail for lack of space", time.Minute, func() bool {
		return metric(t, reg, "ingestor_disk_full_errors_total") > 0
	})
	if err := h.stop(); err != nil {
		t.Fatalf("shutdown with a malformed payload waiting for the full disk: %v", err)
	}
}
