package daemon

import (
	"context"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/ingestorhq/ingestor/internal/testsync"
	"github.com/ingestorhq/ingestor/internal/testupstream"
	"github.com/ingestorhq/ingestor/processor"
)

// TestRetryAfterAndPaginationThroughTheDaemon runs the whole daemon against
// an upstream that first answers 429 with Retry-After: 1, then 503 with a
// Retry-After date, then serves 300 records over Link pages: no request is
// sent before a Retry-After expires, every page becomes its own batch and
// every record arrives exactly once.
func TestRetryAfterAndPaginationThroughTheDaemon(t *testing.T) {
	srv := testupstream.NewServer(t, testupstream.Options{Total: 300, PageSize: 25, Paging: testupstream.PageLink})
	srv.Script(testupstream.RetryAfter(http.StatusTooManyRequests, 1), testupstream.RetryAfterDate(http.StatusServiceUnavailable, 2*time.Second))
	h := startDaemon(t, "", "", fmt.Sprintf(`
[source.paged]
kind = "http_poll"
poll_url = %q
interval = "50ms"
id_field = "id"
cursor_field = "seq"
cursor_param = "since"
pagination = "link"
max_pages = 100
`, srv.URL+"/feed"))
	seen := newSeenSet()
	h.startProcessor(func(_ context.Context, ev *processor.Event) error {
		seen.add(ev.Key)
		return nil
	})
	testsync.WaitFor(t, "all records delivered", 60*time.Second, func() bool { return seen.len() == 300 })
	for n := 1; n <= 300; n++ {
		if c := seen.count(testupstream.ID(n)); c != 1 {
			t.Fatalf("record %s delivered %d times, want exactly once", testupstream.ID(n), c)
		}
	}
	reqs := srv.Requests()
	if len(reqs) < 2+300/25 {
		t.Fatalf("%d requests, want the two refused ones and at least %d pages", len(reqs), 300/25)
	}
	if gap := reqs[1].Time.Sub(reqs[0].Time); gap < time.Second {
		t.Errorf("second request %v after a 429 with Retry-After: 1", gap)
	}
	// The HTTP date has one-second resolution: the wait is at least 1s.
	if gap := reqs[2].Time.Sub(reqs[1].Time); gap < time.Second {
		t.Errorf("third request %v after a 503 with a Retry-After date 2s ahead", gap)
	}
	if n := metric(t, h.d.Registry(), "ingestor_source_polls_total", "source", "paged", "result", "wait"); n != 2 {
		t.Errorf("polls with result wait = %v, want 2", n)
	}
	var pages int
	for _, r := range reqs[2:] {
		if r.Status == http.StatusOK {
			pages++
		}
	}
	if pages < 300/25 {
		t.Errorf("%d pages served, want at least %d", pages, 300/25)
	}
}
