package sources

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ingestorhq/ingestor/internal/testsync"
	"github.com/ingestorhq/ingestor/internal/testupstream"
)

// fetchHonouringWaits fetches as the source actor does, not before the
// Until of a *WaitError, until want records came; it returns the waits.
func fetchHonouringWaits(t *testing.T, src Source, want int) []*WaitError {
	t.Helper()
	var waits []*WaitError
	for got, deadline := 0, time.Now().Add(20*time.Second); got < want; {
		if time.Now().After(deadline) {
			t.Fatalf("got %d of %d records before the deadline; waits %v", got, want, waits)
		}
		ctx, cancel := context.WithTimeout(t.Context(), time.Second)
		b, err := src.Fetch(ctx, "")
		cancel()
		var wait *WaitError
		switch {
		case errors.As(err, &wait):
			waits = append(waits, wait)
			if !testSleep(t, time.Until(wait.Until)) {
				return waits
			}
		case err != nil:
			t.Fatal(err)
		default:
			got += len(b.Records)
		}
	}
	return waits
}

// testSleep waits d, or until the test ends (false).
func testSleep(t *testing.T, d time.Duration) bool {
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case <-timer.C:
		return true
	case <-t.Context().Done():
		return false
	}
}

// TestSSERetryAfterIsHonoured answers the first requests 429 with
// Retry-After in seconds and 503 with Retry-After as an HTTP date: no
// request may go out before the promised time, and Fetch hands each wait
// to its caller as a *WaitError, as websocket does.
func TestSSERetryAfterIsHonoured(t *testing.T) {
	feed := testupstream.NewSSE(t, testupstream.SSEOptions{Total: 3})
	feed.Script(testupstream.RetryAfter(http.StatusTooManyRequests, 1),
		testupstream.RetryAfterDate(http.StatusServiceUnavailable, 2*time.Second))
	var mu sync.Mutex
	var notes []string
	src := openSSE(t, sseSpec(feed.URL, nil), Env{Trace: func(ev TraceEvent) {
		mu.Lock()
		defer mu.Unlock()
		notes = append(notes, ev.Note)
	}})
	waits := fetchHonouringWaits(t, src, 3)

	hs := feed.Handshakes()
	if len(hs) != 3 || hs[0].Status != http.StatusTooManyRequests || hs[1].Status != http.StatusServiceUnavailable || hs[2].Status != http.StatusOK {
		t.Fatalf("requests %+v, want 429, 503, then a stream", hs)
	}
	promised := []time.Time{hs[0].Time.Add(time.Second), hs[1].Time.Add(2 * time.Second).Truncate(time.Second)}
	for i, p := range promised {
		t.Logf("request %d went out %v after the Retry-After of the one before", i+1, hs[i+1].Time.Sub(p))
		if hs[i+1].Time.Before(p) {
			t.Errorf("request %d at %s, before the Retry-After (%s) of the one before",
				i+1, hs[i+1].Time.Format(time.RFC3339Nano), p.Format(time.RFC3339Nano))
		}
	}
	if len(waits) != 2 {
		t.Fatalf("Fetch returned the waits %v, want one per Retry-After", waits)
	}
	for i, status := range []string{"429", "503"} {
		if waits[i].Until.Before(promised[i]) || !strings.Contains(waits[i].Error(), status) || waits[i].Reason != WaitRetryAfter {
			t.Errorf("wait %d: %v until %s, want status %s and not before %s", i, waits[i], waits[i].Until, status, promised[i])
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if traced := strings.Join(notes, "\n"); strings.Count(traced, "Retry-After") != 2 {
		t.Errorf("traces do not show both Retry-After waits:\n%s", traced)
	}
}

// TestSSERetryFieldIsHonoured drops a stream that set retry: 400 twice:
// each reconnect waits at least 400ms after the drop, though reconnect_max
// is 20ms.
func TestSSERetryFieldIsHonoured(t *testing.T) {
	const retry = 400 * time.Millisecond
	feed := testupstream.NewSSE(t, testupstream.SSEOptions{Total: 15, Retry: retry, DropAfter: 5, Drops: 2})
	src := openSSE(t, sseSpec(feed.URL, nil), Env{})
	c := &sseConsumer{t: t, src: src, feed: feed}
	c.until(seqRange(1, 15))
	hs := feed.Handshakes()
	if len(hs) != 3 || !hs[0].Dropped || !hs[1].Dropped {
		t.Fatalf("requests %+v, want two dropped streams and a third", hs)
	}
	for i := 1; i < len(hs); i++ {
		gap := hs[i].Time.Sub(hs[i-1].End)
		t.Logf("reconnect %d came %v after the drop", i, gap)
		if gap < retry {
			t.Errorf("reconnect %d came %v after the drop, before the stream's retry (%v)", i, gap, retry)
		}
	}
}

// TestSSENoContentWaitsReconnectMax answers the first request 204: the
// source is quiet (no error) and asks again only after reconnect_max.
func TestSSENoContentWaitsReconnectMax(t *testing.T) {
	const reconnectMax = 700 * time.Millisecond
	feed := testupstream.NewSSE(t, testupstream.SSEOptions{Total: 2})
	feed.Script(testupstream.Status(http.StatusNoContent))
	src := openSSE(t, sseSpec(feed.URL, func(s *SSESpec) { s.ReconnectMax, s.ReadTimeout = "700ms", "200ms" }), Env{})
	c := &sseConsumer{t: t, src: src, feed: feed}
	c.until(seqRange(1, 2)) // fails on any error, though read_timeout passes
	hs := feed.Handshakes()
	if len(hs) != 2 || hs[0].Status != http.StatusNoContent {
		t.Fatalf("requests %+v, want a 204 then a stream", hs)
	}
	if gap := hs[1].Time.Sub(hs[0].Time); gap < reconnectMax {
		t.Fatalf("asked again %v after a 204, before reconnect_max (%v)", gap, reconnectMax)
	}
}

// TestSSESilentStreamIsReopened sends three events and then nothing: the
// stream is taken for dead after read_timeout and reopened from the last
// id handed out.
func TestSSESilentStreamIsReopened(t *testing.T) {
	feed := testupstream.NewSSE(t, testupstream.SSEOptions{Total: 3})
	src := openSSE(t, sseSpec(feed.URL, func(s *SSESpec) { s.ReadTimeout = "300ms" }), Env{})
	c := &sseConsumer{t: t, src: src, feed: feed}
	c.until(seqRange(1, 3))
	lastAt := c.at[len(c.at)-1]
	testsync.WaitFor(t, "the reconnect", 15*time.Second, func() bool { return len(feed.Handshakes()) == 2 })
	hs := feed.Handshakes()
	if took := hs[1].Time.Sub(lastAt); took < 250*time.Millisecond || took > 2*time.Second {
		t.Fatalf("silent stream replaced %v after the last event, want about read_timeout (300ms)", took)
	}
	if hs[1].LastEventID != "3" {
		t.Fatalf("reopened with Last-Event-ID %q, want 3", hs[1].LastEventID)
	}
}

// TestSSEHeartbeatsKeepQuietStream keeps a stream with no event for over
// twice read_timeout, alive on its heartbeat comments alone.
func TestSSEHeartbeatsKeepQuietStream(t *testing.T) {
	feed := testupstream.NewSSE(t, testupstream.SSEOptions{Total: 1, Heartbeat: 100 * time.Millisecond})
	src := openSSE(t, sseSpec(feed.URL, func(s *SSESpec) { s.ReadTimeout = "500ms" }), Env{})
	c := &sseConsumer{t: t, src: src, feed: feed}
	c.until(seqRange(1, 1))
	testsync.WaitFor(t, "twelve heartbeats", 15*time.Second, func() bool { return feed.Heartbeats() >= 12 })
	if n := len(feed.Handshakes()); n != 1 {
		t.Fatalf("%d streams: a quiet stream that sends heartbeats was dropped", n)
	}
}

// sseOutageError fetches from a source that cannot open its stream until
// Fetch reports the outage with the cause of the last attempt.
func sseOutageError(t *testing.T, src Source) error {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); {
		ctx, cancel := context.WithTimeout(t.Context(), time.Second)
		b, err := src.Fetch(ctx, "")
		cancel()
		switch {
		case err == nil && len(b.Records) > 0:
			t.Fatalf("records from a source that cannot connect: %+v", b)
		case err != nil && !strings.Contains(err.Error(), "still connecting"):
			return err
		}
	}
	t.Fatal("the outage was never reported with its cause")
	return nil
}

func TestSSERefusedAnswersAreErrors(t *testing.T) {
	for _, tc := range []struct {
		name      string
		status    int
		ctype     string
		permanent bool
		want      string
	}{
		{"unauthorized", http.StatusUnauthorized, "text/event-stream", true, "status 401"},
		{"server error", http.StatusBadGateway, "text/event-stream", false, "status 502"},
		{"request timeout", http.StatusRequestTimeout, "text/event-stream", false, "status 408"},
		{"not a stream", http.StatusOK, "application/json", false, `content type "application/json"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
				w.Header().Set("Content-Type", tc.ctype)
				w.WriteHeader(tc.status)
				_, _ = w.Write([]byte(`{"error":"no"}`))
			}))
			t.Cleanup(upstream.Close)
			src := openSSE(t, sseSpec(upstream.URL, func(s *SSESpec) { s.ReadTimeout = "200ms" }), Env{})
			err := sseOutageError(t, src)
			var perm *PermanentError
			if errors.As(err, &perm) != tc.permanent || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %v, want one naming %s, permanent %v", err, tc.want, tc.permanent)
			}
		})
	}
}

func TestSSESecretsStayOutOfTracesAndLogs(t *testing.T) {
	feed := testupstream.NewSSE(t, testupstream.SSEOptions{Total: 2})
	var logs testsync.LockedBuffer
	var mu sync.Mutex
	var traces []TraceEvent
	env := Env{
		Member: "node-7",
		Logger: slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug})),
		Trace: func(ev TraceEvent) {
			mu.Lock()
			defer mu.Unlock()
			traces = append(traces, ev)
		},
	}
	src := openSSE(t, sseSpec(feed.URL+"/feed?token=s3cret", func(s *SSESpec) {
		s.Headers = map[string]string{"Authorization": "Bearer s3cret"}
	}), env)
	c := &sseConsumer{t: t, src: src, feed: feed}
	c.until(seqRange(1, 2))
	feed.Drop()
	testsync.WaitFor(t, "the reconnect", 15*time.Second, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(traces) >= 3 // connected, lost, connected
	})
	h := feed.Handshakes()[0].Header
	if h.Get("Authorization") != "Bearer s3cret" || h.Get(MemberHeader) != "node-7" || h.Get("Accept") != "text/event-stream" {
		t.Fatalf("request header %v", h)
	}
	if err := src.Close(); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	for _, ev := range traces {
		if ev.Method != http.MethodGet || !strings.HasSuffix(ev.URL, "/feed?token=REDACTED") || strings.Contains(ev.URL+ev.Note, "s3cret") {
			t.Errorf("trace %+v", ev)
		}
	}
	if !strings.Contains(traces[0].Note, `Last-Event-ID ""`) || !strings.Contains(traces[2].Note, `Last-Event-ID "2"`) {
		t.Errorf("traces %+v", traces)
	}
	if strings.Contains(logs.String(), "s3cret") {
		t.Errorf("a secret was logged:\n%s", logs.String())
	}
	if !strings.Contains(logs.String(), "/feed?token=REDACTED") {
		t.Errorf("the connect log line lacks the URL, secrets redacted:\n%s", logs.String())
	}
}

func TestSSETLS(t *testing.T) {
	feed := testupstream.NewSSE(t, testupstream.SSEOptions{Total: 2, TLS: true})
	if !strings.HasPrefix(feed.URL, "https://") {
		t.Fatalf("feed URL %s", feed.URL)
	}
	verified := openSSE(t, sseSpec(feed.URL, func(s *SSESpec) { s.ReadTimeout = "1s" }), Env{})
	if err := sseOutageError(t, verified); !strings.Contains(err.Error(), "certificate") {
		t.Fatalf("an unknown certificate: %v, want the error naming it", err)
	}
	src := openSSE(t, sseSpec(feed.URL, func(s *SSESpec) { s.TLSCAFile = writeCAFile(t, feed.Certificate()) }), Env{})
	c := &sseConsumer{t: t, src: src, feed: feed}
	c.until(seqRange(1, 2))

	var logs bytes.Buffer
	insecure := openSSE(t, sseSpec(feed.URL, func(s *SSESpec) { s.TLSInsecureSkipVerify = true }),
		Env{Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	c = &sseConsumer{t: t, src: insecure, feed: feed}
	c.until(seqRange(1, 2))
	if err := insecure.Close(); err != nil { // and stops its logging
		t.Fatal(err)
	}
	if n := strings.Count(logs.String(), "level=WARN"); n < 2 || !strings.Contains(logs.String(), "VERIFICATION IS DISABLED") {
		t.Fatalf("want a warning at Open and at connect, got:\n%s", logs.String())
	}
}
