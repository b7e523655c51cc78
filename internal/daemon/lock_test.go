package daemon

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/ingestorhq/ingestor/config"
	"github.com/ingestorhq/ingestor/internal/datadir"
	"github.com/ingestorhq/ingestor/internal/testsync"
)

// TestStartLocksDataDir checks that a running daemon holds its data dir
// and that Shutdown lets go of it.
func TestStartLocksDataDir(t *testing.T) {
	dir := t.TempDir()
	cfg, err := config.Parse("test.toml", fmt.Appendf(nil, `
[daemon]
data_dir = %q
http_addr = "127.0.0.1:0"

[publish]
endpoint = %q
ack_endpoint = %q

[source.demo]
kind = "demo"
interval = "1h"
`, dir, "tcp://"+testsync.FreePort(t), "tcp://"+testsync.FreePort(t)))
	if err != nil {
		t.Fatalf("config: %v", err)
	}
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
