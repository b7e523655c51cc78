package daemon

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ingestorhq/ingestor/internal/pagebuf"
	"github.com/ingestorhq/ingestor/internal/testsync"
	"github.com/ingestorhq/ingestor/internal/testupstream"
	"github.com/ingestorhq/ingestor/processor"
)

// TestRecycledPageBuffersNeverReachAProcessor: the buffer a page is read
// into goes to a later fetch once every frame of the page was sent, so a
// frame encoded after that would carry another page's bytes. A processor
// that lags now and then (the in-flight window fills, frames wait in the
// frame cache and go out through the backlog scan) and nacks some events
// once (sent again, read back from the raw store) checks every payload it
// gets against the upstream's record for its key, while thousands of
// pages are fetched through recycled buffers.
func TestRecycledPageBuffersNeverReachAProcessor(t *testing.T) {
	const total, page, window = 6_000, 200, 6
	srv := testupstream.NewServer(t, testupstream.Options{Total: total, PageSize: page})
	recycled := pagebuf.Recycled()
	h := startDaemon(t, "", fmt.Sprintf("events_per_frame = 20\nmax_inflight_frames = %d\nack_timeout = \"1s\"", window),
		strings.Replace(httpSource("api", srv.URL), `interval = "20ms"`, `interval = "1ms"`, 1))
	seen := newSeenSet()
	var (
		handled atomic.Int64
		full    atomic.Int64 // lags that saw the window full
		mu      sync.Mutex
		nacked  = map[string]bool{}
		wrong   []string
	)
	h.startProcessor(func(_ context.Context, ev *processor.Event) error {
		n, err := strconv.Atoi(strings.TrimPrefix(ev.Key, "ev-"))
		if err != nil || !bytes.Equal(ev.Data(), testupstream.Record(n)) {
			mu.Lock()
			wrong = append(wrong, ev.Key+": "+string(ev.Data()))
			mu.Unlock()
		}
		if handled.Add(1)%700 == 0 {
			// A lag: hold this event until the in-flight window is full,
			// so that the frames committed meanwhile wait in the frame
			// cache and go out through the backlog scan.
			for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(2 * time.Millisecond) {
				if h.d.sender.Inflight() >= window {
					full.Add(1)
					break
				}
			}
		}
		if n%499 == 0 {
			mu.Lock()
			first := !nacked[ev.Key]
			nacked[ev.Key] = true
			mu.Unlock()
			if first {
				return errors.New("not now") // a retryable nack: sent again from the raw store
			}
		}
		seen.add(ev.Key)
		return nil
	})
	testsync.WaitFor(t, "every record delivered", 120*time.Second, func() bool { return seen.len() == total })
	mu.Lock()
	defer mu.Unlock()
	if len(wrong) > 0 {
		t.Fatalf("%d payloads differ from their records, first %q", len(wrong), wrong[0])
	}
	if full.Load() == 0 {
		t.Error("the in-flight window was never full: the lags did not exercise the frame cache")
	}
	if got := pagebuf.Recycled() - recycled; got < total/page/2 {
		t.Fatalf("%d page buffers recycled of %d pages: the test did not exercise their reuse", got, total/page)
	}
	if n := metric(t, h.d.Registry(), "ingestor_publish_frames_read_back_total"); n == 0 {
		t.Error("no frame was read back: the nacks did not exercise resends")
	}
}
