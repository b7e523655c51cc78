package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ingestorhq/ingestor/config"
)

// fetchPage fetches the firehose page after since.
func fetchPage(url string, since int64) ([]byte, error) {
	resp, err := http.Get(fmt.Sprintf("%s/events?since=%d", url, since))
	if err != nil {
		return nil, err
	}
	body, err := io.ReadAll(resp.Body)
	err = errors.Join(err, resp.Body.Close())
	if err == nil && resp.StatusCode != http.StatusOK {
		err = fmt.Errorf("%s: %s", resp.Status, body)
	}
	return body, err
}

// getPage fetches the firehose page after since and checks its records.
func getPage(t *testing.T, url string, since int64) []map[string]any {
	t.Helper()
	body, err := fetchPage(url, since)
	if err != nil {
		t.Fatalf("since=%d: %v", since, err)
	}
	return checkPage(t, body, since)
}

// checkPage decodes a firehose page and checks its records.
func checkPage(t *testing.T, body []byte, since int64) []map[string]any {
	t.Helper()
	var recs []map[string]any
	if err := json.Unmarshal(body, &recs); err != nil {
		t.Fatalf("since=%d: %v in %.200s", since, err, body)
	}
	if n := len(recs); n > 0 && (len(body)-2)/n < 450 {
		t.Errorf("since=%d: %d records in %d bytes, want ~500 bytes each", since, n, len(body))
	}
	for i, r := range recs {
		n := since + int64(i) + 1
		if r["id"] != fmt.Sprintf("ev-%d", n) || r["seq"] != float64(n) {
			t.Fatalf("since=%d: record %d is id %v seq %v, want ev-%d, %d", since, i, r["id"], r["seq"], n, n)
		}
		if _, err := time.Parse(time.RFC3339Nano, fmt.Sprint(r["ts"])); err != nil {
			t.Errorf("ts: %v", err)
		}
	}
	return recs
}

func post(t *testing.T, url string) {
	t.Helper()
	resp, err := http.Post(url, "", nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := resp.Body.Close(); err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("POST %s: %s %v", url, resp.Status, err)
	}
}

