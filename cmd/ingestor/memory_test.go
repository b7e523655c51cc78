package main

import (
	"bufio"
	"bytes"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/ingestorhq/ingestor/config"
	"github.com/ingestorhq/ingestor/internal/testsync"
	"github.com/ingestorhq/ingestor/processor"
)

// memoryDaemon is a built daemon with one http_poll source on an upstream
// the test controls, for the memory tests.
type memoryDaemon struct {
	bin, dir, cfgPath string
	httpAddr          string
	pub, ack          string
	logs              *testsync.LockedBuffer
	cmd               *exec.Cmd
}

// newMemoryDaemon writes the config of the built daemon bin with one
// http_poll source, "big", polling pollURL with the cursor in "since";
// start runs it.
func newMemoryDaemon(t *testing.T, bin, pollURL string) *memoryDaemon {
	t.Helper()
	d := &memoryDaemon{bin: bin, dir: t.TempDir(), httpAddr: testsync.FreePort(t), pub: "tcp://" + testsync.FreePort(t),
		ack: "tcp://" + testsync.FreePort(t), logs: &testsync.LockedBuffer{}}
	cfg := daemonTOML(d.dir, d.httpAddr, d.pub, d.ack, "", "") + fmt.Sprintf(`
[source.big]
kind = "http_poll"
poll_url = %q
interval = "50ms"
jitter = "0%%"
timeout = "60s"
id_field = "id"
cursor_field = "id"
cursor_param = "since"
`, pollURL)
	d.cfgPath = filepath.Join(d.dir, "ingestor.toml")
	if err := os.WriteFile(d.cfgPath, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	return d
}

// start runs the daemon until it is ready; the test's end stops it with
// SIGTERM, which it must obey.
func (d *memoryDaemon) start(t *testing.T) {
	t.Helper()
	cmd := exec.Command(d.bin, "run", "-c", d.cfgPath)
	cmd.Stderr = d.logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	d.cmd = cmd
	t.Cleanup(func() {
		if cmd.ProcessState != nil {
			return
		}
		if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
			t.Errorf("stop the daemon: %v", err)
		}
		if err := cmd.Wait(); err != nil {
			t.Errorf("daemon exit after SIGTERM: %v\n%s", err, tail(d.logs.String()))
		}
	})
	waitReady(t, d.httpAddr, cmd)
}

// kill stops the daemon with SIGKILL.
func (d *memoryDaemon) kill(t *testing.T) {
	t.Helper()
	if err := d.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = d.cmd.Wait() // killed: its exit status is the signal
}

// startMemoryDaemon is newMemoryDaemon, started.
func startMemoryDaemon(t *testing.T, bin, pollURL string) *memoryDaemon {
	t.Helper()
	d := newMemoryDaemon(t, bin, pollURL)
	d.start(t)
	return d
}

// tinyPage returns a JSON array of n records {"id":1} ... {"id":n}.
func tinyPage(n int) []byte {
	var page bytes.Buffer
	page.WriteByte('[')
	for i := 1; i <= n; i++ {
		if i > 1 {
			page.WriteByte(',')
		}
		fmt.Fprintf(&page, `{"id":%d}`, i)
	}
	page.WriteByte(']')
	return page.Bytes()
}

// memory returns the daemon's resident set (VmRSS) and its peak (VmHWM),
// in bytes, from /proc.
func (d *memoryDaemon) memory(t *testing.T) (rss, peak int64) {
	t.Helper()
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", d.cmd.Process.Pid))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = f.Close() }()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		name, val, ok := strings.Cut(sc.Text(), ":")
		if !ok || (name != "VmRSS" && name != "VmHWM") {
			continue
		}
		kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(val), " kB"), 10, 64)
		if err != nil {
			t.Fatalf("%s in /proc/%d/status: %v", name, d.cmd.Process.Pid, err)
		}
		if name == "VmRSS" {
			rss = kb << 10
		} else {
			peak = kb << 10
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return rss, peak
}

// metric reads the unlabelled series name from the daemon's /metrics.
func (d *memoryDaemon) metric(t *testing.T, name string) float64 {
	t.Helper()
	v := scrapeMetric(d.httpAddr, name)
	if v < 0 {
		t.Fatalf("metric %s not found", name)
	}
	return v
}

