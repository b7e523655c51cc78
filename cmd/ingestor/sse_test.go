package main

import (
	"bytes"
	"database/sql"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	_ "github.com/mattn/go-sqlite3"

	"github.com/ingestorhq/ingestor/internal/testsync"
	"github.com/ingestorhq/ingestor/internal/testupstream"
)

// TestSSEValidateAndCheckSource runs `ingestor validate` and `ingestor
// check-source` on an sse source: the stream's records with their ids,
// and a refused request as a problem with its hint.
func TestSSEValidateAndCheckSource(t *testing.T) {
	feed := testupstream.NewSSE(t, testupstream.SSEOptions{Total: 3})
	dir := t.TempDir()
	cfgPath := writeConfig(t, dir, `
[source.stream]
kind = "sse"
url = "`+feed.URL+`/events?api_key=s3cret"
interval = "50ms"
id_field = "id"
time_field = "ts"
event_types = ["message"]
`)
	var out, errb bytes.Buffer
	if code := run([]string{"validate", "-c", cfgPath}, &out, &errb); code != 0 || !strings.Contains(out.String(), "ok (1 sources, 1 enabled)") {
		t.Fatalf("validate: exit %d\n%s%s", code, out.String(), errb.String())
	}
	out.Reset()
	if code := run([]string{"check-source", "stream", "-c", cfgPath, "-max-pages", "3"}, &out, &errb); code != 0 {
		t.Fatalf("check-source: exit %d\n%s%s", code, out.String(), errb.String())
	}
	for _, want := range []string{
		"GET " + feed.URL + "/events?api_key=REDACTED -> 200 in ",
		`connected, Last-Event-ID ""`,
		"id=" + testupstream.SSEID(1) + " cursor=1 time=2026-11-22T00:00:01Z",
		`sample payload (id=sse-1): {"id":"sse-1","seq":1,`,
		"ok: ",
	} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("check-source output lacks %q:\n%s", want, out.String())
		}
	}

	bad := writeConfig(t, t.TempDir(), `
[source.stream]
kind = "sse"
url = "ws://example.com/events?since={cursor}"
max_event_bytes = 0
`)
	out.Reset()
	errb.Reset()
	if code := run([]string{"validate", "-c", bad}, &out, &errb); code != 1 ||
		!strings.Contains(errb.String()+out.String(), "url: must be an absolute http:// or https:// URL") ||
		!strings.Contains(errb.String()+out.String(), "max_event_bytes: must be between 1 and 1073741824") {
		t.Fatalf("validate of a bad block: exit %d\n%s%s", code, out.String(), errb.String())
	}

	refusals := make([]testupstream.Fault, 200) // more than one check makes
	for i := range refusals {
		refusals[i] = testupstream.Status(http.StatusForbidden)
	}
	feed.Script(refusals...)
	out.Reset()
	errb.Reset()
	if code := run([]string{"check-source", "stream", "-c", cfgPath}, &out, &errb); code != 1 ||
		!strings.Contains(out.String(), "-> 403 in ") || !strings.Contains(out.String(), "hint: 403: the upstream refused the credentials") ||
		strings.Contains(out.String()+errb.String(), "s3cret") {
		t.Fatalf("check-source of a refused stream: exit %d\n%s%s", code, out.String(), errb.String())
	}
}

// sseDaemon is a built daemon with an sse source "stream" on feed and the
// built exactly-once processor writing to sink.
type sseDaemon struct {
	t                  *testing.T
	bin, cfg, httpAddr string
	dataDir, sink      string
	logs               *testsync.LockedBuffer
	d                  *proc
	sinkDB             *sql.DB
}