// TestFirehoseServesReleasedPages checks the pages, the release and the
// pacing of the firehose: a request waits for its page to be released,
// and paced pages are full and come no faster than the rate.
func TestFirehoseServesReleasedPages(t *testing.T) {
	srv := httptest.NewServer(newFirehose(100, 500))
	t.Cleanup(srv.Close)

	type page struct {
		body []byte
		err  error
	}
	first := make(chan page, 1)
	go func() { // waits for the release
		body, err := fetchPage(srv.URL, 0)
		first <- page{body, err}
	}()
	post(t, srv.URL+"/release?n=250")
	p := <-first
	if p.err != nil {
		t.Fatal(p.err)
	}
	if recs := checkPage(t, p.body, 0); len(recs) != 100 {
		t.Errorf("first page: %d records, want 100", len(recs))
	}
	if recs := getPage(t, srv.URL, 200); len(recs) != 50 {
		t.Errorf("last released page: %d records, want 50", len(recs))
	}

	// 500 more at 5000/s: at least 100 ms for the last one.
	begin := time.Now()
	post(t, srv.URL+"/pace?rate=5000&until=750")
	for since := int64(250); since < 750; since += 100 {
		if recs := getPage(t, srv.URL, since); len(recs) != 100 {
			t.Fatalf("paced page after %d: %d records, want 100", since, len(recs))
		}
	}
	if took := time.Since(begin); took < 100*time.Millisecond {
		t.Errorf("500 events paced at 5000/s took %v, want at least 100ms", took)
	}

	for _, bad := range []string{"/events?since=x", "/release?n=-1", "/pace?rate=0&until=9", "/pace?rate=5"} {
		method := http.MethodPost
		if strings.HasPrefix(bad, "/events") {
			method = http.MethodGet
		}
		req, err := http.NewRequest(method, srv.URL+bad, nil)
		if err != nil {
			t.Fatal(err)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		if err := resp.Body.Close(); err != nil || resp.StatusCode != http.StatusBadRequest {
			t.Errorf("%s %s: %s, want 400", method, bad, resp.Status)
		}
	}
}

func TestQuantileInterpolatesInsideTheBucket(t *testing.T) {
	inf := math.Inf(1)
	before := []bucket{{0.001, 5}, {0.002, 5}, {0.004, 5}, {inf, 5}}
	after := []bucket{{0.001, 5}, {0.002, 55}, {0.004, 105}, {inf, 106}}
	// 101 observations since before: 50 in (1, 2] ms, 50 in (2, 4] ms, 1 above.
	for _, c := range []struct{ q, want float64 }{{0.5, 0.00201}, {0.25, 0.0015}, {0.999, 0.004}} {
		if got := quantile(c.q, before, after); math.Abs(got-c.want) > 1e-4 {
			t.Errorf("quantile(%v) = %v, want %v", c.q, got, c.want)
		}
	}
	if got := quantile(0.5, after, after); !math.IsNaN(got) {
		t.Errorf("quantile of nothing = %v, want NaN", got)
	}
	if got := quantile(0.5, before[:2], after); !math.IsNaN(got) {
		t.Errorf("quantile across different buckets = %v, want NaN", got)
	}
}

func TestParseMetrics(t *testing.T) {
	text := `# HELP ingestor_source_events_total New events committed to the queue.
# TYPE ingestor_source_events_total counter
ingestor_source_events_total{source="a"} 2e+06
ingestor_source_events_total{source="b"} 5
ingestor_source_events_totally 99
ingestor_queue_pending_events 7
ingestor_fetch_to_ack_seconds_bucket{le="0.001"} 1
ingestor_fetch_to_ack_seconds_bucket{le="+Inf"} 3
ingestor_fetch_to_ack_seconds_sum 0.5
`
	s, err := parseMetrics(strings.NewReader(text))
	if err != nil {
		t.Fatal(err)
	}
	if s.events != 2e6+5 || s.pending != 7 || len(s.buckets) != 2 || s.buckets[0] != (bucket{0.001, 1}) || !math.IsInf(s.buckets[1].le, 1) || s.buckets[1].count != 3 {
		t.Errorf("parsed %+v", s)
	}
	if _, err := parseMetrics(strings.NewReader("ingestor_queue_pending_events 1\n")); err == nil || !strings.Contains(err.Error(), metricFetchToAck) {
		t.Errorf("no histogram: err %v, want one naming it", err)
	}
	if _, err := parseMetrics(strings.NewReader("ingestor_queue_pending_events x\n")); err == nil {
		t.Error("a malformed value parsed")
	}
}

// TestExactlyOnceAccounting checks the verdict of the summary on missing,
// repeated and redelivered events.
func TestExactlyOnceAccounting(t *testing.T) {
	for _, c := range []struct {
		got  counts
		want bool
	}{
		{counts{Events: 125, DistinctKeys: 125}, true},
		{counts{Events: 124, DistinctKeys: 124}, false},                  // one missing
		{counts{Events: 126, DistinctKeys: 125, Redeliveries: 1}, false}, // one twice
		{counts{Events: 125, DistinctKeys: 124}, false},                  // one twice, one missing
	} {
		r := &realResult{Events: 100, HalfEvents: 25, Received: c.got}
		cols := r.columns()
		if r.exactlyOnce() != c.want || strings.HasPrefix(cols[len(cols)-1][1], "yes") != c.want {
			t.Errorf("%+v: exactly once %v, cell %q; want %v", c.got, r.exactlyOnce(), cols[len(cols)-1][1], c.want)
		}
	}
}

// TestRealModeShort builds the three binaries and runs -mode real on
// 20,000 events (and 5,000 at half load): the table has every column and
// one row, the processor received every event exactly once, and the
// daemon wrote the CPU profile asked for. Timings are not checked.
func TestRealModeShort(t *testing.T) {
	bin := buildBinaries(t)
	dir := filepath.Join(t.TempDir(), "r")
	profile := filepath.Join(t.TempDir(), "daemon.prof")
	procProfile := filepath.Join(t.TempDir(), "processor.prof")
	var out, errOut bytes.Buffer
	cmd := exec.CommandContext(t.Context(), filepath.Join(bin, "ingestor-bench"), "-mode", "real", "-events", "20000", "-dir", dir,
		"-cpuprofile", profile, "-processor-cpuprofile", procProfile)
	cmd.Stdout, cmd.Stderr = &out, &errOut
	if err := cmd.Run(); err != nil {
		t.Fatalf("ingestor-bench -mode real: %v\nstdout:\n%s\nstderr:\n%s\nlogs in %s", err, out.String(), errOut.String(), dir)
	}
	t.Logf("\n%s", out.String())
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	if len(lines) != 4 {
		t.Fatalf("output has %d lines, want a title and a table of one row:\n%s", len(lines), out.String())
	}
	cells := func(line string) []string {
		f := strings.Split(strings.Trim(line, "|"), "|")
		for i := range f {
			f[i] = strings.TrimSpace(f[i])
		}
		return f
	}
	head, row := cells(lines[1]), cells(lines[3])
	want := (&realResult{}).columns()
	if len(head) != len(want) || len(row) != len(want) {
		t.Fatalf("table has %d columns and %d cells, want %d:\n%s", len(head), len(row), len(want), out.String())
	}
	for i, c := range want {
		if head[i] != c[0] {
			t.Errorf("column %d is %q, want %q", i, head[i], c[0])
		}
		if row[i] == "" || strings.Contains(row[i], "NaN") {
			t.Errorf("column %q has %q", c[0], row[i])
		}
	}
	if row[0] != "20000" || row[len(row)-1] != "yes: 25000 keys" {
		t.Errorf("events %q, exactly once %q; want 20000 and \"yes: 25000 keys\"", row[0], row[len(row)-1])
	}
	if info, err := os.Stat(profile); err != nil || info.Size() == 0 {
		t.Errorf("the daemon's CPU profile: %v", err)
	}
	if info, err := os.Stat(procProfile); err != nil || info.Size() == 0 {
		t.Errorf("the processor's CPU profile: %v", err)
	}
}

func TestParseFlagsRealMode(t *testing.T) {
	o, err := parseFlags([]string{"-mode", "real", "-events", "4000"}, &bytes.Buffer{})
	if err != nil || o.eventSize != realEventSize || o.pageSize != 1000 || o.halfEvents != 1000 {
		t.Errorf("real defaults: event size %d, page size %d, half events %d, err %v; want %d, 1000, 1000",
			o.eventSize, o.pageSize, o.halfEvents, err, realEventSize)
	}
	o, err = parseFlags([]string{"-mode", "real", "-events", "100000", "-event-size", "300"}, &bytes.Buffer{})
	if err != nil || o.eventSize != 300 || o.halfEvents != 25000 {
		t.Errorf("event size %d, half events %d, err %v; want 300, 25000", o.eventSize, o.halfEvents, err)
	}
	_, err = parseFlags([]string{"-mode", "real", "-page-size", "0", "-half-events", "0"}, &bytes.Buffer{})
	for _, want := range []string{"-page-size and -event-size must be at least 1", "-half-events must be at least 1"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("error %v does not contain %q", err, want)
		}
	}
}

