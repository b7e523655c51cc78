package daemon

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/ingestorhq/ingestor/internal/testsync"
	"github.com/ingestorhq/ingestor/internal/testupstream"
	"github.com/ingestorhq/ingestor/processor"
)

// TestBodyCursorCatchUpThroughTheDaemon pins issue 9 item 8 end to end: an
// upstream with the cursor in the body and has_more serves a backlog of 5
// pages; with has_more_field the daemon fetches them back to back, far
// faster than one page per interval, stores the last next_cursor, and then
// waits for the interval. The first poll is spread over one interval, so
// interval is a few seconds rather than an hour; the backlog must still
// take well under one interval, where one page per interval would take 4.
func TestBodyCursorCatchUpThroughTheDaemon(t *testing.T) {
	const interval = 4 * time.Second
	srv := testupstream.NewServer(t, testupstream.Options{Total: 50, PageSize: 10, Paging: testupstream.PageBodyCursor})
	h := startDaemon(t, "", "", fmt.Sprintf(`
[source.catchup]
kind = "http_poll"
poll_url = %q
interval = %q
jitter = "0%%"
id_field = "id"
records_path = "data"
cursor_from = "body"
cursor_body_field = "next_cursor"
cursor_param = "cursor"
has_more_field = "has_more"
`, srv.URL+"/feed", interval.String()))
	seen := newSeenSet()
	h.startProcessor(func(_ context.Context, ev *processor.Event) error {
		seen.add(ev.Key)
		return nil
	})
	testsync.WaitFor(t, "all records delivered", 30*time.Second, func() bool { return seen.len() == 50 })
	want := testupstream.BodyCursor(50)
	testsync.WaitFor(t, "the last next_cursor stored", 10*time.Second, func() bool {
		c, ok, err := h.d.Queue().Cursor(t.Context(), "catchup")
		return err == nil && ok && c == want
	})
	reqs := srv.Requests()
	if len(reqs) != 5 {
		t.Fatalf("%d requests, want the 5 pages of the backlog", len(reqs))
	}
	span := reqs[4].Time.Sub(reqs[0].Time)
	t.Logf("5 pages fetched in %v (interval %v)", span, interval)
	if span >= interval {
		t.Errorf("the backlog took %v, want well under one interval (%v)", span, interval)
	}
	for i, r := range reqs {
		if i > 0 && r.Query.Get("cursor") != testupstream.BodyCursor(10*i) {
			t.Errorf("request %d sent cursor %q, want page %d's next_cursor", i, r.Query.Get("cursor"), i)
		}
	}
	// Caught up (has_more false): the next poll is due one interval after
	// the last page, so none goes out for half of it. The sleep is the
	// observation window of that absence, not a wait for a condition.
	time.Sleep(time.Until(reqs[4].Time.Add(interval / 2)))
	if n := len(srv.Requests()); n != 5 {
		t.Errorf("%d requests within half an interval of the last page, want none after it", n-5)
	}
}
