package daemon

import (
	"context"
	"fmt"
	"strings"
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

// TestCatchUpRunStopsAtMaxPages: a source behind by 9 pages of a
// has_more API, with max_pages = 4 and a 3 s interval, fetches 4 pages
// back to back, shows in /status that it waits for the interval because
// max_pages went back to back, sends no request before that interval is
// over, then goes on from where the run stopped; every record arrives.
func TestCatchUpRunStopsAtMaxPages(t *testing.T) {
	srv := testupstream.NewServer(t, testupstream.Options{Total: 90, PageSize: 10, Paging: testupstream.PageBodyCursor})
	h := startDaemon(t, "", "", fmt.Sprintf(`
[source.behind]
kind = "http_poll"
poll_url = %q
interval = "3s"
jitter = "0%%"
records_path = "data"
id_field = "id"
cursor_from = "body"
cursor_body_field = "next_cursor"
cursor_param = "cursor"
has_more_field = "has_more"
max_pages = 4
`, srv.URL+"/feed"))
	seen := newSeenSet()
	h.startProcessor(func(_ context.Context, ev *processor.Event) error {
		seen.add(ev.Key)
		return nil
	})
	testsync.WaitFor(t, "the first run to stop at max_pages", 30*time.Second, func() bool {
		src := getStatus(t, h.d.HTTPAddr()).Sources[0]
		return src.Reason == "interval" && strings.Contains(src.Detail, "4 pages went back to back (max_pages)")
	})
	testsync.WaitFor(t, "every record", 60*time.Second, func() bool { return seen.len() == 90 })
	reqs := srv.Requests()
	if len(reqs) < 9 {
		t.Fatalf("%d requests, want at least the 9 pages", len(reqs))
	}
	for i := 1; i < 9; i++ {
		gap := reqs[i].Time.Sub(reqs[i-1].Time)
		if i%4 == 0 && gap < 3*time.Second {
			t.Errorf("request %d came %s after the run of 4 pages, want the 3s interval", i+1, gap)
		}
		if i%4 != 0 && gap >= 3*time.Second {
			t.Errorf("request %d came %s after the one before, within a run: want at once", i+1, gap)
		}
	}
}
