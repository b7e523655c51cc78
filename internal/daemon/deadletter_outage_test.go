package daemon

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/ingestorhq/ingestor/internal/testsync"
	"github.com/ingestorhq/ingestor/processor"
)

// TestMalformedPagesDuringOutageStayInWindow takes the file raw store away
// (its directory replaced by a plain file, so every write fails) while an
// upstream serves nothing but malformed 1 MiB pages. Each malformed payload
// waiting to be dead-lettered holds its body, so they must stay within the
// source's inflight_batches window like batches do: the payloads held
// (ingestor_raw_writes_pending) never exceed it, the source stops fetching
// once it is full, and the heap stays small. Once the store is back, every
// malformed payload served is stored under deadletter/ and listed, and the
// good records served afterwards arrive. malformed_retries = 0 dead-letters
// each malformed page at once.
func TestMalformedPagesDuringOutageStayInWindow(t *testing.T) {
	const window = 2
	up := startMalformedUpstream(t)
	h := startDaemon(t, "", "", fmt.Sprintf(`
[source.bad]
kind = "http_poll"
poll_url = %q
interval = "10ms"
jitter = "0%%"
timeout = "5s"
inflight_batches = %d
malformed_retries = 0
id_field = "id"
cursor_field = "seq"
cursor_param = "since"
`, up.URL, window))
	seen := newSeenSet()
	h.startProcessor(func(_ context.Context, ev *processor.Event) error {
		seen.add(ev.Key)
		return nil
	})
	reg := h.d.Registry()
	testsync.WaitFor(t, "the source polling", 10*time.Second, func() bool {
		return metric(t, reg, "ingestor_source_polls_total", "source", "bad", "result", "ok") > 0
	})

	rawDir := filepath.Join(h.dir, "raw")
	away := takeRawStoreAway(t, rawDir)
	checkOutageStaysInWindow(t, reg, up, window)

	up.mode.Store(2)
	if err := os.Remove(rawDir); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(away, rawDir); err != nil {
		t.Fatal(err)
	}
	testsync.WaitFor(t, "good records delivered", 60*time.Second, func() bool { return seen.count("g-1") > 0 && seen.count("g-2") > 0 })
	checkMalformedDeadLettered(t, h, up)
	testsync.WaitFor(t, "nothing held", 10*time.Second, func() bool { return metric(t, reg, "ingestor_raw_writes_pending") == 0 })
}

// malformedUpstream is an upstream whose pages are empty, malformed or
// good records, as its mode says, and which counts the malformed pages
// it served.
type malformedUpstream struct {
	*httptest.Server
	malformed []byte
	mode      atomic.Int32 // 0: empty pages, 1: malformed, 2: good records
	served    atomic.Int64
}

// startMalformedUpstream starts a malformedUpstream serving empty pages,
// whose malformed page is 1 MiB of not JSON, until the test ends.
func startMalformedUpstream(t *testing.T) *malformedUpstream {
	up := &malformedUpstream{malformed: bytes.Repeat([]byte("not json "), (1<<20)/9)}
	up.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		switch up.mode.Load() {
		case 1:
			up.served.Add(1)
			if _, err := w.Write(up.malformed); err != nil {
				t.Logf("upstream: write malformed page: %v", err)
			}
		case 2:
			fmt.Fprint(w, `[{"id":"g-1","seq":1},{"id":"g-2","seq":2}]`)
		default:
			fmt.Fprint(w, `[]`)
		}
	}))
	t.Cleanup(up.Close)
	return up
}

// takeRawStoreAway moves the file raw store's directory rawDir aside and
// puts a plain file in its place, so every write fails, and returns where
// the directory went.
func takeRawStoreAway(t *testing.T, rawDir string) (away string) {
	t.Helper()
	away = rawDir + ".away"
	if err := os.Rename(rawDir, away); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(rawDir, []byte("the raw store is down"), 0o600); err != nil {
		t.Fatal(err)
	}
	return away
}

// checkOutageStaysInWindow has up serve malformed pages while the raw store
// is down, and checks that the payloads held, the pages fetched and the
// heap's growth stay within the source's window of window batches.
func checkOutageStaysInWindow(t *testing.T, reg *prometheus.Registry, up *malformedUpstream, window int) {
	t.Helper()
	runtime.GC()
	var before runtime.MemStats
	runtime.ReadMemStats(&before)
	up.mode.Store(1)

	// Each payload held is retried with backoff; wait for several failed
	// writes per window slot, sampling what is held meanwhile.
	var held float64
	testsync.WaitFor(t, "failed raw writes during the outage", 30*time.Second, func() bool {
		held = max(held, metric(t, reg, "ingestor_raw_writes_pending"))
		return metric(t, reg, "ingestor_raw_put_errors_total") >= float64(4*window)
	})
	held = max(held, metric(t, reg, "ingestor_raw_writes_pending"))
	runtime.GC()
	var during runtime.MemStats
	runtime.ReadMemStats(&during)
	growth := int64(during.HeapAlloc) - int64(before.HeapAlloc)
	t.Logf("outage: %d malformed pages fetched, at most %v payloads held, heap grew %d KiB", up.served.Load(), held, growth>>10)
	if held > float64(window) {
		t.Errorf("%v payloads held during the outage, want at most the window of %d", held, window)
	}
	if n := up.served.Load(); n > int64(window) {
		t.Errorf("%d malformed pages fetched during the outage, want at most the window of %d", n, window)
	}
	if growth > 48<<20 {
		t.Errorf("heap grew by %d MiB during the outage, want a few MiB", growth>>20)
	}
}

// checkMalformedDeadLettered waits until every malformed page up served is
// dead-lettered, and checks that each dead letter is stored under
// deadletter/ with the bytes served.
func checkMalformedDeadLettered(t *testing.T, h *harness, up *malformedUpstream) {
	t.Helper()
	// The good answer to the same request resolves them: list those too.
	// The pages are the same bytes: one entry counts them all.
	testsync.WaitFor(t, "every malformed page dead-lettered", 60*time.Second, func() bool {
		var n int64
		for _, d := range allDeadLetters(t, h) {
			n += int64(d.Count)
		}
		return n == up.served.Load()
	})
	for _, d := range allDeadLetters(t, h) {
		if !strings.HasPrefix(d.RawKey, "deadletter/bad/") {
			t.Errorf("dead letter %+v not stored under deadletter/", d)
		}
		body, err := h.d.raw.Get(t.Context(), d.RawKey)
		if err != nil || !bytes.Equal(body, up.malformed) {
			t.Errorf("dead letter %s: %d bytes stored (%v), want the %d bytes served", d.RawKey, len(body), err, len(up.malformed))
		}
	}
}
