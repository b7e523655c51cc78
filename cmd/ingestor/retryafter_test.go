package main

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ingestorhq/ingestor/internal/testsync"
	"github.com/ingestorhq/ingestor/processor"
)

// TestWebhookRetryAfterTracksTheDrain runs the built daemon with a small
// queue limit and a processor that acks slowly, while a sender posts
// faster than it drains: the Retry-After of the 429 answers follows the
// drain, long while the processor handles ~2.5 events/s, short at ~20/s.
func TestWebhookRetryAfterTracksTheDrain(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the daemon")
	}
	t.Parallel() // long and mostly waiting: overlaps the other long tests (make test's wall time)
	bin := buildBinary(t, t.TempDir())
	slow := retryAfterUnderDrain(t, bin, 400*time.Millisecond)
	fast := retryAfterUnderDrain(t, bin, 50*time.Millisecond)
	t.Logf("median Retry-After: %v at ~2.5 events/s, %v at ~20 events/s", slow, fast)
	if slow < 3*fast || slow < 5*time.Second {
		t.Errorf("median Retry-After %v with the slow processor, %v with the fast one: want the slow one at least 5s and 3x the fast one", slow, fast)
	}
}

// retryAfterUnderDrain runs the daemon (max_pending_events = 10) with a
// processor that spends pace on each event, posts a new event every 20 ms
// for 6 s, and returns the median Retry-After of the 429 answers in the
// last 3 s, once the drain has been measured.
func retryAfterUnderDrain(t *testing.T, bin string, pace time.Duration) time.Duration {
	t.Helper()
	dir := t.TempDir()
	httpAddr, pushAddr := testsync.FreePort(t), testsync.FreePort(t)
	pub, ack := "tcp://"+testsync.FreePort(t), "tcp://"+testsync.FreePort(t)
	cfg := filepath.Join(dir, "ingestor.toml")
	text := daemonTOML(dir, httpAddr, pub, ack, `log_level = "warn"`, `ack_timeout = "60s"
max_pending_events = 10`) + fmt.Sprintf(`
[push]
addr = %q

[source.hooks]
kind = "webhook"
id_field = "id"
`, pushAddr)
	if err := os.WriteFile(cfg, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	var logs testsync.LockedBuffer
	cmd := exec.Command(bin, "run", "-c", cfg)
	cmd.Stderr = &logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait() // killed: its exit status is the signal
		if t.Failed() {
			t.Logf("daemon logs:\n%s", tail(logs.String()))
		}
	}()
	waitReady(t, httpAddr, cmd)
	stop := startProcessor(t, pub, ack, func(ctx context.Context, _ *processor.Event) error {
		select {
		case <-time.After(pace):
		case <-ctx.Done():
		}
		return nil
	})
	defer stop()

	url := "http://" + pushAddr + "/ingest/hooks"
	client := &http.Client{Timeout: 10 * time.Second}
	start := time.Now()
	var waits []time.Duration
	for n := 0; time.Since(start) < 6*time.Second; n++ {
		resp, err := client.Post(url, "application/json", strings.NewReader(fmt.Sprintf(`{"id":"e%d"}`, n)))
		if err != nil {
			t.Fatal(err)
		}
		_ = resp.Body.Close()
		switch resp.StatusCode {
		case http.StatusAccepted:
		case http.StatusTooManyRequests:
			secs, err := strconv.Atoi(resp.Header.Get("Retry-After"))
			if err != nil || secs < 1 {
				t.Fatalf("429 with Retry-After %q, want whole seconds, at least 1", resp.Header.Get("Retry-After"))
			}
			if time.Since(start) >= 3*time.Second {
				waits = append(waits, time.Duration(secs)*time.Second)
			}
		default:
			t.Fatalf("POST answered %d", resp.StatusCode)
		}
		time.Sleep(20 * time.Millisecond) // the sender's pace, faster than either drain
	}
	if len(waits) < 10 {
		t.Fatalf("%d answers 429 in the last 3 s with a processor at %v per event, want the queue full", len(waits), pace)
	}
	slices.Sort(waits)
	return waits[len(waits)/2]
}
