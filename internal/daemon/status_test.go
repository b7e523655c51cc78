package daemon

import (
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/ingestorhq/ingestor/internal/testupstream"
)

// statusRig is a daemon with a source in each state the status page
// shows (testupstream.StateFeeds).
type statusRig struct {
	h     *harness
	feeds *testupstream.StateFeeds
}

// startStatusRig starts the rig and brings every source to its state.
func startStatusRig(t *testing.T) *statusRig {
	t.Helper()
	r := &statusRig{feeds: testupstream.NewStateFeeds(t)}
	r.h = startDaemon(t, "", "max_pending_events = 5", r.feeds.TOML)
	r.feeds.Bring(t, r.h.d.PushAddr(), func(name string) (string, string) {
		for _, s := range getStatus(t, r.h.d.HTTPAddr()).Sources {
			if s.Name == name {
				return s.State, s.Reason
			}
		}
		return "", ""
	})
	return r
}

// getStatus reads GET /status from addr.
func getStatus(t *testing.T, addr string) Status {
	t.Helper()
	resp, err := http.Get("http://" + addr + "/status")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close() //nolint:errcheck // read-only body
	if resp.StatusCode != http.StatusOK || resp.Header.Get("Content-Type") != "application/json" {
		t.Fatalf("GET /status answered %d %q", resp.StatusCode, resp.Header.Get("Content-Type"))
	}
	var st Status
	dec := json.NewDecoder(resp.Body)
	dec.DisallowUnknownFields()
	if err := dec.Decode(&st); err != nil {
		t.Fatal(err)
	}
	return st
}

func TestStatusShowsEverySourceState(t *testing.T) {
	r := startStatusRig(t)
	st := getStatus(t, r.h.d.HTTPAddr())
	if len(st.Sources) != len(r.feeds.Want) {
		t.Fatalf("%d sources in /status, want %d: %+v", len(st.Sources), len(r.feeds.Want), st.Sources)
	}
	by := map[string]SourceStatus{}
	for _, s := range st.Sources {
		by[s.Name] = s
		want := r.feeds.Want[s.Name]
		if s.State != want[0] || s.Reason != want[1] {
			t.Errorf("source %q: state %q reason %q, want %q %q", s.Name, s.State, s.Reason, want[0], want[1])
		}
		if len(s.EventsPerSecond) != 60 {
			t.Errorf("source %q: %d events_per_second entries, want 60", s.Name, len(s.EventsPerSecond))
		}
	}
	now := st.Time
	if s := by["slow"]; s.LastPoll == nil || s.LastSuccess != nil || s.Kind != "http_poll" || !s.Enabled || s.IntervalSeconds != 1 {
		t.Errorf("slow: %+v, want a last poll, no success, kind http_poll, enabled, interval 1", s)
	}
	if s := by["limited"]; s.Until == nil || s.Until.Sub(now) < 50*time.Minute || !strings.Contains(s.Detail, "429") {
		t.Errorf("limited: until %v detail %q, want about an hour ahead and the 429", s.Until, s.Detail)
	}
	if s := by["broken"]; !strings.Contains(s.LastError, "404") || s.LastErrorAt == nil || s.Failures != 1 || s.Until == nil || s.Until.Sub(now) < 4*time.Minute {
		t.Errorf("broken: %+v, want the 404 as last error, 1 failure, a retry minutes ahead", s)
	}
	f := by["filler"]
	// A second fetch of the same 10 records may go out before the first
	// commits (inflight_batches is 2): its records count, as duplicates.
	if f.PendingEvents != 10 || f.RecordsLastMinute < 10 || f.RecordsLastMinute%10 != 0 || f.BytesLastMinute == 0 || f.LastSuccess == nil || f.LagSeconds == nil || *f.LagSeconds <= 0 {
		t.Errorf("filler: %+v, want 10 pending and 10 records (or 20) in the last minute, bytes, a last success and a lag", f)
	}
	var events int64
	for _, n := range f.EventsPerSecond {
		events += n
	}
	if events != 10 {
		t.Errorf("filler: events_per_second sums to %d, want 10", events)
	}
	if s := by["off"]; s.Enabled || s.LastPoll != nil {
		t.Errorf("off: %+v, want disabled and never polled", s)
	}
	if s := by["hooks"]; s.Kind != "webhook" || s.LastSuccess == nil || s.LastRequest == nil || s.LastPoll != nil || s.PendingEvents != 1 || s.RecordsLastMinute != 1 || s.IntervalSeconds != 0 {
		t.Errorf("hooks: %+v, want kind webhook, a last request and success, no poll, 1 pending and 1 record, no interval", s)
	}
	p := st.Pipeline
	if p.PendingEvents != 11 || p.MaxPendingEvents != 5 || p.OldestPendingAgeSeconds <= 0 || !p.RawStoreUp || p.ProcessorsConnected != 0 || p.Draining {
		t.Errorf("pipeline: %+v, want 11 pending of 5, an oldest pending age, raw store up, no processor", p)
	}
	if st.Version == "" {
		t.Error("no version")
	}
	if age := metric(t, r.h.d.Registry(), "ingestor_queue_oldest_pending_age_seconds"); age <= 0 {
		t.Errorf("ingestor_queue_oldest_pending_age_seconds = %v with events pending, want > 0", age)
	}
}

func TestLate(t *testing.T) {
	start := time.Date(2026, 11, 24, 10, 0, 0, 0, time.UTC)
	for _, c := range []struct {
		interval     time.Duration
		success, now time.Time
		want         bool
	}{
		{time.Second, start, start.Add(4 * time.Minute), false},        // 3 intervals, but not 5 minutes
		{time.Second, start, start.Add(6 * time.Minute), true},         // past 5 minutes
		{time.Hour, start, start.Add(2 * time.Hour), false},            // within 3 intervals
		{time.Hour, start, start.Add(3*time.Hour + time.Second), true}, // past 3 intervals
		{time.Second, time.Time{}, start.Add(6 * time.Minute), true},   // never succeeded since the start
		{time.Second, time.Time{}, start.Add(time.Minute), false},
	} {
		if got := late(c.interval, c.success, start, c.now); got != c.want {
			t.Errorf("late(interval %v, success %v, now %v) = %v, want %v", c.interval, c.success, c.now, got, c.want)
		}
	}
}

func TestStatusPageHeaders(t *testing.T) {
	h := startDaemon(t, "", "", "")
	resp, err := http.Get("http://" + h.d.HTTPAddr() + "/")
	if err != nil {
		t.Fatal(err)
	}
	body, err := io.ReadAll(resp.Body)
	if err := errors.Join(err, resp.Body.Close()); err != nil {
		t.Fatal(err)
	}
	csp := resp.Header.Get("Content-Security-Policy")
	if resp.StatusCode != http.StatusOK || !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/html") ||
		!strings.Contains(csp, "script-src 'sha256-") || !strings.Contains(csp, "connect-src 'self'") || !strings.Contains(string(body), `fetch("status"`) {
		t.Fatalf("GET / answered %d %q, CSP %q", resp.StatusCode, resp.Header.Get("Content-Type"), csp)
	}
	// Only / is the page: other paths stay 404.
	resp, err = http.Get("http://" + h.d.HTTPAddr() + "/nothing")
	if err != nil {
		t.Fatal(err)
	}
	if err := resp.Body.Close(); err != nil || resp.StatusCode != http.StatusNotFound {
		t.Fatalf("GET /nothing answered %d (%v), want 404", resp.StatusCode, err)
	}
}