// TestDedupeWindowMakesPruneRun checks the config -dedupe-window gives the
// daemon: that window and a prune interval of a third of it, after
// -publish-extra, in a config that loads.
func TestDedupeWindowMakesPruneRun(t *testing.T) {
	o, err := parseFlags([]string{"-mode", "real", "-dedupe-window", "3s", "-publish-extra", "max_inflight_frames = 128"}, &bytes.Buffer{})
	if err != nil {
		t.Fatal(err)
	}
	path, err := realConfig(t.TempDir(), "http://127.0.0.1:1", realPublishExtra(o), o.sourceExtra, "")
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := config.Load(path)
	if err != nil {
		t.Fatal(err)
	}
	if p := cfg.Publish; p.DedupeWindow != 3*time.Second || p.PruneInterval != time.Second || p.MaxInflightFrames != 128 {
		t.Errorf("dedupe_window %v, prune_interval %v, max_inflight_frames %d; want 3s, 1s, 128", p.DedupeWindow, p.PruneInterval, p.MaxInflightFrames)
	}
}

// built is where buildBinaries built the binaries, once per run of this
// package's tests (linking them takes 10-30 s on the 2-core machine);
// TestMain removes it.
var built struct {
	once sync.Once
	dir  string
	err  error
}

func TestMain(m *testing.M) {
	code := m.Run()
	if built.dir != "" {
		if err := os.RemoveAll(built.dir); err != nil {
			fmt.Fprintln(os.Stderr, "remove the built binaries:", err)
		}
	}
	os.Exit(code)
}

// buildBinaries builds bin/ingestor, bin/processor and this bench into a
// temporary directory, the first time it is called, and returns it. The
// tests only run what is in it.
func buildBinaries(t *testing.T) string {
	t.Helper()
	built.once.Do(func() {
		if built.dir, built.err = os.MkdirTemp("", "ingestor-bench-bin-"); built.err != nil {
			return
		}
		build := exec.Command("go", "build", "-o", built.dir+string(filepath.Separator), "../ingestor", "../processor", ".")
		if out, err := build.CombinedOutput(); err != nil {
			built.err = fmt.Errorf("go build: %w\n%s", err, out)
		}
	})
	if built.err != nil {
		t.Fatal(built.err)
	}
	return built.dir
}
