package main

import (
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/ingestorhq/ingestor/internal/testsync"
)

// TestWebhookDiskFullThroughTheBinary runs the built daemon with its data
// dir on a 32 MiB tmpfs and min_free_bytes = 64 MiB, so disk space is low
// from the start: a webhook is answered 503 with Retry-After (never 202),
// /readyz says why, and once the tmpfs grows the same request is stored
// (202) without a restart; SIGTERM then exits 0.
func TestWebhookDiskFullThroughTheBinary(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the daemon")
	}
	bin := buildBinary(t, t.TempDir())
	fs := testsync.MountTmpfs(t, 32<<20)
	httpAddr, pushAddr := testsync.FreePort(t), testsync.FreePort(t)
	cfg := filepath.Join(t.TempDir(), "ingestor.toml")
	text := daemonTOML(fs.Dir, httpAddr, "tcp://"+testsync.FreePort(t), "tcp://"+testsync.FreePort(t), fmt.Sprintf("min_free_bytes = %d", 64<<20), "") +
		fmt.Sprintf("\n[push]\naddr = %q\n\n[source.app]\nkind = \"webhook\"\n", pushAddr)
	if err := os.WriteFile(cfg, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	logs := &testsync.LockedBuffer{}
	cmd := exec.Command(bin, "run", "-c", cfg)
	cmd.Stderr = logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if cmd.ProcessState == nil {
			_ = cmd.Process.Kill()
			_ = cmd.Wait() // killed: its status is the signal
		}
		if t.Failed() {
			t.Logf("daemon logs:\n%s", tail(logs.String()))
		}
	})
	get := func(path string) (int, string) {
		resp, err := http.Get("http://" + httpAddr + path)
		if err != nil {
			return 0, err.Error()
		}
		defer func() { _ = resp.Body.Close() }()
		b, _ := io.ReadAll(resp.Body) //nolint:errcheck // a short body only names the state
		return resp.StatusCode, string(b)
	}
	// Started, it is not ready for want of disk space.
	testsync.WaitFor(t, "/readyz to report the disk space", 30*time.Second, func() bool {
		_, body := get("/readyz")
		return strings.Contains(body, "disk space low") || cmd.ProcessState != nil
	})
	if code, body := get("/readyz"); code != http.StatusServiceUnavailable || !strings.Contains(body, "below daemon.min_free_bytes") || !strings.Contains(body, fs.Dir) {
		t.Errorf("/readyz with 32 MiB of disk and min_free_bytes 64 MiB: %d %q", code, body)
	}
	post := func() *http.Response {
		t.Helper()
		req, err := http.NewRequest(http.MethodPost, "http://"+pushAddr+"/ingest/app", strings.NewReader(`{"id":"evt-1","n":1}`))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Idempotency-Key", "evt-1")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		_ = resp.Body.Close()
		return resp
	}
	if resp := post(); resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get("Retry-After") != "30" {
		t.Errorf("a webhook with disk space low answered %d with Retry-After %q, want 503 and 30", resp.StatusCode, resp.Header.Get("Retry-After"))
	}
	fs.Resize(256 << 20)
	testsync.WaitFor(t, "the daemon to be ready once the disk grew", 30*time.Second, func() bool {
		code, _ := get("/readyz")
		return code == http.StatusOK
	})
	if resp := post(); resp.StatusCode != http.StatusAccepted {
		t.Errorf("the retried webhook answered %d once space returned, want 202", resp.StatusCode)
	}
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if err := cmd.Wait(); err != nil {
		t.Errorf("SIGTERM: %v", err)
	}
}
