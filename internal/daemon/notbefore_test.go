package daemon

import (
	"context"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/ingestorhq/ingestor/internal/queue"
	"github.com/ingestorhq/ingestor/internal/testsync"
	"github.com/ingestorhq/ingestor/internal/testupstream"
	"github.com/ingestorhq/ingestor/processor"
)

// TestWebSocketHonoursStoredNotBefore starts the daemon on a queue where
// an earlier run stored a not-before time for a websocket source (the
// upstream's Retry-After): the source connects to nobody before that time,
// then connects and delivers every record. (The http_poll kind is covered
// end to end by cmd/ingestor TestRetryAfterSurvivesKill.)
func TestWebSocketHonoursStoredNotBefore(t *testing.T) {
	const total = 20
	feed := testupstream.NewWS(t, testupstream.WSOptions{Total: total})
	dir := t.TempDir()
	q, err := queue.Open(queue.Options{Path: filepath.Join(dir, "queue.db")})
	if err != nil {
		t.Fatal(err)
	}
	notBefore := time.Now().Add(2 * time.Second)
	if err := q.SetNotBefore(t.Context(), "ws", notBefore); err != nil {
		t.Fatal(err)
	}
	if err := q.Close(); err != nil {
		t.Fatal(err)
	}

	h := startDaemonIn(t, dir, "", "", "", fmt.Sprintf(`
[source.ws]
kind = "websocket"
url = %q
interval = "20ms"
subscribe = '{"since":"{cursor}"}'
id_field = "id"
cursor_field = "seq"
`, feed.URL), Options{})
	seen := newSeenSet()
	h.startProcessor(func(_ context.Context, ev *processor.Event) error {
		seen.add(ev.Key)
		return nil
	})
	// Every look before the stored time must find no connection; the
	// source itself started at once.
	for time.Now().Before(notBefore) {
		if n := len(feed.Connections()); n > 0 {
			t.Fatalf("%d connection(s) %v before the stored not-before time", n, time.Until(notBefore))
		}
		time.Sleep(5 * time.Millisecond) // sampling the feed until a known instant, not waiting for a condition
	}
	testsync.WaitFor(t, "every record delivered", 30*time.Second, func() bool { return seen.len() == total })
}
