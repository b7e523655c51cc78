package main

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"
)

func TestWeightedPercentiles(t *testing.T) {
	ms := time.Millisecond
	s := []sample{{30 * ms, 1}, {10 * ms, 1}, {20 * ms, 98}}
	got := weightedPercentiles(s, 1, 50, 99, 100)
	want := []time.Duration{10 * ms, 20 * ms, 20 * ms, 30 * ms}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("percentiles = %v, want %v", got, want)
			break
		}
	}
	if got := weightedPercentiles(nil, 50); got[0] != 0 {
		t.Errorf("percentile of no samples = %v, want 0", got[0])
	}
}

func TestBenchConfigQuotesDir(t *testing.T) {
	dir := filepath.Join(t.TempDir(), `a "b" \c ${HOME}`)
	o, err := parseFlags([]string{"-sources", "3", "-synchronous", "normal"}, &bytes.Buffer{})
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := benchConfig(o, dir)
	if err != nil {
		t.Fatal(err)
	}
	if want := filepath.Join(dir, "data"); cfg.Daemon.DataDir != want {
		t.Errorf("data_dir = %q, want %q", cfg.Daemon.DataDir, want)
	}
	if want := "ipc://" + filepath.Join(dir, "pub.sock"); cfg.Publish.Endpoint != want {
		t.Errorf("endpoint = %q, want %q", cfg.Publish.Endpoint, want)
	}
	if len(cfg.Sources) != 3 || cfg.Publish.Synchronous != "normal" {
		t.Errorf("got %d sources, synchronous %q; want 3, normal", len(cfg.Sources), cfg.Publish.Synchronous)
	}
}

func TestParseFlagsReportsEveryProblem(t *testing.T) {
	_, err := parseFlags([]string{"-mode", "fast", "-synchronous", "off", "-events", "0", "-processors", "0"}, &bytes.Buffer{})
	if err == nil {
		t.Fatal("no error")
	}
	for _, want := range []string{"-mode", "-synchronous", "-events", "-processors"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not mention %s", err, want)
		}
	}
}

func TestDirMustBeEmpty(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "queue.db"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	err := run(t.Context(), []string{"-events", "1", "-dir", dir}, &bytes.Buffer{}, &bytes.Buffer{})
	if err == nil || !strings.Contains(err.Error(), "not empty") {
		t.Fatalf("err = %v, want a not-empty error", err)
	}
}

// runJSON runs the bench with args and -json and decodes its result.
func runJSON(t *testing.T, args ...string) result {
	t.Helper()
	var out, errOut bytes.Buffer
	args = append(args, "-json", "-dir", filepath.Join(t.TempDir(), "b"))
	if err := run(t.Context(), args, &out, &errOut); err != nil {
		t.Fatalf("run: %v\nstderr:\n%s", err, errOut.String())
	}
	var r result
	if err := json.Unmarshal(out.Bytes(), &r); err != nil {
		t.Fatalf("decode %q: %v", out.String(), err)
	}
	return r
}

func TestRunThroughput(t *testing.T) {
	r := runJSON(t, "-events", "20000", "-events-per-tick", "500")
	if r.Capped || r.Acked < 20000 {
		t.Errorf("capped %v, acked %d; want every one of 20000 acked", r.Capped, r.Acked)
	}
	if r.EventsPerSec <= 0 || r.Latency.P50 <= 0 || r.Latency.Max < r.Latency.P99 || r.CPUSeconds <= 0 || r.PeakRSSMiB <= 0 {
		t.Errorf("implausible measurements: %+v", r)
	}
	if r.Received.Events < r.Acked {
		t.Errorf("processors received %d events, fewer than the %d acked", r.Received.Events, r.Acked)
	}
}

func TestRunProcessorDown(t *testing.T) {
	r := runJSON(t, "-mode", "processor-down", "-events", "15000", "-backlog", "10000", "-events-per-tick", "500")
	b := r.Backlog
	if b == nil {
		t.Fatal("no backlog result")
	}
	if b.Events < 10000 || b.DrainEventsPerSec <= 0 || b.RSSQueuedMiB <= 0 {
		t.Errorf("implausible backlog measurements: %+v", *b)
	}
	if r.Acked < 15000 {
		t.Errorf("acked %d, want at least 15000", r.Acked)
	}
}

