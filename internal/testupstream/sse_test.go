package testupstream

import (
	"io"
	"net/http"
	"strings"
	"testing"
	"time"
)

// getSSE requests feed with Last-Event-ID lastID (none when empty) and
// returns the status and the body read until the stream ends or breaks,
// which the feed's End or drops make it do.
func getSSE(t *testing.T, feed *SSEFeed, lastID string) (int, string, error) {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), http.MethodGet, feed.URL, nil)
	if err != nil {
		t.Fatal(err)
	}
	if lastID != "" {
		req.Header.Set("Last-Event-ID", lastID)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = resp.Body.Close() }()
	body, err := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body), err
}

func TestSSEFeedStreamsFromLastEventID(t *testing.T) {
	feed := NewSSE(t, SSEOptions{Total: 5, End: true, Resend: 1, Retry: 250 * time.Millisecond, OtherEvery: 4, MultiLine: true})
	status, body, err := getSSE(t, feed, "2")
	if err != nil || status != http.StatusOK {
		t.Fatalf("status %d, %v", status, err)
	}
	want := "retry: 250\n" +
		"id: 2\ndata: {\"id\":\"sse-2\",\ndata: \"seq\":2,\ndata: \"ts\":\"2026-11-22T00:00:02Z\",\ndata: \"body\":\"record number 2\"}\n\n" +
		"id: 3\ndata: {\"id\":\"sse-3\",\ndata: \"seq\":3,\ndata: \"ts\":\"2026-11-22T00:00:03Z\",\ndata: \"body\":\"record number 3\"}\n\n" +
		"id: 4\nevent: status\ndata: {\"status\":\"ok\",\ndata: \"n\":4}\n\n" +
		"id: 5\ndata: {\"id\":\"sse-5\",\ndata: \"seq\":5,\ndata: \"ts\":\"2026-11-22T00:00:05Z\",\ndata: \"body\":\"record number 5\"}\n\n"
	if body != want {
		t.Fatalf("body\n%q\nwant\n%q", body, want)
	}
	if got := string(feed.Data(2)); got != "{\"id\":\"sse-2\",\n\"seq\":2,\n\"ts\":\"2026-11-22T00:00:02Z\",\n\"body\":\"record number 2\"}" {
		t.Fatalf("Data(2) = %q", got)
	}
	hs := feed.Handshakes()
	if len(hs) != 1 || hs[0].LastEventID != "2" || !hs[0].HasLastEventID || hs[0].From != 2 || hs[0].Sent != 4 || hs[0].Dropped {
		t.Fatalf("handshakes %+v", hs)
	}
}

func TestSSEFeedDropsMidEvent(t *testing.T) {
	feed := NewSSE(t, SSEOptions{Total: 10, DropAfter: 2, Drops: 2, MidEvent: 2, LineEnd: "\r"})
	_, body, err := getSSE(t, feed, "")
	if err == nil || body != "id: 1\rdata: "+string(feed.Data(1))+"\r\rid: 2\rdata: "+string(feed.Data(2))+"\r\r" {
		t.Fatalf("first stream: %q, %v; want two events and a broken stream", body, err)
	}
	_, body, err = getSSE(t, feed, "2")
	data := "data: " + string(feed.Data(5))
	if err == nil || !strings.HasSuffix(body, "\r\rid: 5\r"+data[:6+(len(data)-6)/2]) {
		t.Fatalf("second stream: %q, %v; want it cut inside event 5", body, err)
	}
	if hs := feed.Handshakes(); len(hs) != 2 || !hs[1].Dropped || hs[1].Sent != 2 || hs[1].End.IsZero() {
		t.Fatalf("handshakes %+v", hs)
	}
}

func TestSSEFeedScriptedFaultsAndBadIDs(t *testing.T) {
	feed := NewSSE(t, SSEOptions{Total: 3, End: true, MalformedAt: 2})
	feed.Script(RetryAfter(http.StatusServiceUnavailable, 7), Status(http.StatusNoContent))
	if status, _, _ := getSSE(t, feed, ""); status != http.StatusServiceUnavailable {
		t.Fatalf("status %d, want the scripted 503", status)
	}
	if status, body, _ := getSSE(t, feed, ""); status != http.StatusNoContent || body != "" {
		t.Fatalf("status %d body %q, want the scripted 204", status, body)
	}
	if status, _, _ := getSSE(t, feed, "x"); status != http.StatusBadRequest {
		t.Fatalf("status %d for Last-Event-ID x, want 400", status)
	}
	for range 2 {
		_, body, _ := getSSE(t, feed, "1")
		if strings.Count(body, SSEMalformed) > 1 || strings.Count(body, "id: ") != 2 {
			t.Fatalf("body %q", body)
		}
	}
	hs := feed.Handshakes()
	if len(hs) != 5 || hs[0].Status != 503 || hs[1].Status != 204 || hs[2].Status != 400 || hs[3].Status != 200 {
		t.Fatalf("handshakes %+v", hs)
	}
}