// startSSEDaemon writes the config, starts the processor and the daemon.
func startSSEDaemon(t *testing.T, bin, procBin, url string) *sseDaemon {
	dir := t.TempDir()
	httpAddr, pub, ack := testsync.FreePort(t), "tcp://"+testsync.FreePort(t), "tcp://"+testsync.FreePort(t)
	h := &sseDaemon{t: t, bin: bin, cfg: filepath.Join(dir, "ingestor.toml"), httpAddr: httpAddr,
		dataDir: filepath.Join(dir, "data"), sink: filepath.Join(dir, "sink.db"), logs: &testsync.LockedBuffer{}}
	cfg := daemonTOML(dir, httpAddr, pub, ack, "", `ack_timeout = "2s"`) + fmt.Sprintf(`
[source.stream]
kind = "sse"
url = %q
interval = "20ms"
id_field = "id"
time_field = "ts"
read_timeout = "5s"
reconnect_max = "300ms"
`, url)
	if err := os.WriteFile(h.cfg, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	var procLogs testsync.LockedBuffer
	p := startProc(t, &procLogs, procBin, "-connect", pub, "-ack", ack, "-sqlite", h.sink, "-log-every", "1h")
	t.Cleanup(func() {
		if h.sinkDB != nil {
			_ = h.sinkDB.Close()
		}
		if err := p.cmd.Process.Signal(syscall.SIGTERM); err == nil {
			if err := p.wait(); err != nil {
				t.Errorf("processor: %v\n%s", err, tail(procLogs.String()))
			}
		}
		if strings.Contains(procLogs.String(), "BUG") {
			t.Errorf("the processor applied an event twice:\n%s", tail(procLogs.String()))
		}
		if t.Failed() {
			t.Logf("daemon:\n%s", tail(h.logs.String()))
		}
	})
	h.start()
	return h
}

// start starts the daemon and waits until it is ready.
func (h *sseDaemon) start() {
	h.d = startProc(h.t, h.logs, h.bin, "run", "-c", h.cfg)
	waitReady(h.t, h.httpAddr, h.d.cmd)
}

// stop stops the daemon gracefully.
func (h *sseDaemon) stop() {
	if err := h.d.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		h.t.Fatal(err)
	}
	if err := h.d.wait(); err != nil {
		h.t.Fatalf("graceful stop: %v\n%s", err, tail(h.logs.String()))
	}
}

// applied returns how many events the processor's table holds.
func (h *sseDaemon) applied() int {
	if h.sinkDB == nil {
		if _, err := os.Stat(h.sink); err != nil {
			return 0
		}
		db, err := sql.Open("sqlite3", "file:"+h.sink+"?mode=ro&_busy_timeout=5000")
		if err != nil {
			h.t.Fatal(err)
		}
		h.sinkDB = db
	}
	var n int
	if err := h.sinkDB.QueryRow(`SELECT count(*) FROM events`).Scan(&n); err != nil {
		return 0 // no table yet
	}
	return n
}

// durable returns the source's durable cursor in the queue.
func (h *sseDaemon) durable() (string, error) {
	db, err := sql.Open("sqlite3", "file:"+filepath.Join(h.dataDir, "queue.db")+"?mode=ro&_busy_timeout=5000")
	if err != nil {
		return "", err
	}
	defer func() { _ = db.Close() }()
	var c string
	err = db.QueryRow(`SELECT cursor FROM offsets WHERE source = 'stream'`).Scan(&c)
	if errors.Is(err, sql.ErrNoRows) {
		return "", nil
	}
	return c, err
}

// waitAll waits until the processor applied total events and the queue is
// drained, then checks that every event is in its table exactly once.
func (h *sseDaemon) waitAll(total int) {
	t := h.t
	began := time.Now()
	testsync.WaitFor(t, fmt.Sprintf("%d events applied and the queue drained", total), 90*time.Second, func() bool {
		return h.applied() >= total && pendingEvents(t, h.httpAddr) == 0
	})
	t.Logf("all applied %v later", time.Since(began).Round(time.Millisecond))
	got := sinkEvents(t, h.sink)
	for n := 1; n <= total; n++ {
		if _, ok := got[testupstream.SSEID(n)]; !ok {
			t.Fatalf("event %s is missing from the processor's table", testupstream.SSEID(n))
		}
	}
	if len(got) != total {
		t.Fatalf("the processor's table holds %d events, want %d", len(got), total)
	}
}

// eventID parses a Last-Event-ID of the feed, -1 for none.
func eventID(t *testing.T, h testupstream.SSEHandshake) int {
	t.Helper()
	if !h.HasLastEventID {
		return -1
	}
	n, err := strconv.Atoi(h.LastEventID)
	if err != nil {
		t.Fatalf("request at %s sent Last-Event-ID %q, not an event id", h.Time.Format(time.RFC3339Nano), h.LastEventID)
	}
	return n
}

// TestSSEThroughTheDaemon runs the built daemon with an sse source and
// the built exactly-once processor; see the subtests.
func TestSSEThroughTheDaemon(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the daemon and the processor")
	}
	t.Parallel() // long and mostly waiting: overlaps the other long tests (make test's wall time)
	dir := t.TempDir()
	bin, procBin := buildBinary(t, dir), buildProcessor(t, dir)
	t.Run("drops", func(t *testing.T) { sseDrops(t, bin, procBin) })
	t.Run("kill9", func(t *testing.T) { sseKills(t, bin, procBin) })
}

// dropMark is the durable cursor when the feed dropped a stream.
type dropMark struct {
	at     time.Time
	cursor int
}