// TestMillionRecordPageMemory serves the built daemon one page of
// 1,000,000 tiny records ([{"id":1},{"id":2},...], 14 MB) while a
// processor acks: every record arrives once with its bytes, the queue ends
// empty, and the daemon's peak resident set grows by at most pageMultiple
// times the page's bytes over what it held before the page, plus twice
// the frame cache's bound (frames committed while the in-flight window is
// full wait there, and the collector's headroom doubles them), a constant
// of the config whatever the page: 7.8 times with frame_cache_bytes = 0
// and 9.2 with its default of 16 MiB (the page held by the source and read
// back by the sender, a few slices of records, the frames waiting, and the
// collector's headroom), against 33-48 times before pages were taken in
// slices of sources.SliceRecords records.
func TestMillionRecordPageMemory(t *testing.T) {
	t.Parallel() // long and mostly waiting: overlaps the other long tests (make test's wall time)
	const records, pageMultiple = 1_000_000, 10
	page := tinyPage(records)
	var serve atomic.Bool // false: an empty page until the baseline is read
	var served atomic.Int32
	var polls atomic.Int64
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !serve.Load() || r.URL.Query().Get("since") != "" {
			polls.Add(1)
			fmt.Fprint(w, `[]`)
			return
		}
		served.Add(1)
		w.Header().Set("Content-Length", strconv.Itoa(len(page)))
		if _, err := w.Write(page); err != nil {
			t.Logf("upstream: write the page: %v", err)
		}
	}))
	t.Cleanup(up.Close)
	d := startMemoryDaemon(t, buildBinary(t, t.TempDir()), up.URL)

	seen := make([]atomic.Int32, records+1)
	var distinct atomic.Int64
	stopProc := startProcessor(t, d.pub, d.ack, func(_ context.Context, ev *processor.Event) error {
		n, err := strconv.Atoi(ev.Key)
		if err != nil || n < 1 || n > records || string(ev.Payload) != `{"id":`+ev.Key+`}` {
			t.Errorf("unexpected event %q: %s", ev.Key, ev.Payload)
			return processor.Permanent(fmt.Errorf("unexpected event %q", ev.Key))
		}
		if seen[n].Add(1) == 1 {
			distinct.Add(1)
		}
		return nil
	})
	var stopOnce sync.Once
	t.Cleanup(func() { stopOnce.Do(stopProc) })
	testsync.WaitFor(t, "an empty poll", 30*time.Second, func() bool {
		return polls.Load() > 0
	})
	baseRSS, basePeak := d.memory(t)
	serve.Store(true)
	testsync.WaitFor(t, "every record delivered and acked", 5*time.Minute, func() bool {
		return distinct.Load() == records && d.metric(t, "ingestor_queue_pending_events") == 0
	})
	_, peak := d.memory(t)
	stopOnce.Do(stopProc)
	for n := 1; n <= records; n++ {
		if c := seen[n].Load(); c != 1 {
			t.Fatalf("record %d delivered %d times, want once", n, c)
		}
	}
	if n := served.Load(); n != 1 {
		t.Fatalf("the page was served %d times, want once", n)
	}
	growth := peak - max(baseRSS, basePeak)
	t.Logf("page of %d records, %.1f MB: daemon RSS %.1f MiB before, peak %.1f MiB (+%.1f MiB, %.1fx the page)",
		records, float64(len(page))/1e6, float64(baseRSS)/(1<<20), float64(peak)/(1<<20), float64(growth)/(1<<20),
		float64(growth)/float64(len(page)))
	if limit := int64(pageMultiple*len(page)) + 2*config.DefaultFrameCacheBytes; growth > limit {
		t.Errorf("the daemon's peak RSS grew by %d MiB for a page of %d MiB, want at most %dx the page + 2 x frame_cache_bytes (%d MiB)",
			growth>>20, len(page)>>20, pageMultiple, limit>>20)
	}
}

// TestRefusedBodyReleasesMemory serves the built daemon an endless
// chunked body, which the source refuses at max_body_bytes (64 MiB), then
// empty pages: the daemon's heap in use and its resident set come back
// near where they were before, without anything outside forcing a
// collection (before, 141 MB of heap stayed in use and the RSS at 562 MB).
func TestRefusedBodyReleasesMemory(t *testing.T) {
	t.Parallel() // long and mostly waiting: overlaps the other long tests (make test's wall time)
	const slack = 32 << 20
	var endless atomic.Bool
	var polls atomic.Int64
	chunk := bytes.Repeat([]byte(`{"id":1},`), 64<<10/9)
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !endless.CompareAndSwap(true, false) {
			polls.Add(1)
			fmt.Fprint(w, `[]`)
			return
		}
		fmt.Fprint(w, `[`)
		for r.Context().Err() == nil {
			if _, err := w.Write(chunk); err != nil {
				return // the daemon hung up: it refused the body
			}
		}
	}))
	t.Cleanup(up.Close)
	d := startMemoryDaemon(t, buildBinary(t, t.TempDir()), up.URL)
	testsync.WaitFor(t, "an empty poll", 30*time.Second, func() bool {
		return polls.Load() > 0
	})
	baseRSS, _ := d.memory(t)
	baseHeap := d.metric(t, "go_memstats_heap_inuse_bytes")
	endless.Store(true)
	testsync.WaitFor(t, "the body refused", 60*time.Second, func() bool {
		return strings.Contains(d.logs.String(), "larger than max_body_bytes")
	})
	// Only /proc is read while waiting: scraping /metrics would make the
	// daemon allocate, and so collect sooner than an idle one would.
	var rss, peak int64
	defer func() {
		heap := d.metric(t, "go_memstats_heap_inuse_bytes")
		t.Logf("refused body: RSS %.1f MiB before, peak %.1f MiB, %.1f MiB after; heap in use %.1f MiB before, %.1f MiB after",
			float64(baseRSS)/(1<<20), float64(peak)/(1<<20), float64(rss)/(1<<20), baseHeap/(1<<20), heap/(1<<20))
		if heap > baseHeap+slack {
			t.Errorf("heap in use %d MiB after the refused body, want within %d MiB of the %d MiB before", int64(heap)>>20, slack>>20, int64(baseHeap)>>20)
		}
	}()
	testsync.WaitFor(t, fmt.Sprintf("the RSS back within %d MiB of where it was", slack>>20), 10*time.Second, func() bool {
		rss, peak = d.memory(t)
		return rss <= baseRSS+slack
	})
}

