package main

import (
	"context"
	"database/sql"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	_ "github.com/mattn/go-sqlite3"

	"github.com/ingestorhq/ingestor/internal/rawstore"
	"github.com/ingestorhq/ingestor/internal/testconfig"
	"github.com/ingestorhq/ingestor/internal/testsync"
	"github.com/ingestorhq/ingestor/internal/testupstream"
	"github.com/ingestorhq/ingestor/processor"
)

// buildBinary builds the ingestor command into dir.
func buildBinary(t *testing.T, dir string) string {
	t.Helper()
	bin := filepath.Join(dir, "ingestor")
	out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput()
	if err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	return bin
}

// buildProcessor builds the example processor command into dir.
func buildProcessor(t *testing.T, dir string) string {
	t.Helper()
	bin := filepath.Join(dir, "processor")
	if out, err := exec.Command("go", "build", "-o", bin, "../processor").CombinedOutput(); err != nil {
		t.Fatalf("go build processor: %v\n%s", err, out)
	}
	return bin
}

// daemonTOML returns the daemon's own tables (daemon, raw store,
// publish) of a built daemon under test: its data dir and raw store under
// dir, JSON logs, a 10s shutdown grace, and the given addresses.
// daemonExtra and publishExtra add keys to the daemon and publish tables;
// callers append their other tables. The text keeps the empty first and
// last lines it always had: with no extra keys, its lines and those of
// what follows it are numbered as before, which TestSIGHUPReloadsTheConfig
// relies on (it checks the line numbers in the daemon's errors).
func daemonTOML(dir, httpAddr, pub, ack, daemonExtra, publishExtra string) string {
	return "\n" + testconfig.Daemon{Dir: dir, HTTPAddr: httpAddr, JSONLogs: true, ShutdownGrace: "10s", DaemonKeys: daemonExtra,
		Publish: pub, Ack: ack, PublishKeys: publishExtra}.TOML() + "\n"
}

// startProcessor runs a processor client on pub and ack with handle and
// returns the function that stops it; the test fails if it ended with an
// error.
func startProcessor(t *testing.T, pub, ack string, handle processor.Handler) (stop func()) {
	t.Helper()
	c, err := processor.New(processor.Options{Endpoint: pub, AckEndpoint: ack, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx, handle) }()
	return func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("processor: %v", err)
		}
	}
}

type delivered struct {
	rawKey   string
	off, len int
	payload  string
}

// TestCrashLosesNothing SIGKILLs the built daemon at random moments, 25
// times, while an upstream serves a known sequence and a processor acks.
// At the end every event was delivered at least once, every delivered
// event's bytes are in the raw store where its reference says, every
// event was queued, and the cursor reached the end without skipping.
func TestCrashLosesNothing(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and kills the daemon repeatedly")
	}
	t.Parallel() // long and mostly waiting: overlaps the other long tests (make test's wall time)
	bin := buildBinary(t, t.TempDir())
	t.Run("cursor", func(t *testing.T) {
		feed := testupstream.New(t, 8000, 20)
		crashCycles(t, bin, 8000, feed.URL+"/feed", `interval = "20ms"`)
	})
	// Each poll follows up to 20 Link rel="next" pages, each its own
	// durable batch, so many kills land in the middle of a pagination: the
	// restart must resume at the right page and skip nothing.
	t.Run("pagination", func(t *testing.T) {
		srv := testupstream.NewServer(t, testupstream.Options{Total: 8000, PageSize: 10, Paging: testupstream.PageLink})
		crashCycles(t, bin, 8000, srv.URL+"/feed", `interval = "150ms"
pagination = "link"
max_pages = 20`)
		var mid int
		for _, r := range srv.Requests() {
			if r.Query.Get("after") != "" {
				mid++
			}
		}
		if mid == 0 {
			t.Fatal("no page beyond the first was ever requested: the test did not paginate")
		}
	})
}

