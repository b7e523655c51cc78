package daemon

import (
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"testing"
)

// TestPushGuardThroughTheDaemon: a webhook source of a whole daemon naming
// a [rate_limiters.NAME] of burst 2 and 1/h serves two requests and
// answers the third 429 with the hour's wait in Retry-After; a source whose
// allow_cidrs leaves out loopback answers 403. Both refusals are counted in
// ingestor_push_requests_total.
func TestPushGuardThroughTheDaemon(t *testing.T) {
	h := startDaemon(t, "", "", `
[push]
addr = "127.0.0.1:0"

[rate_limiters.hooks]
rate = "1/h"
burst = 2

[source.hooks]
kind = "webhook"
rate_limiter = "hooks"
allow_cidrs = ["127.0.0.0/8", "::1"]

[source.fenced]
kind = "webhook"
allow_cidrs = ["10.0.0.0/8"]
`)
	post := func(source string, n int) *http.Response {
		t.Helper()
		req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, "http://"+h.d.PushAddr()+"/ingest/"+source,
			strings.NewReader(fmt.Sprintf(`{"n":%d}`, n)))
		if err != nil {
			t.Fatal(err)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		if err := resp.Body.Close(); err != nil {
			t.Fatal(err)
		}
		return resp
	}
	for n := range 2 {
		if resp := post("hooks", n); resp.StatusCode != http.StatusAccepted {
			t.Fatalf("request %d answered %d, want 202", n, resp.StatusCode)
		}
	}
	resp := post("hooks", 2)
	if ra, _ := strconv.Atoi(resp.Header.Get("Retry-After")); resp.StatusCode != http.StatusTooManyRequests || ra < 3000 || ra > 3600 {
		t.Errorf("third request answered %d with Retry-After %q, want 429 and about an hour", resp.StatusCode, resp.Header.Get("Retry-After"))
	}
	if resp := post("fenced", 0); resp.StatusCode != http.StatusForbidden {
		t.Errorf("request from outside allow_cidrs answered %d, want 403", resp.StatusCode)
	}
	reg := h.d.Registry()
	if n := metric(t, reg, "ingestor_push_requests_total", "source", "hooks", "code", "429"); n != 1 {
		t.Errorf("ingestor_push_requests_total{source=hooks,code=429} = %v, want 1", n)
	}
	if n := metric(t, reg, "ingestor_push_requests_total", "source", "fenced", "code", "403"); n != 1 {
		t.Errorf("ingestor_push_requests_total{source=fenced,code=403} = %v, want 1", n)
	}
}