// TestKillMidPageFetchesThePageAgain SIGKILLs the built daemon while a
// page of 300,000 records is being committed in slices of
// sources.SliceRecords: some of its records are queued, and the cursor,
// which commits only with the page's last slice, has not moved. Restarted
// on the same data dir, the daemon fetches the page again and the queue
// drops the records already queued: every record is queued once, the
// cursor ends at the page's last record, and a processor receives each.
func TestKillMidPageFetchesThePageAgain(t *testing.T) {
	t.Parallel() // long and mostly waiting: overlaps the other long tests (make test's wall time)
	const records = 300_000
	page := tinyPage(records)
	var served atomic.Int32
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Query().Get("since") != "" {
			fmt.Fprint(w, `[]`)
			return
		}
		served.Add(1)
		w.Header().Set("Content-Length", strconv.Itoa(len(page)))
		if _, err := w.Write(page); err != nil {
			t.Logf("upstream: write the page: %v", err)
		}
	}))
	t.Cleanup(up.Close)
	d := newMemoryDaemon(t, buildBinary(t, t.TempDir()), up.URL)
	d.start(t)
	var pending float64
	testsync.WaitFor(t, "the first slices of the page queued", time.Minute, func() bool {
		pending = scrapeMetric(d.httpAddr, "ingestor_queue_pending_events")
		return pending > 0
	})
	d.kill(t)
	if pending > records/2 {
		t.Fatalf("%v of %d records were queued when the kill came: it must land in the middle of the page", pending, records)
	}
	queuePath := filepath.Join(d.dir, "data", "queue.db")
	queued, cursor := pageQueueState(t, queuePath)
	if queued == 0 || queued == records || cursor != "" {
		t.Fatalf("after the kill: %d of %d records queued, cursor %q; want some queued and no cursor yet", queued, records, cursor)
	}

	d.start(t)
	seen := make([]atomic.Int32, records+1)
	var distinct atomic.Int64
	stopProc := startProcessor(t, d.pub, d.ack, func(_ context.Context, ev *processor.Event) error {
		n, err := strconv.Atoi(ev.Key)
		if err != nil || n < 1 || n > records || string(ev.Payload) != `{"id":`+ev.Key+`}` {
			t.Errorf("unexpected event %q: %s", ev.Key, ev.Payload)
			return processor.Permanent(fmt.Errorf("unexpected event %q", ev.Key))
		}
		if seen[n].Add(1) == 1 {
			distinct.Add(1)
		}
		return nil
	})
	testsync.WaitFor(t, "every record delivered and acked", 2*time.Minute, func() bool {
		return distinct.Load() == records && scrapeMetric(d.httpAddr, "ingestor_queue_pending_events") == 0
	})
	stopProc()
	if err := d.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if err := d.cmd.Wait(); err != nil {
		t.Fatalf("daemon exit after SIGTERM: %v\n%s", err, tail(d.logs.String()))
	}
	queued, cursor = pageQueueState(t, queuePath)
	t.Logf("killed with %d of %d records queued; the page was served %d times", int(pending), records, served.Load())
	if queued != records || cursor != strconv.Itoa(records) || served.Load() != 2 {
		t.Fatalf("at the end: %d records queued (want %d, once each), cursor %q (want %d), page served %d times (want 2)",
			queued, records, cursor, records, served.Load())
	}
}

// pageQueueState returns how many events the queue at path holds for the
// source "big", and its cursor ("" when none is stored).
func pageQueueState(t *testing.T, path string) (events int, cursor string) {
	t.Helper()
	db, err := sql.Open("sqlite3", "file:"+path+"?mode=ro")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = db.Close() }()
	if err := db.QueryRow(`SELECT count(*) FROM events WHERE source = 'big'`).Scan(&events); err != nil {
		t.Fatal(err)
	}
	err = db.QueryRow(`SELECT cursor FROM offsets WHERE source = 'big'`).Scan(&cursor)
	if err != nil && !errors.Is(err, sql.ErrNoRows) {
		t.Fatal(err)
	}
	return events, cursor
}
