package testupstream

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ingestorhq/ingestor/internal/testsync"
)

// StateFeeds are the upstreams of a daemon whose sources end up in every
// state its status page shows, with no processor and a queue limit of 5
// events (publish.max_pending_events):
//
//   - "slow": its upstream holds the request, so it stays polling;
//   - "limited": answered 429 with Retry-After: 3600, it waits retry_after;
//   - "broken": answered 404, a configuration problem, it is failing and
//     retries only after ~5 minutes;
//   - "filler": empty answers until Bring fills it, then 10 records: the
//     queue is then full, and it waits queue_full;
//   - "off": disabled, so stopped;
//   - "hooks": a webhook, receiving once Bring posted an event to it.
type StateFeeds struct {
	// TOML holds the [push] block and the sources' blocks.
	TOML string
	// Want maps each source to the state and reason it reaches.
	Want map[string][2]string

	fill atomic.Bool
}

// NewStateFeeds starts the upstreams, closed when the test ends.
func NewStateFeeds(t testing.TB) *StateFeeds {
	f := &StateFeeds{Want: map[string][2]string{
		"slow":    {"polling", ""},
		"limited": {"waiting", "retry_after"},
		"broken":  {"failing", "backoff"},
		"filler":  {"waiting", "queue_full"},
		"off":     {"stopped", "disabled"},
		"hooks":   {"receiving", ""},
	}}
	slow := NewServer(t, Options{Total: 10})
	slow.Script(Hang())
	limited := NewServer(t, Options{Total: 10})
	limited.Script(RetryAfter(http.StatusTooManyRequests, 3600))
	broken := NewServer(t, Options{Total: 10})
	broken.Script(Status(http.StatusNotFound))
	filler := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		body := "[]"
		if f.fill.Load() {
			recs := make([]string, 10)
			for i := range recs {
				recs[i] = fmt.Sprintf(`{"id":"f%d","ts":"2026-11-24T10:00:0%dZ"}`, i, i)
			}
			body = "[" + strings.Join(recs, ",") + "]"
		}
		if _, err := io.WriteString(w, body); err != nil {
			t.Logf("state feeds: filler: %v", err)
		}
	}))
	t.Cleanup(filler.Close)
	poll := func(name, url, interval, extra string) string {
		return fmt.Sprintf(`
[source.%s]
kind = "http_poll"
poll_url = %q
interval = %q
timeout = "5m"
id_field = "id"
%s
`, name, url, interval, extra)
	}
	f.TOML = `
[push]
addr = "127.0.0.1:0"

[source.hooks]
kind = "webhook"
` + poll("slow", slow.URL+"/feed", "1s", "") +
		poll("limited", limited.URL+"/feed", "1s", "") +
		poll("broken", broken.URL+"/feed", "1s", "") +
		poll("filler", filler.URL, "100ms", `time_field = "ts"`) +
		poll("off", slow.URL+"/off", "1s", "enabled = false")
	return f
}

// Bring brings the running daemon's sources to their states: it posts an
// event to "hooks" at pushAddr, waits until every other source shows its
// state, then fills the queue and waits for "filler". (A full queue would
// pause the sources that had not polled yet.) state reads a source's state
// and reason from the daemon.
func (f *StateFeeds) Bring(t testing.TB, pushAddr string, state func(name string) (string, string)) {
	t.Helper()
	resp, err := http.Post("http://"+pushAddr+"/ingest/hooks", "application/json", strings.NewReader(`{"hello":"status"}`))
	if err != nil {
		t.Fatal(err)
	}
	if err := resp.Body.Close(); err != nil || resp.StatusCode != http.StatusAccepted {
		t.Fatalf("webhook answered %d (%v), want 202", resp.StatusCode, err)
	}
	wait := func(name string) {
		want := f.Want[name]
		var got [2]string
		testsync.WaitFor(t, fmt.Sprintf("source %q to be %s %s", name, want[0], want[1]), 30*time.Second, func() bool {
			got[0], got[1] = state(name)
			return got == want
		})
	}
	for _, name := range []string{"slow", "limited", "broken", "off", "hooks"} {
		wait(name)
	}
	f.fill.Store(true)
	wait("filler")
}
