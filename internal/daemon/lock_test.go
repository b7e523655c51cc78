package daemon

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/ingestorhq/ingestor/internal/datadir"
	"github.com/ingestorhq/ingestor/internal/testconfig"
	"github.com/ingestorhq/ingestor/internal/testsync"
)

// TestStartLocksDataDir checks that a running daemon holds its data dir
// and that Shutdown lets go of it.
func TestStartLocksDataDir(t *testing.T) {
	dir := t.TempDir()
	pub, ack := testconfig.FreeEndpoints(t)
	cfg := testconfig.Daemon{
		Dir: dir, DataDir: dir, HTTPAddr: "127.0.0.1:0", Publish: pub, Ack: ack,
		Rest: `
[source.demo]
kind = "demo"
interval = "1h"
`,
	}.Parse(t, "test.toml")
	log := slog.New(slog.NewTextHandler(&testsync.LockedBuffer{}, nil))
	d, err := Start(t.Context(), cfg, Options{Logger: log})
	if err != nil {
		t.Fatalf("start: %v", err)
	}
	_, err = datadir.Lock(dir)
	if want := fmt.Sprintf("data dir %s is in use by another ingestor (pid %d)", dir, os.Getpid()); err == nil || err.Error() != want {
		t.Errorf("lock while the daemon runs: %v, want %q", err, want)
	}
	// A second daemon on the same data dir refuses to start.
	if d2, err := Start(t.Context(), cfg, Options{Logger: log}); err == nil {
		t.Errorf("a second daemon started on the same data dir")
		if err := d2.Shutdown(t.Context()); err != nil {
			t.Error(err)
		}
	} else if !strings.Contains(err.Error(), "is in use by another ingestor") {
		t.Errorf("second start: %v", err)
	}

	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	if err := d.Shutdown(ctx); err != nil {
		t.Fatalf("shutdown: %v", err)
	}
	unlock, err := datadir.Lock(dir)
	if err != nil {
		t.Fatalf("lock after shutdown: %v", err)
	}
	if err := unlock(); err != nil {
		t.Fatal(err)
	}
}