func TestWatchdogFailsWithoutProgress(t *testing.T) {
	w := &watchdog{ctx: t.Context(), capCtx: t.Context(), stall: 50 * time.Millisecond,
		state: func() string { return "7 of 10 events acked" }}
	err := w.wait("acking events", func() bool { return false }, func() int64 { return 7 })
	if err == nil || !strings.Contains(err.Error(), "no progress") || !strings.Contains(err.Error(), "7 of 10 events acked") {
		t.Fatalf("err = %v, want a no-progress error with the state", err)
	}
	var n int64
	err = w.wait("acking events", func() bool { return n >= 20 }, func() int64 { n++; return n })
	if err != nil {
		t.Fatalf("a wait that progresses failed: %v", err)
	}
}

func TestDurationCap(t *testing.T) {
	r := runJSON(t, "-events", "1000000000", "-duration", "300ms")
	if !r.Capped {
		t.Errorf("not capped: %+v", r)
	}
}

// TestRunWebhook runs webhook mode briefly, without and with signatures:
// every request is answered as stored (a refused signature would fail
// the run) and acked, and both output forms carry the figures.
func TestRunWebhook(t *testing.T) {
	o, err := parseFlags([]string{"-mode", "webhook"}, &bytes.Buffer{})
	if err != nil || o.events != webhookRequests || o.clients != 64 || o.signature != "" {
		t.Fatalf("webhook defaults: events %d clients %d signature %q err %v", o.events, o.clients, o.signature, err)
	}
	if _, err := parseFlags([]string{"-mode", "webhook", "-signature", "stripe"}, &bytes.Buffer{}); err == nil || !strings.Contains(err.Error(), "-signature") {
		t.Errorf("-signature stripe: err %v, want one naming -signature", err)
	}
	for _, signature := range []string{"", "github"} {
		var out, errOut bytes.Buffer
		args := []string{"-mode", "webhook", "-signature", signature, "-events", "3000", "-clients", "8", "-json", "-dir", filepath.Join(t.TempDir(), "b")}
		if err := run(t.Context(), args, &out, &errOut); err != nil {
			t.Fatalf("run %q: %v\nstderr:\n%s", args, err, errOut.String())
		}
		var r webhookResult
		if err := json.Unmarshal(out.Bytes(), &r); err != nil {
			t.Fatalf("decode %q: %v", out.String(), err)
		}
		if r.Requests != 3000 || r.Acked != 3000 || r.PerSec <= 0 || r.Latency.P50 <= 0 || r.Latency.P99 < r.Latency.P50 || r.MeanGroupSize < 1 || r.Signature != signature {
			t.Errorf("implausible webhook measurements: %+v", r)
		}
		var text bytes.Buffer
		if err := printWebhook(&text, &r, false); err != nil {
			t.Fatal(err)
		}
		want := "no signature"
		if signature != "" {
			want = "signature github checked"
		}
		if line := text.String(); !strings.HasPrefix(line, "webhook: ") || !strings.Contains(line, " requests/s") || !strings.Contains(line, want) {
			t.Errorf("text output %q lacks \"webhook\", \"N requests/s\" or %q", line, want)
		}
	}
}

// TestRunWebhookCeiling runs webhook-ceiling mode briefly: two runs of the
// ceiling server (every answered event stored) and two of the daemon's
// webhook path, then the ratio of the best and each round's.
func TestRunWebhookCeiling(t *testing.T) {
	var out, errOut bytes.Buffer
	args := []string{"-mode", "webhook-ceiling", "-events", "600", "-clients", "8", "-dir", filepath.Join(t.TempDir(), "b")}
	if err := run(t.Context(), args, &out, &errOut); err != nil {
		t.Fatalf("run %q: %v\nstderr:\n%s", args, err, errOut.String())
	}
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	if len(lines) != 5 {
		t.Fatalf("want 4 runs and the ratio, got:\n%s", out.String())
	}
	for i, prefix := range []string{"webhook-ceiling: ", "webhook: ", "webhook-ceiling: ", "webhook: "} {
		if !strings.HasPrefix(lines[i], prefix) || !strings.Contains(lines[i], "; 600 requests in ") || strings.Contains(lines[i], " 0.0 requests per group commit") {
			t.Errorf("line %d %q: want %q with 600 requests", i, lines[i], prefix)
		}
	}
	if !regexp.MustCompile(`^webhook-ceiling: the daemon's webhook path reached [0-9.]+x the ceiling \(best of 2 each: .*\); within each round [0-9.]+, [0-9.]+, median [0-9.]+x$`).MatchString(lines[4]) {
		t.Errorf("ratio line %q", lines[4])
	}
}