// sseDrops streams 10,000 events that the feed drops every 500 (every
// other time inside an event), resending three events before the id
// after each resume, and answering every fifth reconnect 503 with
// Retry-After: 1. Every event is applied exactly once; every reconnect
// sends a Last-Event-ID no older than the cursor durable when the stream
// dropped and no newer than the last event the feed sent whole (never
// the id of the event cut off); no request comes before a Retry-After.
func sseDrops(t *testing.T, bin, procBin string) {
	const total, dropAfter = 10_000, 500
	var (
		mu    sync.Mutex
		feed  *testupstream.SSEFeed
		h     *sseDaemon
		marks []dropMark
	)
	feed = testupstream.NewSSE(t, testupstream.SSEOptions{Total: total, DropAfter: dropAfter, Drops: total, MidEvent: 2, Resend: 3,
		OnDrop: func() {
			mu.Lock()
			defer mu.Unlock()
			c, err := h.durable()
			n, _ := strconv.Atoi(c)
			if err != nil {
				t.Errorf("reading the durable cursor at a drop: %v", err)
			}
			marks = append(marks, dropMark{at: time.Now(), cursor: n})
			if len(marks)%5 == 0 {
				feed.Script(testupstream.RetryAfter(http.StatusServiceUnavailable, 1))
			}
		}})
	mu.Lock()
	h = startSSEDaemon(t, bin, procBin, feed.URL)
	mu.Unlock()
	h.waitAll(total)
	h.stop()

	hs := feed.Handshakes()
	mu.Lock()
	defer mu.Unlock()
	if len(marks) < total/dropAfter-1 {
		t.Fatalf("%d drops, want %d", len(marks), total/dropAfter-1)
	}
	if eventID(t, hs[0]) != -1 {
		t.Errorf("the first request sent Last-Event-ID %q, want none", hs[0].LastEventID)
	}
	sentWhole, violations, waits := 0, 0, 0
	for i := 1; i < len(hs); i++ {
		if prev := hs[i-1]; prev.Status == http.StatusOK {
			sentWhole = max(sentWhole, prev.From+prev.Sent-1)
		} else if prev.Status == http.StatusServiceUnavailable {
			waits++
			if promised := prev.Time.Add(time.Second); hs[i].Time.Before(promised) {
				violations++
				t.Errorf("request %d came %v before the Retry-After of the one before", i, promised.Sub(hs[i].Time))
			}
		}
		durable := 0
		for _, m := range marks {
			if m.at.Before(hs[i].Time) {
				durable = m.cursor
			}
		}
		id := eventID(t, hs[i])
		if id < durable || id > sentWhole {
			t.Errorf("request %d sent Last-Event-ID %d: want at least the cursor durable at the drop, %d, and at most the last event sent whole, %d",
				i, id, durable, sentWhole)
		}
	}
	t.Logf("%d requests, %d drops, %d Retry-After waits, %d violations", len(hs), len(marks), waits, violations)
	if waits == 0 {
		t.Error("no request was answered with Retry-After")
	}
}

// sseKills SIGKILLs the daemon three times while it streams 10,000
// events (paced, so that a kill lands while events are read, and dropped
// every 700, every other time inside an event): each
// restart sends the durable cursor as Last-Event-ID, exactly, and at the
// end every event is applied exactly once.
func sseKills(t *testing.T, bin, procBin string) {
	const total = 10_000
	feed := testupstream.NewSSE(t, testupstream.SSEOptions{Total: total, DropAfter: 700, Drops: total, MidEvent: 2,
		Pace: 300 * time.Microsecond})
	h := startSSEDaemon(t, bin, procBin, feed.URL)
	for kill := 1; kill <= 3; kill++ {
		testsync.WaitFor(t, "events applied", 60*time.Second, func() bool { return h.applied() >= kill*total/5 })
		h.d.kill(t)
		applied := h.applied()
		durable, err := h.durable()
		if err != nil {
			t.Fatal(err)
		}
		n := len(feed.Handshakes())
		h.start()
		testsync.WaitFor(t, "the restarted daemon's request", 30*time.Second, func() bool { return len(feed.Handshakes()) > n })
		first := feed.Handshakes()[n]
		t.Logf("kill %d: %d events applied, durable cursor %q, restart sent Last-Event-ID %q", kill, applied, durable, first.LastEventID)
		if first.LastEventID != durable || first.HasLastEventID != (durable != "") {
			t.Fatalf("kill %d: the restarted daemon sent Last-Event-ID %q (set: %v), want the durable cursor %q",
				kill, first.LastEventID, first.HasLastEventID, durable)
		}
	}
	h.waitAll(total)
	h.stop()
}
