package main

import (
	"database/sql"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ingestorhq/ingestor/internal/powercut"
	"github.com/ingestorhq/ingestor/internal/testconfig"
	"github.com/ingestorhq/ingestor/internal/testsync"
)

// TestAnsweredWebhookSurvivesAPowerCutOnANewDataDir: the built daemon
// starts on a data dir that does not exist yet, two levels below the
// power-cut file system's root (as /var/lib/ingestor on a fresh
// machine), with its raw store on another disk. A webhook it answered
// 202 must still be queued after a power cut right after: the daemon
// makes the directories it creates durable, not only the files in them
// (before, the data dir was made with os.MkdirAll and nothing fsynced its
// parent: the cut took the data dir, the queue and the answered event
// with it).
func TestAnsweredWebhookSurvivesAPowerCutOnANewDataDir(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the daemon and cuts the power under it")
	}
	bin := buildBinary(t, t.TempDir())
	disk := powercut.NewDisk(t)
	dataDir := filepath.Join(disk.Dir, "lib", "ingestor")
	httpAddr, pushAddr := testsync.FreePort(t), testsync.FreePort(t)
	pub, ack := testconfig.FreeEndpoints(t)
	// Dir holds only the raw store: the data dir is on the power-cut disk.
	cfg := testconfig.Daemon{
		Dir: t.TempDir(), DataDir: dataDir, HTTPAddr: httpAddr, JSONLogs: true, Publish: pub, Ack: ack,
		Rest: fmt.Sprintf(`[push]
addr = %q

[source.app]
kind = "webhook"
`, pushAddr),
	}.Write(t, filepath.Join(t.TempDir(), "ingestor.toml"))
	var logs testsync.LockedBuffer
	d := startProc(t, &logs, bin, "run", "-c", cfg)
	defer func() {
		if t.Failed() {
			t.Logf("daemon:\n%s", tail(logs.String()))
		}
	}()
	waitReady(t, httpAddr, d.cmd)
	resp, err := http.Post("http://"+pushAddr+"/ingest/app", "application/json", strings.NewReader(`{"id":"evt-1"}`))
	if err != nil {
		t.Fatal(err)
	}
	if err := resp.Body.Close(); err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusAccepted {
		t.Fatalf("webhook answered %d, want 202", resp.StatusCode)
	}
	freeze(t, d)
	disk.PowerCut(func() { d.kill(t) })

	path := filepath.Join(dataDir, "queue.db")
	if _, err := os.Stat(path); err != nil {
		t.Fatalf("after the power cut: %v (the data dir's entry was never made durable)", err)
	}
	db, err := sql.Open("sqlite3", "file:"+path+"?mode=ro")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = db.Close() }() // read-only
	var n int
	if err := db.QueryRow(`SELECT count(*) FROM events WHERE source = 'app'`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n != 1 {
		t.Fatalf("after the power cut the queue holds %d events of the answered webhook, want 1", n)
	}
}