func crashCycles(t *testing.T, bin string, total int, pollURL, sourceExtra string) {
	const cycles = 25
	dir := t.TempDir()
	httpAddr, pub, ack := testsync.FreePort(t), "tcp://"+testsync.FreePort(t), "tcp://"+testsync.FreePort(t)
	cfgPath := filepath.Join(dir, "ingestor.toml")
	cfg := daemonTOML(dir, httpAddr, pub, ack, "", `ack_timeout = "2s"
events_per_frame = 7`) + fmt.Sprintf(`
[source.seq]
kind = "http_poll"
poll_url = %q
%s
jitter = "20%%"
timeout = "5s"
id_field = "id"
cursor_field = "seq"
cursor_param = "since"
`, pollURL, sourceExtra)
	if err := os.WriteFile(cfgPath, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}

	var mu sync.Mutex
	seen := map[string]delivered{}
	defer startProcessor(t, pub, ack, func(_ context.Context, ev *processor.Event) error {
		mu.Lock()
		defer mu.Unlock()
		seen[ev.Key] = delivered{rawKey: ev.Raw.Key, off: ev.Raw.Off, len: ev.Raw.Len, payload: string(ev.Payload)}
		return nil
	})()
	seenCount := func() int {
		mu.Lock()
		defer mu.Unlock()
		return len(seen)
	}

	var logs testsync.LockedBuffer
	start := func() *exec.Cmd {
		cmd := exec.Command(bin, "run", "-c", cfgPath)
		cmd.Stderr = &logs
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		waitReady(t, httpAddr, cmd)
		return cmd
	}
	for i := 0; i < cycles; i++ {
		cmd := start()
		time.Sleep(time.Duration(rand.Int64N(int64(300*time.Millisecond))) + 20*time.Millisecond) // a random kill moment, not a wait for a condition
		if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		_ = cmd.Wait() // killed: its exit status is the signal
	}
	t.Logf("after %d kills: %d of %d events delivered", cycles, seenCount(), total)

	cmd := start()
	deadline := time.Now().Add(2 * time.Minute)
	for seenCount() < total || pendingEvents(t, httpAddr) != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("final run: %d of %d delivered, pending %v\n%s", seenCount(), total, pendingEvents(t, httpAddr), tail(logs.String()))
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if err := cmd.Wait(); err != nil {
		t.Fatalf("graceful stop after SIGTERM: %v\n%s", err, tail(logs.String()))
	}

	mu.Lock()
	defer mu.Unlock()
	for n := 1; n <= total; n++ {
		if _, ok := seen[testupstream.ID(n)]; !ok {
			t.Fatalf("event %s was never delivered", testupstream.ID(n))
		}
	}
	checkRawPayloads(t, filepath.Join(dir, "raw"), seen)

	db, err := sql.Open("sqlite3", "file:"+filepath.Join(dir, "data", "queue.db")+"?mode=ro")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = db.Close() }()
	var cursor string
	var queued, pending int
	if err := db.QueryRow(`SELECT cursor FROM offsets WHERE source = 'seq'`).Scan(&cursor); err != nil {
		t.Fatal(err)
	}
	if err := db.QueryRow(`SELECT count(*) FROM events WHERE source = 'seq'`).Scan(&queued); err != nil {
		t.Fatal(err)
	}
	if err := db.QueryRow(`SELECT count(*) FROM frames`).Scan(&pending); err != nil {
		t.Fatal(err)
	}
	if cursor != fmt.Sprint(total) || queued != total || pending != 0 {
		t.Fatalf("queue after the run: cursor %q (want %d), %d events queued once each (want %d), %d frames pending (want 0)",
			cursor, total, queued, total, pending)
	}
}

// checkRawPayloads checks that each event's payload is in the file raw
// store under rawDir where its reference says, and that every page segment
// referenced reads back page by page (the segments kills and power cuts
// left), each page's checksum holding and each event inside one page.
func checkRawPayloads(t *testing.T, rawDir string, events map[string]delivered) {
	t.Helper()
	raws := map[string][]byte{}
	for id, d := range events {
		body, ok := raws[d.rawKey]
		if !ok {
			var err error
			body, err = os.ReadFile(filepath.Join(rawDir, d.rawKey))
			if err != nil {
				t.Fatalf("raw payload of %s missing: %v", id, err)
			}
			raws[d.rawKey] = body
		}
		if d.off < 0 || d.off+d.len > len(body) || string(body[d.off:d.off+d.len]) != d.payload {
			t.Fatalf("raw object %s at [%d,+%d) does not hold the payload of %s", d.rawKey, d.off, d.len, id)
		}
	}
	for key, body := range raws {
		if !rawstore.IsPageSegment(key) {
			t.Fatalf("raw object %s is not a page segment", key)
		}
		var pages [][2]int
		err := rawstore.ReadPages(key, body, func(p rawstore.Page) error {
			if p.Err != nil {
				return p.Err
			}
			pages = append(pages, [2]int{p.Off, p.Off + len(p.Body)})
			return nil
		})
		if err != nil {
			t.Fatalf("page segment %s: %v", key, err)
		}
		for id, d := range events {
			if d.rawKey != key {
				continue
			}
			if !slices.ContainsFunc(pages, func(p [2]int) bool { return p[0] <= d.off && d.off+d.len <= p[1] }) {
				t.Fatalf("event %s at [%d,+%d) of %s is in no page of it (pages %v)", id, d.off, d.len, key, pages)
			}
		}
	}
}

// waitReady polls /readyz until the daemon answers or exits.
func waitReady(t *testing.T, addr string, cmd *exec.Cmd) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		resp, err := http.Get("http://" + addr + "/readyz")
		if err == nil {
			_ = resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return
			}
		}
		if cmd.ProcessState != nil {
			t.Fatal("daemon exited before it was ready")
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatal("daemon not ready after 30s")
}

// pendingEvents reads ingestor_queue_pending_events from /metrics (-1 if
// unavailable).
func pendingEvents(t *testing.T, addr string) float64 {
	return scrapeMetric(addr, "ingestor_queue_pending_events")
}

// scrapeMetric reads the unlabelled series name from /metrics (-1 if
// unavailable).
func scrapeMetric(addr, name string) float64 {
	text, err := metricsText(addr)
	if err != nil {
		return -1
	}
	for _, line := range strings.Split(text, "\n") {
		if v, ok := strings.CutPrefix(line, name+" "); ok {
			var f float64
			if _, err := fmt.Sscan(v, &f); err == nil {
				return f
			}
		}
	}
	return -1
}

// metricsText returns the text of the daemon's /metrics at addr.
func metricsText(addr string) (string, error) {
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		return "", err
	}
	defer func() { _ = resp.Body.Close() }()
	b, err := io.ReadAll(resp.Body)
	return string(b), err
}

func tail(s string) string {
	if len(s) > 4000 {
		return "..." + s[len(s)-4000:]
	}
	return s
}
