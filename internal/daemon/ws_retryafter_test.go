package daemon

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/ingestorhq/ingestor/internal/testsync"
	"github.com/ingestorhq/ingestor/internal/testupstream"
	"github.com/ingestorhq/ingestor/processor"
)

// TestWebSocketRetryAfterThroughTheDaemon is
// TestRetryAfterAndPaginationThroughTheDaemon for a websocket source: the
// handshakes are answered 429 with Retry-After: 1, then 503 with a
// Retry-After date. No handshake goes out before a Retry-After expires,
// each wait is logged as "upstream asked to wait" and counted as a "wait"
// poll, as for http_poll, and every record arrives.
func TestWebSocketRetryAfterThroughTheDaemon(t *testing.T) {
	feed := testupstream.NewWS(t, testupstream.WSOptions{Total: 20})
	feed.Script(testupstream.RetryAfter(http.StatusTooManyRequests, 1), testupstream.RetryAfterDate(http.StatusServiceUnavailable, 2*time.Second))
	h := startDaemon(t, "", "", fmt.Sprintf(`
[source.stream]
kind = "websocket"
url = %q
subscribe = '{"op":"subscribe","since":"{cursor}"}'
interval = "50ms"
id_field = "id"
cursor_field = "seq"
reconnect_max = "20ms"
`, feed.URL))
	seen := newSeenSet()
	h.startProcessor(func(_ context.Context, ev *processor.Event) error {
		seen.add(ev.Key)
		return nil
	})
	testsync.WaitFor(t, "all records delivered", 60*time.Second, func() bool { return seen.len() == 20 })

	hs := feed.Handshakes()
	if len(hs) != 3 || hs[0].Status != http.StatusTooManyRequests || hs[1].Status != http.StatusServiceUnavailable || hs[2].Status != 0 {
		t.Fatalf("handshakes %+v, want 429, 503, then one accepted", hs)
	}
	if gap := hs[1].Time.Sub(hs[0].Time); gap < time.Second {
		t.Errorf("second handshake %v after a 429 with Retry-After: 1", gap)
	}
	if promised := hs[1].Time.Add(2 * time.Second).Truncate(time.Second); hs[2].Time.Before(promised) {
		t.Errorf("third handshake %v before the Retry-After date of the 503", promised.Sub(hs[2].Time))
	}
	if n := metric(t, h.d.Registry(), "ingestor_source_polls_total", "source", "stream", "result", "wait"); n != 2 {
		t.Errorf("polls with result wait = %v, want 2", n)
	}
	if logs := h.logs.String(); strings.Count(logs, `msg="upstream asked to wait" source=stream`) != 2 {
		t.Errorf("want two \"upstream asked to wait\" lines for the source:\n%s", logs)
	}
}
